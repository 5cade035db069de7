"""`eagle-check BUILD` (doctor/eagle_check.py): the first check of a finished build on the machine that serves it.
Here TensorRT-LLM is not installed, so it runs every step on the reference engine and says so; the tests run the real
CLI on a tiny current-line build for the PyTorch backend (checked through a reference copy of it) and on a 1.1
reference build (the SmolLM2 current-line build with its trained head: tests/test_triton_llmapi.py); the exit 1
path through an expected output that differs (speculation itself is lossless, so a build whose two runs differ cannot
be made without breaking the engine); and unusable inputs (exit 2, a message, no traceback)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from builders.build import main as build_main
from doctor.eagle_check import main, read_build, version_line
from tests.test_config_cli import write_cfg

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parent.parent
REFERENCE_SAYS = ("TensorRT-LLM: not installed in this Python. Every step below runs on the REFERENCE ENGINE "
                  "(engines/, PyTorch), not on TensorRT-LLM")


def _check(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", TQDM_DISABLE="1", HF_HUB_OFFLINE="1")
    p = subprocess.run([sys.executable, "-m", "doctor.eagle_check", *args], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=600)
    assert "Traceback" not in p.stderr, p.stderr
    return p


def _prompts(d: Path, *texts: str) -> Path:
    f = d / "prompts.jsonl"
    f.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    return f


@pytest.fixture(scope="module")
def pytorch_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A current-line (1.4) build for TensorRT-LLM's PyTorch backend: a tiny 8-layer target (EAGLE-3 captures three
    distinct layers) and a random EAGLE-3 head, a dynamic tree, bfloat16 as TensorRT-LLM serves it."""
    from testkit import tiny_models as tm

    root = tmp_path_factory.mktemp("check_pytorch")
    target = tm.make_target(root / "target", layers=8)
    head = tm.make_eagle3_head(root / "eagle3", target)
    cfg = write_cfg(root / "c.yaml", target, head, root / "build", trtllm_version="1.4", draft__type="eagle3",
                    target__dtype="bfloat16", engine__backend="pytorch", tree={"dynamic": {
                        "top_k": 2, "depth": 3, "total_draft_tokens": 5}})
    assert build_main([str(cfg)]) == 0
    return root / "build"


@pytest.fixture(scope="module")
def engine_flow_build(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path, eagle_head: Path) -> Path:
    """A 1.1 build on the reference engine (the ensemble layout: no LLM API options written)."""
    root = tmp_path_factory.mktemp("check_11")
    assert build_main([str(write_cfg(root / "c.yaml", tiny_target, eagle_head, root / "build"))]) == 0
    return root / "build"


def test_a_current_line_pytorch_build_is_checked_on_the_reference_engine_and_says_so(pytorch_build: Path,
                                                                                      tmp_path: Path) -> None:
    prompts = _prompts(tmp_path, "hello there", "the cat sat on the")
    out = tmp_path / "check.json"
    p = _check(str(pytorch_build), "--prompts", str(prompts), "--max-new-tokens", "8", "--json", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    assert REFERENCE_SAYS in p.stdout
    assert "The build was written for TensorRT-LLM 1.4.0rc4 (trtllm_version '1.4')" in p.stdout
    assert "options: engine/llm_api_options.yaml (checked against the contract ledger only)" in p.stdout
    assert "decoding on the reference engine: 2 prompt(s), up to 8 tokens, greedy" in p.stdout
    assert "with speculation = without: 2/2 prompts identical" in p.stdout and "all checks passed" in p.stdout
    r = json.loads(out.read_text())
    assert r["engine"] == "reference engine" and r["installed_trtllm"] is None and r["problems"] == []
    assert [len(o["plain"]) for o in r["outputs"]] == [8, 8] and all(o["plain"] == o["speculative"]
                                                                     for o in r["outputs"])
    s = r["stats"]
    assert s["target_forwards"] > 0 and s["draft_tokens"] == 5 * s["target_forwards"]  # total_draft_tokens per step
    assert f"{s['accepted_draft_tokens']} of {s['draft_tokens']} drafted tokens accepted" in p.stdout



def test_outputs_that_differ_from_the_expected_ones_exit_1(pytorch_build: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """The exit-1 path: the check's comparison against an earlier check's outputs (--expect), with one token of one
    prompt changed, and unchanged (exit 0). In-process: the CLI's main, as the installed command runs it."""
    prompts = _prompts(tmp_path, "hello there", "the cat sat on the")
    out = tmp_path / "check.json"
    assert main([str(pytorch_build), "--prompts", str(prompts), "--max-new-tokens", "6", "--json", str(out)]) == 0
    assert main([str(pytorch_build), "--prompts", str(prompts), "--max-new-tokens", "6", "--expect", str(out)]) == 0
    for prompt, at in ((1, 3), (0, 0)):
        wrong = json.loads(out.read_text())
        wrong["outputs"][prompt]["speculative"][at] += 1
        (tmp_path / "wrong.json").write_text(json.dumps(wrong))
        capsys.readouterr()
        assert main([str(pytorch_build), "--prompts", str(prompts), "--max-new-tokens", "6", "--expect",
                     str(tmp_path / "wrong.json")]) == 1
        said = capsys.readouterr().out
        assert (f"with speculation vs --expect {tmp_path / 'wrong.json'}: prompt {prompt + 1} differs from token {at} "
                "on") in said and "1 problem(s) found" in said and "2/2 prompts identical" in said, said


def test_a_11_reference_build_writes_no_options_and_is_checked(engine_flow_build: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(engine_flow_build), "--prompts", str(_prompts(tmp_path, "hi")), "--max-new-tokens", "4"]) == 0
    said = capsys.readouterr().out
    assert "written for TensorRT-LLM 1.1.0 (trtllm_version '1.1')" in said
    assert "options: none written for TensorRT-LLM (a reference build of the ensemble layout)" in said
    assert "with speculation = without: 1/1 prompts identical" in said


def _corrupt(build: Path, tmp: Path, how: str) -> Path:
    b = tmp / "b"
    shutil.copytree(build, b, symlinks=True)
    man = b / "engine" / "manifest.json"
    if how == "manifest garbage":
        man.write_text("{not json")
    elif how == "manifest nested":
        man.write_text("[" * 100_000)
    elif how == "manifest a list":
        man.write_text("[1, 2]")
    elif how == "manifest of another stage":
        man.write_text(json.dumps(dict(json.loads(man.read_text()), stage="checkpoint")))
    elif how == "manifest a fifo":
        man.unlink()
        os.mkfifo(man)
    elif how == "manifest missing":
        man.unlink()
    elif how == "engine stage missing":
        shutil.rmtree(b / "engine")
    elif how == "config garbage":
        (b / "config.resolved.yaml").write_text("name: [unclosed\n")
    elif how == "config nested":
        (b / "config.resolved.yaml").write_text("[" * 100_000)
    elif how == "config a fifo":
        (b / "config.resolved.yaml").unlink()
        os.mkfifo(b / "config.resolved.yaml")
    elif how == "config not a build's":
        (b / "config.resolved.yaml").write_text(yaml.safe_dump({"name": "x", "unknown_section": 1}))
    return b


@pytest.mark.parametrize(("how", "says"), [
    ("manifest garbage", "engine/manifest.json: not valid JSON"),
    ("manifest nested", "engine/manifest.json: JSON nested too deeply to read"),
    ("manifest a list", "not a manifest of the engine stage"),
    ("manifest of another stage", "not a manifest of the engine stage"),
    ("manifest a fifo", "is a FIFO (named pipe); give a regular file"),
    ("manifest missing", "engine/manifest.json: no such file"),
    ("engine stage missing", "is not a finished build: run `eagle-build CONFIG` first"),
    ("config garbage", "not a build's resolved config (unreadable YAML"),
    ("config nested", "not a build's resolved config (unreadable YAML"),
    ("config a fifo", "is a FIFO (named pipe); give a regular file"),
    ("config not a build's", "unknown_section"),
])
def test_a_damaged_build_exits_2_with_the_reason(how: str, says: str, engine_flow_build: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    b = _corrupt(engine_flow_build, tmp_path, how)
    assert main([str(b)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and says in err, err


def test_unusable_arguments_exit_2_before_any_work(engine_flow_build: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad.json").write_text(json.dumps({"outputs": [{"speculative": [1, True]}]}))
    (tmp_path / "int.json").write_text(json.dumps({"outputs": 5}))
    cases = [
        ([str(tmp_path / "gone")], "no such directory; give the output_dir of a finished build"),
        ([str(tmp_path / "a_file")], "no such directory"),
        ([str(tmp_path / "empty")], "no config.resolved.yaml, so not a build directory"),
        ([str(engine_flow_build), "--json", str(tmp_path)], f"--json {tmp_path}: is a directory"),
        ([str(engine_flow_build), "--max-new-tokens", "0"], "--max-new-tokens 0: give an integer in [2, 4096]"),
        ([str(engine_flow_build), "--prompts", str(tmp_path / "a_file")], "line 1: not valid JSON"),
        ([str(engine_flow_build), "--expect", str(tmp_path / "bad.json")], "not the --json of an eagle-check of 4"),
        ([str(engine_flow_build), "--expect", str(tmp_path / "a_file")], "not valid JSON"),
        ([str(engine_flow_build), "--expect", str(tmp_path / "int.json")], "not the --json of an eagle-check of 4"),
        ([str(engine_flow_build), "--expect", str(tmp_path)], "is a directory; give a regular file"),
    ]
    for args, says in cases:
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert err.startswith("error: ") and says in err, (args, err)


@pytest.mark.parametrize(("installed", "error", "problem"), [
    ("1.4.0rc4", None, None),
    ("1.4.0rc4.post1", None, None),
    ("1.4.0rc3", None, "the installed TensorRT-LLM is 1.4.0rc3, the build was written for TensorRT-LLM 1.4.0rc4"),
    ("1.2.0", None, "the installed TensorRT-LLM is 1.2.0"),
    (None, "ImportError: libcuda.so.1: cannot open", "`import tensorrt_llm` fails: ImportError: libcuda.so.1"),
])
def test_the_installed_release_is_compared_with_the_one_the_build_was_written_for(
        installed: str | None, error: str | None, problem: str | None, pytorch_build: Path) -> None:
    line, problems = version_line(read_build(pytorch_build), installed, error)
    if problem is None:
        assert problems == [] and line == (f"TensorRT-LLM {installed}: the release the build was written for, "
                                           "TensorRT-LLM 1.4.0rc4 (trtllm_version '1.4')")
    else:
        assert len(problems) == 1 and problem in problems[0], problems
