"""Full-depth oracles (tests/oracle.py): heads whose drafts are the target's greedy continuation, so every tree kind is
accepted to its deepest level. Each case asserts both lossless output and the EXACT per-request forwards and
acceptance by depth that the tree and the oracle's schedule imply: a tree-mask, position, KV-compaction or drafter
state bug at any depth changes the output or tau. Static, chain and dynamic trees, batches of different lengths,
in-flight joins, tp=2, EAGLE-1 and EAGLE-3, every family in `oracle.FAMILIES`."""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from engines.api import GenerationRequest, GenerationResult, ReferenceEngine, SamplingParams
from core.trees import DraftTree, DynamicTree, preset
from engines.drafting import DraftState, Lap, draft_static
from engines.drafting import DynamicDrafting, StaticDrafting
from engines.cache import KVCache, Rows
from engines.heads import Drafter
from engines.tree import StaticTree, TreeBatch
from tests import oracle
from testkit import tiny_models as tm

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[5, 17, 33, 101, 7], [9, 8, 7], [100, 200, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]]
NEW = [29, 17, 24]  # different lengths: sequences finish at different steps, cut inside an accepted path


def static(name: str) -> DraftTree:
    return DraftTree.from_choices(preset(name))


@pytest.fixture(scope="session")
def family_ckpts(tiny_dir: Path) -> dict[str, dict[str, Path]]:
    """family -> {"eagle": EAGLE-1 checkpoint, "eagle3": target checkpoint with the EAGLE-3 head in eagle3/}, built
    on first use (tiny models from the family's factory)."""
    return {}


def ckpt(family_ckpts: dict[str, dict[str, Path]], tiny_dir: Path, family: str, kind: str) -> Path:
    from builders.convert import convert_eagle3
    from tests.conftest import convert_eagle_ckpt

    got = family_ckpts.setdefault(family, {})
    if kind not in got:
        root = tiny_dir / f"oracle_{family}"
        target = root / "target"
        if not (target / "config.json").is_file():
            oracle.sharpen(oracle.FAMILIES[family](target, 7))
        if kind == "eagle":
            head = tm.make_eagle_head(root / "head1", target)
            got[kind] = convert_eagle_ckpt(target, head, root / "ckpt_eagle")
        else:
            # A 288-of-320 draft vocabulary: most greedy tokens can be drafted (deep acceptance), some cannot (d2t).
            head = tm.make_eagle3_head(root / "head3", target, draft_vocab=288)
            out = root / "ckpt_eagle3"
            convert_eagle3(target, head, out, dtype="float32", layers_to_capture=None)
            got[kind] = out
    return got[kind]


def load(path: Path, kind: str, tree: DraftTree | DynamicTree) -> ReferenceEngine:
    head = path / "eagle3" if kind == "eagle3" else None
    return ReferenceEngine.from_checkpoint(path, tree=tree, dtype="float32", device="cpu", eagle3_head_dir=head)


TREES: dict[str, DraftTree | DynamicTree] = {
    "chain-4": static("chain-4"),
    "trtllm-63": static("trtllm-default"),
    "eagle-25": static("eagle-default"),
    "dynamic-k3-d4-n12": DynamicTree(3, 4, 12),
}
MIX_TREES: dict[str, DraftTree | DynamicTree] = {**TREES, "dynamic-k1-d2-n2": DynamicTree(1, 2, 2)}


# EAGLE-1/2 heads run on Llama targets only (the engine flow's EagleForCausalLM subclasses LLaMAForCausalLM:
# builders/trtllm/architectures.py); EAGLE-3 on every family.
FAMILY_KINDS = [(f, k) for f in oracle.FAMILIES for k in ("eagle", "eagle3") if k == "eagle3" or f.startswith("llama")]


@pytest.mark.parametrize(("family", "kind"), FAMILY_KINDS)
@pytest.mark.parametrize("tree", list(TREES))
def test_oracle_reaches_full_depth_lossless_with_exact_tau(family_ckpts, tiny_dir, family, kind, tree) -> None:
    engine = load(ckpt(family_ckpts, tiny_dir, family, kind), kind, TREES[tree])
    reqs = oracle.requests(PROMPTS, NEW)
    engine = oracle.with_oracle(engine, reqs)
    res = engine.generate(reqs)
    oracle.check_exact(engine, reqs, res, f"{family} {kind} {tree}")
    depth = TREES[tree].depth
    deepest = sum(r.stats.acceptance_by_depth[depth - 1] for r in res)
    assert deepest >= (3 if kind == "eagle" else 1), f"the oracle never reached depth {depth}: {[r.stats for r in res]}"
    if kind == "eagle":  # every greedy token is draftable: each step but a cut last one accepts the whole depth
        for r in res:
            assert r.stats.target_forwards == -(-(len(r.output_ids) - 1) // (depth + 1))


@pytest.mark.parametrize(
    "tree,ranks",
    [
        ("trtllm-63", [0, 0, 1, 0, None, 2, 0, 3]),  # runner-up branches [1], [0, 1], [2, 0], ... are accepted
        ("eagle-25", [0, 1, 0, 2, 0, None]),
        ("chain-4", [0, 0, 1, None]),  # a chain accepts only rank 0
        ("dynamic-k3-d4-n12", [0, 0, 0, None]),  # EAGLE-2: a miss ends the chain, the scores keep it otherwise
        ("dynamic-k1-d2-n2", [0, None]),  # the smallest EAGLE-2 tree: one drafter run, a 1x1 visibility table
    ],
)
def test_oracle_mix_gives_exact_acceptance(family_ckpts, tiny_dir, tree, ranks) -> None:
    engine = load(ckpt(family_ckpts, tiny_dir, "llama", "eagle"), "eagle", MIX_TREES[tree])
    reqs = oracle.requests(PROMPTS, NEW)
    engine = oracle.with_oracle(engine, reqs, oracle.mixed(ranks))
    res = engine.generate(reqs)
    oracle.check_exact(engine, reqs, res, f"mix {ranks} on {tree}")
    agg = engine.aggregate(res)
    assert 0 < agg.accepted_draft_tokens < agg.target_forwards * MIX_TREES[tree].depth  # a mix: neither none nor all


def test_oracle_in_flight_joins_are_exact(family_ckpts, tiny_dir) -> None:
    """Requests joining a running batch (engines/session.py): a newcomer's prefill next to others' tree steps and a
    reused slot keep every request lossless with its exact acceptance."""
    engine = load(ckpt(family_ckpts, tiny_dir, "llama", "eagle"), "eagle", TREES["eagle-25"])
    reqs = oracle.requests(PROMPTS, NEW)
    engine = oracle.with_oracle(engine, reqs)
    session = engine.session(capacity=2, max_len=64)
    slot_of: dict[int, int] = {}  # request -> slot while running
    results: dict[int, GenerationResult] = {}
    joins = {0: 0, 1: 3, 2: 5}  # request -> step at which it joins (request 2 waits for a free slot)
    step = 0
    while len(results) < len(reqs):
        for k, at in joins.items():
            if at <= step and k not in slot_of and k not in results and session.free:
                slot_of[k] = session.add(reqs[k])
        session.step()
        step += 1
        for slot in session.finished:
            k = next(k for k, s in slot_of.items() if s == slot)
            results[k] = session.pop(slot)
            del slot_of[k]
    oracle.check_exact(engine, reqs, [results[i] for i in range(3)], "in-flight eagle-25")


def _tp_worker(rank: int, *, eagle: str, eagle3: str) -> dict[str, list[tuple]]:
    out = {}
    for name, path, kind, tree in (
        ("eagle", eagle, "eagle", TREES["trtllm-63"]),
        ("eagle3", eagle3, "eagle3", TREES["dynamic-k3-d4-n12"]),
    ):
        engine = load(Path(path), kind, tree)
        reqs = oracle.requests(PROMPTS, NEW)
        engine = oracle.with_oracle(engine, reqs)
        res = engine.generate(reqs)
        oracle.check_exact(engine, reqs, res, f"tp=2 rank {rank} {name}")
        out[name] = [(r.output_ids, r.stats.target_forwards, list(r.stats.acceptance_by_depth)) for r in res]
    return out


def test_oracle_tp2_exact(tiny_dir: Path) -> None:
    """Both ranks of a tp=2 checkpoint (two gloo processes) reach full depth with the exact tp=1 acceptance."""
    from builders.convert import convert_eagle3
    from engines.parallel import spawn
    from tests.conftest import convert_eagle_ckpt

    root = tiny_dir / "oracle_tp2"
    target = root / "target"
    if not (target / "config.json").is_file():
        oracle.sharpen(oracle.FAMILIES["llama"](target, 7))
    e1 = convert_eagle_ckpt(target, tm.make_eagle_head(root / "head1", target), root / "eagle", tp=2)
    e3 = root / "eagle3"
    if not (e3 / "config.json").is_file():
        convert_eagle3(target, tm.make_eagle3_head(root / "head3", target, draft_vocab=288), e3, dtype="float32", tp=2,
                       layers_to_capture=None)
    ranks = spawn(functools.partial(_tp_worker, eagle=str(e1), eagle3=str(e3)), world=2)
    assert ranks[0] == ranks[1]
    depth = TREES["trtllm-63"].depth
    assert all(by[depth - 1] > 0 for _, _, by in ranks[0]["eagle"])
    torch.set_num_threads(1)


def test_oracle_really_drafts_the_greedy_path(family_ckpts, tiny_dir) -> None:
    """The oracle is no no-op: with it the real head's tau (~1) becomes depth + 1, and the schedule's misses cost
    exactly what the simulation says (a wrong simulation would fail check_exact on one of the two)."""
    engine = load(ckpt(family_ckpts, tiny_dir, "llama", "eagle"), "eagle", TREES["chain-4"])
    reqs = [GenerationRequest([5, 17, 33, 101, 7], 41, SamplingParams(), [])]
    real = engine.generate(reqs)[0].stats
    top = oracle.with_oracle(engine, reqs)
    got = top.generate(reqs)[0].stats
    assert oracle.oracle_of(top).placed > 0
    assert got.target_forwards == 8 and got.accepted_draft_tokens == 32  # 1 + 8 x (4 + 1) = 41 tokens
    assert real.accepted_draft_tokens < 8
    miss = oracle.with_oracle(engine, reqs, lambda ctx: None)
    assert miss.generate(reqs)[0].stats.accepted_draft_tokens == 0


@dataclasses.dataclass(frozen=True)
class _Checked:
    """A drafting strategy that checks each draft of `inner` against a reference; it is `inner` in every other
    respect. `steps` records the size of each checked draft."""

    inner: Any
    steps: list[int]

    @property
    def tree(self) -> Any:
        return self.inner.tree

    @property
    def scratch_slots(self) -> int:
        return self.inner.scratch_slots

    def describe(self) -> str:
        return self.inner.describe()


@dataclasses.dataclass(frozen=True)
class StaticCheckedDynamic(_Checked):
    """EAGLE-2 drafting that re-drafts every step's tree as a STATIC tree of the same shape (each node = its
    parent and its rank among its siblings) from the same drafter state and requires the same tokens. A drafter bug
    costs only acceptance, never output, so lossless and oracle tests cannot see one in the dynamic drafter's scratch
    visibility, positions or parent features; the static drafter's (whose tensors tests/test_tree_tensors.py checks
    against an independent definition) is the reference here. Batch 1: a static tree is shared by the batch."""

    inner: DynamicDrafting

    def draft(self, drafter: Drafter, cache: KVCache, rows: Rows, root: torch.Tensor, state: DraftState,
              lap: Lap) -> TreeBatch:
        got = self.inner.draft(drafter, cache, rows, root, state, lap)
        assert got.tokens.shape[0] == 1
        paths: list[tuple[int, ...]] = [()]
        for i, p in enumerate(got.parent[0].tolist()[1:], start=1):
            assert p < i, f"node {i}'s parent {p} comes after it"
            paths.append((*paths[p], got.children(0)[p].index(i)))
        assert got.depth[0].tolist() == [len(p) for p in paths]
        static = StaticTree.build(DraftTree.from_choices([list(p) for p in paths[1:]]), root.device)
        ref = draft_static(drafter, cache, static, rows, root, state, lambda _: None)
        ref_token = dict(zip([(), *static_paths(static)], ref.tokens[0].tolist()))
        assert {p: ref_token[p] for p in paths} == dict(zip(paths, got.tokens[0].tolist()))
        self.steps.append(len(paths))
        return got


def static_paths(static: StaticTree) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = [()]
    for i in range(1, static.parent.shape[0]):
        out.append((*out[int(static.parent[i])], int(static.rank[i])))
    return out[1:]


@pytest.mark.parametrize("tree", [DynamicTree(3, 4, 12), DynamicTree(2, 3, 10), DynamicTree(4, 3, 9)])
def test_dynamic_drafts_the_tokens_of_the_static_tree_of_its_shape(
    family_ckpts: dict[str, dict[str, Path]], tiny_dir: Path, tree: DynamicTree
) -> None:
    engine = load(ckpt(family_ckpts, tiny_dir, "llama", "eagle"), "eagle", tree)
    rt = engine._rt
    assert isinstance(rt.drafting, DynamicDrafting)
    steps: list[int] = []
    checked = ReferenceEngine(dataclasses.replace(rt, drafting=StaticCheckedDynamic(rt.drafting, steps)))
    req = GenerationRequest([5, 17, 33, 101, 7], 12, SamplingParams(), [])
    assert checked.generate([req])[0].output_ids == engine.generate([req])[0].output_ids
    assert len(steps) >= 3 and set(steps) == {tree.total_draft_tokens + 1}


@dataclasses.dataclass(frozen=True)
class ChainCheckedStatic(_Checked):
    """Static drafting of a chain checked against the definition of drafting (engines/drafting.py): the depth-d node is
    fed to the drafter as (its token, its parent's drafter output) at position n + d - 1 into scratch slot d - 1,
    seeing the committed cache and its ancestors' slots. Here each node is fed alone, in that order, into a copy of
    the drafter cache: every node's keys and values (rotated by its position) and its child token must be the
    drafter's. A wrong drafting position costs acceptance only, so no output-level test can see it."""

    inner: StaticDrafting

    def draft(self, drafter: Drafter, cache: KVCache, rows: Rows, root: torch.Tensor, state: DraftState,
              lap: Lap) -> TreeBatch:
        ref = KVCache([k.clone() for k in cache.k], [v.clone() for v in cache.v])
        got = self.inner.draft(drafter, cache, rows, root, state, lap)
        b, depth = got.tokens.shape[0], got.tokens.shape[1] - 1
        assert got.parent[0].tolist()[1:] == list(range(depth)), "a chain: node d's parent is node d - 1"
        h = state.h
        for d in range(1, depth):  # the nodes with a child
            visible = torch.ones(b, 1, d, dtype=torch.bool)  # scratch slots 0 .. d-1: its ancestors and itself
            step = rows.step(rows.lens[:, None] + (d - 1), visible, start=d - 1)
            h = drafter.forward(got.tokens[:, d : d + 1], h[:, None], step, ref)[:, 0]
            child = drafter.to_target_ids(torch.topk(drafter.logits(h), 1, dim=-1).indices)[:, 0]
            assert got.tokens[:, d + 1].tolist() == child.tolist(), f"depth {d + 1}"
        slots = rows.lens[:, None] + torch.arange(depth - 1)
        for a, r in zip([*cache.k, *cache.v], [*ref.k, *ref.v]):
            torch.testing.assert_close(a[rows.idx[:, None], slots], r[rows.idx[:, None], slots])
        self.steps.append(b)
        return got


def test_static_drafting_feeds_each_node_at_its_position_after_the_committed_tokens(
    family_ckpts: dict[str, dict[str, Path]], tiny_dir: Path
) -> None:
    engine = load(ckpt(family_ckpts, tiny_dir, "llama", "eagle"), "eagle", TREES["chain-4"])
    rt = engine._rt
    assert isinstance(rt.drafting, StaticDrafting)
    steps: list[int] = []
    checked = ReferenceEngine(dataclasses.replace(rt, drafting=ChainCheckedStatic(rt.drafting, steps)))
    reqs = oracle.requests(PROMPTS[:2], [14, 9])  # two rows of different committed lengths
    assert [r.output_ids for r in checked.generate(reqs)] == [r.output_ids for r in engine.generate(reqs)]
    assert len(steps) >= 3 and 2 in steps
