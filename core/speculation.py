"""Load-aware speculation, the rule (torch-free): how many draft levels a decoding step of B sequences uses.

The semantics are TensorRT-LLM's `speculative_config` fields (DecodingBaseConfig, tensorrt_llm/llmapi/llm_args.py;
cited per version in ledger/llmapi.py):
- `draft_len_schedule` {batch threshold: draft length}: a step of B sequences drafts the length of the smallest
  threshold >= B; above the largest threshold it drafts nothing (speculation off);
- `max_concurrency` N: full length up to N sequences, nothing above (upstream turns it into {N: max_draft_len});
- `acceptance_rate_window_size` W / `acceptance_rate_threshold` T: once the mean acceptance rate (accepted /
  drafted draft tokens of the whole batch) of the last W speculating steps drops below T, speculation stays off.

A draft length d < the tree's depth keeps the tree's first d levels (`truncate`). The reference engine applies the
rule step by step in engines/schedule.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import overload

from core.trees import DraftTree, DynamicTree


def draft_len_for(schedule: dict[int, int], batch: int) -> int:
    """The draft length of a step of `batch` sequences: the value of the smallest threshold >= batch, else 0."""
    for threshold in sorted(schedule):
        if batch <= threshold:
            return schedule[threshold]
    return 0


@overload
def truncate(tree: DraftTree, length: int) -> DraftTree: ...
@overload
def truncate(tree: DynamicTree, length: int) -> DynamicTree: ...
@overload
def truncate(tree: DraftTree | DynamicTree, length: int) -> DraftTree | DynamicTree: ...
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
    # Ours, beyond TensorRT-LLM: the acceptance switch per sequence (each sequence's own window and threshold)
    # instead of upstream's one switch for the whole batch.
    per_sequence_switch: bool = False

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
        if self.per_sequence_switch and not (self.acceptance_rate_window_size and t is not None):
            raise ValueError("per_sequence_switch needs acceptance_rate_window_size and acceptance_rate_threshold")

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

    def describe(self) -> str:
        """What the policy does, in a line (the demo prints it)."""
        parts = []
        if self.draft_len_schedule is not None:
            parts.append(f"draft length per batch size {self.draft_len_schedule} (tree.draft_len_schedule)")
        if self.max_concurrency is not None:
            n = self.max_concurrency
            parts.append(f"no speculation above {n} sequence{'s' if n > 1 else ''} (tree.max_concurrency: {n})")
        if self.acceptance_rate_window_size and self.acceptance_rate_threshold is not None:
            who = "each sequence on its own" if self.per_sequence_switch else "the whole batch"
            parts.append(f"speculation off for {who} once the acceptance rate over {self.acceptance_rate_window_size} "
                         f"steps is below {self.acceptance_rate_threshold}")
        return "; ".join(parts) or "the whole tree at every step"
