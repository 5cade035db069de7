"""A head's served acceptance on captured greedy requests, replayed from the target's features (the refresh's gate).

A captured greedy request's output IS the target's greedy continuation of its prompt, and the refresh has already
computed the target's features of every captured sequence (one forward each). That is all a speculative decode
needs besides the head: at each step the build's own drafting strategy (engines/drafting.py, the same tree) grows a
draft tree from the drafter's state at the root, the target's verification is the captured output (a tree node is
accepted when its token is the next output token, exactly what the greedy walk of engines/step.py accepts), and
the drafter is fed the accepted pairs (token, target feature) as engines/step.py commit_drafter feeds them. The
counters are the session's (engines/slots.py Slot.count), so the figures are the doctor's gate figures
(doctor/gate.py) without running the target: the same numbers when the features are computed in the
engine's dtype (tests/test_adaptive_replay.py checks equality on a tiny model), an estimate within the features'
rounding otherwise (a refresh computes them in bf16 on a CPU that has it).

Each request is decoded for min(max_new_tokens, its captured output) tokens (beyond that the target's choice is
unknown); requests that sampled, or whose prompt exceeds the engine's max_input_len, are left out and counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from core.types import GenerationRequest, RequestStats, SamplingParams
from engines.cache import KVCache, Rows
from engines.heads import Eagle3Drafter
from engines.runtime import Runtime
from engines.slots import Accepted, Slot
from engines.step import DraftBatch, greedy_node, update_drafter


@dataclass(frozen=True)
class Replayable:
    """One captured greedy request with the target's fused-layer inputs of prompt + output (aux: [T, n*H])."""

    prompt_ids: list[int]
    output_ids: list[int]
    aux: torch.Tensor


def runtime_for(build_dir: Path, head: Path) -> Runtime:
    """The build's reference runtime (its tree, dtype, limits) drafting with the normalized head `head`."""
    from core.spec import read_spec
    from engines.runtime import runtime_from_spec

    spec = read_spec(build_dir).model_copy(update={"eagle3_head_dir": str(Path(head).resolve())})
    return runtime_from_spec(spec, build_dir, device="cpu")


@torch.inference_mode()
def replay_one(rt: Runtime, r: Replayable, max_new_tokens: int, eos: list[int]) -> Slot:
    """Decode one request as a batch of one in the engine would, the target's side replayed; returns its slot (its
    output and RequestStats)."""
    d, drafting = rt.drafter, rt.drafting
    if not isinstance(d, Eagle3Drafter) or drafting is None:
        raise ValueError("the replay needs a runtime with an EAGLE-3 head and a tree")
    n = min(max_new_tokens, len(r.output_ids))
    seq = r.prompt_ids + r.output_ids
    p, dev = len(r.prompt_ids), rt.device
    req = GenerationRequest(r.prompt_ids, n, SamplingParams(), eos)
    slot = Slot(0, req, torch.Generator(), stats=RequestStats(acceptance_by_depth=[0] * drafting.tree.depth))
    slots = p + n + drafting.tree.size + 2 + drafting.scratch_slots
    batch = DraftBatch(d, drafting, KVCache.allocate(len(d.layers), 1, slots, d.kv_heads, d.head_dim, rt.dtype, dev),
                       1)
    feats = d.features(torch.empty(0), [r.aux[: p + n].to(dev, rt.dtype)])  # fc of the captured layer inputs

    def feed(start: int, count: int) -> None:  # pairs (x_{t+1}, f_t), t = start .. start + count - 1
        tok = torch.tensor([seq[start + 1: start + 1 + count]], device=dev)
        update_drafter(batch, Rows.of([0], [start], dev), tok, feats[None, start: start + count], [count])

    feed(0, p)  # the prefill: the prompt's pairs and the first output token (the target's choice)
    slot.length = p
    slot.take([seq[p]], str)
    slot.count(Accepted(0, [seq[p]], forwards=0), 1)
    while slot.going:
        assert batch.state is not None
        length = slot.length
        tree = drafting.draft(d, batch.cache, Rows.of([0], [length], dev), torch.tensor([seq[length]], device=dev),
                              batch.state, lambda _part: None)
        tokens, parents = tree.tokens[0].tolist(), tree.parent[0].tolist()
        kids: list[list[int]] = [[] for _ in tokens]
        for c, par in enumerate(parents[1:], start=1):
            kids[par].append(c)
        path = [0]
        # the greedy walk (engines/step.py walk): the target's token after the path's end is seq[length + len(path)]
        while length + len(path) < len(seq) and (child := greedy_node(seq[length + len(path)], kids[path[-1]],
                                                                       tokens)) is not None:
            path.append(child)
        new = [tokens[c] for c in path[1:]] + ([seq[length + len(path)]] if length + len(path) < len(seq) else [])
        kept = slot.take(new, str)
        slot.count(Accepted(0, new, forwards=1, drafted=tree.size - 1, accepted=len(path) - 1), len(kept))
        if slot.going:
            feed(length, len(path))
            slot.length += len(path)
    return slot


def lossless_check(rt: Runtime, requests: list[Replayable], max_new_tokens: int, eos: list[int]
                   ) -> tuple[bool, int]:
    """(candidate = target alone on every request, how many also reproduce the captured output): `requests` decoded
    on the reference engine with rt's head and without it, in batches of the engine's max_batch_size."""
    from engines.api import ReferenceEngine

    eng = ReferenceEngine(rt)
    b = eng.limits.max_batch_size
    reqs = [GenerationRequest(r.prompt_ids, min(max_new_tokens, len(r.output_ids)), SamplingParams(), eos)
            for r in requests]
    same, reproduced = True, 0
    for i in range(0, len(reqs), b):
        alone = eng.generate(reqs[i:i + b], speculative=False)
        spec = eng.generate(reqs[i:i + b], speculative=True)
        for r, a, s in zip(requests[i:i + b], alone, spec):
            same &= a.output_ids == s.output_ids
            reproduced += a.output_ids == r.output_ids[: len(a.output_ids)]
    return same, reproduced


def replay_stats(rt: Runtime, requests: list[Replayable], max_new_tokens: int, eos: list[int]) -> RequestStats:
    """The summed RequestStats of rt's head decoding `requests`, replayed (one at a time)."""
    from engines.api import aggregate_stats

    return aggregate_stats([replay_one(rt, r, max_new_tokens, eos).stats for r in requests])
