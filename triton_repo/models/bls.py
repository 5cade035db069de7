"""Triton python model `tensorrt_llm_bls`: the ensemble's contract, run as business logic (upstream
all_models/inflight_batcher_llm/tensorrt_llm_bls): preprocessing -> tensorrt_llm (decoupled when streaming) ->
text, in one model. Streaming text is detokenized incrementally (a chunk is held back while it ends inside a
multi-byte character), so the concatenated stream equals the unary text exactly. A cancelled client cancels the
LLM request.
"""

from __future__ import annotations

import secrets
import threading

from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from eagle_bootstrap import project_on_path  # rendered next to this file (models/bootstrap.py)

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _output(resp: pb_utils.InferenceResponse, name: str) -> np.ndarray[Any, Any]:
    t = pb_utils.get_output_tensor_by_name(resp, name)
    if t is None:  # the preprocessing model declares every output and always sends it
        raise pb_utils.TritonModelException(f"the preprocessing model sent no {name}")
    return t.as_numpy()


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        project_on_path(args)
        from triton_repo import contract
        from triton_repo.models import bounds, capture, common, guard, llm_io, ownership, perf_bridge

        self.C, self.common, self.io, self.bounds, self.ownership = contract, common, llm_io, bounds, ownership
        self._count = 0
        p = common.Params.of(args)
        self.tokenizer = common.load_tokenizer(p.path("tokenizer_dir"))
        self.pre_model, self.llm_model = p.str("preprocessing_model"), p.str("llm_model")
        self.decoupled = p.bool("decoupled")
        self.bridge, self.bridge_mod = perf_bridge.from_params(pb_utils, args, p, gauges=False), perf_bridge
        self._lock = threading.Lock()
        self.skip_special = contract.SKIP_SPECIAL_TOKENS
        ens = contract.by_name(contract.ENSEMBLE_INPUTS)
        self.stream_spec = ens["stream"]
        # The LLM model answers only requests carrying the server's secret (models/guard.py)
        key = guard.load_key(p.bool("internal_guard"), args["model_name"])
        self.llm_params = {} if key is None else {guard.PARAMETER: key.decode()}
        self.opt_out, self.forwarded = capture.forwarded, dict[str, Any]()  # the client's capture opt-out

    def execute(self, requests: list[pb_utils.InferenceRequest]) -> list[pb_utils.InferenceResponse | None] | None:
        """Requests are served one after the other, as upstream's BLS: run triton.bls_instances instances for
        concurrency. (Serving them on threads of one instance stalled the python backend 24.10 stub under load.)"""
        out: list[pb_utils.InferenceResponse | None] = []
        for r in requests:
            sender = r.get_response_sender() if self.decoupled else None
            if problem := self.ownership.problem(r):  # an id or stop_key too long: refused before any work
                err = self.common.error_response(pb_utils, problem, self.C.INVALID_ARGUMENT)
                if sender is not None:
                    sender.send(err, flags=FINAL)
                else:
                    out.append(err)
            elif sender is not None:
                self._serve(self._read(r), sender)
            else:
                out.append(self._answer(self._read(r), None))
        return None if self.decoupled else out

    def _read(self, request: pb_utils.InferenceRequest) -> dict[str, np.ndarray[Any, Any]]:
        self.forwarded = self.opt_out(request)  # requests are served one after the other (execute)
        out = {}
        for t in self.C.ENSEMBLE_INPUTS:
            x = pb_utils.get_input_tensor_by_name(request, t.name)
            if x is not None:
                out[t.name] = np.array(x.as_numpy(), copy=True)
        return out

    def _answer(
        self, request: dict[str, np.ndarray[Any, Any]], sender: pb_utils.InferenceResponseSender | None
    ) -> pb_utils.InferenceResponse | None:
        try:
            return self._one(request, sender)
        except self.common.RequestError as e:
            return self.common.error_response(pb_utils, str(e), e.code)
        except pb_utils.TritonModelException as e:
            return self.common.error_response(pb_utils, str(e), self.C.INVALID_ARGUMENT)

    def _serve(self, request: dict[str, np.ndarray[Any, Any]], sender: pb_utils.InferenceResponseSender) -> None:
        try:
            resp = self._answer(request, sender)
        except Exception as e:  # never leave a client without a final response
            resp = self.common.error_response(pb_utils, f"BLS error: {type(e).__name__}: {e}", "INTERNAL")
        try:
            if resp is None:
                sender.send(flags=FINAL)
            elif resp.has_error():  # as the LLM model does: the error, then a bare FINAL (reference_llm._finish)
                sender.send(resp)
                sender.send(flags=FINAL)
            else:
                sender.send(resp, flags=FINAL)
        except Exception:
            pass  # the client is gone

    # ---- steps --------------------------------------------------------------------------------------------------
    def _inputs(self, request: dict[str, np.ndarray[Any, Any]], names_map: dict[str, str]) -> list[pb_utils.Tensor]:
        """pb_utils.Tensors for a step: {step input: source}; a source is the name of an ensemble input present in
        `request` (a dict of arrays) or an already computed internal array."""
        tensors = []
        for key, src in names_map.items():
            if isinstance(src, np.ndarray):
                tensors.append(pb_utils.Tensor(key, src))
            elif src in request:
                tensors.append(pb_utils.Tensor(key, request[src]))
        return tensors

    def _raise_if_error(self, resp: pb_utils.InferenceResponse) -> None:
        """A step's error, passed on with its code (an engine fault stays INTERNAL, a deadline UNAVAILABLE)."""
        if resp.has_error():
            err = resp.error()
            code = next((n for n in ("INTERNAL", self.C.UNAVAILABLE) if err.code() == getattr(pb_utils.TritonError, n)),
                        self.C.INVALID_ARGUMENT)
            raise self.common.RequestError(err.message(), code)

    def _one(
        self, request: dict[str, np.ndarray[Any, Any]], sender: pb_utils.InferenceResponseSender | None
    ) -> pb_utils.InferenceResponse | None:
        C = self.C
        if "stop_words" in request:  # bounded here too: never forward a million strings to preprocessing
            self.bounds.stop_strings(request["stop_words"], "stop_words")
        pre = pb_utils.InferenceRequest(
            model_name=self.pre_model,
            inputs=self._inputs(request, C.PREPROCESSING_INPUT_MAP),
            requested_output_names=list(C.PREPROCESSING_OUTPUT_MAP),
        ).exec()
        self._raise_if_error(pre)
        internal = {v: _output(pre, k) for k, v in C.PREPROCESSING_OUTPUT_MAP.items()}
        llm_map = {k: internal.get(v, v) for k, v in C.LLM_INPUT_MAP.items()}
        if self.bridge is not None:  # the C++ backend's perf outputs, on every request (models/perf_bridge.py)
            llm_map["return_perf_metrics"] = np.ones((internal["_INPUT_ID"].shape[0], 1), np.bool_)
        streaming = bool(request["stream"].reshape(-1)[0]) if "stream" in request else bool(self.stream_spec.default)
        with self._lock:
            self._count += 1
            request_id = f"{self.C.BLS_REQUEST_ID_PREFIX}{self._count}-{secrets.token_hex(16)}"
        # the key its stop presents: only this model can stop its LLM request (models/ownership.py)
        key = {self.ownership.STOP_KEY: secrets.token_hex(16)}
        llm_req = pb_utils.InferenceRequest(
            model_name=self.llm_model, inputs=self._inputs(request, llm_map),
            requested_output_names=list(C.LLM_OUTPUT_MAP), request_id=request_id,
            parameters={**self.llm_params, **self.forwarded, **key},
        )
        if not self.decoupled:
            resp = llm_req.exec()
            self._raise_if_error(resp)
            self._count_perf(resp, request_id)
            return self._text_response(self._ids(resp), resp)
        return self._stream(request, sender, llm_req, streaming, request_id, key)

    def _ids(self, resp: pb_utils.InferenceResponse) -> list[int]:
        t = pb_utils.get_output_tensor_by_name(resp, "output_ids")
        n = pb_utils.get_output_tensor_by_name(resp, "sequence_length")
        if t is None:
            return []
        if n is None:  # the LLM model sends both (triton_repo/contract.py LLM_OUTPUTS)
            raise pb_utils.TritonModelException("the LLM model sent output_ids without sequence_length")
        length = int(n.as_numpy().reshape(-1)[0])
        return [int(i) for i in t.as_numpy()[0, 0][:length]]

    def _text_response(
        self, ids_or_text: list[int] | str, resp: pb_utils.InferenceResponse | None
    ) -> pb_utils.InferenceResponse:
        text = ids_or_text if isinstance(ids_or_text, str) else self.tokenizer.decode(
            ids_or_text, skip_special_tokens=self.skip_special)
        tensors = [pb_utils.Tensor("text_output", np.array([[text.encode("utf-8")]], dtype=object))]
        for p in self.C.PERF_OUTPUTS:
            t = None if resp is None else pb_utils.get_output_tensor_by_name(resp, p.name)
            if t is not None:
                tensors.append(pb_utils.Tensor(p.name, t.as_numpy()))
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def _cancel_llm(self, request_id: str, key: dict[str, str]) -> None:
        """Tell the LLM model to stop our request (upstream BLS: a `stop` request with the same request id; here also
        with the request's stop_key)."""
        stop = pb_utils.InferenceRequest(
            model_name=self.llm_model, inputs=self.io.stop_request_tensors(pb_utils),
            requested_output_names=[], request_id=request_id, parameters={**self.llm_params, **key},
        )
        for _ in stop.exec(decoupled=True):
            pass

    def _stream(
        self,
        request: dict[str, np.ndarray[Any, Any]],
        sender: pb_utils.InferenceResponseSender | None,
        llm_req: pb_utils.InferenceRequest,
        streaming: bool,
        request_id: str,
        key: dict[str, str],
    ) -> pb_utils.InferenceResponse | None:
        """Decoupled LLM: forward chunks (streaming) or collect them (unary over a decoupled model)."""
        responses = llm_req.exec(decoupled=True)
        ids, emitted, last, cancelled = [], "", None, False
        for resp in responses:
            if not cancelled and sender is not None and sender.is_cancelled():
                self._cancel_llm(request_id, key)
                cancelled = True  # keep draining until the LLM's final response
            if cancelled or resp is None:
                continue
            self._raise_if_error(resp)
            if not resp.output_tensors():
                continue
            ids += self._ids(resp)
            last = resp
            if streaming:
                text = self.tokenizer.decode(ids, skip_special_tokens=self.skip_special)
                if text.endswith("\ufffd"):
                    continue  # the last token ends inside a multi-byte character: wait for the rest
                if len(text) > len(emitted) and sender is not None:
                    sender.send(self._text_response(text[len(emitted):], None))
                    emitted = text
        self._count_perf(last, request_id)
        if cancelled:
            return None  # the client is gone: close the stream with the bare FINAL flag
        if not streaming:
            return self._text_response(ids, last)
        text = self.tokenizer.decode(ids, skip_special_tokens=self.skip_special)
        tail = text[len(emitted):]
        has_perf = last is not None and pb_utils.get_output_tensor_by_name(last, "acceptance_rate") is not None
        return self._text_response(tail, last) if (tail or has_perf) else None

    def _count_perf(self, last: Any, request_id: str) -> None:
        if self.bridge is not None and last is not None:
            self.bridge_mod.count_response(self.bridge, pb_utils, last, request_id)

    def finalize(self) -> None:
        pass
