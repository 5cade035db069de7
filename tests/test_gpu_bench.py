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
    assert list(steps) == ["data", "target", "train", "engine"]  # the engine measures the trained head
    assert steps["data"][-2:] == ["--write-data", str(gpu_bench.DATA_FILE)]
    assert steps["target"][1:] == ["-m", "sources.targets"]
    eng = steps["engine"]
    for name, value in (("--device", "cuda"), ("--forward-ts", "1,2,4,8,16,64"), ("--dtypes", "float32,bfloat16"),
                        ("--questions", "5"), ("--json", str(tmp_path / "engine.json")),
                        ("--eagle3-head", str(tmp_path / "head"))):
        assert flag(eng, name) == value
    assert "--eagle-head" not in eng  # the committed EAGLE-1 head
    train = steps["train"]
    assert train[1:3] == [str(REPO / "training/train_head.py"), str(REPO / "configs/train/smollm2-eagle3-h200.yaml")]
    sets = [train[i + 1] for i, a in enumerate(train) if a == "--set"]
    assert sets == [f"data.path={gpu_bench.DATA_FILE}", f"work_dir={REPO / 'build/gpu/work'}",
                    f"output_dir={tmp_path / 'head'}"]
    assert "--until" not in train and "--stop-at-step" not in train


def test_an_eagle1_recipe_puts_its_head_in_the_eagle1_place(tmp_path: Path) -> None:
    args = gpu_bench.parse(["--out", str(tmp_path), "--recipe", "configs/train/smollm2-eagle-h200.yaml"])
    steps = gpu_bench.plan(args)
    assert flag(steps["engine"], "--eagle-head") == str(tmp_path / "head") and "--eagle3-head" not in steps["engine"]
    assert steps["train"][2] == str(REPO / "configs/train/smollm2-eagle-h200.yaml")
    no_train = gpu_bench.plan(gpu_bench.parse(["--out", str(tmp_path), "--stages", "engine"]))
    assert "--eagle3-head" not in no_train["engine"] and "--eagle-head" not in no_train["engine"]
    assert "--eagle3-head" not in gpu_bench.engine_argv(args, trained=False)


def test_figures_of_both_head_kinds_and_the_finished_shards(tmp_path: Path) -> None:
    eagle3 = [{"draft_vocab_size": 8}, {"step": 1, "loss": 2.0, "tokens_0": 30, "tokens_1": 28},
              {"step": 2, "loss": 1.5, "tokens_0": 10, "tokens_1": 9},
              {"step": 2, "eval_acc_0": 0.6, "eval_acc_1": 0.4, "eval_chain_tau": 2.1}]
    (tmp_path / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in eagle3))
    assert gpu_bench.train_figures(tmp_path, 4.0) == {"steps": 2, "tokens": 40, "tokens_per_s": 10.0,
                                                      "eval_top1": 0.6, "eval_chain_tau": 2.1}
    eagle1 = [{"step": 1, "loss": 2.0, "tokens": 50}, {"step": 1, "eval_acc": 0.3, "eval_chain_tau": 1.4}]
    (tmp_path / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in eagle1))
    assert gpu_bench.train_figures(tmp_path, 5.0)["eval_top1"] == 0.3
    (tmp_path / "data").mkdir()
    for name in ("shard-00000.pt", "shard-00001.pt", "shard-00002.pt.tmp-12", "key.json"):
        (tmp_path / "data" / name).write_text("")
    assert gpu_bench.finished_conversations(tmp_path, 512) == 1024  # a partial shard is not a finished one


def test_tiny_plan_stays_on_cpu_and_off_the_full_scale_files(tmp_path: Path) -> None:
    args = gpu_bench.parse(["--out", str(tmp_path), "--tiny", "--stages", "data,engine,train"])
    steps = gpu_bench.plan(args)
    assert list(steps) == ["data", "train", "engine"]
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
    assert json.loads(done.stdout) == written and list(written) == ["train", "engine"]
    assert flag(written["engine"], "--questions") == "7"
    assert sorted(p.name for p in out.iterdir()) == ["plan.json"]  # no summary, no engine.json, no head


@pytest.mark.parametrize("argv, error", [
    ([], "--out DIR is required"),
    (["--out", "x", "--stages", "engine,bench"], "--stages: unknown bench; choose from data, target, train, engine"),
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


@pytest.mark.parametrize("recipe", ["smollm2-eagle3-h200.yaml", "smollm2-eagle-h200.yaml"])
def test_the_h200_recipes_read_the_file_the_data_stage_writes(recipe: str) -> None:
    from training.config import load_train_config

    cfg = load_train_config(REPO / "configs/train" / recipe)
    assert cfg.data.source == "file" and Path(str(cfg.data.path)) == gpu_bench.DATA_FILE
    assert cfg.data.responses == "regenerate" and cfg.data.max_prompt_tokens == 128  # = the data stage's filter
    assert cfg.data.num_conversations == 7707 and cfg.compute.device == "auto"
