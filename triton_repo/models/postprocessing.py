"""Triton python model `postprocessing`: token ids -> text (upstream all_models/inflight_batcher_llm/
postprocessing). Each response is decoded on its own: a streamed chunk that splits a multi-byte character shows
U+FFFD, as upstream; the BLS model (tensorrt_llm_bls) streams with incremental detokenization instead.
"""

import numpy as np
import triton_python_backend_utils as pb_utils
from eagle_bootstrap import project_on_path  # rendered next to this file (models/bootstrap.py)


class TritonPythonModel:
    def initialize(self, args):
        project_on_path(args)
        from triton_repo.models import common

        p = common.Params.of(args)
        self.tokenizer = common.load_tokenizer(p.path("tokenizer_dir"))
        self.skip_special_tokens = p.bool("skip_special_tokens")

    def execute(self, requests):
        out = []
        for r in requests:
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
