"""The speculative families for TensorRT-LLM's C++ `tensorrtllm` backend, bridged from its per-response perf outputs.

The C++ backend exports no speculative metric: its custom Prometheus families (`nv_trt_llm_request_metrics`,
`nv_trt_llm_runtime_memory_metrics`, `nv_trt_llm_kv_cache_block_metrics`, `nv_trt_llm_disaggregated_serving_metrics`,
`nv_trt_llm_inflight_batcher_metrics`, `nv_trt_llm_general_metrics`, `nv_llm_{input,output}_token_len`;
NVIDIA/TensorRT-LLM triton_backend/inflight_batcher_llm/src/custom_metrics_reporter/custom_metrics_reporter.cc
`CustomMetricsReporter::InitializeReporter`) carry requests, memory, KV blocks and token lengths only. Per request,
with the optional input `return_perf_metrics`, every response carries `total_accepted_draft_tokens`,
`total_draft_tokens` (INT32 [1, 1]), `acceptance_rate` (FP32) and `arrival_time_ns` (INT64) among its perf outputs
(model_instance_state.cc `ModelInstanceState::fillTritonResponse`, names in utils.h `OutputFieldsNames`). The values
are the request's running totals: the executor copies the request's perf metrics into every result, streamed ones
included (cpp/tensorrt_llm/batch_manager/llmRequest.cpp `LlmRequest::createResult`).

The engine-flow ensemble maps them to our postprocessing model, which counts them here. A response's totals include
the earlier responses' of its sequence, so each sequence is counted by its increase since its previous response; a
sequence is keyed by (request id, arrival_time_ns). Forwards are not reported: each generation step drafts the same
number of tokens (`draft_tokens_per_step`: the tree's depth for the C++ runtime, which counts min(draft length,
max path length) per step; the tree's node count for the reference engine), so forwards = drafted / that number,
exact while every step drafts a full tree. Per-position acceptance, requests in flight and queued cannot be
bridged (the perf outputs carry totals only; in flight: `nv_trt_llm_request_metrics{request_type="active"}`).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from triton_repo.models.spec_metrics import SPEC_SPECS, baseline_for

BACKEND_LABEL = "tensorrtllm"
# postprocessing input -> the perf output it receives through the ensemble (triton_repo/contract.py)
INPUTS = {"TOTAL_ACCEPTED_DRAFT_TOKENS": "total_accepted_draft_tokens", "TOTAL_DRAFT_TOKENS": "total_draft_tokens",
          "ARRIVAL_TIME_NS": "arrival_time_ns"}
RECENT = 4096  # sequences remembered; far more than a model holds in flight (max_batch_size + its queue)


class PerfBridge:
    """drafted / accepted / forwards / tau / speculation on, labelled {model, backend="tensorrtllm"}, from the
    running totals of the responses the postprocessing model sees."""

    def __init__(self, pb_utils: Any, model: str, draft_tokens_per_step: int, baseline_tau: float | None,
                 gauges: bool = True) -> None:
        if draft_tokens_per_step < 1:
            raise ValueError(f"draft_tokens_per_step={draft_tokens_per_step} must be >= 1")
        fam = pb_utils.MetricFamily
        labels = {"model": model, "backend": BACKEND_LABEL}
        self.families: list[Any] = []  # kept alive: a Metric whose family was collected can no longer be set
        self.m: dict[str, Any] = {}  # SPEC_SPECS attribute -> its Metric
        for attr, name, desc, kind in SPEC_SPECS:
            if (attr == "baseline_tau" and baseline_tau is None) or (kind == "GAUGE" and not gauges):
                continue
            self.families.append(fam(name, desc, getattr(fam, kind)))
            self.m[attr] = self.families[-1].Metric(labels)
        self.per_step, self.gauges = draft_tokens_per_step, gauges
        if gauges:
            self.m["enabled"].set(1)  # the engine flow is rendered with decoding_mode eagle: every step drafts
            if baseline_tau is not None:
                self.m["baseline_tau"].set(baseline_tau)
        self.seen: OrderedDict[tuple[str, int], tuple[int, int]] = OrderedDict()
        self.totals = [0, 0]  # accepted, drafted since load

    def add(self, key: tuple[str, int], accepted: int, drafted: int) -> tuple[int, int]:
        """Count one response's running totals; returns the increase counted. Totals below the sequence's previous
        ones mean a new sequence that reused the key: counted whole."""
        prev_acc, prev_dr = self.seen.pop(key, (0, 0))
        if accepted < prev_acc or drafted < prev_dr:
            prev_acc, prev_dr = 0, 0
        self.seen[key] = (accepted, drafted)
        if len(self.seen) > RECENT:
            self.seen.popitem(last=False)
        d_acc, d_dr = accepted - prev_acc, drafted - prev_dr
        self.m["accepted"].increment(d_acc)
        self.m["drafted"].increment(d_dr)
        self.totals[0] += d_acc
        self.totals[1] += d_dr
        # forwards as a running quotient of the totals, so per-response rounding never accumulates
        forwards_before = (self.totals[1] - d_dr) // self.per_step
        forwards = self.totals[1] // self.per_step
        self.m["forwards"].increment(forwards - forwards_before)
        if forwards and self.gauges:
            self.m["tau"].set(1.0 + self.totals[0] / forwards)
        return d_acc, d_dr

    def observe(self, pb_utils: Any, request: Any) -> None:
        """Count a postprocessing request's perf inputs (absent: the LLM response carried none, nothing to count)."""
        got = {}
        for name in INPUTS:
            t = pb_utils.get_input_tensor_by_name(request, name)
            if t is None:
                return
            got[name] = t.as_numpy().reshape(-1)
        for arrival, accepted, drafted in zip(got["ARRIVAL_TIME_NS"].tolist(),
                                              got["TOTAL_ACCEPTED_DRAFT_TOKENS"].tolist(),
                                              got["TOTAL_DRAFT_TOKENS"].tolist()):  # one row per sequence
            self.add((request.request_id(), int(arrival)), int(accepted), int(drafted))


def from_params(pb_utils: Any, args: dict[str, Any], params: Any, gauges: bool = True) -> PerfBridge | None:
    """The postprocessing (or BLS) model's bridge: `draft_tokens_per_step` 0 = none (the LLM model counts itself).
    The BLS model counts into the same counters (Triton shares a family's metric between models that register the
    same name and labels) and leaves the gauges to postprocessing, whose tau covers the ensemble's traffic."""
    per_step = params.int("draft_tokens_per_step")
    if per_step == 0:
        return None
    baseline = baseline_for(args)
    tau = None if baseline is None else float(baseline["tau"])
    return PerfBridge(pb_utils, params.str("llm_model"), per_step, tau, gauges)


def count_response(bridge: PerfBridge, pb_utils: Any, response: Any, request_id: str) -> None:
    """The BLS model: count the running totals of the last response its LLM request got (the sequence's totals)."""
    got = [pb_utils.get_output_tensor_by_name(response, n) for n in ("total_accepted_draft_tokens",
                                                                     "total_draft_tokens")]
    if any(t is None for t in got):
        return
    accepted, drafted = (int(t.as_numpy().reshape(-1)[0]) for t in got)
    bridge.add((request_id, 0), accepted, drafted)
