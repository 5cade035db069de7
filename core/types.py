"""The reference engine's value types: requests, sampling parameters, results and statistics.

They live in the torch-free core: the engine (and engines.api, which re-exports them), the serve-time models and the
build side all use them without importing torch or each other.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

FinishReason = Literal["eos", "stop", "length", "cancelled", "error"]


@dataclass
class SamplingParams:
    """How the next token is chosen from the target's distribution.

    temperature 0 = greedy (argmax). Otherwise logits / temperature, then top-k (0 = off), then top-p (1.0 = off),
    then a categorical draw. `seed` seeds this request's own random generator (None = nondeterministic).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raise ValueError for values no sampler can use (NaN or infinite temperature: probabilities of NaN). The one
        domain of the sampling parameters: the serve-time models translate their wire conventions into these values
        and report these messages (triton_repo/models/llm_io.py `sampling_from`)."""
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} must be a finite number >= 0 (0 = greedy)")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} must be >= 0 (0 = off)")
        if not 0.0 < self.top_p <= 1.0:  # also refuses NaN (every comparison with NaN is false)
            raise ValueError(f"top_p={self.top_p} must be in (0, 1] (1.0 = off)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class GenerationRequest:
    """One sequence to generate. Generation stops at the first of: a token in `stop_token_ids` (kept in the output,
    finish_reason "eos"), decoded output containing one of `stop_strings` (output ends with the token that completed
    it, finish_reason "stop"), `max_new_tokens` generated ("length")."""

    prompt_ids: list[int]
    max_new_tokens: int
    sampling: SamplingParams
    stop_token_ids: list[int]
    stop_strings: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError("GenerationRequest.prompt_ids is empty; give at least one token")
        if problem := new_tokens_problem(self.max_new_tokens):
            raise ValueError(problem)


@dataclass
class RequestStats:
    """Per-request counters.

    generated_tokens: tokens in output_ids (including the one sampled from the prefill).
    target_forwards: target forward passes AFTER the prefill (one per decoding step; each verifies one draft tree).
    accepted_draft_tokens: draft tokens that were accepted and kept in the output.
    draft_tokens: draft tokens proposed to the target (tree nodes, root excluded), summed over steps.
    acceptance_by_depth: [d] = number of steps whose accepted path reached depth d+1.

    tau (average acceptance length) = (accepted_draft_tokens + target_forwards) / target_forwards, i.e. tokens
    gained per target forward after the prefill: every step yields its accepted draft tokens plus one token sampled
    from the target (the bonus/correction token). Target-only decoding has tau = 1 exactly. Tokens cut by a stop
    condition are not counted.
    """

    generated_tokens: int = 0
    target_forwards: int = 0
    accepted_draft_tokens: int = 0
    draft_tokens: int = 0
    acceptance_by_depth: list[int] = field(default_factory=list)

    @property
    def tau(self) -> float:
        if self.target_forwards == 0:
            return 0.0
        return (self.accepted_draft_tokens + self.target_forwards) / self.target_forwards

    @property
    def acceptance_rate(self) -> float:
        """Accepted / proposed draft tokens (TRT-LLM's `acceptance_rate` perf metric)."""
        return self.accepted_draft_tokens / self.draft_tokens if self.draft_tokens else 0.0


@dataclass
class GenerationResult:
    """finish_reason "error": stepping this sequence raised `error` (type and message); it ended there, the other
    sequences of its batch went on (engines/session.py `Session.step`)."""

    output_ids: list[int]  # generated tokens only (the prompt is not repeated)
    finish_reason: FinishReason
    stats: RequestStats
    error: str | None = None


def aggregate_stats(stats: list[RequestStats]) -> RequestStats:
    """Sum of per-request counters; the aggregate tau is therefore forward-weighted (total tokens gained over total
    target forwards), not the mean of per-request taus."""
    total = RequestStats()
    depth = max((len(s.acceptance_by_depth) for s in stats), default=0)
    total.acceptance_by_depth = [0] * depth
    for s in stats:
        total.generated_tokens += s.generated_tokens
        total.target_forwards += s.target_forwards
        total.accepted_draft_tokens += s.accepted_draft_tokens
        total.draft_tokens += s.draft_tokens
        for d, n in enumerate(s.acceptance_by_depth):
            total.acceptance_by_depth[d] += n
    return total


def stats_dict(s: RequestStats) -> dict[str, Any]:
    """JSON-ready stats including the derived tau and acceptance rate."""
    return {
        "generated_tokens": s.generated_tokens,
        "target_forwards": s.target_forwards,
        "accepted_draft_tokens": s.accepted_draft_tokens,
        "draft_tokens": s.draft_tokens,
        "acceptance_by_depth": list(s.acceptance_by_depth),
        "tau": round(s.tau, 4),
        "acceptance_rate": round(s.acceptance_rate, 4),
    }


OnTokens = Callable[[int, list[int]], bool]


@dataclass(frozen=True)
class Limits:
    """The request limits a build fixed (engine.max_batch_size / max_input_len / max_seq_len, the build's
    reference.json); the serve-time Triton models check requests against the same object."""

    max_batch_size: int
    max_input_len: int
    max_seq_len: int

    def check(self, requests: list[GenerationRequest]) -> None:
        if len(requests) > self.max_batch_size:
            raise ValueError(f"{len(requests)} requests exceed the build's engine.max_batch_size={self.max_batch_size}")
        for i, r in enumerate(requests):
            self.check_request(i, r)

    def check_request(self, i: int, r: GenerationRequest) -> None:
        if problem := self.length_problem(len(r.prompt_ids), r.max_new_tokens):
            raise ValueError(f"request {i}: {problem}")

    def length_problem(self, prompt_tokens: int, new_tokens: int, name: str = "max_new_tokens") -> str | None:
        """The one check of a request's lengths against the build, with the one text every entry point reports (the
        engine, the serve-time models); `name` is what the caller calls the number of tokens to generate."""
        if problem := new_tokens_problem(new_tokens, name):
            return problem
        if prompt_tokens > self.max_input_len:
            return f"prompt of {prompt_tokens} tokens exceeds engine.max_input_len={self.max_input_len}; shorten it"
        if prompt_tokens + new_tokens > self.max_seq_len:
            return (f"prompt {prompt_tokens} + {name} {new_tokens} exceeds engine.max_seq_len={self.max_seq_len}; "
                    f"lower {name} to at most {self.max_seq_len - prompt_tokens}")
        return None


def new_tokens_problem(new_tokens: int, name: str = "max_new_tokens") -> str | None:
    return f"{name}={new_tokens} must be >= 1" if new_tokens < 1 else None
