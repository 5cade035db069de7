"""Drafting: how a speculative step grows its draft tree (engines/step.py calls `Drafting.draft`), built once per
engine from its tree.

A strategy owns everything that depends on the kind of tree: how many draft tokens a step proposes (`size`), how
deep it goes, how many drafter scratch slots one step needs after the committed cache, how many candidates per
node the drafter must offer, and `draft()` itself. The session and the step only talk to this interface.

State per sequence: `h`, the drafter's output for the last committed pair (x_n, f_{n-1}), and `logits` = its
next-token logits; the root of the tree is x_n (already chosen, not yet verified into the caches). A depth-d
node is fed to the drafter as the pair (its token, its parent's drafter output) at position n + d - 1; its output
gives its children. Drafted nodes' K/V live in scratch slots after the committed cache and are discarded after the
step (the accepted tokens are re-fed with the TARGET's features when committing, as in EAGLE).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from core.trees import DraftTree, DynamicTree, Tree
from engines.cache import KVCache, Rows
from engines.heads import Drafter
from engines.tree import StaticTree, TreeBatch, ancestor_mask

Lap = Callable[[str], None]  # measure/profile.py Laps.lap: charges the time since the last mark to a part


@dataclass
class DraftState:
    h: torch.Tensor  # (B, H) drafter output at the last committed pair
    logits: torch.Tensor  # (B, V_draft) float32 next-token logits from h


def _run(
    drafter: Drafter, cache: KVCache, rows: Rows, tokens: torch.Tensor, feats: torch.Tensor, start: int, depth: int,
    visible: torch.Tensor,
) -> torch.Tensor:
    """Drafter forward of nodes at `depth` written to scratch slots start, start + 1, ... (position n + depth - 1)."""
    positions = (rows.lens[:, None] + (depth - 1)).expand(tokens.shape)
    return drafter.forward(tokens, feats, rows.step(positions, visible, start), cache)


def _topk_ids(drafter: Drafter, logits: torch.Tensor, k: int) -> torch.Tensor:
    return drafter.to_target_ids(torch.topk(logits, k, dim=-1).indices)


def draft_static(
    drafter: Drafter, cache: KVCache, tree: StaticTree, rows: Rows, root: torch.Tensor, state: DraftState, lap: Lap,
) -> TreeBatch:
    """Fill a fixed tree: node (parent, rank r) gets the r-th most likely token of the drafter at its parent.
    One drafter forward and one lm_head product per level, over all of the level's expanded nodes (`lap` marks
    the end of each level: "draft d" = filling depth d and the drafter forward of its nodes)."""
    b, t, k = root.shape[0], tree.parent.shape[0], tree.top_k
    tokens = torch.zeros(b, t, dtype=torch.long, device=root.device)
    tokens[:, 0] = root
    cand = torch.zeros(b, t, k, dtype=torch.long, device=root.device)  # top-k children of each expanded node
    cand[:, 0] = _topk_ids(drafter, state.logits, k)
    h_of = state.h.new_zeros(b, t, state.h.shape[-1])
    h_of[:, 0] = state.h
    for d in range(1, tree.max_depth + 1):
        nodes = tree.levels[d]
        tokens[:, nodes] = cand[:, tree.parent[nodes], tree.rank[nodes]]
        ex = tree.expand[d]
        if d < tree.max_depth and ex.numel() > 0:
            start = tree.run_start[d]
            visible = tree.run_visible[start : start + ex.numel()].expand(b, -1, -1)
            h = _run(drafter, cache, rows, tokens[:, ex], h_of[:, tree.parent[ex]], start, d, visible)
            h_of[:, ex] = h
            cand[:, ex] = _topk_ids(drafter, drafter.logits(h), k)
        lap(f"draft {d}")
    expand = (b, t)
    return TreeBatch(tokens, tree.parent.expand(expand), tree.depth.expand(expand), tree.anc.expand(b, t, t))


def draft_dynamic(
    drafter: Drafter, cache: KVCache, dyn: DynamicTree, rows: Rows, root: torch.Tensor, state: DraftState, lap: Lap,
) -> TreeBatch:
    """EAGLE-2 (eagle/model/cnets1.py `topK_genrate`): expand the top_k frontier by top_k children each, score =
    cumulative log-prob, keep the global top_k as the next frontier; after `depth` levels keep the
    `total_draft_tokens` best-scored candidates. A child scores <= its parent and comes later, so a stable sort
    by score keeps every kept node's parent: the kept set is a tree."""
    k, b, dev = dyn.top_k, root.shape[0], root.device
    score, ids = torch.log_softmax(state.logits, -1).topk(k, dim=-1)  # level 1: (B, k)
    tok = [drafter.to_target_ids(ids)]
    scores = [score]
    parents = [torch.full((b, k), -1, device=dev)]  # candidate index of the parent (-1 = root)
    depths = [torch.ones(k, dtype=torch.long, device=dev)]
    frontier = torch.arange(k, device=dev).expand(b, k)  # candidate indices
    f_score, f_feat, f_run_parent = score, state.h[:, None].expand(b, k, -1), torch.full((b, k), -1, device=dev)
    runs = dyn.drafter_runs
    visible = torch.zeros(b, max(runs, 1), max(runs, 1), dtype=torch.bool, device=dev)
    base = k
    all_tok = tok[0]
    for level in range(1, dyn.depth):
        slots = torch.arange((level - 1) * k, level * k, device=dev)
        # A frontier node sees its parent's visible slots plus itself.
        inherited = torch.gather(visible, 1, f_run_parent.clamp(min=0)[:, :, None].expand(b, k, visible.shape[2]))
        inherited = inherited & (f_run_parent >= 0)[:, :, None]
        inherited[:, torch.arange(k), slots] = True
        visible[:, slots] = inherited
        h = _run(
            drafter, cache, rows, torch.gather(all_tok, 1, frontier), f_feat, (level - 1) * k, level, visible[:, slots]
        )
        s2, ids2 = torch.log_softmax(drafter.logits(h), -1).topk(k, dim=-1)  # (B, k, k)
        cum = (f_score[:, :, None] + s2).reshape(b, k * k)
        tok.append(drafter.to_target_ids(ids2).reshape(b, k * k))
        scores.append(cum)
        parents.append(frontier[:, :, None].expand(b, k, k).reshape(b, k * k))
        depths.append(torch.full((k * k,), level + 1, dtype=torch.long, device=dev))
        all_tok = torch.cat(tok, 1)
        f_score, top = cum.topk(k, dim=-1)
        frontier = base + top
        f_feat = torch.gather(h, 1, (top // k)[:, :, None].expand(b, k, h.shape[-1]))
        f_run_parent = slots[top // k]
        base += k * k
        lap(f"draft {level}")
    tree = _select(dyn, root, all_tok, torch.cat(scores, 1), torch.cat(parents, 1), torch.cat(depths))
    lap("draft select")
    return tree


def _select(
    dyn: DynamicTree, root: torch.Tensor, cand_tok: torch.Tensor, cand_score: torch.Tensor, cand_parent: torch.Tensor,
    cand_depth: torch.Tensor,
) -> TreeBatch:
    b, m = cand_tok.shape
    n = dyn.total_draft_tokens
    order = torch.sort(cand_score, dim=1, descending=True, stable=True).indices[:, :n]
    sel = torch.sort(order, dim=1).values  # keep candidate (= generation) order: parents first
    node_of = torch.full((b, m), -1, dtype=torch.long, device=root.device)
    node_of.scatter_(1, sel, torch.arange(1, n + 1, device=root.device).expand(b, n))
    par_cand = torch.gather(cand_parent, 1, sel)
    par_node = torch.where(par_cand >= 0, torch.gather(node_of, 1, par_cand.clamp(min=0)), 0)
    if bool((par_node < 0).any()):
        raise RuntimeError("EAGLE-2 selection kept a node without its parent (non-monotone scores); this is a bug")
    zero = torch.zeros(b, 1, dtype=torch.long, device=root.device)
    parent = torch.cat([zero, par_node], 1)
    tokens = torch.cat([root[:, None], torch.gather(cand_tok, 1, sel)], 1)
    depth = torch.cat([zero, cand_depth[sel]], 1)
    return TreeBatch(tokens, parent, depth, ancestor_mask(parent, dyn.depth))


# ---- the strategies ----------------------------------------------------------------------------------------------
class Drafting(Protocol):
    @property
    def tree(self) -> Tree: ...

    @property
    def scratch_slots(self) -> int:
        """Drafter cache slots one step uses after the committed ones (discarded after the step)."""
        ...

    def draft(
        self, drafter: Drafter, cache: KVCache, rows: Rows, root: torch.Tensor, state: DraftState, lap: Lap
    ) -> TreeBatch: ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class StaticDrafting:
    """A fixed tree (`eagle_choices`): its index tensors are computed once, here."""

    tree: DraftTree
    tensors: StaticTree

    @property
    def scratch_slots(self) -> int:
        return self.tensors.num_runs

    def draft(
        self, drafter: Drafter, cache: KVCache, rows: Rows, root: torch.Tensor, state: DraftState, lap: Lap
    ) -> TreeBatch:
        return draft_static(drafter, cache, self.tensors, rows, root, state, lap)

    def describe(self) -> str:
        return f"static tree, {self.tree.size} draft tokens, depth {self.tree.depth}"


@dataclass(frozen=True)
class DynamicDrafting:
    """EAGLE-2: the tree is chosen per step by the drafter's scores."""

    tree: DynamicTree

    @property
    def scratch_slots(self) -> int:
        return self.tree.drafter_runs

    def draft(
        self, drafter: Drafter, cache: KVCache, rows: Rows, root: torch.Tensor, state: DraftState, lap: Lap
    ) -> TreeBatch:
        return draft_dynamic(drafter, cache, self.tree, rows, root, state, lap)

    def describe(self) -> str:
        return f"dynamic top_k={self.tree.top_k} tree, {self.tree.size} draft tokens, depth {self.tree.depth}"


def drafting_for(tree: Tree, device: torch.device) -> Drafting:
    """The strategy of a tree: the one place that tells the kinds apart."""
    if isinstance(tree, DraftTree):
        return StaticDrafting(tree, StaticTree.build(tree, device))
    return DynamicDrafting(tree)
