"""The refresh's offline gate (measure/replay.py, adaptive/replay.py): a head's tau replayed from the
target's features of the captured requests equals what the doctor's gate measures by decoding them on the reference
engine, on a tiny model (features in the engine's dtype), for the build's static tree and for a dynamic (EAGLE-2)
tree; and the refresh's time budget, resume and replayed gate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.test_adaptive import ROOT, held_out, mimic3_build  # noqa: F401  (module-scoped fixture)


def replay_inputs(build: Path, records_file: Path) -> tuple[list, list[torch.Tensor]]:
    """The records as the refresh reads them and their target features (float32, the build's dtype)."""
    from transformers import AutoModelForCausalLM

    from builders import layout
    from adaptive.dataset import read_jsonl
    from core.hfconfig import read_config
    from training.features import FeatureSpec, sequence_features

    recs = read_jsonl(records_file)
    ids = [int(i) for i in read_config(build / "checkpoint" / "eagle3")["eagle_aux_hidden_state_layer_ids"]]
    model = AutoModelForCausalLM.from_pretrained(layout.hf_target_dir(build), dtype=torch.float32).eval()
    seqs = [torch.tensor(c.prompt_ids + c.output_ids) for c in recs]
    with torch.no_grad():
        rows = sequence_features(model, seqs, FeatureSpec(tuple(ids), torch.float32), 4096)
    return recs, [r["aux"] for r in rows]


@pytest.mark.parametrize("tree", ["build", "dynamic"])
def test_replayed_tau_equals_the_engines(mimic3_build: Path, tree: str) -> None:  # noqa: F811
    from adaptive.replay import replay_figures, replayable
    from measure.replay import runtime_for
    from doctor.gate import decode, figures
    from core.trees import DynamicTree
    from engines.api import ReferenceEngine

    build = mimic3_build
    recs, aux = replay_inputs(build, held_out(build, 6))
    rt = runtime_for(build, build / "checkpoint" / "eagle3")
    if tree == "dynamic":
        rt = rt.with_tree(DynamicTree(top_k=2, depth=3, total_draft_tokens=5))
    reqs, left = replayable(recs, aux, ReferenceEngine(rt).limits.max_input_len)
    assert left == 0 and len(reqs) == 6
    got = replay_figures(rt, reqs, 12, [])
    want = figures(decode(ReferenceEngine(rt), [c.prompt_ids for c in recs], 12, [], True, "engine"))
    assert got == want, json.dumps({"replayed": got, "engine": want})
    assert got["target_forwards"] < 6 * 11 and got["accepted_draft_tokens"] > 0  # the head accepts: not trivial


def set_refresh(build: Path, **kw: object) -> None:
    """Change the refresh section of a finished build's config (what adaptive/refresh.py reads)."""
    import yaml

    f = build / "config.resolved.yaml"
    data = yaml.safe_load(f.read_text())
    data["refresh"].update(kw)
    f.write_text(yaml.safe_dump(data))


def test_refresh_stops_at_its_budget_resumes_and_gates_by_replay(mimic3_build: Path) -> None:  # noqa: F811
    from adaptive.refresh import main
    from triton_repo.models import capture as C

    build = mimic3_build
    records = [json.loads(x) for x in held_out(build, 12).read_text().splitlines()]
    w = C.Writer(build / "capture", C.Settings(dir="capture", max_bytes=1 << 20, sample_rate=1.0, segment_records=4,
                                               segment_seconds=60.0, queue_size=64))
    for r in records:
        assert w.offer(r)
    w.close()
    run = build / "refresh" / "budget"
    # a budget the first epoch already spends: no second epoch starts
    set_refresh(build, epochs=3, patience=3, train_seconds=1e-6, threads=1, gate_engine_requests=2)
    assert main(["--build", str(build), "--run", "budget"]) in (0, 1)
    rep = json.loads((run / "report.json").read_text())
    assert rep["chain_tau"]["stopped"] == "budget" and len(rep["chain_tau"]["by_epoch"]) == 1
    assert len(rep["chain_tau"]["epoch_seconds"]) == 1 and rep["threads"] == 1
    g = rep["gate"]
    assert g["method"] == "replay" and g["requests"] == rep["sizes"]["held_out"] and g["lossless_requests"] == 2
    assert g["lossless"] and g["captured_outputs_reproduced"] == 2 and g["left_out"] == 0
    assert set(rep["cpu_seconds"]) == {"features", "train", "gate", "total"}
    # interrupted after the first epoch: the same command resumes (split and features kept) and trains on
    shards = {p: p.stat().st_mtime_ns for p in (run / "work" / "features").iterdir()}
    (run / "report.json").unlink()
    set_refresh(build, train_seconds=3600.0)
    assert main(["--build", str(build), "--run", "budget"]) in (0, 1)
    rep = json.loads((run / "report.json").read_text())
    assert rep["chain_tau"]["stopped"] in ("epochs", "patience") and len(rep["chain_tau"]["by_epoch"]) == 3
    assert {p: p.stat().st_mtime_ns for p in (run / "work" / "features").iterdir()} == shards
    steps = [r["step"] for r in map(json.loads, (run / "work" / "checkpoints" / "train_log.jsonl").read_text()
                                    .splitlines()) if "loss" in r]
    assert steps == list(range(1, len(steps) + 1))  # one trajectory: the resumed epochs continue the first
    # the threads A/B the guide shows, on this run
    p = subprocess.run([sys.executable, "bench/bench_refresh_threads.py", "--build", str(build), "--run", str(run),
                        "--rounds", "1", "--steps", "1"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert [r["threads"] for r in json.loads(p.stdout)["rows"]] == [1, 2]
    # the held-out problems of the guide's measurement as request records for the doctor's gate
    f = build / "held_problems.jsonl"
    p = subprocess.run([sys.executable, "bench/bench_adaptive.py", "--out", str(build), "--held-out-problems", "3",
                        "--held-out-requests", str(f)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    held = [json.loads(x) for x in f.read_text().splitlines()]
    assert len(held) == 3 and all(r["prompt_ids"] and r["output_ids"] == [] for r in held)
