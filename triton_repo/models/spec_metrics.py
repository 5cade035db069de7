"""Speculative-decoding metrics on Triton's Prometheus endpoint, for every python LLM model we render.

The families are registered through the python backend's `pb_utils.MetricFamily` (python backend r24.10
src/metric_family.cc, exposed as `triton_python_backend_utils.MetricFamily`), so they appear on the server's
`/metrics` next to Triton's own `nv_inference_*` families. Every sample carries `model` (the Triton model name) and
`backend` (`reference` = this project's engine, `pytorch` = TensorRT-LLM's LLM API) and `version` (the Triton model
version: a head published by adaptive/refresh.py is a new version); the per-position families add `position`
(1-based draft depth). Names follow Prometheus' conventions: counters end in `_total`, ratios in
`_ratio`, and no family repeats another's label in its name. docs/production-metrics.md documents each one.

Per-position acceptance, from the engine's per-request `acceptance_by_depth` (steps whose accepted path reached
depth d): a draft at position p is *attempted* in a step when positions 1..p-1 were all accepted (every step
attempts position 1), and *accepted* when the accepted path reaches p. So

    attempts[1] = target forwards,  attempts[p] = accepted[p-1],  accepted[p] = acceptance_by_depth[p-1]

and the conditional acceptance of position p over any interval is rate(accepted[p]) / rate(attempts[p]). The
accepted counts summed over positions equal the accepted draft tokens (a path of length L counts once at each
depth 1..L); tau over an interval = 1 + rate(accepted draft tokens) / rate(target forwards).

Python models import only `engines` and this package (import-linter); pb_utils is handed in, so the arithmetic here
runs without a server.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from triton_python_backend_utils import Metric

BASELINE_FILE = "acceptance_baseline.json"  # written at the repository root by the build (builders/baseline.py)

# attribute, family name, description, kind; labels {model, backend}
REQUEST_SPECS = (
    ("in_flight", "eagle_llm_requests_in_flight", "Requests admitted and not finished (queued + running); moves for "
     "decoupled models, unlike Triton's nv_inference_pending_request_count", "GAUGE"),
    ("queued", "eagle_llm_requests_queued", "Requests admitted and waiting for a sequence slot", "GAUGE"),
    ("refused", "eagle_llm_requests_refused_total", "Requests refused: queue full", "COUNTER"),
    ("cancelled", "eagle_llm_requests_cancelled_total", "Requests cancelled or disconnected mid-generation",
     "COUNTER"),
    ("expired", "eagle_llm_requests_expired_total", "Requests ended by the server's deadline "
     "(triton.request_deadline_s)", "COUNTER"),
    ("failed", "eagle_llm_requests_failed_total", "Requests ended by an engine error (INTERNAL)", "COUNTER"),
    ("tokens", "eagle_llm_generated_tokens_total", "Tokens generated (cancelled requests included)", "COUNTER"),
)

SPEC_SPECS = (
    ("forwards", "eagle_llm_target_forwards_total", "Target forward passes after the prefill (decoding steps)",
     "COUNTER"),
    ("accepted", "eagle_llm_accepted_draft_tokens_total", "Draft tokens the target accepted", "COUNTER"),
    ("drafted", "eagle_llm_draft_tokens_total", "Draft tokens proposed (tree nodes per step)", "COUNTER"),
    ("tau", "eagle_llm_tau", "Tokens per target forward since the model loaded (1 + accepted / forwards); use the "
     "counters' rates for a window", "GAUGE"),
    ("enabled", "eagle_llm_speculation_enabled", "1 while the model drafts, 0 while it decodes with the target only",
     "GAUGE"),
    ("baseline_tau", "eagle_llm_baseline_tau", "tau the build measured on its calibration prompts", "GAUGE"),
)

POSITION_SPECS = (
    ("pos_attempts", "eagle_llm_position_attempts_total", "Steps in which the draft at this position could be "
     "accepted (all earlier positions were)", "COUNTER"),
    ("pos_accepted", "eagle_llm_position_accepted_total", "Steps whose accepted path reached this position",
     "COUNTER"),
    ("baseline_pos", "eagle_llm_baseline_position_acceptance_ratio", "Acceptance of this position (accepted / "
     "attempts) the build measured on its calibration prompts", "GAUGE"),
)


def position_counts(target_forwards: int, acceptance_by_depth: list[int]) -> tuple[list[int], list[int]]:
    """(attempts, accepted) per position 1..D from one request's (or a sum of requests') counters."""
    accepted = list(acceptance_by_depth)
    attempts = [target_forwards, *accepted[:-1]] if accepted else []
    return attempts, accepted


def llmapi_counts(generated_tokens: int, spec: Any) -> tuple[int, int, int]:
    """(target forwards, accepted, drafted) of one finished LLM API request, from its
    `RequestOutput.outputs[0].request_perf_metrics.speculative_decoding` (total_accepted_draft_tokens,
    total_draft_tokens) and its token count. The LLM API reports no forward count: the context step yields one token
    and every generation step its accepted drafts plus one, so forwards = tokens - 1 - accepted (exact unless a
    stop string cut the last step's tokens)."""
    accepted, drafted = int(spec.total_accepted_draft_tokens), int(spec.total_draft_tokens)
    return max(0, generated_tokens - 1 - accepted), accepted, drafted


def read_baseline(repo_root: Path) -> dict[str, Any] | None:
    """The build's baseline (`tau`, `position_acceptance` list), or None when the build measured none."""
    f = repo_root / BASELINE_FILE
    return json.loads(f.read_text()) if f.is_file() else None


def iteration_counts(stat: dict[str, Any] | str) -> tuple[int, int, int, int, int] | None:
    """(target forwards, accepted, drafted, queued, active) of one LLM API iteration-stats entry (`LLM.get_stats()`:
    a dict, or its JSON text in some releases): the executor's IterationStats with its SpecDecodingStats
    (NVIDIA/TensorRT-LLM cpp/include/tensorrt_llm/executor/types.h). Every request with drafts is verified by one
    target forward in the iteration, so forwards = numRequestsWithDraftTokens and 1 + accepted / forwards is
    upstream's acceptanceLength. An iteration without speculative stats counts nothing.

    With attention data parallelism one iteration is reported once per attention-DP rank, and every rank's row
    carries a copy of the iteration's specDecodingStats, numActiveRequests and the rest, with the queue counts zeroed
    outside rank 0 (tensorrt_llm/executor/iteration_stats.py `_materialize_frame`: row = dict(base) per
    rank_payload). So only the row with attentionDpRank 0 (absent = 0, as upstream writes it without rank payloads)
    is counted; the others return None."""
    d: dict[str, Any] = json.loads(stat) if isinstance(stat, str) else stat
    if int(d.get("attentionDpRank") or 0) != 0:
        return None
    spec = d.get("specDecodingStats") or {}
    return (int(spec.get("numRequestsWithDraftTokens", 0)), int(spec.get("numAcceptedTokens", 0)),
            int(spec.get("numDraftTokens", 0)), int(d.get("numQueuedRequests", 0)),
            int(d.get("numActiveRequests", 0)))


def baseline_for(args: dict[str, Any]) -> dict[str, Any] | None:
    """The baseline of the model version a python model was loaded as: a published head version carries the gate's
    figures in its version directory (models/versions.py); otherwise the build's, at the repository root (`args` of
    initialize(): model_repository is the model's directory)."""
    model_dir = Path(args["model_repository"]).resolve()
    own = read_baseline(model_dir / str(args.get("model_version", "1")))
    return own if own is not None else read_baseline(model_dir.parent)


class SpecMetrics:
    """The request and speculative families of one model. The families are kept alive here: a Metric whose family
    was garbage-collected can no longer be set."""

    # One Metric per attribute of REQUEST_SPECS and SPEC_SPECS, set in __init__ (baseline_tau only with a baseline).
    in_flight: Metric
    queued: Metric
    refused: Metric
    cancelled: Metric
    expired: Metric
    failed: Metric
    tokens: Metric
    forwards: Metric
    accepted: Metric
    drafted: Metric
    tau: Metric
    enabled: Metric
    baseline_tau: Metric

    def __init__(self, pb_utils: Any, model: str, backend: str, depth: int, speculative: bool,
                 baseline: dict[str, Any] | None, version: str | None = None) -> None:
        fam = pb_utils.MetricFamily
        # `version`: the Triton model version, so a published head's acceptance is told from its predecessor's
        labels = {"model": model, "backend": backend, **({"version": version} if version else {})}
        self.families: list[Any] = []
        for attr, name, desc, kind in REQUEST_SPECS + SPEC_SPECS:
            if attr.startswith("baseline") and baseline is None:
                continue
            self.families.append(fam(name, desc, getattr(fam, kind)))
            setattr(self, attr, self.families[-1].Metric(labels))
        self.by_position: dict[str, list[Any]] = {}
        for attr, name, desc, kind in POSITION_SPECS:
            if attr.startswith("baseline") and baseline is None:
                continue
            self.families.append(fam(name, desc, getattr(fam, kind)))
            self.by_position[attr] = [self.families[-1].Metric({**labels, "position": str(p)})
                                      for p in range(1, depth + 1)]
        self.depth, self._forwards, self._accepted = depth, 0, 0
        self.enabled.set(1 if speculative else 0)
        if baseline is not None:
            self.baseline_tau.set(float(baseline["tau"]))
            for m, v in zip(self.by_position["baseline_pos"], baseline["position_acceptance"]):
                m.set(float(v))

    def close(self) -> None:
        """Remove this model version's series from the server's /metrics: the model's finalize() calls it, so a
        version that was unloaded (a published head replaced it) stops exporting. Dropping the last reference to a
        family makes the python backend delete each of its metrics and then the family (python_backend r24.10
        src/metric_family.cc `MetricFamily::~MetricFamily`: `Metric::Clear` sends PYTHONSTUB_MetricRequestDelete,
        then PYTHONSTUB_MetricFamilyRequestDelete), and the server drops a series when its last metric is deleted
        (core r24.10 src/metric_family.cc `MetricFamily::Remove`, reference-counted per label set). It must run while
        the stub still talks to the server, i.e. in finalize(), not at interpreter exit. The metrics of other versions
        share the family names and are untouched (one family object per version). Idempotent."""
        for attr, *_ in REQUEST_SPECS + SPEC_SPECS:
            self.__dict__.pop(attr, None)
        self.by_position.clear()
        self.families.clear()
        gc.collect()

    def counts(self, in_flight: int, queued: int) -> None:
        self.in_flight.set(in_flight)
        self.queued.set(queued)

    def add(self, target_forwards: int, accepted: int, drafted: int, acceptance_by_depth: list[int]) -> None:
        """Count one finished request's decoding work."""
        self.forwards.increment(target_forwards)
        self.accepted.increment(accepted)
        self.drafted.increment(drafted)
        attempts, acc = position_counts(target_forwards, acceptance_by_depth)
        for p in range(min(self.depth, len(acc))):
            self.by_position["pos_attempts"][p].increment(attempts[p])
            self.by_position["pos_accepted"][p].increment(acc[p])
        self._forwards += target_forwards
        self._accepted += accepted
        if self._forwards:
            self.tau.set(1.0 + self._accepted / self._forwards)

    def finished(self, job: Any) -> None:
        """Count a finished batcher job's decoding work (whatever ended it) and why it ended early."""
        st = None if job.result is None else getattr(job.result, "stats", None)
        if st is not None:
            self.add(st.target_forwards, st.accepted_draft_tokens, st.draft_tokens, st.acceptance_by_depth)
        if job.expired:
            self.expired.increment(1)
        elif job.error_code == "INTERNAL":
            self.failed.increment(1)
