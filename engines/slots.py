"""One sequence slot of a session: its request and everything kept for it on the host.

The steps (engines/step.py, engines/decode.py) read a slot's request, sampling generator and committed length, and
move the length when they commit cache entries; the session (engines/session.py) applies what a step accepted:
output, stop conditions, statistics. A slot's host state is small, so a failing step is undone by restoring a
`snapshot`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from core.types import FinishReason, GenerationRequest, GenerationResult, RequestStats


class Accepted(NamedTuple):
    """What one step accepted for one slot: the tokens (the accepted draft tokens, then the one the target chose)
    and how many draft tokens the step proposed and the target accepted (both 0 for a prefill or a target-only
    step); `forwards`: target forwards the step ran for the slot (0 for the prefill)."""

    slot: int
    tokens: list[int]
    forwards: int = 1
    drafted: int = 0
    accepted: int = 0


@dataclass
class Slot:
    """A request's sequence: committed cache length, output, finish reason, statistics, sampling generator."""

    index: int
    request: GenerationRequest
    gen: torch.Generator
    length: int = 0  # committed target cache entries; the step's slots and masks are built from it
    out: list[int] = field(default_factory=list)
    finish: FinishReason | None = None
    stats: RequestStats = field(default_factory=RequestStats)
    error: str | None = None
    # Drafter backlog: the (token, target feature) pairs of the steps this sequence took without drafting, in
    # position order, not yet fed to the drafter (its cache holds `length - len(behind)` entries); fed in one batched
    # pass when the sequence drafts again (engines/step.py catch_up).
    behind: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    # The per-sequence acceptance switch (engines/schedule.py): this sequence's recent acceptance rates, and whether
    # it stopped drafting for good.
    window: list[float] = field(default_factory=list)
    drafting_off: bool = False

    @property
    def going(self) -> bool:
        return self.finish is None

    def take(self, tokens: list[int], decode: Callable[[list[int]], str]) -> list[int]:
        """Append accepted tokens until a stop condition (eos, stop string, max_new_tokens); return those kept.
        `decode` turns token ids into text (the tokenizer's), for stop strings."""
        req, kept = self.request, []
        for tok in tokens:
            self.out.append(tok)
            kept.append(tok)
            if tok in req.stop_token_ids:
                self.finish = "eos"
            elif req.stop_strings and _hit_stop_string(self.out, req.stop_strings, decode):
                self.finish = "stop"
            elif len(self.out) >= req.max_new_tokens:
                self.finish = "length"
            if self.finish is not None:
                break
        self.stats.generated_tokens = len(self.out)
        return kept

    def count(self, step: Accepted, kept: int) -> None:
        """A step's statistics: target forwards, drafted and accepted draft tokens (those cut by a stop condition
        are not counted as accepted), acceptance by depth."""
        st = self.stats
        st.target_forwards += step.forwards
        st.draft_tokens += step.drafted
        accepted = min(step.accepted, kept)
        st.accepted_draft_tokens += accepted
        for d in range(accepted):
            st.acceptance_by_depth[d] += 1

    def fail(self, e: BaseException) -> None:
        self.finish, self.error = "error", f"{type(e).__name__}: {e}"

    def result(self) -> GenerationResult:
        assert self.finish is not None, f"slot {self.index} has not finished"
        return GenerationResult(self.out, self.finish, self.stats, self.error)

    # ---- undo -----------------------------------------------------------------------------------------------------
    def snapshot(self) -> tuple[Any, ...]:
        """What a step changes (a few scalars; the generator state only when the request samples)."""
        stats = dataclasses.replace(self.stats, acceptance_by_depth=list(self.stats.acceptance_by_depth))
        gen = None if self.request.sampling.greedy else self.gen.get_state()
        return (self.length, len(self.out), self.finish, self.error, stats, gen, list(self.behind), list(self.window),
                self.drafting_off)

    def restore(self, snap: tuple[Any, ...]) -> None:
        self.length, n_out, self.finish, self.error, self.stats, gen, self.behind, self.window, self.drafting_off = snap
        del self.out[n_out:]
        if gen is not None:
            self.gen.set_state(gen)


def _hit_stop_string(out: list[int], stops: list[str], decode: Callable[[list[int]], str]) -> bool:
    # Only the tail can contain a stop string that the previous token did not complete.
    tail = decode(out[-(max(len(s) for s in stops) + 8) :])
    return any(s in tail for s in stops)
