"""Tree tensors (engines/tree.py, engines/drafting.py `_select`, engines/cache.py `make_step`) against independent
definitions written from the paths alone: node j is an ancestor-or-self of node i iff j's path is a prefix of i's;
a node's depth is its path length and its RoPE position is committed length + depth; the retrieval path of a node
is the indices of its path's prefixes; the drafter's scratch slots follow the expanded nodes level by level.

The trees: every preset shape plus seeded random prefix-closed trees (depths 1..7, ranks 0..4), batched parent
arrays in any topological order, and EAGLE-2 selections from random scores."""

from __future__ import annotations

import random

import pytest
import torch

from engines.drafting import _select
from engines.cache import make_step
from engines.tree import StaticTree, TreeBatch, ancestor_mask
from core.trees import DraftTree, DynamicTree, preset

Path = tuple[int, ...]


def random_tree(rng: random.Random) -> list[list[int]]:
    """A random prefix-closed tree: each node gets 0..4 children with consecutive or gapped ranks."""
    depth = rng.randint(1, 7)
    paths: list[Path] = []
    frontier: list[Path] = [()]
    for _ in range(depth):
        nxt = []
        for p in frontier:
            ranks = sorted(rng.sample(range(5), rng.randint(0 if p else 1, 3)))
            nxt += [p + (r,) for r in ranks]
        if not nxt:
            break
        paths += nxt
        frontier = rng.sample(nxt, min(len(nxt), 3))
    return [list(p) for p in paths]


TREES = {
    name: preset(name) for name in ("trtllm-default", "eagle-default", "chain-1", "chain-7", "topk-3-3", "topk-1-1")
}
TREES.update({f"random-{s}": random_tree(random.Random(s)) for s in range(12)})


def definition(choices: list[list[int]]) -> dict:
    """Everything about a static tree, from its paths only (no tensor code of the engine)."""
    paths: list[Path] = [()] + sorted((tuple(p) for p in choices), key=lambda p: (len(p), p))
    n = len(paths)
    depth = max(len(p) for p in paths)
    prefix = [[paths[i][: len(paths[j])] == paths[j] for j in range(n)] for i in range(n)]
    parents_of_any = {p[:-1] for p in paths[1:]}
    runs = [i for d in range(1, depth) for i, p in enumerate(paths) if len(p) == d and p in parents_of_any]
    return {
        "paths": paths,
        "parent": [0] + [paths.index(p[:-1]) for p in paths[1:]],
        "depth": [len(p) for p in paths],
        "rank": [0] + [p[-1] for p in paths[1:]],
        "anc": prefix,
        "levels": [[i for i, p in enumerate(paths) if len(p) == d] for d in range(depth + 1)],
        "expand": [[i for i, p in enumerate(paths) if len(p) == d and p in parents_of_any] for d in range(depth + 1)],
        "retrieve": [[paths.index(p[:k]) for k in range(len(p) + 1)] for p in paths],
        "runs": runs,
        "run_start": [0] + [sum(1 for i in runs if len(paths[i]) < d) for d in range(1, depth + 1)],
        "top_k": max(p[-1] for p in paths[1:]) + 1,
    }


@pytest.mark.parametrize("name", list(TREES))
def test_static_tree_tensors_match_the_paths(name: str) -> None:
    want = definition(TREES[name])
    t = StaticTree.build(DraftTree.from_choices(TREES[name]), torch.device("cpu"))
    assert t.parent.tolist() == want["parent"], "parent index of each node"
    assert t.depth.tolist() == want["depth"], "depth (= RoPE offset from the committed length) of each node"
    assert t.rank.tolist() == want["rank"], "top-k rank of each node among its siblings' candidates"
    assert t.anc.dtype == torch.bool and t.run_visible.dtype == torch.bool
    assert t.anc.tolist() == want["anc"], (
        "ancestor mask (engines/tree.py ancestor_mask): node i must see exactly the nodes whose paths prefix its own"
    )
    assert [lv.tolist() for lv in t.levels] == want["levels"] and t.max_depth == len(want["levels"]) - 1
    assert [e.tolist() for e in t.expand] == want["expand"], "nodes whose drafter output is needed, per depth"
    assert t.top_k == want["top_k"]
    runs = want["runs"]
    assert t.num_runs == len(runs)
    assert [t.run_slot[i].item() for i in runs] == list(range(len(runs)))
    assert [s for i, s in enumerate(t.run_slot.tolist()) if i not in runs] == [-1] * (len(want["paths"]) - len(runs)), (
        "only expanded non-root nodes get a slot (-1 = not run)"
    )
    assert t.run_start == want["run_start"], "first drafter scratch slot of each depth 0..D"
    assert t.run_visible.tolist() == [[want["anc"][a][b] for b in runs] for a in runs], (
        "a drafter scratch slot sees exactly its own and its ancestors' slots"
    )
    # Retrieval paths: following parents from any node yields its path's prefixes (root first).
    for i, chain in enumerate(want["retrieve"]):
        walk = [i]
        while walk[-1] != 0:
            walk.append(t.parent[walk[-1]].item())
        assert walk[::-1] == chain, f"retrieval path of node {i} {want['paths'][i]}"


def closure(parent: list[int]) -> list[list[bool]]:
    """Ancestor-or-self by walking parents in Python."""
    n = len(parent)
    out = [[False] * n for _ in range(n)]
    for i in range(n):
        j = i
        out[i][j] = True
        while j != 0:
            j = parent[j]
            out[i][j] = True
    return out


def random_parents(rng: random.Random, n: int, chain_bias: float) -> list[int]:
    """A random rooted tree on n nodes with every parent before its child (any topological order, not only by
    depth); `chain_bias` makes deep chains likely."""
    par = [0]
    for i in range(1, n):
        par.append(i - 1 if rng.random() < chain_bias else rng.randrange(i))
    return par


def depth_of(parent: list[int]) -> int:
    d = [0] * len(parent)
    for i in range(1, len(parent)):
        d[i] = d[parent[i]] + 1
    return max(d)


@pytest.mark.parametrize("seed", range(6))
def test_ancestor_mask_is_the_closure_of_parent_in_a_batch(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(2, 40)
    parents = [random_parents(rng, n, chain_bias=rng.choice([0.2, 0.9, 1.0])) for _ in range(3)]
    depth = max(depth_of(p) for p in parents)
    anc = ancestor_mask(torch.tensor(parents), depth)
    assert anc.dtype == torch.bool and anc.shape == (3, n, n), "a boolean (B, T, T) mask (attention masks with it)"
    for b, par in enumerate(parents):
        assert anc[b].tolist() == closure(par), (
            f"ancestor_mask(parent, max_depth={depth}) misses ancestors of sequence {b}: following parents max_depth "
            "times must reach the root from the deepest node"
        )


def test_ancestor_mask_of_a_deep_chain_sees_the_root_from_the_deepest_node() -> None:
    for n in (2, 3, 8, 65):
        parent = torch.tensor([[0] + list(range(n - 1))])
        anc = ancestor_mask(parent, n - 1)[0]
        assert anc.tolist() == [[j <= i for j in range(n)] for i in range(n)], (
            f"a chain of {n} nodes is lower-triangular"
        )


def test_tree_batch_children_are_in_rank_order() -> None:
    want = definition(preset("trtllm-default"))
    t = StaticTree.build(DraftTree.from_choices(preset("trtllm-default")), torch.device("cpu"))
    tb = TreeBatch(torch.zeros(2, len(want["paths"]), dtype=torch.long), t.parent.expand(2, -1), t.depth.expand(2, -1),
                   t.anc.expand(2, -1, -1))
    paths = want["paths"]
    for i, kids in enumerate(tb.children(1)):
        assert [paths[k] for k in kids] == sorted(
            p for p in paths if len(p) == len(paths[i]) + 1 and p[:-1] == paths[i]
        )


def _log_probs(g: torch.Generator, shape: tuple[int, ...], ties: bool) -> torch.Tensor:
    """Children's log-probs (<= 0). With ties: multiples of 0.5 including 0, a drafted token of probability 1 (a
    peaked head; float32 log_softmax gives exactly 0 once the runner-up is ~17 below), so siblings tie each other
    and a child ties its parent's cumulative score."""
    if ties:
        return -0.5 * torch.randint(0, 3, shape, generator=g).float()
    return -torch.rand(shape, generator=g) - 0.01


@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
@pytest.mark.parametrize("seed", range(4))
def test_dynamic_selection_keeps_the_best_scored_tree(seed: int, ties: bool) -> None:
    """EAGLE-2 `_select`: the kept nodes are the total_draft_tokens best candidates by score (ties: earlier first, so
    a parent is kept before a child of equal score), in generation order; parents, depths and the ancestor mask are
    those of the candidates' own parent links."""
    g = torch.Generator().manual_seed(seed)
    dyn = DynamicTree(3, 4, 14)
    k, b = dyn.top_k, 2
    # Candidates level by level as draft_dynamic makes them: k at depth 1, then k*k children of k frontier nodes.
    par, dep = [-1] * k, [1] * k
    score = [_log_probs(g, (b, k), ties).sort(descending=True).values]
    base = 0
    for level in range(1, dyn.depth):
        frontier = base + torch.randperm(k if level == 1 else k * k, generator=g)[:k]
        for f in frontier.tolist():
            par += [f] * k
        dep += [level + 1] * (k * k)
        parent_scores = torch.cat(score, 1)[:, frontier]
        score.append((parent_scores[:, :, None] + _log_probs(g, (b, k, k), ties)).reshape(b, k * k))
        base = len(dep) - k * k
    cand_score = torch.cat(score, 1)
    m = cand_score.shape[1]
    cand_tok = torch.randint(0, 300, (b, m), generator=g)
    root = torch.tensor([7, 9])
    tree = _select(dyn, root, cand_tok, cand_score, torch.tensor(par).expand(b, m), torch.tensor(dep))
    for s in range(b):
        order = sorted(range(m), key=lambda c: (-cand_score[s, c].item(), c))[: dyn.total_draft_tokens]
        kept = sorted(order)
        node = {c: i + 1 for i, c in enumerate(kept)}
        assert tree.tokens[s].tolist() == [root[s].item()] + [cand_tok[s, c].item() for c in kept]
        want_parent = [0] + [0 if par[c] < 0 else node[par[c]] for c in kept]
        assert tree.parent[s].tolist() == want_parent
        assert tree.depth[s].tolist() == [0] + [dep[c] for c in kept]
        assert tree.anc[s].tolist() == closure(want_parent)


@pytest.mark.parametrize("seed", range(5))
def test_step_mask_sees_committed_cache_and_visible_scratch_only(seed: int) -> None:
    """make_step: new token t of row b goes to slot lens[b] + start + t at the given position and sees every
    committed slot (< lens[b]) and the scratch slots lens[b] + r it is told to (always itself); nothing else."""
    rng = random.Random(seed)
    b, t = rng.randint(1, 4), rng.randint(1, 6)
    r = t + rng.randint(0, 5)
    start = rng.randint(0, r - t)
    lens = [rng.randint(0, 12) for _ in range(b)]
    visible = torch.rand(b, t, r, generator=torch.Generator().manual_seed(seed)) < 0.5
    visible[:, torch.arange(t), start + torch.arange(t)] = True  # every caller lets a new token see itself
    depth = torch.randint(0, 5, (b, t))
    positions = torch.tensor(lens)[:, None] + depth
    step = make_step(torch.arange(b), torch.tensor(lens), positions, visible, start=start)
    assert step.kv_len == max(lens) + r
    assert step.slots.tolist() == [[lens[i] + start + j for j in range(t)] for i in range(b)]
    assert step.positions.tolist() == positions.tolist()
    if step.mask is None:  # one row, one token, one scratch slot: it sees every slot < kv_len
        assert b == 1 and t == 1 and r == 1
        return
    want = [[[s < lens[i] or (lens[i] <= s < lens[i] + r and bool(visible[i, j, s - lens[i]]))
              for s in range(step.kv_len)] for j in range(t)] for i in range(b)]
    assert step.mask[:, 0].tolist() == want
