"""Triton python model `postprocessing`: token ids -> text (upstream all_models/inflight_batcher_llm/
postprocessing). Each response is decoded on its own: a streamed chunk that splits a multi-byte character shows
U+FFFD, as upstream; the BLS model (tensorrt_llm_bls) streams with incremental detokenization instead.

It also passes an ensemble client's cancellation on to the LLM model, which Triton itself never tells (see
models/cancel_channel.py for why only postprocessing sees it). A request that arrives cancelled is still answered
(the ensemble discards the answer), after one of:
  - it carries a `CANCEL_HANDLE` (our python LLM models): the handle's token goes back to the LLM model instance;
  - otherwise (the C++ tensorrtllm backend), when the LLM model is decoupled and the request has an id: the LLM
    model gets tensorrtllm_backend's `stop` request with that id (the ensemble gives its composing requests the
    client's request id), as the BLS model sends it. Like every stop request it stops every request with that id,
    so clients give their requests unique ids; a request without an id cannot be stopped this way.
Each sequence is relayed once (the recent handles and ids are remembered).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from eagle_bootstrap import project_on_path  # rendered next to this file (models/bootstrap.py)

RECENT = 1024  # relayed handles / ids remembered, so the later cancelled steps of a sequence send nothing


def _required(r: pb_utils.InferenceRequest, name: str) -> np.ndarray[Any, Any]:
    t = pb_utils.get_input_tensor_by_name(r, name)
    if t is None:  # config.pbtxt declares it required: Triton refuses a request without it before execute()
        raise pb_utils.TritonModelException(f"input {name} is missing")
    return t.as_numpy()


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        project_on_path(args)
        from triton_repo.models import cancel_channel, common, llm_io, perf_bridge

        self.send_cancel, self.io = cancel_channel.send_cancel, llm_io
        p = common.Params.of(args)
        self.tokenizer = common.load_tokenizer(p.path("tokenizer_dir"))
        self.skip_special_tokens = p.bool("skip_special_tokens")
        self.llm_model, self.llm_decoupled = p.str("llm_model"), p.bool("decoupled")
        self.relayed: OrderedDict[str, None] = OrderedDict()
        self.bridge = perf_bridge.from_params(pb_utils, args, p)  # the C++ backend's speculative metrics

    def execute(self, requests: list[pb_utils.InferenceRequest]) -> list[pb_utils.InferenceResponse]:
        out = []
        for r in requests:
            self._relay_cancellation(r)
            if self.bridge is not None:
                self.bridge.observe(pb_utils, r)
            tokens = _required(r, "TOKENS_BATCH")  # [B, beam, T]
            lengths = _required(r, "SEQUENCE_LENGTH")  # [B, beam]
            texts = np.empty(lengths.shape, dtype=object)
            for b in range(tokens.shape[0]):
                for k in range(tokens.shape[1]):
                    ids = tokens[b, k, : int(lengths[b, k])].tolist()
                    text = self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)
                    texts[b, k] = text.encode("utf-8")
            out.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", texts)]))
        return out

    def _relay_cancellation(self, r: pb_utils.InferenceRequest) -> None:
        handle = pb_utils.get_input_tensor_by_name(r, "CANCEL_HANDLE")
        key = handle.as_numpy().reshape(-1)[0].decode("ascii", "replace") if handle is not None else None
        if key is None and self.llm_decoupled and r.request_id():
            key = "id:" + r.request_id()
        if key is None or key in self.relayed or not r.is_cancelled():
            return
        self.relayed[key] = None
        if len(self.relayed) > RECENT:
            self.relayed.popitem(last=False)
        if handle is not None:
            if not self.send_cancel(key):  # malformed (not from our LLM model), or that model instance is gone
                pb_utils.Logger.log_warn(f"postprocessing: cancel handle {key!r} could not be delivered")
            return
        stop = pb_utils.InferenceRequest(model_name=self.llm_model, inputs=self.io.stop_request_tensors(pb_utils),
                                         requested_output_names=[], request_id=r.request_id())
        try:
            for _ in stop.exec(decoupled=True):
                pass
        except Exception as e:  # the LLM model refused it: nothing more this model can do for that sequence
            pb_utils.Logger.log_warn(f"postprocessing: stop request for {r.request_id()!r} failed: {e}")

    def finalize(self) -> None:
        pass
