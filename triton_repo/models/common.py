"""Helpers shared by the python-backend models (imported inside the stub once the project is importable,
models/bootstrap.py).

`pb_utils` (triton_python_backend_utils) exists only inside the python-backend stub; it is passed in, never
imported here, so this module also imports in tests.
"""

from __future__ import annotations

import builtins
import json
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from triton_repo import contract as C

if TYPE_CHECKING:
    from engines.api import ReferenceEngine


class RequestError(ValueError):
    """A bad request: answered with INVALID_ARGUMENT (or `code`) and this message; the server keeps serving."""

    def __init__(self, message: str, code: str = C.INVALID_ARGUMENT) -> None:
        super().__init__(message)
        self.code = code


class Params:
    """The model's config.pbtxt `parameters`, strict: a missing one is an error naming it (render it). Paths are
    written relative to the model repository (builders/triton/render.py) and resolved here against where the
    repository is now, so a build can be moved."""

    def __init__(self, model_config: dict[str, Any], repository: str | None = None) -> None:
        self.model = model_config["name"]
        self.repository = repository
        self._p = {k: v["string_value"] for k, v in model_config.get("parameters", {}).items()}

    @classmethod
    def of(cls, args: dict[str, Any]) -> Params:
        """From TritonPythonModel.initialize's args: `model_repository` is this model's directory, inside the
        repository (python_backend src/python_be.cc passes the model's repository path)."""
        return cls(model_config(args), os.path.dirname(os.path.abspath(args["model_repository"])))

    def path(self, key: str) -> str:
        """A path parameter, resolved against the model repository's directory when relative."""
        value = self.str(key)
        if os.path.isabs(value):
            return value
        if self.repository is None:
            raise ValueError(f"model {self.model}: parameter {key}={value!r} is relative but the model repository is "
                             "unknown; build the parameters with Params.of(args)")
        return os.path.normpath(os.path.join(self.repository, value))

    def str(self, key: str) -> str:
        if key not in self._p or self._p[key] == "" or "${" in self._p[key]:
            raise KeyError(f"model {self.model}: parameter {key!r} missing or unset in config.pbtxt; re-render the "
                           "repository with builders/triton/render.py")
        return self._p[key]

    def int(self, key: builtins.str) -> builtins.int:
        return int(self.str(key))

    def bool(self, key: builtins.str) -> builtins.bool:
        v = self.str(key).lower()
        if v not in ("true", "false"):
            raise ValueError(f"model {self.model}: parameter {key}={v!r} must be true or false")
        return v == "true"


def draft_depth(engine: ReferenceEngine) -> int:
    """The depth of the engine's draft tree; 0 without a drafter (the per-position metric families)."""
    tree = engine.tree
    return tree.depth if engine.has_draft and tree is not None else 0


def load_tokenizer(path: str) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def max_text_bytes(tokenizer: Any, max_input_len: int) -> tuple[int, int]:
    """(bytes, bytes per token): the longest UTF-8 text that can still fit in `max_input_len` tokens, checked before
    tokenizing so an oversized prompt costs a length comparison, not a tokenizer pass over megabytes.

    Every token covers at most `per_token` bytes of text, `per_token` = the longest token string of the vocabulary
    (added tokens included) in UTF-8 bytes, at least 4 (one UTF-8 character, e.g. an unknown one). The token strings
    overestimate the text they cover (byte-level BPE writes each byte as one character of 1-2 UTF-8 bytes,
    SentencePiece a space as the 3-byte '\u2581', byte fallback a byte as the 6 characters '<0xNN>'), so a text of
    more than max_input_len x per_token bytes has more than max_input_len tokens; only a normalizer that deletes
    characters could break this, and none of the supported (Llama-family) tokenizers does."""
    vocab = tokenizer.get_vocab()
    per_token = max([4, *(len(t.encode("utf-8")) for t in vocab)])
    return max_input_len * per_token, per_token


def end_pad_ids(tokenizer: Any) -> tuple[int, int]:
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no eos token; clients must send end_id")
    pad = tokenizer.pad_token_id
    return int(eos), int(eos if pad is None else pad)


def tensor(pb_utils: Any, request: Any, name: str) -> np.ndarray | None:
    t = pb_utils.get_input_tensor_by_name(request, name)
    return None if t is None else t.as_numpy()


def scalar(pb_utils: Any, request: Any, spec: C.Tensor) -> Any:
    """The first element of a [B, 1] input, or the contract's default when the optional input is absent."""
    arr = tensor(pb_utils, request, spec.name)
    if arr is None:
        if not spec.optional:
            raise RequestError(f"input {spec.name} is required")
        return spec.default
    if arr.size != 1:
        raise RequestError(f"input {spec.name} has {arr.size} values; send one, shape [1, 1]")
    return arr.reshape(-1)[0].item()


def unexpected(e: Exception) -> str:
    """A short message for an exception no check anticipated: its type and first line, never a traceback (which
    would show the server's install paths)."""
    first = (str(e).splitlines() or [""])[0]
    first = first if len(first) <= 200 else first[:200] + "..."
    return f"the request could not be processed ({type(e).__name__}: {first}); check its inputs against client.json"


def error_response(pb_utils: Any, message: str, code: str = C.INVALID_ARGUMENT) -> Any:
    return pb_utils.InferenceResponse(
        output_tensors=[], error=pb_utils.TritonError(message, getattr(pb_utils.TritonError, code))
    )


def word_list(words_ids: list[list[int]]) -> np.ndarray:
    """TensorRT-LLM's stop/bad word format [2, L]: row 0 = the words' ids concatenated, row 1 = end offsets,
    both padded (ids with 0, offsets with -1) to L = max(1, total ids) (upstream preprocessing
    `_to_word_list_format`)."""
    flat = [i for w in words_ids for i in w]
    offsets = np.cumsum([len(w) for w in words_ids]).tolist() if words_ids else []
    width = max(1, len(flat))
    out = np.zeros((2, width), dtype=np.int32)
    out[1, :] = -1
    out[0, : len(flat)] = flat
    out[1, : len(offsets)] = offsets
    return out


def parse_word_list(arr: np.ndarray) -> list[list[int]]:
    """Inverse of `word_list` for one [2, L] array."""
    flat, offsets = arr[0].tolist(), [int(o) for o in arr[1].tolist() if o >= 0]
    words, start = [], 0
    for end in offsets:
        words.append([int(x) for x in flat[start:end]])
        start = end
    return [w for w in words if w]


def model_config(args: dict[str, Any]) -> dict[str, Any]:
    return json.loads(args["model_config"])


def yaml_paths_resolved(options: dict, repository: str | None) -> dict:
    """model.yaml's relative directories (`./x` or `../x`: builders/triton/render_llmapi.py yaml_paths_relative),
    resolved against the model repository, so this model does not depend on the server's working directory."""
    def resolve(value: object) -> object:
        if not (isinstance(value, str) and value.startswith(("./", "../"))):
            return value
        if repository is None:
            raise ValueError(f"model.yaml path {value!r} is relative but the model repository is unknown; build the "
                             "parameters with Params.of(args)")
        return os.path.normpath(os.path.join(repository, value))

    out = dict(options, model=resolve(options.get("model")))
    spec = out.get("speculative_config")
    if isinstance(spec, dict):
        out["speculative_config"] = {k: resolve(v) if k in ("speculative_model_dir", "speculative_model") else v
                                     for k, v in spec.items()}
    return out
