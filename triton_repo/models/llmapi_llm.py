"""Triton python model `tensorrt_llm` for engine.backend=pytorch: TensorRT-LLM's LLM API (PyTorch backend, EAGLE-3)
behind the tensorrt_llm model's I/O (contract.LLM_INPUTS / LLM_OUTPUTS), so the ensemble contract is the same as for
the other backends.

Like upstream's triton_backend/all_models/llmapi/tensorrt_llm/1/model.py it builds `LLM(**model.yaml minus
triton_config)` and runs requests with `generate_async` on an asyncio loop in a thread; unlike it, it takes token ids
(preprocessing tokenizes) and reports the speculative-decoding perf metrics (RequestOutput.outputs[0]
.request_perf_metrics.speculative_decoding, filled when SamplingParams(return_perf_metrics=True)). The LLM API
batches in flight itself; admission is bounded by max_batch_size + max_queue_size. A request is aborted at its next
output when its client cancels (called directly or through the BLS model) or when tensorrtllm_backend's `stop`
request names its request id and presents its `stop_key` request parameter, as the reference model does (how
clients cancel an ensemble request: docs/triton.md, "Cancellation"; who may stop a request: models/ownership.py).
Needs a GPU and tensorrt_llm (the NGC TensorRT-LLM container).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import secrets
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
        from triton_repo.models import common, guard, llm_io, ownership, spec_metrics

        self.C, self.common, self.io, self.ownership = contract, common, llm_io, ownership
        p = common.Params.of(args)
        self.decoupled = p.bool("decoupled")
        self.handles = llm_io.declares_handle(args)  # postprocessing's stop relay needs it (models/stop_relay.py)
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
            spec_metrics.baseline_for(args), str(args.get("model_version", "")))
        self.llmapi_counts = spec_metrics.llmapi_counts
        self._in_flight = 0
        self._lock = threading.Lock()
        # (request id, stop_key) -> how many running requests have it / their LLM API streams; the owners a `stop`
        # named (models/ownership.py: a request without a key is never stopped by a `stop`)
        self._live: dict[tuple[str, str | None], int] = {}
        self._streams: dict[tuple[str, str | None], list[Any]] = {}
        self._stopped: set[tuple[str, str | None]] = set()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def execute(self, requests: list[pb_utils.InferenceRequest]) -> list[pb_utils.InferenceResponse | None] | None:
        futures: list[tuple[int, concurrent.futures.Future[pb_utils.InferenceResponse | None]]] = []
        out: list[pb_utils.InferenceResponse | None] = []
        for r in requests:
            sender = r.get_response_sender() if self.decoupled else None
            if problem := self.ownership.problem(r):  # an id or stop_key too long: nothing is kept of it
                self._reply(sender, self.common.error_response(pb_utils, problem), out)
                continue
            if self.io.is_stop_request(pb_utils, r):
                self._reply(sender, self._stop(r.request_id(), self.ownership.stop_key(r)), out)
                continue
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
            # the client's stop_key, or one made here when the config wires the handle (models/stop_relay.py)
            owner = (r.request_id(), self.ownership.stop_key(r) or (secrets.token_hex(16) if self.handles else None))
            self._track(owner)
            fut = asyncio.run_coroutine_threadsafe(self._run(r, owner, parsed, sender), self.loop)
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

    def _stop(self, request_id: str, key: str | None) -> Any:
        """tensorrtllm_backend's stop request: abort the running requests sent with this id and this stop_key
        (models/ownership.py); the same empty answer whether such a request was running or not."""
        if key is None:
            return self.common.error_response(pb_utils, self.ownership.NO_KEY_MESSAGE)
        with self._lock:
            for owner in [o for o in self._live if o[0] == request_id and self.ownership.owns(o[1], key)]:
                self._stopped.add(owner)  # a stop for a finished request is not kept
                for stream in self._streams.get(owner, []):  # now, not at its next output (unary: the last)
                    self.loop.call_soon_threadsafe(stream.abort)
        return pb_utils.InferenceResponse(output_tensors=[])

    def _track(self, owner: tuple[str, str | None]) -> None:
        with self._lock:
            self._live[owner] = self._live.get(owner, 0) + 1

    def _untrack(self, owner: tuple[str, str | None], stream: Any) -> None:
        with self._lock:
            streams = self._streams.get(owner, [])
            if stream in streams:
                streams.remove(stream)
            self._live[owner] -= 1
            if not self._live[owner]:
                del self._live[owner]
                self._streams.pop(owner, None)
                self._stopped.discard(owner)

    def _cancelled(self) -> Any:
        """Decoupled: a bare FINAL flag, as the reference model sends (an error response with code CANCELLED left
        the caller's stub unable to unload in python backend 24.10, models/reference_llm.py `_finish`)."""
        return None if self.decoupled else self.common.error_response(pb_utils, "request cancelled", "CANCELLED")

    async def _run(
        self, request: pb_utils.InferenceRequest, owner: tuple[str, str | None], parsed: Any,
        sender: pb_utils.InferenceResponseSender | None,
    ) -> pb_utils.InferenceResponse | None:
        from tensorrt_llm import SamplingParams

        stream = None  # `owner` is tracked since execute(): a stop may come before this runs

        s = parsed.sampling
        params = SamplingParams(
            max_tokens=parsed.max_new_tokens, end_id=parsed.end_id, stop=parsed.stop_strings or None,
            temperature=0.0 if s.greedy else s.temperature, top_k=1 if s.greedy else (s.top_k or None),
            top_p=None if s.greedy else s.top_p, seed=s.seed, return_perf_metrics=True,
        )
        try:
            stream = self.llm.generate_async(parsed.prompt_ids, params, streaming=parsed.streaming)
            with self._lock:
                self._streams.setdefault(owner, []).append(stream)
                if owner in self._stopped:  # the stop came first
                    stream.abort()
            sent, final = 0, None
            async for output in stream:
                if owner in self._stopped:  # aborted by the stop request
                    break
                if request.is_cancelled():
                    stream.abort()
                    return self._done(sender, self._cancelled())
                ids = list(output.outputs[0].token_ids)
                if parsed.streaming and len(ids) > sent and sender is not None:
                    chunk = self.io.ids_tensors(pb_utils, ids[sent:], owner[1] if self.handles else None)
                    sender.send(pb_utils.InferenceResponse(output_tensors=chunk))
                    sent = len(ids)
                final = output
            if owner in self._stopped:
                return self._done(sender, self._cancelled())
            if final is None:
                raise RuntimeError("the LLM API finished the request without an output")
            spec = final.outputs[0].request_perf_metrics.speculative_decoding
            self.metrics.add(*self.llmapi_counts(len(final.outputs[0].token_ids), spec), [])
            resp = self.io.final_response(
                pb_utils, parsed, list(final.outputs[0].token_ids), int(spec.total_accepted_draft_tokens),
                int(spec.total_draft_tokens),
            )
            return self._done(sender, resp)
        except Exception as e:  # the engine failed for this request: report it, keep serving
            return self._done(sender, self.common.error_response(pb_utils, f"LLM API error: {e}", "INTERNAL"))
        finally:
            self._untrack(owner, stream)
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
        self.llm.shutdown()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.metrics.close()  # an unloaded version stops exporting its series
