"""scripts/gpu_bench.py on a CPU: its plan (every stage's command), the dry run through the real CLI, the budget
arithmetic, and that the full-scale recipe reads the file the data stage writes. The GPU run itself needs a GPU; the
same path runs on a CPU with `--tiny` (docs/gpu.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import gpu_bench

REPO = Path(__file__).resolve().parent.parent


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_plan_runs_every_stage_on_cuda_with_the_recipe(tmp_path: Path) -> None:
    args = gpu_bench.parse(["--out", str(tmp_path)])
    steps = gpu_bench.plan(args)
    assert list(steps) == ["data", "target", "engine", "train"]
    assert steps["data"][-2:] == ["--write-data", str(gpu_bench.DATA_FILE)]
    assert steps["target"][1:] == ["-m", "measure.model_source"]
    eng = steps["engine"]
    for name, value in (("--device", "cuda"), ("--forward-ts", "1,2,4,8,16,64"), ("--dtypes", "float32,bfloat16"),
                        ("--questions", "5"), ("--json", str(tmp_path / "engine.json"))):
        assert flag(eng, name) == value
    train = steps["train"]
    assert train[1:3] == [str(REPO / "builders/train_head.py"), str(REPO / "configs/train/smollm2-eagle-h200.yaml")]
    sets = [train[i + 1] for i, a in enumerate(train) if a == "--set"]
    assert sets == [f"data.path={gpu_bench.DATA_FILE}", f"work_dir={REPO / 'build/gpu/work'}",
                    f"output_dir={tmp_path / 'head'}"]
    assert "--until" not in train and "--stop-at-step" not in train


def test_tiny_plan_stays_on_cpu_and_off_the_full_scale_files(tmp_path: Path) -> None:
    args = gpu_bench.parse(["--out", str(tmp_path), "--tiny", "--stages", "data,engine,train"])
    steps = gpu_bench.plan(args)
    assert list(steps) == ["data", "engine", "train"]
    assert flag(steps["engine"], "--device") == "cpu"
    assert flag(steps["data"], "--write-data") != str(gpu_bench.DATA_FILE)
    assert flag(steps["data"], "--data-limit") == str(gpu_bench.TINY_CONVERSATIONS)
    sets = [steps["train"][i + 1] for i, a in enumerate(steps["train"]) if a == "--set"]
    assert "compute.device=cpu" in sets and f"work_dir={REPO / 'build/gpu/work'}" not in sets


def test_cli_dry_run_writes_the_plan_and_runs_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(REPO / "scripts/gpu_bench.py"), "--out", str(out), "--dry-run",
                           "--stages", "engine,train", "--questions", "7"], capture_output=True, text=True,
                          cwd=REPO, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    written = json.loads((out / "plan.json").read_text())
    assert json.loads(done.stdout) == written and list(written) == ["engine", "train"]
    assert flag(written["engine"], "--questions") == "7"
    assert sorted(p.name for p in out.iterdir()) == ["plan.json"]  # no summary, no engine.json, no head


@pytest.mark.parametrize("argv, error", [
    ([], "--out DIR is required"),
    (["--out", "x", "--stages", "engine,bench"], "--stages: unknown bench; choose from data, target, engine, train"),
])
def test_cli_refuses_with_the_fix(argv: list[str], error: str) -> None:
    done = subprocess.run([sys.executable, str(REPO / "scripts/gpu_bench.py"), *argv], capture_output=True,
                          text=True, cwd=REPO, timeout=120, check=False)
    assert done.returncode == 2 and error in done.stderr


def test_epochs_fit_the_time_left() -> None:
    # 640 training sequences, batch 64: 10 steps per epoch; 0.5 s a step -> 5 s an epoch (5.5 with the margin).
    assert gpu_bench.choose_epochs(0.5, 10.0, 10.0 + 5.5 * 3, 640, 64, 10) == 3
    assert gpu_bench.choose_epochs(0.5, 10.0, 1000.0, 640, 64, 10) == 10  # never more than the recipe's
    assert gpu_bench.choose_epochs(0.5, 10.0, 11.0, 640, 64, 10) == 1  # at least one


def test_the_h200_recipe_reads_the_file_the_data_stage_writes() -> None:
    from training.config import load_train_config

    cfg = load_train_config(gpu_bench.RECIPE)
    assert cfg.data.source == "file" and Path(cfg.data.path) == gpu_bench.DATA_FILE
    assert cfg.data.responses == "regenerate" and cfg.data.max_prompt_tokens == 128  # = the data stage's filter
