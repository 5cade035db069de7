"""The refresh's offline gate (builders/adaptive/replay.py): a head's tau replayed from the target's features of the
captured requests equals what the doctor's gate measures by decoding them on the reference engine, on a tiny model
(features in the engine's dtype), for the build's static tree and for a dynamic (EAGLE-2) tree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.test_adaptive import held_out, mimic3_build  # noqa: F401  (module-scoped fixture)


def replay_inputs(build: Path, records_file: Path) -> tuple[list, list[torch.Tensor]]:
    """The records as the refresh reads them and their target features (float32, the build's dtype)."""
    from transformers import AutoModelForCausalLM

    from builders import layout
    from builders.adaptive.dataset import read_jsonl
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
    from builders.adaptive.replay import replay_figures, replayable, runtime_for
    from builders.doctor.gate import decode, figures
    from core.trees import DynamicTree
    from engines.api import ReferenceEngine

    build = mimic3_build
    recs, aux = replay_inputs(build, held_out(build, 6))
    rt = runtime_for(build, build / "checkpoint" / "eagle3")
    if tree == "dynamic":
        rt = rt.with_tree(DynamicTree(top_k=2, depth=3, total_draft_tokens=5))
    reqs, left = replayable(recs, aux, rt.limits.max_input_len)
    assert left == 0 and len(reqs) == 6
    got = replay_figures(rt, reqs, 12, [])
    want = figures(decode(ReferenceEngine(rt), [c.prompt_ids for c in recs], 12, [], True, "engine"))
    assert got == want, json.dumps({"replayed": got, "engine": want})
    assert got["target_forwards"] < 6 * 11 and got["accepted_draft_tokens"] > 0  # the head accepts: not trivial
