"""Triton python model `preprocessing`: text -> token ids, with the request checks (upstream
all_models/inflight_batcher_llm/preprocessing, I/O in triton_repo/contract.py).

Bad requests (empty, non-UTF-8 or too many bytes of text (checked before tokenizing), max_tokens <= 0, prompt over max_input_len, prompt + max_tokens over
max_seq_len, and with `greedy_only` a request asking for sampling) get INVALID_ARGUMENT with a message; the other
requests of the batch are unaffected.
"""


import numpy as np
import triton_python_backend_utils as pb_utils
from eagle_bootstrap import project_on_path  # rendered next to this file (models/bootstrap.py)


class TritonPythonModel:
    def initialize(self, args):
        project_on_path(args)
        from triton_repo import contract
        from core.types import Limits
        from triton_repo.models import common, llm_io

        self.C, self.common, self.io = contract, common, llm_io
        cfg = common.model_config(args)
        p = common.Params.of(args)
        self.tokenizer = common.load_tokenizer(p.path("tokenizer_dir"))
        self.add_special_tokens = p.bool("add_special_tokens")
        self.max_input_len = p.int("max_input_len")
        self.max_text_bytes, self.bytes_per_token = common.max_text_bytes(self.tokenizer, self.max_input_len)
        self.max_seq_len = p.int("max_seq_len")
        self.limits = Limits(int(cfg["max_batch_size"]), self.max_input_len, self.max_seq_len)
        self.greedy_only = p.bool("greedy_only")
        self.end_id, self.pad_id = common.end_pad_ids(self.tokenizer)

    def execute(self, requests):
        out = []
        for r in requests:
            try:
                out.append(self._one(r))
            except self.common.RequestError as e:
                out.append(self.common.error_response(pb_utils, str(e), e.code))
        return out

    def _decode_query(self, raw):
        n = len(raw) if isinstance(raw, bytes) else len(str(raw).encode("utf-8"))
        if n > self.max_text_bytes:  # before decoding and tokenizing: refusing costs a comparison
            raise self.common.RequestError(
                f"text_input has {n} bytes > {self.max_text_bytes} = max_input_len {self.max_input_len} x "
                f"{self.bytes_per_token} bytes (the longest token): it cannot fit in max_input_len tokens; shorten it")
        text = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)  # strict: UnicodeDecodeError below
        if text == "":
            raise self.common.RequestError("text_input is empty; send a non-empty prompt")
        return text

    def _one(self, request):
        common = self.common
        query = self._required(request, "QUERY")
        out_len = self._required(request, "REQUEST_OUTPUT_LEN")
        stop = common.tensor(pb_utils, request, "STOP_WORDS_DICT")
        end_in = common.tensor(pb_utils, request, "END_ID")
        pad_in = common.tensor(pb_utils, request, "PAD_ID")
        batch = query.shape[0]
        ids, stop_lists = [], []
        if self.greedy_only:
            self._refuse_sampling(request, batch)
        for b in range(batch):
            try:
                text = self._decode_query(query[b].reshape(-1)[0])
            except UnicodeDecodeError as e:
                raise common.RequestError(f"text_input is not valid UTF-8 ({e.reason} at byte {e.start})") from None
            n_out = int(out_len[b].reshape(-1)[0])
            tok = self.tokenizer.encode(text, add_special_tokens=self.add_special_tokens)
            if problem := self.limits.length_problem(len(tok), n_out, "max_tokens"):
                raise common.RequestError(problem)
            ids.append(tok)
            words = [] if stop is None else [w for w in stop[b].reshape(-1).tolist() if w not in (b"", "")]
            try:
                words = [w.decode("utf-8") if isinstance(w, bytes) else str(w) for w in words]
            except UnicodeDecodeError:
                raise common.RequestError("stop_words contains invalid UTF-8") from None
            stop_lists.append(common.word_list(
                [self.tokenizer.encode(w, add_special_tokens=False) for w in words]))
        width = max(len(t) for t in ids)
        end = np.full((batch, 1), self.end_id, np.int32) if end_in is None else end_in.astype(np.int32).reshape(batch, 1)
        pad = np.full((batch, 1), self.pad_id, np.int32) if pad_in is None else pad_in.astype(np.int32).reshape(batch, 1)
        input_ids = np.empty((batch, width), np.int32)
        for b, t in enumerate(ids):
            input_ids[b, :] = pad[b, 0]
            input_ids[b, : len(t)] = t
        swidth = max(s.shape[1] for s in stop_lists)
        stop_ids = np.zeros((batch, 2, swidth), np.int32)
        stop_ids[:, 1, :] = -1
        for b, s in enumerate(stop_lists):
            stop_ids[b, :, : s.shape[1]] = s
        tensors = {
            "INPUT_ID": input_ids,
            "REQUEST_INPUT_LEN": np.array([[len(t)] for t in ids], np.int32),
            "REQUEST_OUTPUT_LEN": out_len.astype(np.int32).reshape(batch, 1),
            "STOP_WORDS_IDS": stop_ids,
            "OUT_END_ID": end,
            "OUT_PAD_ID": pad,
        }
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in tensors.items()])

    def _required(self, request, name):
        """QUERY and REQUEST_OUTPUT_LEN are declared optional in config.pbtxt (render.py says why) and required
        here: a request without one is refused naming the client-facing input."""
        arr = self.common.tensor(pb_utils, request, name)
        if arr is None or arr.size == 0:
            given = self.C.PREPROCESSING_INPUT_MAP[name]
            raise self.common.RequestError(f"input {given} is required ({self.C.REQUIRED_HELP[given]})")
        return arr

    def _refuse_sampling(self, request, batch):
        """Engine-flow EAGLE verifies drafts by token equality with the target's argmax (TensorRT-LLM's
        eagle_sample_and_accept_draft plugin, greedy_sampling; the Triton C++ backend sets no per-request
        EagleConfig), so sampling parameters would be ignored: say so instead."""
        C, common = self.C, self.common
        values = {}
        for name in ("TEMPERATURE", "RUNTIME_TOP_K", "RUNTIME_TOP_P"):
            arr = common.tensor(pb_utils, request, name)
            spec = C.by_name(C.PREPROCESSING_INPUTS)[name]
            values[name] = [spec.default] * batch if arr is None else arr.reshape(batch, -1)[:, 0].tolist()
        for b in range(batch):
            t, k, p = values["TEMPERATURE"][b], values["RUNTIME_TOP_K"][b], values["RUNTIME_TOP_P"][b]
            if not self.io.sampling_from(float(t), int(k), float(p), 0).greedy:
                raise common.RequestError(
                    f"temperature={t:g}, top_k={k}, top_p={p:g} ask for sampling, but this model serves an engine-flow "
                    "EAGLE engine (engine.backend tensorrt), which accepts draft tokens greedily: the sampling "
                    "parameters would be ignored. Send temperature 0 (or top_k 1, or top_k 0 with top_p 0), or serve "
                    "with engine.backend pytorch or reference")

    def finalize(self):
        pass
