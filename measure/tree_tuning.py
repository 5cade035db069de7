"""Tree tuning: measure how often the rank-r draft at depth d is accepted, build the tree with the most expected
accepted tokens within a node budget, and compare expected with measured tau.

Measurement (public reference-engine API only): for each rank r < top_k, decode the prompts greedily with the
chain tree [[r], [r, r], ...] of depth D. Greedy speculative decoding is lossless, so every run produces the same
text; a step's accepted depth is the number of leading chain nodes equal to the target's continuation, and
`acceptance_by_depth[d-1]` counts the steps that reached depth d. Hence

    p[d][r] = P(rank-r draft at depth d accepted | its parent accepted) = reach_r(d) / reach_r(d-1),

with reach_r(0) = the number of steps (target forwards). We assume, as EAGLE-2 and Sequoia do, that this depends
on (depth, rank) only, not on the ranks above it. A (depth, rank) never reached has no evidence and gets p = 0:
the tuner never grows the tree where it has not observed acceptance.

Expected tau of a tree T: each depth accepts at most one node, so accepted tokens = number of accepted nodes and

    E[tau] = 1 + sum_{v in T} w(v),   w(v) = prod_{i=1..depth(v)} p[i][rank_i(v)]     (the 1 = the bonus token).

Optimal tree within N nodes: take the N largest w(v) over all paths (ties -> shorter, then lexicographic). Because
p <= 1, w(child) <= w(parent), so this top-N set always contains each node's parent (it is a valid, prefix-closed
tree); and no N-node set can have a larger sum than the N largest weights. So greedy is optimal for this objective.
For the chain of rank 0, E[tau] equals the measured tau exactly (the products telescope to reach(d)/steps).

Fastest tree (`--objective speed`). A cycle of tree T emits tau(T) tokens in step_ms(T); target-only decoding emits
one token per target_ms. So

    speedup(T) = E[tau(T)] * target_ms / step_ms(T).

step_ms grows with the tree (a wider verification forward, more draft levels) at a rate only the device can tell:
on a GPU a 15-token forward costs about a 1-token one, on a small CPU twice as much. The optimal N-node trees are
nested (each adds the next-heaviest path), so measuring step_ms once per size N = 1..budget and taking the best
speedup picks the fastest tree of at most `budget` nodes under this model.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

from core.trees import DraftTree


@dataclass
class AcceptanceTable:
    """reach[r][d] = steps whose accepted path reached depth d (d = 0: all steps) with the rank-r chain."""

    reach: list[list[int]]

    @property
    def top_k(self) -> int:
        return len(self.reach)

    @property
    def depth(self) -> int:
        return len(self.reach[0]) - 1

    def p(self, depth: int, rank: int) -> float:
        """P(rank `rank` at depth `depth` (1-based) accepted | parent accepted); 0 without evidence."""
        if rank >= self.top_k or depth > self.depth:
            return 0.0
        trials = self.reach[rank][depth - 1]
        return self.reach[rank][depth] / trials if trials else 0.0

    def weight(self, path: tuple[int, ...]) -> float:
        w = 1.0
        for d, r in enumerate(path, 1):
            w *= self.p(d, r)
        return w

    def expected_tau(self, tree: DraftTree) -> float:
        return 1.0 + sum(self.weight(p) for p in tree.paths)

    def to_json(self) -> dict[str, Any]:
        return {"reach": self.reach, "p": [[round(self.p(d, r), 4) for r in range(self.top_k)]
                                           for d in range(1, self.depth + 1)]}


def chain(rank: int, depth: int) -> DraftTree:
    return DraftTree.from_choices([[rank] * d for d in range(1, depth + 1)])


def optimal_tree(table: AcceptanceTable, budget: int) -> DraftTree:
    """The `budget` paths with the largest weights (see module doc for why this is optimal).

    Best-first search: a child's weight never exceeds its parent's, so popping the heaviest frontier node and
    pushing its children yields paths in non-increasing weight order."""
    if budget < 1:
        raise ValueError(f"--budget {budget}: need at least one node")
    frontier: list[tuple[float, int, tuple[int, ...]]] = []

    def push(path: tuple[int, ...]) -> None:
        if len(path) <= table.depth:
            heapq.heappush(frontier, (-table.weight(path), len(path), path))

    for r in range(table.top_k):
        push((r,))
    chosen: list[tuple[int, ...]] = []
    while frontier and len(chosen) < budget:
        _, _, path = heapq.heappop(frontier)
        chosen.append(path)
        for r in range(table.top_k):
            push(path + (r,))
    return DraftTree.from_choices([list(p) for p in chosen])


@dataclass(frozen=True)
class SizeCost:
    """An optimal tree, its expected tau and the measured wall ms of one decoding step with it."""

    tree: DraftTree
    expected_tau: float
    step_ms: float

    @property
    def nodes(self) -> int:
        return self.tree.size

    @property
    def depth(self) -> int:
        return self.tree.depth

    def speedup(self, target_ms: float) -> float:
        """Predicted tokens/s over target-only decoding's (module doc)."""
        return self.expected_tau * target_ms / self.step_ms


def nested_trees(table: AcceptanceTable, budget: int) -> list[DraftTree]:
    """The optimal tree of every size 1..budget (each the previous one plus the next-heaviest path); fewer when the
    table's ranks and depths hold fewer than `budget` paths."""
    out: list[DraftTree] = []
    for n in range(1, budget + 1):
        tree = optimal_tree(table, n)
        if tree.size < n:
            break
        out.append(tree)
    return out


def fastest(costs: list[SizeCost], target_ms: float) -> SizeCost:
    """The size with the largest predicted speedup; ties go to the smaller tree."""
    if not costs:
        raise ValueError("no tree sizes were measured")
    return max(costs, key=lambda c: (c.speedup(target_ms), -c.nodes))


def snippet_yaml(tree: DraftTree, comment: str) -> str:
    """A config snippet (the `tree:` section) with one flow-style path per line."""
    lines = [f"# {line}" for line in comment.splitlines()]
    lines.append("tree:")
    lines.append("  choices: [")
    lines += [f"    {list(p)}," for p in tree.paths]
    lines.append("  ]")
    return "\n".join(lines) + "\n"
