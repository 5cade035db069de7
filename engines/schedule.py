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

This module holds the whole rule; the session asks `SpeculationPolicy.step_fn` for each step's function.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from engines.drafting import Drafting, drafting_for
from engines.tree import TreeBatch
from engines.trees import DraftTree, DynamicTree

if TYPE_CHECKING:
    from engines.session import Session

StepFn = Callable[["Session", list[int]], None]


def draft_len_for(schedule: dict[int, int], batch: int) -> int:
    """The draft length of a step of `batch` sequences: the value of the smallest threshold >= batch, else 0."""
    for threshold in sorted(schedule):
        if batch <= threshold:
            return schedule[threshold]
    return 0


def truncate(tree: DraftTree | DynamicTree, length: int) -> DraftTree | DynamicTree:
    """The tree's first `length` levels (1 <= length <= depth)."""
    if not 1 <= length <= tree.depth:
        raise ValueError(f"draft length {length} must be in 1..{tree.depth} (the tree's depth)")
    if length == tree.depth:
        return tree
    if isinstance(tree, DraftTree):
        return DraftTree.from_choices([list(p) for p in tree.paths if len(p) <= length])
    return DynamicTree(tree.top_k, length, min(tree.total_draft_tokens, tree.top_k * length))


@dataclass(frozen=True)
class SpeculationPolicy:
    """What decides a step's draft length; all None / 0 = always the whole tree."""

    draft_len_schedule: dict[int, int] | None = None
    max_concurrency: int | None = None
    acceptance_rate_window_size: int = 0
    acceptance_rate_threshold: float | None = None

    def __post_init__(self) -> None:
        s = self.draft_len_schedule
        if s is not None and (not s or min(s) < 1 or min(s.values()) < 0):
            raise ValueError(f"draft_len_schedule={s}: thresholds must be >= 1 and lengths >= 0")
        if self.draft_len_schedule is not None and self.max_concurrency is not None:
            raise ValueError("max_concurrency and draft_len_schedule are mutually exclusive; give one")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency={self.max_concurrency} must be >= 1")
        t = self.acceptance_rate_threshold
        if self.acceptance_rate_window_size < 0 or (t is not None and not 0.0 <= t <= 1.0):
            raise ValueError("acceptance_rate_window_size must be >= 0 and acceptance_rate_threshold in [0, 1]")

    @property
    def is_static(self) -> bool:
        return (self.draft_len_schedule is None and self.max_concurrency is None
                and not (self.acceptance_rate_window_size and self.acceptance_rate_threshold is not None))

    def draft_len(self, batch: int, depth: int) -> int:
        """The length the schedule / max_concurrency give a step of `batch` sequences (capped at the tree depth)."""
        if self.draft_len_schedule is not None:
            return min(depth, draft_len_for(self.draft_len_schedule, batch))
        if self.max_concurrency is not None and batch > self.max_concurrency:
            return 0
        return depth


@dataclass
class PolicyState:
    """Per session: the drafting of each length used so far, the acceptance window, and the off switch."""

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


def root_only(s: Session, rows_idx: torch.Tensor) -> TreeBatch:
    """A draft of no tokens: the root alone (the target verifies nothing and chooses the next token)."""
    root = s.root[rows_idx][:, None]
    b, dev = root.shape[0], root.device
    zeros = torch.zeros(b, 1, dtype=torch.long, device=dev)
    return TreeBatch(root, zeros, zeros.clone(), torch.ones(b, 1, 1, dtype=torch.bool, device=dev))


def scheduled_step(s: Session, active: list[int]) -> None:
    """One speculative step whose draft length follows the policy for len(active) sequences."""
    from engines import decode

    st = s.policy_state
    assert st is not None
    length = st.length(len(active))
    before = [(s.stats[i].draft_tokens, s.stats[i].accepted_draft_tokens) for i in active]
    if length == 0:
        decode.speculative_step(s, active, make_draft=lambda rows: root_only(s, rows.idx))
    else:
        drafting = st.drafting(length)
        decode.speculative_step(s, active, make_draft=lambda rows: decode.draft(s, rows, drafting))
    drafted = sum(s.stats[i].draft_tokens - d for i, (d, _) in zip(active, before))
    accepted = sum(s.stats[i].accepted_draft_tokens - a for i, (_, a) in zip(active, before))
    st.drafted_by_batch[len(active)] = st.drafted_by_batch.get(len(active), 0) + drafted
    if length > 0:
        st.record(drafted, accepted)
