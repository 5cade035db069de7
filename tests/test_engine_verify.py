"""`python -m measure.verify`: a real build directory (builders/build.py: checkpoint + engine stages, reference backend)
checked against Hugging Face generate() on the original target; a build whose checkpoint does not match the HF
target must fail with exit status 1 and name the first divergence."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from measure.lossless import first_divergence
from measure.verify import main

REPO = Path(__file__).resolve().parent.parent


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path, eagle_head: Path) -> Path:
    root = tmp_path_factory.mktemp("verify_build")
    cfg = {
        "name": "tiny-verify",
        "trtllm_version": "1.1",
        "output_dir": str(root / "out"),
        "target": {"model": str(tiny_target), "dtype": "float32"},
        "draft": {"type": "eagle", "model": str(eagle_head)},
        "tree": {"choices": "eagle-default"},
        "engine": {
            "backend": "reference",
            "max_batch_size": 2,
            "max_input_len": 64,
            "max_seq_len": 128,
            "device": "cpu",
        },
    }
    (root / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.run(
        [sys.executable, "builders/build.py", str(root / "cfg.yaml")], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (root / "out" / "engine" / "reference.json").is_file()
    return root / "out"


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    f = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    f.write_text(
        '{"prompt": "Hello world!"}\n{"turns": ["What is the capital of France?", "And Italy?"]}\n{"prompt": "x"}\n'
    )
    return f


def test_verify_identical(build_dir: Path, prompts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "v.json"
    rc = main(
        [
            "--build",
            str(build_dir),
            "--prompts",
            str(prompts),
            "--max-new-tokens",
            "12",
            "--limit",
            "2",
            "--json",
            str(report),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "2/2 identical" in out
    data = json.loads(report.read_text())
    assert data["all_identical"] and len(data["prompts"]) == 2
    assert all(p["identical"] and p["engine_tokens"] == p["hf_tokens"] == 12 for p in data["prompts"])
    assert data["aggregate"]["generated_tokens"] == 24 and data["aggregate"]["tau"] >= 1.0


def test_verify_fails_when_the_checkpoint_differs_from_the_target(
    build_dir: Path, prompts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Point the build at another HF target (same shapes and tokenizer, different weights): outputs must differ."""
    import shutil

    from testkit import tiny_models as tm

    other = tm.make_target(tmp_path / "other_target", seed=9)
    tampered = tmp_path / "build"
    shutil.copytree(build_dir, tampered)
    spec_file = tampered / "engine" / "reference.json"
    spec = json.loads(spec_file.read_text())
    spec["hf_target_dir"] = str(other)
    spec_file.write_text(json.dumps(spec))
    rc = main(["--build", str(tampered), "--prompts", str(prompts), "--max-new-tokens", "8", "--limit", "1"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "DIFFERS at token 0" in out and "0/1 identical" in out


def test_reuse_hf_outputs_of_an_earlier_report(
    build_dir: Path, prompts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--reuse-hf: outputs still compared token by token (against the stored HF ids), HF not run again; a report of
    other prompts / lengths / target, or a tampered HF output, is caught."""
    first = tmp_path / "first.json"
    base = ["--build", str(build_dir), "--prompts", str(prompts), "--limit", "2"]
    assert main([*base, "--max-new-tokens", "10", "--json", str(first)]) == 0
    doc = json.loads(first.read_text())
    assert all(len(p["hf_output_ids"]) == p["hf_tokens"] == 10 for p in doc["prompts"]) and doc["eos_token_ids"]
    capsys.readouterr()
    again = tmp_path / "again.json"
    assert main([*base, "--max-new-tokens", "10", "--reuse-hf", str(first), "--json", str(again)]) == 0
    out = capsys.readouterr().out
    assert f"HF outputs from {first}" in out and "2/2 identical" in out
    second = json.loads(again.read_text())
    assert [p["hf_tokens_per_s"] for p in second["prompts"]] == [p["hf_tokens_per_s"] for p in doc["prompts"]]
    assert second["hf_reused_from"] == str(first)

    tampered = tmp_path / "tampered.json"
    doc["prompts"][1]["hf_output_ids"][4] += 1
    tampered.write_text(json.dumps(doc))
    assert main([*base, "--max-new-tokens", "10", "--reuse-hf", str(tampered)]) == 1
    assert "DIFFERS at token 4" in capsys.readouterr().out

    assert main([*base, "--max-new-tokens", "12", "--reuse-hf", str(first)]) == 2
    assert "its max_new_tokens is 10, this run's 12; rerun without --reuse-hf" in capsys.readouterr().err
    assert main([*base[:-1], "3", "--max-new-tokens", "10", "--reuse-hf", str(first)]) == 2
    assert "its 2 prompts are not this run's 3" in capsys.readouterr().err
    doc["hf_target_dir"] = "/elsewhere"
    tampered.write_text(json.dumps(doc))
    assert main([*base, "--max-new-tokens", "10", "--reuse-hf", str(tampered)]) == 2
    assert "its target is '/elsewhere'" in capsys.readouterr().err
    assert main([*base, "--max-new-tokens", "10", "--temperature", "0.7", "--reuse-hf", str(first)]) == 2
    assert "--reuse-hf needs greedy decoding" in capsys.readouterr().err


def test_first_divergence() -> None:
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def test_cli_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--prompts", "x.jsonl", "--max-new-tokens", "4"])
    assert e.value.code == 2 and "--build" in capsys.readouterr().err
    assert main(["--build", "b", "--prompts", "x.jsonl", "--max-new-tokens", "0"]) == 2
