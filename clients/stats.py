"""Percentile maths and per-level aggregation of request records.

Definitions (the same ones genai-perf / perf_analyzer use for LLM runs, so figures are comparable):
  * TTFT: time from sending a request to receiving its first response.
  * end-to-end latency: time from sending to receiving the last response.
  * inter-token latency (ITL) of one request: (e2e - ttft) / (output_tokens - 1); defined only for streamed
    requests with at least 2 output tokens (a non-streamed request has one response, so no per-token timing).
  * percentiles: linear interpolation between closest ranks (numpy's default "linear" method): for sorted
    values x_0..x_{n-1}, the p-th percentile sits at rank r = p/100 * (n-1), value x_floor(r) + frac(r) * (x_ceil(r) -
    x_floor(r)).
  * acceptance rate: sum of accepted draft tokens / sum of draft tokens, over all requests that reported them
    (a token-weighted mean, not a mean of per-request ratios).
  * tau (mean accepted length = tokens per target forward after the prefill), the definition the engine, the build's
    baseline and the served metrics use (core/types.py `RequestStats.tau`, `eagle_llm_tau`): the prefill yields a
    request's first token; every later target forward yields one token of its own plus the draft tokens it
    accepted. So over requests, forwards = tokens - requests - accepted and tau = (tokens - requests) / forwards
    (`tau_of`). Counting the prefill as a step would give tokens / (tokens - accepted), a little lower (48 tokens
    with 15 accepted: 1.45 instead of 1.47). The clients count tokens by re-tokenizing the text, so a token cut by a
    stop word or merged differently moves their tau slightly against the server's.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float], p: float) -> float:
    """p-th percentile (0..100) by linear interpolation between closest ranks; values need not be sorted."""
    if not values:
        raise ValueError("percentile of an empty sequence is undefined")
    if not 0 <= p <= 100:
        raise ValueError(f"percentile p={p} is outside [0, 100]")
    xs = sorted(values)
    rank = p / 100 * (len(xs) - 1)
    lo = math.floor(rank)
    hi = math.ceil(rank)
    return xs[lo] + (rank - lo) * (xs[hi] - xs[lo])


@dataclass(frozen=True)
class Summary:
    """Mean and percentiles of one latency series (seconds), with its sample count."""

    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    min: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary | None:
        if not values:
            return None
        return cls(
            count=len(values),
            mean=sum(values) / len(values),
            p50=percentile(values, 50),
            p90=percentile(values, 90),
            p99=percentile(values, 99),
            min=min(values),
            max=max(values),
        )


@dataclass
class RequestRecord:
    """What one request produced; times are seconds on the client's monotonic clock."""

    index: int
    prompt_index: int
    start: float
    status: str  # "OK" or an error status (gRPC status code name, SERVER_ERROR, INTERRUPTED, ...)
    end: float | None = None
    first_response: float | None = None
    responses: int = 0
    output_tokens: int = 0
    streamed: bool = False
    accepted_draft_tokens: int | None = None
    draft_tokens: int | None = None
    error: str | None = None
    text: str | None = None  # the answer's text (a request that completed): compared across deployments

    @property
    def ok(self) -> bool:
        return self.status == "OK"

    @property
    def e2e(self) -> float | None:
        return None if self.end is None else self.end - self.start

    @property
    def ttft(self) -> float | None:
        return None if self.first_response is None else self.first_response - self.start

    @property
    def itl(self) -> float | None:
        if not (self.ok and self.streamed and self.output_tokens >= 2):
            return None
        assert self.end is not None and self.first_response is not None
        return (self.end - self.first_response) / (self.output_tokens - 1)


@dataclass
class LevelReport:
    """Aggregate of one load level (one concurrency or one request rate)."""

    mode: str  # "concurrency" or "rate"
    level: float
    requests_sent: int
    requests_ok: int
    errors: dict[str, int]
    duration_s: float
    request_throughput: float
    output_tokens: int
    output_tokens_per_s: float
    ttft_s: Summary | None
    itl_s: Summary | None
    e2e_s: Summary | None
    accepted_draft_tokens: int | None
    draft_tokens: int | None
    acceptance_rate: float | None
    tau: float | None
    interrupted: bool = False
    error_examples: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def speculative(records: Sequence[RequestRecord]) -> tuple[int | None, int | None, float | None, float | None]:
    """(accepted, drafted, acceptance rate, tau) over the OK requests that reported speculative stats."""
    with_stats = [r for r in records if r.ok and r.accepted_draft_tokens is not None and r.draft_tokens is not None]
    if not with_stats:
        return None, None, None, None
    accepted = sum(r.accepted_draft_tokens or 0 for r in with_stats)
    drafted = sum(r.draft_tokens or 0 for r in with_stats)
    tokens = sum(r.output_tokens for r in with_stats)
    rate = accepted / drafted if drafted > 0 else None
    return accepted, drafted, rate, tau_of(tokens, accepted, len(with_stats))


def tau_of(tokens: int, accepted: int, requests: int = 1) -> float | None:
    """Tokens per target forward after the prefill (the module docstring's definition); None without a forward."""
    forwards = tokens - requests - accepted
    return (tokens - requests) / forwards if forwards > 0 else None


def aggregate(
    records: Sequence[RequestRecord], *, mode: str, level: float, duration_s: float, interrupted: bool = False
) -> LevelReport:
    """Summarise one level. Throughputs divide by the level's wall time (first send to last completion)."""
    ok = [r for r in records if r.ok]
    errors = Counter(r.status for r in records if not r.ok)
    examples: dict[str, str] = {}
    for r in records:
        if not r.ok and r.status not in examples:
            examples[r.status] = (r.error or "")[:300]
    tokens = sum(r.output_tokens for r in ok)
    accepted, drafted, rate, tau = speculative(records)
    per_s = (lambda n: n / duration_s) if duration_s > 0 else (lambda n: 0.0)
    return LevelReport(
        mode=mode,
        level=level,
        requests_sent=len(records),
        requests_ok=len(ok),
        errors=dict(sorted(errors.items())),
        duration_s=duration_s,
        request_throughput=per_s(len(ok)),
        output_tokens=tokens,
        output_tokens_per_s=per_s(tokens),
        ttft_s=Summary.of([r.ttft for r in ok if r.ttft is not None]),
        itl_s=Summary.of([r.itl for r in ok if r.itl is not None]),
        e2e_s=Summary.of([r.e2e for r in ok if r.e2e is not None]),
        accepted_draft_tokens=accepted,
        draft_tokens=drafted,
        acceptance_rate=rate,
        tau=tau,
        interrupted=interrupted,
        error_examples=examples,
    )


CSV_COLUMNS = (
    "mode",
    "level",
    "requests_sent",
    "requests_ok",
    "errors",
    "duration_s",
    "request_throughput",
    "output_tokens",
    "output_tokens_per_s",
    *(f"{m}_{s}" for m in ("ttft_s", "itl_s", "e2e_s") for s in ("mean", "p50", "p90", "p99")),
    "acceptance_rate",
    "tau",
    "interrupted",
)


def csv_row(rep: LevelReport) -> dict[str, Any]:
    """One flat CSV row; errors as `STATUS=count;...`, missing latency series as empty cells."""
    row: dict[str, Any] = {k: getattr(rep, k) for k in CSV_COLUMNS if hasattr(rep, k) and k != "errors"}
    row["errors"] = ";".join(f"{k}={v}" for k, v in rep.errors.items())
    for m in ("ttft_s", "itl_s", "e2e_s"):
        summ: Summary | None = getattr(rep, m)
        for s in ("mean", "p50", "p90", "p99"):
            row[f"{m}_{s}"] = "" if summ is None else getattr(summ, s)
    for k in ("acceptance_rate", "tau"):
        row[k] = "" if row[k] is None else row[k]
    return row


def acceptance_by_level(reports: Sequence[LevelReport]) -> list[dict[str, Any]]:
    """Acceptance rate and tau per level, each also relative to the first level's (acceptance can fall as the batch
    grows on TensorRT-LLM: NVIDIA/TensorRT-LLM issue #9208); levels without speculative stats are left out."""
    rows = [r for r in reports if r.acceptance_rate is not None]
    first = rows[0].acceptance_rate if rows else None
    return [{"mode": r.mode, "level": r.level, "acceptance_rate": r.acceptance_rate, "tau": r.tau,
             "vs_first_level": (r.acceptance_rate / first) if first and r.acceptance_rate is not None else None}
            for r in rows]
