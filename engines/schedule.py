"""Load-aware speculation: how many draft levels a decoding step uses, from the live batch size and acceptance.

The semantics are TensorRT-LLM's `speculative_config` fields (DecodingBaseConfig, tensorrt_llm/llmapi/llm_args.py;
cited per version in builders/trtllm/ledger_llmapi.py), so the reference engine behaves like the server it mirrors:
- `draft_len_schedule` {batch threshold: draft length}: a step of B sequences drafts the length of the smallest
  threshold >= B; above the largest threshold it drafts nothing (speculation off);
- `max_concurrency` N: full length up to N sequences, nothing above (upstream turns it into {N: max_draft_len});
- `acceptance_rate_window_size` W / `acceptance_rate_threshold` T: once the mean acceptance rate (accepted /
  drafted draft tokens of the whole batch) of the last W speculating steps drops below T, speculation stays off.

A draft length d < the tree's depth keeps the tree's first d levels (for a chain: its first d nodes; for EAGLE-2
dynamic trees: depth d and at most top_k * d tokens). Length 0 verifies the root alone: one target forward that still
feeds the drafter, so the drafter's cache stays complete for the steps that speculate again. Every variant is a
verification of a draft by the target, so outputs are the target's whatever the schedule does.

The rule itself is core/speculation.py (torch-free); this module applies it per step (the session calls
`scheduled_step` when its runtime has a policy).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass, field

import torch

from core.speculation import SpeculationPolicy, draft_len_for, truncate
from core.trees import DraftTree, DynamicTree
from engines.decode import DraftBatch
from engines.draft import DraftState, Lap
from engines.drafting import Drafting, drafting_for
from engines.model import Drafter, KVCache, Rows
from engines.slots import Accepted
from engines.tree import TreeBatch

__all__ = ["PolicyState", "RootOnly", "SpeculationPolicy", "draft_len_for", "truncate"]


@dataclass(frozen=True)
class RootOnly:
    """Draft length 0: no draft token; the target verifies the root alone and chooses the next token, and the
    drafter is still fed (the session commits the step to it), so its cache stays complete."""

    tree: DraftTree | DynamicTree  # the engine's tree (what the drafter was built for)

    @property
    def scratch_slots(self) -> int:
        return 0

    def draft(self, drafter: Drafter, cache: KVCache, rows: Rows, root: torch.Tensor, state: DraftState,
              lap: Lap) -> TreeBatch:
        b, dev = root.shape[0], root.device
        zeros = torch.zeros(b, 1, dtype=torch.long, device=dev)
        return TreeBatch(root[:, None], zeros, zeros.clone(), torch.ones(b, 1, 1, dtype=torch.bool, device=dev))

    def describe(self) -> str:
        return "no draft (speculation off for this step)"


@dataclass
class PolicyState:
    """Per session: the drafting of each length used so far, the acceptance window, the off switch, and the draft
    tokens proposed per batch size (what a test or a benchmark reads)."""

    policy: SpeculationPolicy
    full: Drafting
    device: torch.device
    window: deque[float] = field(default_factory=deque)
    switched_off: bool = False
    by_length: dict[int, Drafting] = field(default_factory=dict)
    drafted_by_batch: dict[int, int] = field(default_factory=dict)  # batch size -> draft tokens proposed

    def drafting(self, length: int) -> Drafting:
        if length == self.full.tree.depth:
            return self.full
        if length not in self.by_length:
            self.by_length[length] = (RootOnly(self.full.tree) if length == 0
                                      else drafting_for(truncate(self.full.tree, length), self.device))
        return self.by_length[length]

    def length(self, batch: int) -> int:
        return 0 if self.switched_off else self.policy.draft_len(batch, self.full.tree.depth)

    def for_step(self, d: DraftBatch, batch: int) -> DraftBatch:
        """The drafter side of a step of `batch` sequences: `d` drafting the policy's length (same head, cache and
        state: only the drafting strategy differs)."""
        drafting = self.drafting(self.length(batch))
        return d if drafting is d.drafting else dataclasses.replace(d, drafting=drafting)

    def after_step(self, batch: int, accepted: list[Accepted]) -> None:
        drafted = sum(a.drafted for a in accepted)
        self.drafted_by_batch[batch] = self.drafted_by_batch.get(batch, 0) + drafted
        if drafted:
            self.record(drafted, sum(a.accepted for a in accepted))

    def record(self, drafted: int, accepted: int) -> None:
        """One speculating step's totals; the window switch (upstream: permanent once below the threshold)."""
        p = self.policy
        if not p.acceptance_rate_window_size or p.acceptance_rate_threshold is None or drafted == 0:
            return
        self.window.append(accepted / drafted)
        if len(self.window) > p.acceptance_rate_window_size:
            self.window.popleft()
        full = len(self.window) == p.acceptance_rate_window_size
        if full and sum(self.window) / len(self.window) < p.acceptance_rate_threshold:
            self.switched_off = True
