"""Triton python model `tensorrt_llm` of the llmapi layout with engine.backend=pytorch: TensorRT-LLM's own llmapi
model, unmodified, plus the speculative and request metrics of triton_repo/models/spec_metrics.py.

Upstream's triton_backend/all_models/llmapi/tensorrt_llm/1/model.py is copied next to this file as
`upstream_model.py` (docker/serve.py, from the image; byte for byte) and this model subclasses its
`TritonPythonModel`, adding one step to its request path: a request with sampling inputs the one-model speculative
path cannot honour is answered INVALID_ARGUMENT before upstream sees it (models/llmapi_refusals.py, shared with
the reference engine's mirror). After upstream's initialize() has started the LLM, a thread
polls the LLM API's iteration statistics (`LLM.get_stats(timeout)`: one dict per executor iteration, filled when the
LLM args set `enable_iter_perf_stats`, which the rendered model.yaml does) and counts, per iteration:

    specDecodingStats.numDraftTokens             -> eagle_llm_draft_tokens_total
    specDecodingStats.numAcceptedTokens          -> eagle_llm_accepted_draft_tokens_total
    specDecodingStats.numRequestsWithDraftTokens -> eagle_llm_target_forwards_total (one verification per request
                                                    and iteration: tau = 1 + accepted / forwards, upstream's own
                                                    acceptanceLength over any window)
    numQueuedRequests                            -> eagle_llm_requests_queued

from the row of attention-DP rank 0 only: with attention data parallelism every rank's row repeats the iteration's
statistics (spec_metrics.iteration_counts).

Requests in flight are upstream's own count (`_ongoing_request_count`: +1 when a request starts, -1 when its final
response was sent), so the gauge moves for this decoupled model, where Triton's pending count stays 0. Upstream
exposes no per-position acceptance for this backend (IterationStats carries totals only), so the per-position
families are absent; speculation is reported off for an iteration with requests that drafted nothing.
Non-leader MPI ranks (multi-node) run no LLM and export nothing.
"""

from __future__ import annotations

import os
import threading

from typing import Any

import triton_python_backend_utils as pb_utils
from eagle_bootstrap import project_on_path  # rendered next to this file (models/bootstrap.py)
from upstream_model import TritonPythonModel as UpstreamModel  # TensorRT-LLM's model.py, copied unmodified

POLL_S = 1.0  # how often the iteration statistics are drained (they queue up between polls)
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _speculative_config() -> dict[str, Any]:
    """model.yaml's speculative_config, from where upstream's model reads model.yaml (LLM_CONFIG_PATH, else the
    file next to this one)."""
    import yaml

    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, os.environ.get("LLM_CONFIG_PATH", "model.yaml"))) as f:
        return dict((yaml.safe_load(f) or {}).get("speculative_config") or {})


class TritonPythonModel(UpstreamModel):
    def initialize(self, args: dict[str, Any]) -> None:
        super().initialize(args)
        self._eagle_stop = threading.Event()
        self._eagle_spec = _speculative_config()
        if getattr(self, "_llm_engine", None) is None:
            return  # a worker rank: the leader serves the requests and the metrics
        project_on_path(args)
        from triton_repo.models import spec_metrics

        self._eagle_counts = spec_metrics.iteration_counts
        self._eagle = spec_metrics.SpecMetrics(pb_utils, args["model_name"], "pytorch", 0, True,
                                               spec_metrics.baseline_for(args), str(args.get("model_version", "")))
        self._eagle_thread = threading.Thread(target=self._eagle_poll, daemon=True)
        self._eagle_thread.start()

    def execute(self, requests: list[Any]) -> None:
        """Upstream's execute, over the requests that pass the request boundary (models/llmapi_refusals.py)."""
        return super().execute(self._eagle_admitted(requests))

    def _eagle_admitted(self, requests: list[Any]) -> list[Any]:
        """Answer INVALID_ARGUMENT, in upstream's error format, to each request with sampling inputs the one-model
        speculative path would refuse once in the executor (or answer with a meaningless value); keep the rest."""
        from triton_repo.models import llmapi_io, llmapi_refusals

        kept = []
        for r in requests:
            msg = llmapi_refusals.refuse_speculative_sampling(pb_utils, r, self._eagle_spec)
            if msg is None:
                kept.append(r)
            else:
                r.get_response_sender().send(llmapi_io.error(pb_utils, msg), flags=FINAL)
        return kept

    def _eagle_poll(self) -> None:
        queued = 0
        while not self._eagle_stop.wait(POLL_S):
            llm = self._llm_engine
            if llm is None or isinstance(llm, Exception):
                continue
            try:
                stats = llm.get_stats(timeout=POLL_S)
            except Exception as e:  # a failed poll loses no count: the stats stay queued upstream
                pb_utils.Logger.log_warn(f"[eagle] iteration statistics unavailable: {e}")
                stats = []
            for stat in stats:
                counts = self._eagle_counts(stat)
                if counts is None:  # another attention-DP rank's copy of an iteration already counted
                    continue
                forwards, accepted, drafted, queued, active = counts
                self._eagle.add(forwards, accepted, drafted, [])
                if active > 0:
                    self._eagle.enabled.set(1 if drafted > 0 else 0)
            self._eagle.counts(max(0, int(getattr(self, "_ongoing_request_count", 0))), queued)

    def finalize(self) -> None:
        self._eagle_stop.set()
        super().finalize()
