"""Triton python model `postprocessing`: token ids -> text (upstream all_models/inflight_batcher_llm/
postprocessing). Each response is decoded on its own: a streamed chunk that splits a multi-byte character shows
U+FFFD, as upstream; the BLS model (tensorrt_llm_bls) streams with incremental detokenization instead.

A cancelled step (its ensemble client went away) is still answered, so the ensemble request completes, after
postprocessing has sent the LLM model tensorrtllm_backend's `stop` for that request (models/stop_relay.py).
"""

from __future__ import annotations


from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from eagle_bootstrap import project_on_path  # rendered next to this file (models/bootstrap.py)


def _required(r: pb_utils.InferenceRequest, name: str) -> np.ndarray[Any, Any]:
    t = pb_utils.get_input_tensor_by_name(r, name)
    if t is None:  # config.pbtxt declares it required: Triton refuses a request without it before execute()
        raise pb_utils.TritonModelException(f"input {name} is missing")
    return t.as_numpy()


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        project_on_path(args)
        from triton_repo.models import common, perf_bridge, step_profile, stop_relay

        self.profile = step_profile.for_model(args["model_name"])  # $EAGLE_DEPLOY_STEP_PROFILE (off: None)
        self.step_profile = step_profile
        p = common.Params.of(args)
        self.tokenizer = common.load_tokenizer(p.path("tokenizer_dir"))
        self.skip_special_tokens = p.bool("skip_special_tokens")
        self.bridge = perf_bridge.from_params(pb_utils, args, p)  # the C++ backend's speculative metrics
        # A stop request is answered on a stream: only a decoupled LLM model takes one (and only a decoupled one
        # streams, so only then do later responses reveal that the client went away).
        self.relay = stop_relay.StopRelay(pb_utils, p.str("llm_model")) if p.bool("decoupled") else None

    def execute(self, requests: list[pb_utils.InferenceRequest]) -> list[pb_utils.InferenceResponse]:
        out: list[pb_utils.InferenceResponse] = self.step_profile.timed_execute(self.profile, self._execute, requests)
        return out

    def _execute(self, requests: list[pb_utils.InferenceRequest]) -> list[pb_utils.InferenceResponse]:
        out = []
        for r in requests:
            if self.relay is not None:
                self.relay.observe(r)
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

    def finalize(self) -> None:
        pass
