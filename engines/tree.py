"""Draft-tree tensors: node order, parents, depths, ancestor masks.

Node 0 is the root (the last token already chosen, not yet in the cache); nodes 1..N are draft tokens sorted by
(depth, path) as TRT-LLM and EAGLE sort `eagle_choices` (core/trees.py), so a parent always precedes its
children and siblings appear in rank order. A node attends to the committed cache plus its ancestors and itself;
its RoPE position is (committed length + depth).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from core.trees import DraftTree


def ancestor_mask(parent: torch.Tensor, max_depth: int) -> torch.Tensor:
    """(B, T, T) bool: [b, i, j] = node j is node i or one of its ancestors. `parent[b, 0]` must be 0 (the root is
    its own parent); following parents `max_depth` times from any node reaches the root."""
    b, t = parent.shape
    anc = torch.eye(t, dtype=torch.bool, device=parent.device).expand(b, t, t).clone()
    cur = parent
    for _ in range(max_depth):
        anc.scatter_(2, cur[:, :, None], True)
        cur = torch.gather(parent, 1, cur)
    return anc


@dataclass
class TreeBatch:
    """The draft trees of one decoding step, one per sequence (shapes shared: T = draft tokens + 1)."""

    tokens: torch.Tensor  # (B, T) target token ids, [:, 0] = root
    parent: torch.Tensor  # (B, T) node index of the parent; parent[:, 0] = 0
    depth: torch.Tensor  # (B, T) 0 for the root
    anc: torch.Tensor  # (B, T, T) ancestor-or-self mask

    @property
    def size(self) -> int:
        return self.tokens.shape[1]

    def children(self, b: int) -> list[list[int]]:
        """Children of every node of sequence b, in index (= rank) order."""
        out: list[list[int]] = [[] for _ in range(self.size)]
        for i, p in enumerate(self.parent[b].tolist()[1:], start=1):
            out[p].append(i)
        return out


def root_only_rows(tree: TreeBatch, sub: list[int], roots: torch.Tensor) -> TreeBatch:
    """The trees of the rows `sub` in a batch of len(roots) rows whose other rows verify their root alone: their
    other nodes are their own parents (no walk reaches them) and see only themselves."""
    b, n = roots.shape[0], tree.size
    dev = roots.device
    idx = torch.tensor(sub, device=dev)
    tokens = torch.zeros(b, n, dtype=tree.tokens.dtype, device=dev)
    tokens[:, 0] = roots
    tokens[idx] = tree.tokens
    parent = torch.arange(n, device=dev).expand(b, n).clone()
    parent[:, 0] = 0
    parent[idx] = tree.parent
    depth = torch.zeros(b, n, dtype=tree.depth.dtype, device=dev)
    depth[idx] = tree.depth
    anc = torch.eye(n, dtype=torch.bool, device=dev).expand(b, n, n).clone()
    anc[idx] = tree.anc
    return TreeBatch(tokens, parent, depth, anc)


@dataclass(frozen=True)
class StaticTree:
    """Tensors of a `core.trees.DraftTree`, computed once per engine."""

    parent: torch.Tensor  # (T,)
    depth: torch.Tensor  # (T,)
    rank: torch.Tensor  # (T,) top-k rank of each node among its parent's candidates (root: 0)
    anc: torch.Tensor  # (T, T)
    levels: list[torch.Tensor]  # levels[d] = node indices at depth d (d = 0..D)
    expand: list[torch.Tensor]  # expand[d] = nodes at depth d that have children (whose drafter output is needed)
    run_slot: torch.Tensor  # (T,) scratch slot of each expanded node in the drafter's cache (-1 = not run)
    run_start: list[int]  # run_start[d] = first scratch slot of depth d's expanded nodes (consecutive slots)
    run_visible: torch.Tensor  # (R, R) scratch slot a may see scratch slot b (b is a or an ancestor of a)
    top_k: int  # candidates needed per expanded node

    @property
    def max_depth(self) -> int:
        return len(self.levels) - 1

    @classmethod
    def build(cls, tree: DraftTree, device: torch.device) -> StaticTree:
        paths: list[tuple[int, ...]] = [(), *tree.paths]
        index = {p: i for i, p in enumerate(paths)}
        parent = torch.tensor([0] + [index[p[:-1]] for p in paths[1:]], device=device)
        depth = torch.tensor([len(p) for p in paths], device=device)
        rank = torch.tensor([0] + [p[-1] for p in paths[1:]], device=device)
        has_children = {p[:-1] for p in paths[1:]}
        levels, expand = [], []
        for d in range(tree.depth + 1):
            levels.append(torch.tensor([i for i, p in enumerate(paths) if len(p) == d], device=device))
            expand.append(
                torch.tensor([i for i, p in enumerate(paths) if len(p) == d and p in has_children], device=device)
            )
        run_slot = torch.full((len(paths),), -1, device=device)
        runs = [i for d in range(1, tree.depth) for i in expand[d].tolist()]
        run_start = [0] + [sum(expand[e].numel() for e in range(1, d)) for d in range(1, tree.depth + 1)]
        run_slot[torch.tensor(runs, dtype=torch.long, device=device)] = torch.arange(len(runs), device=device)
        anc = ancestor_mask(parent[None], tree.depth)[0]
        run_nodes = torch.tensor(runs, dtype=torch.long, device=device)
        run_visible = anc[run_nodes][:, run_nodes]
        return cls(parent, depth, rank, anc, levels, expand, run_slot, run_start, run_visible, tree.max_top_k)

    @property
    def num_runs(self) -> int:
        """Drafter scratch slots needed (expanded non-root nodes)."""
        return self.run_visible.shape[0]
