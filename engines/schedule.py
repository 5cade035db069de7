"""Load-aware speculation: how many draft levels a decoding step uses, from the live batch size and acceptance.

The semantics are TensorRT-LLM's `speculative_config` fields (DecodingBaseConfig, tensorrt_llm/llmapi/llm_args.py;
cited per version in ledger/llmapi.py), so the reference engine behaves like the server it mirrors:
- `draft_len_schedule` {batch threshold: draft length}: a step of B sequences drafts the length of the smallest
  threshold >= B; above the largest threshold it drafts nothing (speculation off);
- `max_concurrency` N: full length up to N sequences, nothing above (upstream turns it into {N: max_draft_len});
- `acceptance_rate_window_size` W / `acceptance_rate_threshold` T: once the mean acceptance rate (accepted /
  drafted draft tokens of the whole batch) of the last W speculating steps drops below T, speculation stays off.

A draft length d < the tree's depth keeps the tree's first d levels (for a chain: its first d nodes; for EAGLE-2
dynamic trees: depth d and at most top_k * d tokens). Length 0 is a plain target step: no drafter forward, no tree;
each sequence keeps the drafter's input of that step (token, target feature) in a backlog that one batched drafter
pass feeds when it drafts again (engines/step.py catch_up), so the drafter's cache is then complete; a request
that joins a batch which will not draft keeps its prompt's pairs in that backlog too (no drafter pass at prefill).
Every variant is the target's choice (verification of a draft, or a target step), so outputs are the target's
whatever the schedule does.

Beyond upstream (ours): with `SpeculationPolicy.per_sequence_switch`, the acceptance window and threshold apply to
each sequence on its own: a sequence whose own recent acceptance is low stops drafting (its row verifies its root
alone in the batch's forward) while the others keep drafting.

The rule itself is core/speculation.py (torch-free); this module applies it per step (the session calls
`scheduled_step` when its runtime has a policy).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass, field

import torch

from core.speculation import SpeculationPolicy, draft_len_for, truncate
from engines.drafting import Drafting, drafting_for
from engines.slots import Accepted, Slot
from engines.step import DraftBatch

__all__ = ["PolicyState", "SpeculationPolicy", "draft_len_for", "truncate"]


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
            self.by_length[length] = drafting_for(truncate(self.full.tree, length), self.device)
        return self.by_length[length]

    def length(self, batch: int) -> int:
        return 0 if self.switched_off else self.policy.draft_len(batch, self.full.tree.depth)

    def for_step(self, d: DraftBatch, batch: int) -> DraftBatch:
        """The drafter side of a drafting step of `batch` sequences: `d` drafting the policy's length (>= 1; same
        head, cache and state: only the drafting strategy differs)."""
        length = self.length(batch)
        if length == 0:
            raise ValueError(f"no draft at batch {batch}: the step is a plain target step (Session._plain_step)")
        drafting = self.drafting(length)
        return d if drafting is d.drafting else dataclasses.replace(d, drafting=drafting)

    def drafting_now(self, slots: list[Slot]) -> list[bool]:
        """Per sequence of a step, whether it drafts: the batch's length is > 0 and (per-sequence switch) its own
        switch is on."""
        if self.length(len(slots)) == 0:
            return [False] * len(slots)
        return [not s.drafting_off for s in slots]

    def after_step(self, batch: int, accepted: list[Accepted], slots: list[Slot]) -> None:
        drafted = sum(a.drafted for a in accepted)
        self.drafted_by_batch[batch] = self.drafted_by_batch.get(batch, 0) + drafted
        if self.policy.per_sequence_switch:
            for s, a in zip(slots, accepted):
                if a.drafted:
                    self.record_sequence(s, a.drafted, a.accepted)
        elif drafted:
            self.record(drafted, sum(a.accepted for a in accepted))

    def record_sequence(self, s: Slot, drafted: int, accepted: int) -> None:
        """One sequence's speculating step; its own switch (permanent for the sequence once below the threshold)."""
        p = self.policy
        if not p.acceptance_rate_window_size or p.acceptance_rate_threshold is None:
            return
        s.window.append(accepted / drafted)
        del s.window[: -p.acceptance_rate_window_size]
        if len(s.window) == p.acceptance_rate_window_size and sum(s.window) / len(s.window) < (
                p.acceptance_rate_threshold):
            s.drafting_off = True

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
