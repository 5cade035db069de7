"""Triton python model `preprocessing`: text -> token ids, with the request checks (upstream
all_models/inflight_batcher_llm/preprocessing, I/O in triton_repo/contract.py).

Bad requests (a request id or stop_key over its bound, models/ownership.py; empty, non-UTF-8 or too many bytes of
text, more than one value per input, too many or too long stop words, end_id / pad_id outside the vocabulary: all
checked before anything is tokenized, models/bounds.py);
max_tokens <= 0, prompt over max_input_len, prompt + max_tokens over max_seq_len, and with `greedy_only` a request
asking for sampling) get INVALID_ARGUMENT with a message; the other requests of the batch are unaffected.
"""


from __future__ import annotations


from typing import Any

import numpy.typing as npt

import numpy as np
import triton_python_backend_utils as pb_utils
from eagle_bootstrap import project_on_path  # rendered next to this file (models/bootstrap.py)


Array = npt.NDArray[Any]


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        project_on_path(args)
        from triton_repo import contract
        from core.types import Limits
        from triton_repo.models import bounds, common, guard, llm_io, ownership, step_profile

        self.C, self.common, self.io, self.bounds, self.ownership = contract, common, llm_io, bounds, ownership
        cfg = common.model_config(args)
        self.profile = step_profile.for_model(args["model_name"])  # $EAGLE_DEPLOY_STEP_PROFILE (off: None)
        self.step_profile = step_profile
        p = common.Params.of(args)
        self.tokenizer = common.load_tokenizer(p.path("tokenizer_dir"))
        self.add_special_tokens = p.bool("add_special_tokens")
        self.max_input_len = p.int("max_input_len")
        self.max_text_bytes, self.bytes_per_token = common.max_text_bytes(self.tokenizer, self.max_input_len)
        self.max_seq_len = p.int("max_seq_len")
        self.limits = Limits(int(cfg["max_batch_size"]), self.max_input_len, self.max_seq_len)
        self.greedy_only = p.bool("greedy_only")
        self.perf_bridge = p.bool("perf_bridge")  # ask the LLM model for its perf outputs (models/perf_bridge.py)
        self.end_id, self.pad_id = common.end_pad_ids(self.tokenizer)
        self.vocab = len(self.tokenizer)  # ids the tokenizer knows: end_id / pad_id must be one of them
        # The token that lets the LLM model take these outputs (models/guard.py); never the secret itself.
        self.guard, self.key = guard, guard.load_key(p.bool("internal_guard"), args["model_name"])

    def execute(self, requests: list[pb_utils.InferenceRequest]) -> list[pb_utils.InferenceResponse]:
        out: list[pb_utils.InferenceResponse] = self.step_profile.timed_execute(self.profile, self._execute, requests)
        return out

    def _execute(self, requests: list[pb_utils.InferenceRequest]) -> list[pb_utils.InferenceResponse]:
        out = []
        for r in requests:
            try:
                out.append(self._one(r))
            except self.common.RequestError as e:
                out.append(self.common.error_response(pb_utils, str(e), e.code))
            except Exception as e:  # an input no check anticipated: refused without a traceback
                out.append(self.common.error_response(pb_utils, self.common.unexpected(e)))
        return out

    def _checked(self, request: pb_utils.InferenceRequest) -> tuple[list[Any], Array, list[Any], Array, Array]:
        """Every input bounded and checked for every row before any row is tokenized (models/bounds.py)."""
        common, bounds = self.common, self.bounds
        query = self._required(request, "QUERY")
        batch = query.shape[0]
        texts = [bounds.text(q, "text_input", self.max_text_bytes,
                             f"max_input_len {self.max_input_len} x {self.bytes_per_token} bytes (the longest token)")
                 for q in bounds.one_per_row(query, "text_input", batch).tolist()]
        out_len = bounds.one_per_row(self._required(request, "REQUEST_OUTPUT_LEN"), "max_tokens", batch)
        for n in out_len.tolist():
            if n <= 0:
                raise common.RequestError(f"max_tokens={n} must be >= 1")
        stop = common.tensor(pb_utils, request, "STOP_WORDS_DICT")
        if stop is not None and stop.shape[0] != batch:
            raise common.RequestError(f"input stop_words has shape {list(stop.shape)}; send [1, n] strings")
        stops = [bounds.stop_strings(None if stop is None else stop[b], "stop_words") for b in range(batch)]
        ids = {}
        for name, given, default, none_ok in (("END_ID", "end_id", self.end_id, True),
                                              ("PAD_ID", "pad_id", self.pad_id, False)):
            arr = common.tensor(pb_utils, request, name)
            values = [default] * batch if arr is None else bounds.one_per_row(arr, given, batch).tolist()
            ids[name] = np.array([[bounds.token_id(v, given, self.vocab, none_ok)] for v in values], np.int32)
        return texts, out_len, stops, ids["END_ID"], ids["PAD_ID"]

    def _one(self, request: pb_utils.InferenceRequest) -> pb_utils.InferenceResponse:
        common = self.common
        # The ensemble's first step: an id or stop_key too long ends the request here, before the LLM model or the
        # stop relay could keep it (models/ownership.py)
        if problem := self.ownership.problem(request):
            raise common.RequestError(problem)
        texts, out_len, stops, end, pad = self._checked(request)
        if self.greedy_only:
            self._refuse_sampling(request, len(texts))
        batch = len(texts)
        ids, stop_lists = [], []
        for b, text in enumerate(texts):
            n_out = int(out_len[b])
            tok = self.tokenizer.encode(text, add_special_tokens=self.add_special_tokens)
            if problem := self.limits.length_problem(len(tok), n_out, "max_tokens"):
                raise common.RequestError(problem)
            ids.append(tok)
            stop_lists.append(common.word_list(
                [self.tokenizer.encode(w, add_special_tokens=False) for w in stops[b]]))
        width = max(len(t) for t in ids)
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
        if self.perf_bridge:
            tensors["OUT_RETURN_PERF_METRICS"] = np.ones((batch, 1), np.bool_)
        out = [pb_utils.Tensor(k, v) for k, v in tensors.items()]
        if self.key is not None:
            out.append(self.guard.token_tensor(pb_utils, self.key, tensors))
        return pb_utils.InferenceResponse(output_tensors=out)

    def _required(self, request: pb_utils.InferenceRequest, name: str) -> np.ndarray[Any, Any]:
        """QUERY and REQUEST_OUTPUT_LEN are declared optional in config.pbtxt (render.py says why) and required
        here: a request without one is refused naming the client-facing input."""
        arr = self.common.tensor(pb_utils, request, name)
        if arr is None or arr.size == 0:
            given = self.C.PREPROCESSING_INPUT_MAP[name]
            raise self.common.RequestError(f"input {given} is required ({self.C.REQUIRED_HELP[given]})")
        return arr

    def _refuse_sampling(self, request: pb_utils.InferenceRequest, batch: int) -> None:
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

    def finalize(self) -> None:
        pass
