"""Tensor parallelism: a tp=2 checkpoint run in two CPU processes joined by torch.distributed (gloo) gives exactly the
tp=1 outputs — target-only, EAGLE-1 with a tree, and EAGLE-3 (head replicated, captured layers from the sharded
target). Split layout: builders/convert (TensorRT-LLM's tensorrt_llm/models/llama/convert.py scheme)."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from core.trees import DraftTree, DynamicTree, preset
from engines.api import GenerationRequest, ReferenceEngine, SamplingParams
from engines.parallel import spawn

PROMPTS = [[5, 17, 33, 101, 7], [9, 8, 7, 6, 5, 4, 3, 2]]


def _decode(ckpt: str, eagle3: str | None, tree_name: str | None, dynamic: bool) -> dict[str, list[list[int]]]:
    tree = DynamicTree(3, 3, 8) if dynamic else (DraftTree.from_choices(preset(tree_name)) if tree_name else None)
    engine = ReferenceEngine.from_checkpoint(
        Path(ckpt), tree=tree, dtype="float32", device="cpu", eagle3_head_dir=Path(eagle3) if eagle3 else None
    )
    reqs = [GenerationRequest(p, 20, SamplingParams(), []) for p in PROMPTS]
    out = {"plain": [r.output_ids for r in engine.generate(reqs, speculative=False)]}
    if tree is not None:
        out["spec"] = [r.output_ids for r in engine.generate(reqs)]
        sampled = [GenerationRequest(p, 12, SamplingParams(temperature=0.8, seed=7), []) for p in PROMPTS]
        out["sampled"] = [r.output_ids for r in engine.generate(sampled)]
        unseeded = [GenerationRequest(p, 12, SamplingParams(temperature=1.0), []) for p in PROMPTS]
        out["unseeded"] = [r.output_ids for r in engine.generate(unseeded)]
    return out


CASES = {  # name -> (checkpoint subdir, EAGLE-3 head?, static tree preset, dynamic tree?)
    "eagle1-eagle25": ("eagle", False, "eagle-default", False),
    "eagle3-dynamic": ("eagle3", True, None, True),
}


def _all_cases(root: str) -> dict[str, dict[str, list[list[int]]]]:
    out = {}
    for name, (sub, eagle3, tree_name, dynamic) in CASES.items():
        ckpt = os.path.join(root, sub)
        out[name] = _decode(ckpt, os.path.join(ckpt, "eagle3") if eagle3 else None, tree_name, dynamic)
    return out


def _worker(rank: int, *, root: str) -> dict[str, dict[str, list[list[int]]]]:
    return _all_cases(root)


def test_tp2_equals_tp1(tiny_dir: Path, tiny_target: Path, eagle_head: Path, eagle3_head: Path) -> None:
    """One pair of processes runs every case (process start-up dominates the cost)."""
    from builders.convert import convert_eagle3
    from tests.conftest import convert_eagle_ckpt

    torch.set_num_threads(1)
    roots = {1: tiny_dir / "tp_1", 2: tiny_dir / "tp_2"}
    for tp, root in roots.items():
        convert_eagle_ckpt(tiny_target, eagle_head, root / "eagle", tp=tp)
        convert_eagle3(tiny_target, eagle3_head, root / "eagle3", dtype="float32", tp=tp, layers_to_capture=None)
    assert (roots[2] / "eagle" / "rank1.safetensors").is_file() and (
        roots[2] / "eagle3" / "rank1.safetensors"
    ).is_file()
    expected = _all_cases(str(roots[1]))
    ranks = spawn(functools.partial(_worker, root=str(roots[2])), world=2)
    assert ranks[0] == ranks[1]  # unseeded sampling too: rank 0's random seeds are broadcast
    for name, case in expected.items():
        assert {k: v for k, v in ranks[0][name].items() if k != "unseeded"} == {
            k: v for k, v in case.items() if k != "unseeded"
        }
        assert case["spec"] == case["plain"]  # and greedy EAGLE is lossless under tp=2 as well
