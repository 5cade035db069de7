"""Triton python model `tensorrt_llm` for engine.backend=pytorch: TensorRT-LLM's LLM API (PyTorch backend, EAGLE-3)
behind the tensorrt_llm model's I/O (contract.LLM_INPUTS / LLM_OUTPUTS), so the ensemble contract is the same as for
the other backends.

Like upstream's triton_backend/all_models/llmapi/tensorrt_llm/1/model.py it builds `LLM(**model.yaml minus
triton_config)` and runs requests with `generate_async` on an asyncio loop in a thread; unlike it, it takes token ids
(preprocessing tokenizes) and reports the speculative-decoding perf metrics (RequestOutput.outputs[0]
.request_perf_metrics.speculative_decoding, filled when SamplingParams(return_perf_metrics=True)). The LLM API
batches in flight itself; admission is bounded by max_batch_size + max_queue_size. Every response carries the
request's `cancel_handle`; the postprocessing model sends it back when an ensemble stream's client cancelled, and
the request is aborted at its next output (models/cancel_channel.py). Needs a GPU and tensorrt_llm (the NGC
TensorRT-LLM container).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading

from typing import Any

import triton_python_backend_utils as pb_utils
from eagle_bootstrap import project_on_path  # rendered next to this file (models/bootstrap.py)

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        project_on_path(args)
        import yaml
        from tensorrt_llm import LLM

        from triton_repo import contract
        from triton_repo.models import cancel_channel, common, guard, llm_io, spec_metrics

        self.C, self.common, self.io = contract, common, llm_io
        p = common.Params.of(args)
        self.decoupled = p.bool("decoupled")
        self.guard, self.key = guard, guard.load_key(p.bool("internal_guard"), args["model_name"])
        self.refusal = guard.refusal(args["model_name"], p.str("entry_models"))
        from core.types import Limits

        self.limits = Limits(p.int("max_batch_size"), p.int("max_input_len"), p.int("max_seq_len"))
        self.limit = self.limits.max_batch_size + p.int("max_queue_size")
        self.tokenizer = common.load_tokenizer(p.path("tokenizer_dir"))
        yaml_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "model.yaml")
        with open(yaml_path) as f:
            options = yaml.safe_load(f)
        options.pop("triton_config")
        self.llm = LLM(**common.yaml_paths_resolved(options, p.repository))
        # The LLM API reports accepted and drafted tokens per request, not per position (spec_metrics.llmapi_counts)
        self.metrics = spec_metrics.SpecMetrics(
            pb_utils, args["model_name"], "pytorch", 0, "speculative_config" in options,
            spec_metrics.baseline_for(args))
        self.llmapi_counts = spec_metrics.llmapi_counts
        self._in_flight = 0
        self._lock = threading.Lock()
        self._live: set[str] = set()
        self._cancelled: set[str] = set()  # cancel tokens of the running requests / of those to abort
        self.cancels = cancel_channel.Listener(self._on_cancel)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def execute(self, requests: list[pb_utils.InferenceRequest]) -> list[pb_utils.InferenceResponse | None] | None:
        futures: list[tuple[int, concurrent.futures.Future[pb_utils.InferenceResponse | None]]] = []
        out: list[pb_utils.InferenceResponse | None] = []
        for r in requests:
            sender = r.get_response_sender() if self.decoupled else None
            try:
                if self.key is not None and not self.guard.allowed(pb_utils, r, self.key):
                    raise self.common.RequestError(self.refusal)
                parsed = self.io.parse_request(pb_utils, r, self.limits, None, self.tokenizer, self.decoupled)
            except self.common.RequestError as e:
                err = self.common.error_response(pb_utils, str(e), e.code)
                self._reply(sender, err, out)
                continue
            with self._lock:
                full = self._in_flight >= self.limit
                if not full:
                    self._in_flight += 1
                    self._count()
            if full:
                self.metrics.refused.increment(1)
                msg = f"server busy: {self.limit} requests in flight (max_batch_size + max_queue_size); retry later"
                self._reply(sender, self.common.error_response(pb_utils, msg, self.C.UNAVAILABLE), out)
                continue
            fut = asyncio.run_coroutine_threadsafe(self._run(r, parsed, sender), self.loop)
            futures.append((len(out), fut))
            out.append(None)
        if self.decoupled:
            return None
        for i, fut in futures:
            out[i] = fut.result()
        return out

    def _reply(
        self,
        sender: pb_utils.InferenceResponseSender | None,
        resp: pb_utils.InferenceResponse,
        out: list[pb_utils.InferenceResponse | None],
    ) -> None:
        if sender is not None:  # decoupled
            sender.send(resp, flags=FINAL)
        else:
            out.append(resp)

    def _on_cancel(self, token: str) -> None:
        if token in self._live:  # a late token of a finished request is dropped, not kept
            self._cancelled.add(token)

    async def _run(
        self, request: pb_utils.InferenceRequest, parsed: Any, sender: pb_utils.InferenceResponseSender | None
    ) -> pb_utils.InferenceResponse | None:
        from tensorrt_llm import SamplingParams

        handle, token = self.cancels.handle()
        self._live.add(token)

        s = parsed.sampling
        params = SamplingParams(
            max_tokens=parsed.max_new_tokens, end_id=parsed.end_id, stop=parsed.stop_strings or None,
            temperature=0.0 if s.greedy else s.temperature, top_k=1 if s.greedy else (s.top_k or None),
            top_p=None if s.greedy else s.top_p, seed=s.seed, return_perf_metrics=True,
        )
        try:
            stream = self.llm.generate_async(parsed.prompt_ids, params, streaming=parsed.streaming)
            sent, final = 0, None
            async for output in stream:
                if request.is_cancelled() or token in self._cancelled:
                    stream.abort()
                    return self._done(sender, self.common.error_response(pb_utils, "request cancelled", "CANCELLED"))
                ids = list(output.outputs[0].token_ids)
                if parsed.streaming and len(ids) > sent and sender is not None:
                    chunk = self.io.ids_tensors(pb_utils, ids[sent:], handle)
                    sender.send(pb_utils.InferenceResponse(output_tensors=chunk))
                    sent = len(ids)
                final = output
            if final is None:
                raise RuntimeError("the LLM API finished the request without an output")
            spec = final.outputs[0].request_perf_metrics.speculative_decoding
            self.metrics.add(*self.llmapi_counts(len(final.outputs[0].token_ids), spec), [])
            resp = self.io.final_response(
                pb_utils, parsed, list(final.outputs[0].token_ids), int(spec.total_accepted_draft_tokens),
                int(spec.total_draft_tokens), handle,
            )
            return self._done(sender, resp)
        except Exception as e:  # the engine failed for this request: report it, keep serving
            return self._done(sender, self.common.error_response(pb_utils, f"LLM API error: {e}", "INTERNAL"))
        finally:
            self._live.discard(token)
            self._cancelled.discard(token)
            with self._lock:
                self._in_flight -= 1
                self._count()

    def _count(self) -> None:
        """The LLM API runs up to max_batch_size requests; the rest of those in flight wait in its queue."""
        self.metrics.counts(self._in_flight, max(0, self._in_flight - self.limits.max_batch_size))

    def _done(
        self, sender: pb_utils.InferenceResponseSender | None, resp: pb_utils.InferenceResponse | None
    ) -> pb_utils.InferenceResponse | None:
        if sender is None:  # not decoupled
            return resp
        if resp is None:
            sender.send(flags=FINAL)
        else:
            sender.send(resp, flags=FINAL)
        return None

    def finalize(self) -> None:
        self.cancels.close()
        self.llm.shutdown()
        self.loop.call_soon_threadsafe(self.loop.stop)
