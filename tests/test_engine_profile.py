"""Reference engine, cycle profiler (measure/profile.py, measure/costs.py): the parts of every speculative cycle
are named after the loop's stages and add up to the cycle's wall time measured around it; the cost helpers count
what they say."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from core.laps import NO_LAPS, Laps
from core.trees import DraftTree, DynamicTree, preset
from engines.api import GenerationRequest, ReferenceEngine, SamplingParams
from engines.linear import layout_for
from measure.costs import Machine, bounds, forward_flops, forward_fns, interleaved_ms, profile_cycles, weight_bytes
from measure.profile import python_share

pytestmark = pytest.mark.usefixtures("one_thread")


def test_laps_charge_each_interval_to_one_part() -> None:
    ticks = iter([0.0, 1.0, 3.0, 6.0, 10.0, 20.0, 21.0])
    laps = Laps(clock=lambda: next(ticks))
    with pytest.raises(RuntimeError, match=r"Laps.lap\('a'\) before start\(\)"):
        laps.lap("a")
    laps.start()  # 0
    laps.lap("a")  # 1
    laps.lap("b")  # 3
    laps.lap("a")  # 6
    laps.start()  # 10: a second step
    laps.lap("b")  # 20
    assert laps.parts == {"a": 1.0 + 3.0, "b": 2.0 + 10.0} and laps.total == 16.0 and laps.steps == 2
    assert laps.per_step_ms() == {"a": 2000.0, "b": 6000.0}
    NO_LAPS.lap("never started")  # the disabled profiler accepts marks without a start and keeps nothing
    assert NO_LAPS.parts == {}


@pytest.mark.parametrize(
    "tree,levels",
    [(DraftTree.from_choices(preset("eagle-default")), ["draft 1", "draft 2", "draft 3", "draft 4", "draft 5"]),
     (DynamicTree(4, 3, 12), ["draft 1", "draft 2", "draft select"])],
    ids=["static-25", "dynamic"],
)
def test_cycle_parts_add_up_to_the_cycle(mimic_ckpt: Path, tree, levels: list[str]) -> None:
    engine = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=tree, dtype="float32", device="cpu")
    reqs = [GenerationRequest([5 + i, 17, 33, 101, 7], 40, SamplingParams(), []) for i in range(2)]
    expected = engine.generate(reqs)
    session = engine.session(capacity=2, max_len=64)
    prof = profile_cycles(session, reqs)
    assert list(prof.laps.parts) == levels + ["verify", "walk", "kv compaction", "output", "drafter update"]
    # One lap-set per speculative step, the same steps a plain generate takes; every generated token counted.
    agg = engine.aggregate(expected)
    assert prof.laps.steps == max(r.stats.target_forwards for r in expected)
    assert prof.tokens == agg.generated_tokens - len(reqs)
    assert [r.output_ids for r in prof.results] == [r.output_ids for r in expected]
    # The parts are contiguous (each lap is charged from the previous mark) and lie inside the steps' wall time as
    # measured around Session.step(). How much of it they cover is a figure (bench/bench_engine.py --profile), not
    # asserted: a loaded machine can pause between the call and the step's first mark.
    assert 0 < prof.laps.total <= prof.decode_s
    assert session.laps is NO_LAPS and session.done  # profiling leaves the session as it found it


def test_python_share_splits_wall_time() -> None:
    x = torch.randn(64, 64)
    wall, in_ops = python_share(lambda: [x @ x for _ in range(20)])
    assert 0 < in_ops <= wall


def test_forward_cost_and_bounds_count_weights_and_flops(target_ckpt: Path) -> None:
    engine = ReferenceEngine.from_checkpoint(target_ckpt, tree=None, dtype="float32", device="cpu")
    t = engine._rt.target
    layer_params = sum(
        lin.weight.numel()
        for layer in t.layers
        for lin in (layer.attn.qkv, layer.attn.dense, layer.mlp.fc_gate, layer.mlp.proj)
    )
    head = t.lm_head.linear.weight.numel()
    assert weight_bytes(t) == 4 * (layer_params + head)  # float32 layout
    assert forward_flops(t, 8) == 2 * 8 * layer_params + 2 * head
    b = bounds(t, 8, Machine(copy_bytes_per_s=1e9, read_bytes_per_s=2e9, gemm_flops=1e9))
    assert b.memory_copy_s == weight_bytes(t) / 1e9 and b.memory_read_s == weight_bytes(t) / 2e9
    assert b.roof_s == max(b.compute_s, b.memory_read_s)
    calls: list[int] = []
    fns = {k: (lambda k=k: calls.append(k)) for k in "ab"}
    assert set(interleaved_ms(fns, repeats=3)) == {"a", "b"} and calls == ["a", "b"] * 4  # warm-up round + 3
    ms = interleaved_ms(forward_fns(t, torch.float32, torch.device("cpu"), [1, 4], context=16), repeats=3)
    assert set(ms) == {1, 4} and all(v > 0 for v in ms.values())
    half = ReferenceEngine.from_checkpoint(target_ckpt, tree=None, dtype="bfloat16", device="cpu")
    # bf16 weights are read as float32 only in the float32-kernel layout (no native 16-bit matmul and no AVX2
    # kernel: engines/linear.py); natively and through the AVX2 kernel they are read as stored.
    upcast = layout_for(torch.device("cpu"), torch.bfloat16) == "float32 kernels"
    assert weight_bytes(half._rt.target) == (weight_bytes(t) if upcast else weight_bytes(t) // 2)


def test_eagle_speedup_compares_both_decodings_on_the_same_prompts(mimic_ckpt: Path, target_ckpt: Path) -> None:
    from measure.costs import eagle_speedup

    engine = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=DraftTree.from_choices(preset("chain-3")),
                                             dtype="float32", device="cpu")
    prompts = [[5 + i, 17, 33, 101, 7] for i in range(2)]
    s = eagle_speedup(engine, prompts, 24, [])
    spec = engine.generate([GenerationRequest(p, 24, SamplingParams(), []) for p in prompts])
    assert s.prompts == 2 and s.identical == 2  # greedy float32: EAGLE reproduces target-only decoding
    assert s.tau == pytest.approx(engine.aggregate(spec).tau) and s.tau > 1.2
    assert s.ratio == pytest.approx(s.eagle_tps / s.target_tps) and s.eagle_tps > 0 and s.target_tps > 0
    plain = ReferenceEngine.from_checkpoint(target_ckpt, tree=None, dtype="float32", device="cpu")
    with pytest.raises(ValueError, match="no EAGLE head"):
        eagle_speedup(plain, prompts, 4, [])


READ_BACKS = ("tolist", "item", "__int__", "__bool__", "__float__", "__index__")


def step_reading_back(session: Any) -> list[str]:
    """One session.step(), returning the device -> host read-backs it made (the torch.Tensor methods that copy a
    tensor to the host), in order."""
    reads: list[str] = []
    saved = {n: getattr(torch.Tensor, n) for n in READ_BACKS}

    def counting(name: str) -> Any:
        def read(self: torch.Tensor, *a: Any, **k: Any) -> Any:
            reads.append(name)
            return saved[name](self, *a, **k)

        return read

    for n in READ_BACKS:
        setattr(torch.Tensor, n, counting(n))
    try:
        session.step()
    finally:
        for n in READ_BACKS:
            setattr(torch.Tensor, n, saved[n])
    return reads


def test_a_speculative_step_reads_the_device_back_once_per_walk_level(mimic_ckpt: Path) -> None:
    """Host syncs on CUDA are device -> host read-backs (.tolist(), .item(), int(), bool(), float() of a tensor). A
    greedy speculative step with a static tree does two (the tree's tokens and parents) plus one per level the walk
    goes down (the argmax of every sequence still walking), however many sequences, drafter levels or forwards."""
    from engines import step

    engine = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=DraftTree.from_choices(preset("eagle-default")),
                                             dtype="float32", device="cpu")
    session = engine.session(capacity=2, max_len=80)
    for i in range(2):
        session.add(GenerationRequest([5 + i, 17, 33, 101, 7], 40, SamplingParams(), []))
    session.step()  # prefill
    levels: list[int] = []
    walk = step.walk

    def walk_levels(s, active, tree, hidden):
        walked = walk(s, active, tree, hidden)
        levels.append(max(len(path) for path, _ in walked))  # root .. deepest accepted node: one level per node
        return walked

    step.walk = walk_levels
    try:
        while not session.done:
            reads = step_reading_back(session)
            assert len(reads) == 2 + levels[-1], reads
    finally:
        step.walk = walk
    assert len(levels) > 5 and max(levels) > 1  # several steps, some accepting drafts


def test_a_target_only_step_reads_the_device_back_once(mimic_ckpt: Path) -> None:
    """engines/decode.py `target_step`: the next tokens of every greedy sequence of the batch come back to the host
    in ONE read-back (the argmax of all of them), however many sequences."""
    engine = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=None, dtype="float32", device="cpu")
    session = engine.session(capacity=3, max_len=48, speculative=False)
    for i in range(3):
        session.add(GenerationRequest([5 + i, 17, 33, 101, 7], 12 + 4 * i, SamplingParams(), []))
    session.step()  # prefill
    steps = 0
    while not session.done:
        reads = step_reading_back(session)
        assert reads == ["tolist"], reads
        steps += 1
    assert steps == 12 + 4 * 2 - 1  # the longest request's tokens after the prefill's


@pytest.mark.parametrize("tree", ["chain-3", "topk-2-3"])
def test_the_walk_gives_the_same_tokens_and_counts_with_the_lm_head_at_every_node_or_level_by_level(
        mimic_ckpt: Path, tree: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """engines/step.py `walk`: one lm_head product over every node (small trees) or one per level (large ones)
    is the same rule on the same logits: same tokens, same acceptance, in a batch of 3 with a sampled request."""
    from engines import step

    engine = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=DraftTree.from_choices(preset(tree)), dtype="float32",
                                             device="cpu")
    requests = [GenerationRequest([5 + i, 17, 33, 101, 7], 20, SamplingParams(), []) for i in range(2)]
    requests.append(GenerationRequest([9, 17, 3], 20, SamplingParams(temperature=0.8, seed=3), []))
    runs = []
    for rows in (0, 10**6):
        monkeypatch.setattr(step, "EAGER_LM_HEAD_ROWS", rows)
        runs.append(engine.generate(requests))
    lazy, eager = runs
    assert [r.output_ids for r in lazy] == [r.output_ids for r in eager]
    assert [r.stats.accepted_draft_tokens for r in lazy] == [r.stats.accepted_draft_tokens for r in eager]
    assert sum(r.stats.accepted_draft_tokens for r in lazy) > 0


@pytest.mark.parametrize(
    ("tree", "batch", "sizes"),
    [("chain-3", 1, {4}), ("chain-1", 2, {4, 2}), ("chain-3", 2, {8, 4}), ("topk-2-3", 1, {15})],
)
def test_the_walk_multiplies_the_lm_head_once_over_small_trees_and_once_per_level_over_large_ones(
        mimic_ckpt: Path, tree: str, batch: int, sizes: set[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """engines/step.py `walk`: when the batch's tree nodes (B * N rows) are at most EAGER_LM_HEAD_ROWS, ONE lm_head
    product covers every node, at the boundary too; above it, one product per level the walk reaches, over the
    sequences still walking. Chains of 2 and 4 nodes at batch 1 and 2, a 15-node tree: both sides of the boundary."""
    from engines import step
    from engines.slots import Slot
    from engines.tree import TreeBatch

    engine = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=DraftTree.from_choices(preset(tree)), dtype="float32",
                                             device="cpu")
    assert step.EAGER_LM_HEAD_ROWS == 4  # the sizes above sit on both sides of it
    target = engine._rt.target
    lm_head = target.lm_head
    products: list[tuple[int, ...]] = []
    walking: list[bool] = [False]

    def counting(h: torch.Tensor) -> torch.Tensor:
        if walking[0]:
            products.append(tuple(h.shape[:-1]))
        return lm_head(h)

    walk = step.walk
    steps: list[tuple[int, int, int, list[tuple[int, ...]]]] = []  # (B, N, deepest path, products)

    def watched(t: step.TargetBatch, slots: list[Slot], tree_batch: TreeBatch, hidden: torch.Tensor
                ) -> list[step.Walked]:
        products.clear()
        walking[0] = True
        try:
            walked = walk(t, slots, tree_batch, hidden)
        finally:
            walking[0] = False
        b, n = hidden.shape[:2]
        steps.append((b, n, max(len(w.path) for w in walked), list(products)))
        return walked

    monkeypatch.setattr(target, "lm_head", counting)
    monkeypatch.setattr(step, "walk", watched)
    reqs = [GenerationRequest([5 + i, 17, 33, 101, 7], 16 + 3 * i, SamplingParams(), []) for i in range(batch)]
    engine.generate(reqs)
    assert steps and any(deepest > 1 for _, _, deepest, _ in steps)  # some steps accept drafts
    for b, n, deepest, got in steps:
        if b * n <= step.EAGER_LM_HEAD_ROWS:
            assert got == [(b, n)], f"B={b} N={n}: one product over every node"
        else:
            assert len(got) == deepest and got[0] == (b,), f"B={b} N={n}: one product per level reached {got}"
    assert {b * n for b, n, _, _ in steps} == sizes  # B * N rows the steps had (B drops as sequences finish)
