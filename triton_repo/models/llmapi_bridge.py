"""Triton python model `tensorrt_llm` of the llmapi layout with engine.backend=pytorch: TensorRT-LLM's own llmapi
model, unmodified, plus the speculative and request metrics of triton_repo/models/spec_metrics.py.

Upstream's triton_backend/all_models/llmapi/tensorrt_llm/1/model.py is imported where the image has it
(`$TRTLLM_LLMAPI_MODEL_DIR`, else /app/all_models/llmapi/tensorrt_llm/1, with its helpers.py; a copy named
`upstream_model.py` next to this file wins), never copied into the build, so a build serves from a read-only
mount; this model subclasses its `TritonPythonModel`, adding one step to its request path: a request with sampling
inputs the one-model speculative path cannot honour is answered INVALID_ARGUMENT before upstream sees it
(models/llmapi_refusals.py, shared with the reference engine's mirror). After upstream's initialize() has started
the LLM, a thread
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

Capture (opt-in, models/capture.py, the same store, opt-out and bounds as the reference engine's models): each
request runs in its own asyncio task in upstream's model, so a context variable set when it starts carries its
capture decision and its sampling parameters to the final `_create_response`, where the finished RequestOutput's
prompt and output token ids are handed to the store (models/llmapi_capture.py).
"""

from __future__ import annotations

import contextvars
import importlib.util
import os
import sys
import threading

from typing import TYPE_CHECKING, Any

import triton_python_backend_utils as pb_utils
from eagle_bootstrap import project_on_path  # rendered next to this file (models/bootstrap.py)

UPSTREAM_ENV = "TRTLLM_LLMAPI_MODEL_DIR"  # docker/serve.py UPSTREAM_LLMAPI_ENV
UPSTREAM_DIR = "/app/all_models/llmapi/tensorrt_llm/1"  # builders/triton/render_llmapi.py UPSTREAM_MODEL_DIR


def _upstream_model() -> Any:
    """TensorRT-LLM's model.py, unmodified: the copy next to this file if there is one, else the image's, loaded by
    path with its helpers.py first (the `from helpers import ...` it does finds that module)."""
    here = os.path.dirname(os.path.abspath(__file__))
    if os.path.isfile(os.path.join(here, "upstream_model.py")):
        import upstream_model

        return upstream_model
    src = os.environ.get(UPSTREAM_ENV) or UPSTREAM_DIR
    return [_load(name, os.path.join(src, f"{file}.py")) for name, file in (("helpers", "helpers"),
                                                                             ("upstream_model", "model"))][-1]


def _load(name: str, path: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None or not os.path.isfile(path):
        raise ImportError(f"TensorRT-LLM's llmapi model file {path} not found; set ${UPSTREAM_ENV} to TensorRT-LLM's "
                          "triton_backend/all_models/llmapi/tensorrt_llm/1")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


if TYPE_CHECKING:  # the members the bridge uses (stubs/upstream_model.pyi)
    from upstream_model import TritonPythonModel as UpstreamModel
else:
    UpstreamModel = _upstream_model().TritonPythonModel
_CAPTURED: contextvars.ContextVar[Any] = contextvars.ContextVar("eagle_capture", default=None)

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
        from triton_repo.models import capture, llmapi_capture

        self._eagle_capture = capture.Hook.of(pb_utils, args, "pytorch")  # opt-in store (models/capture.py)
        self._eagle_record = llmapi_capture.record_of

    # ---- capture: one context per request (upstream runs each request as its own asyncio task) ----------------
    async def _execute_single_request(self, request: Any) -> Any:
        hook = getattr(self, "_eagle_capture", None)
        _CAPTURED.set({"params": None} if hook is not None and hook.wanted(request) else None)
        return await super()._execute_single_request(request)

    def _convert_request(self, request: Any) -> Any:
        converted = super()._convert_request(request)
        state = _CAPTURED.get()
        if state is not None:
            state["params"] = dict(converted[1])  # (prompt, sampling_params, streaming, output_config)
        return converted

    def _create_response(self, request_output: Any, output_config: Any) -> Any:
        response = super()._create_response(request_output, output_config)
        state = _CAPTURED.get()
        if state is not None and state["params"] is not None and getattr(request_output, "finished", False):
            _CAPTURED.set(None)  # one record per request
            try:
                rec = self._eagle_record(request_output, state["params"], self._eagle_capture.version)
            except Exception:  # the store never breaks serving: a record it cannot make is a dropped one
                rec = None
                if self._eagle_capture.writer is not None:
                    self._eagle_capture.writer.on_dropped(1)
            if rec is not None and self._eagle_capture.writer is not None:
                self._eagle_capture.writer.offer(rec)
        return response

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
        if getattr(self, "_eagle_capture", None) is not None:
            self._eagle_capture.close()
        if getattr(self, "_eagle", None) is not None:
            self._eagle_thread.join(timeout=2 * POLL_S)
            self._eagle.close()  # an unloaded version stops exporting its series
