"""Triton python model `postprocessing`: token ids -> text (upstream all_models/inflight_batcher_llm/
postprocessing). Each response is decoded on its own: a streamed chunk that splits a multi-byte character shows
U+FFFD, as upstream; the BLS model (tensorrt_llm_bls) streams with incremental detokenization instead.

A request that arrives cancelled (the ensemble's client cancelled its stream) with a `CANCEL_HANDLE` passes the
cancellation on to the python LLM model that sent the handle (models/cancel_channel.py), which Triton itself never
tells; it is still answered (the ensemble discards it)."""


import numpy as np
import triton_python_backend_utils as pb_utils
from eagle_bootstrap import project_on_path  # rendered next to this file (models/bootstrap.py)


class TritonPythonModel:
    def initialize(self, args):
        project_on_path(args)
        from triton_repo.models import cancel_channel, common

        self.send_cancel = cancel_channel.send_cancel

        p = common.Params(common.model_config(args))
        self.tokenizer = common.load_tokenizer(p.str("tokenizer_dir"))
        self.skip_special_tokens = p.bool("skip_special_tokens")

    def execute(self, requests):
        out = []
        for r in requests:
            handle = pb_utils.get_input_tensor_by_name(r, "CANCEL_HANDLE")
            if handle is not None and r.is_cancelled():
                self.send_cancel(handle.as_numpy().reshape(-1)[0].decode("ascii", "replace"))
            tokens = pb_utils.get_input_tensor_by_name(r, "TOKENS_BATCH").as_numpy()  # [B, beam, T]
            lengths = pb_utils.get_input_tensor_by_name(r, "SEQUENCE_LENGTH").as_numpy()  # [B, beam]
            texts = np.empty(lengths.shape, dtype=object)
            for b in range(tokens.shape[0]):
                for k in range(tokens.shape[1]):
                    ids = tokens[b, k, : int(lengths[b, k])].tolist()
                    text = self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)
                    texts[b, k] = text.encode("utf-8")
            out.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", texts)]))
        return out

    def finalize(self):
        pass
