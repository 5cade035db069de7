"""`draft_len_schedule: auto` (measure/schedule_policy.py, tune_tree.py --objective schedule): the draft length per
batch size from the expected tau of the cut tree and measured step costs, in upstream's schedule form; the CLI on a
tiny build writes the schedule a config's tree.schedule_file reads back."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import yaml

from measure import tune_tree
from builders.convert.stage import CONVERT_STAGE
from builders.engine.stage import ENGINE_STAGE
from builders.pipeline import run_stage
from measure.schedule_policy import ScheduleResult
from builders.speculation import read_schedule, schedule_problems
from core.speculation import draft_len_for
from core.trees import DraftTree
from tests.engine_cases import make_cfg

TREE = DraftTree.from_choices([[0], [1], [0, 0], [0, 0, 0]])  # depth 3


def _result(chosen: dict[int, int], taus: tuple[float, ...] = (1.0, 1.6, 1.9, 2.1)) -> ScheduleResult:
    """Costs under which draft length chosen[b] is the unique best at batch b (0: nothing beats target-only)."""
    step = {b: [1.2 * 10.0] + [1e3] * 3 for b in chosen}  # d=0 is slower than target-only: never chosen
    for b, d in chosen.items():
        if d:
            step[b][d] = 10.0  # S = tau_d > 1 here, S < 1 elsewhere
    return ScheduleResult(sorted(chosen), list(taus), step, dict.fromkeys(chosen, 10.0), TREE)


SIZES = [1, 2, 4, 8]


@pytest.mark.parametrize("choice", list(itertools.product(range(4), repeat=len(SIZES))))
def test_schedule_reproduces_the_choice_at_every_measured_batch_size(choice: tuple[int, ...]) -> None:
    chosen = dict(zip(SIZES, choice, strict=True))
    r = _result(chosen)
    assert {b: r.best(b) for b in SIZES} == chosen
    sched = r.schedule()
    if chosen[1] == 0:
        assert sched == {}
        return
    assert schedule_problems(sched, chosen[1]) == []  # upstream accepts it with the tree cut to schedule[1]
    for b in SIZES:  # the measured sizes get their choice (capped at the length at batch 1)
        assert draft_len_for(sched, b) == min(chosen[b], chosen[1]), (b, sched)
    for b in range(1, 9):  # sizes between two measured ones take the larger one's length
        nxt = min(s for s in SIZES if s >= b)
        assert draft_len_for(sched, b) == min(chosen[nxt], chosen[1])
    assert draft_len_for(sched, 9) == 0  # above what was measured: off, as upstream


def test_speedup_is_tau_times_cost_ratio() -> None:
    r = ScheduleResult([1, 4], [1.0, 1.5], {1: [11.0, 12.0], 4: [13.0, 20.0]}, {1: 10.0, 4: 12.0},
                       DraftTree.from_choices([[0]]))
    assert r.speedup(1, 1) == pytest.approx(1.5 * 10 / 12) and r.speedup(4, 1) == pytest.approx(1.5 * 12 / 20)
    assert (r.best(1), r.best(4)) == (1, 0) and r.schedule() == {1: 1}


@pytest.fixture(scope="module")
def tiny_build(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path, eagle_head: Path) -> Path:
    root = tmp_path_factory.mktemp("sched")
    cfg = make_cfg("engine.backend=reference", "engine.device=cpu", "tree.choices=topk-2-2", "target.dtype=float32",
                   f"target.model={tiny_target}", f"draft.model={eagle_head}", f"output_dir={root}")
    run_stage(CONVERT_STAGE, cfg, root)
    run_stage(ENGINE_STAGE, cfg, root)
    return root


def test_cli_schedule_objective_writes_what_auto_reads(tiny_build: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ["The quick brown fox", "Hello world!"]) + "\n")
    js, snippet, png = tmp_path / "s.json", tmp_path / "s.yaml", tmp_path / "s.png"
    rc = tune_tree.main(["--build", str(tiny_build), "--prompts", str(prompts), "--budget", "6", "--top-k", "2",
                         "--max-depth", "2", "--max-new-tokens", "8", "--objective", "schedule", "--batch-sizes",
                         "1,2", "--steps", "2", "--cost-rounds", "1", "--json", str(js), "--out", str(snippet),
                         "--plot", str(png)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "expected tau by draft length: d=0: 1.000" in printed and "draft_len_schedule:" in printed
    doc = json.loads(js.read_text())["schedule"]
    assert doc["batch_sizes"] == [1, 2] and set(doc["step_ms"]) == {"1", "2"}
    assert all(len(v) == 3 and min(v) > 0 for v in doc["step_ms"].values())  # d = 0..2, measured
    r = ScheduleResult(
        [1, 2],
        doc["taus"],
        {int(b): v for b, v in doc["step_ms"].items()},
        {int(b): v for b, v in doc["target_ms"].items()},
        DraftTree.from_choices([[0], [1], [0, 0], [1, 0]]),
    )
    assert {str(b): n for b, n in r.schedule().items()} == doc["draft_len_schedule"]
    assert png.is_file() and png.stat().st_size > 0
    sched = read_schedule(js)
    text = yaml.safe_load(snippet.read_text())["tree"]
    if sched:
        assert text["draft_len_schedule"] == sched and DraftTree.from_choices(text["choices"]).depth == sched[1]
    else:
        assert "draft_len_schedule" not in text


def test_cli_schedule_errors(tiny_build: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "Hello"}) + "\n")
    base = ["--build", str(tiny_build), "--prompts", str(prompts), "--budget", "2", "--objective", "schedule",
            "--top-k", "1", "--max-depth", "1", "--max-new-tokens", "4"]
    assert tune_tree.main(base + ["--batch-sizes", "2,4"]) == 2
    assert "including 1 (draft_len_schedule must hold batch size 1)" in capsys.readouterr().err
    assert tune_tree.main(base + ["--batch-sizes", "1,500"]) == 2  # within 512, above this build's
    assert "give sizes from 1 up to the build's engine.max_batch_size" in capsys.readouterr().err


# ---- the GPU roofline model (--cost-model) ---------------------------------------------------------------------------
def test_gpu_model_regimes() -> None:
    """Small batches are bound by reading the weights (a wider verification is almost free: speedup ~ tau), large
    ones by arithmetic (speedup ~ tau / tokens verified): the model must show both and the crossing between."""
    from measure import gpu_cost_model as gm

    shape = gm.ModelShape(hidden=4096, layers=32, intermediate=14336, vocab=128256, heads=32, kv_heads=8, head_dim=128)
    assert 7.5e9 < shape.params() < 8.5e9  # a Llama-3.1-8B shape
    chain3 = DraftTree.from_choices([[0], [0, 0], [0, 0, 0]])
    for gpu in gm.GPUS.values():
        small = gm.step_ms(gpu, shape, 1, chain3, 1024) / gm.step_ms(gpu, shape, 1, None, 1024)
        big = gm.step_ms(gpu, shape, 4096, chain3, 16) / gm.step_ms(gpu, shape, 4096, None, 16)
        long_ctx = gm.step_ms(gpu, shape, 4096, chain3, 8192) / gm.step_ms(gpu, shape, 4096, None, 8192)
        # weight reads dominate: 4 verified tokens cost about 1; what is added is mostly the head's 4 passes, each
        # reading its lm_head (0.5B of 8.3B parameters here)
        assert 1.0 < small < 1.5, gpu.name
        assert big > 3.5, gpu.name  # short context, many sequences: arithmetic dominates, 4 tokens cost about 4x
        assert long_ctx < big, gpu.name  # a long context makes the step read the KV cache: verification cheaper again
        costs = [gm.step_ms(gpu, shape, b, None, 1024) for b in (1, 8, 64, 512)]
        assert costs == sorted(costs)  # more sequences never cost less
    steps, target = gm.modelled_costs(gm.GPUS["H100-SXM"], shape, chain3, [1, 256], 1024)
    assert all(steps[b][0] == target[b] for b in (1, 256))  # length 0 = a target-only step
    r = ScheduleResult([1, 8, 64, 512], [1.0, 1.7, 2.2, 2.5],
                       *gm.modelled_costs(gm.GPUS["H100-SXM"], shape, chain3, [1, 8, 64, 512], 1024), chain3)
    sched = r.schedule()
    assert sched[1] == 3 and draft_len_for(sched, 512) < 3  # full length alone, less (or none) under load


def test_cli_schedule_with_a_gpu_cost_model(tiny_build: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "The quick brown fox"}) + "\n")
    js = tmp_path / "g.json"
    base = ["--build", str(tiny_build), "--prompts", str(prompts), "--budget", "6", "--top-k", "2", "--max-depth",
            "2", "--max-new-tokens", "8", "--objective", "schedule"]
    assert tune_tree.main(base + ["--cost-model", "H100-SXM", "--json", str(js)]) == 0
    printed = capsys.readouterr().out
    assert "the roofline model of H100-SXM at context 1024, not a measurement" in printed
    doc = json.loads(js.read_text())
    assert doc["schedule"]["batch_sizes"] == [1, 2, 4, 8, 16, 32, 64, 128, 256] and "MODEL" in doc["device"]
    assert tune_tree.main(base + ["--cost-model", "TPU"]) == 2
    assert "--cost-model TPU: use one of H100-SXM, H200-SXM, A100-SXM-80GB, L40S" in capsys.readouterr().err
