"""Drafting strategies: how a speculative step grows its draft tree, built once per engine from its tree.

A strategy owns everything that depends on the kind of tree: how many draft tokens a step proposes (`size`), how
deep it goes, how many drafter scratch slots one step needs after the committed cache, how many candidates per
node the drafter must offer, and `draft()` itself. The session and the decoding loop only talk to this interface.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from core.trees import DraftTree, DynamicTree, Tree
from engines.draft import DraftState, Lap, draft_dynamic, draft_static
from engines.cache import KVCache, Rows
from engines.heads import Drafter
from engines.tree import StaticTree, TreeBatch


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
