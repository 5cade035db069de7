"""Bounds on every request input, checked before any work (tokenizing, decoding, copying lists): an input's count
and bytes are compared with a constant first, so an oversized request costs a comparison, not a pass over its
megabytes while it holds a model instance that other users wait for. Each refusal is a RequestError
(INVALID_ARGUMENT) naming the input, what was found and what to send.

Shared by the preprocessing, tensorrt_llm (reference and LLM API) and llmapi-layout models; `pb_utils` is never
needed here, so this module also imports in tests.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from triton_repo.models.common import RequestError

MAX_STOP_WORDS = 64  # stop strings (or stop id sequences) of one request
MAX_STOP_WORD_BYTES = 1024  # UTF-8 bytes of one stop string
MAX_STOP_TOTAL_BYTES = 8192  # UTF-8 bytes of all stop strings of one request
MAX_WORD_IDS = 4096  # token ids in one request's stop_words_list (all words together)
def one_per_row(arr: np.ndarray, name: str, rows: int = 1) -> np.ndarray:
    """An input of shape [rows, 1] (or [rows]): exactly one value per batch row, never a silently ignored rest."""
    if arr.size != rows or (arr.ndim > 0 and arr.shape[0] != rows):
        raise RequestError(f"input {name} has shape {list(arr.shape)} ({arr.size} values); send one value per "
                           f"request, shape [{rows}, 1]" if rows > 1 else
                           f"input {name} has shape {list(arr.shape)} ({arr.size} values); send one value, shape "
                           "[1, 1] (one prompt per request: concurrent requests are batched by the server)")
    return arr.reshape(rows)


def _utf8(raw: Any, name: str) -> str:
    if not isinstance(raw, bytes):
        return str(raw)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(f"{name} is not valid UTF-8 ({e.reason} at byte {e.start})") from None


def text(raw: Any, name: str, max_bytes: int, why: str) -> str:
    """One prompt: bytes bounded BEFORE decoding (and so before tokenizing), then strict UTF-8, then non-empty."""
    n = len(raw) if isinstance(raw, bytes) else len(str(raw).encode("utf-8"))
    if n > max_bytes:
        raise RequestError(f"{name} has {n} bytes > {max_bytes} = {why}: it cannot fit in max_input_len tokens; "
                           "shorten it")
    value = _utf8(raw, name)
    if value == "":
        raise RequestError(f"{name} is empty; send a non-empty prompt")
    return value


def stop_strings(arr: np.ndarray | None, name: str) -> list[str]:
    """Stop strings: count, then each one's bytes and the total, then strict UTF-8; empty strings are dropped."""
    if arr is None:
        return []
    if arr.size > MAX_STOP_WORDS:
        raise RequestError(f"{name} has {arr.size} entries > {MAX_STOP_WORDS}; send at most {MAX_STOP_WORDS} stop "
                           "strings")
    raw = arr.reshape(-1).tolist()
    sizes = [len(w) if isinstance(w, bytes) else len(str(w).encode("utf-8")) for w in raw]
    if sizes and max(sizes) > MAX_STOP_WORD_BYTES:
        raise RequestError(f"{name}[{sizes.index(max(sizes))}] has {max(sizes)} bytes > {MAX_STOP_WORD_BYTES}; "
                           "shorten it")
    if sum(sizes) > MAX_STOP_TOTAL_BYTES:
        raise RequestError(f"{name} holds {sum(sizes)} bytes > {MAX_STOP_TOTAL_BYTES} in all; send fewer or shorter "
                           "stop strings")
    words = [_utf8(w, f"{name}[{i}]") for i, w in enumerate(raw)]
    return [w for w in words if w != ""]


def token_id(value: Any, name: str, vocab: int, allow_none_id: bool = False) -> int:
    """A token id in [0, vocab); with `allow_none_id`, -1 too (end_id -1: no token ends generation)."""
    v = int(value)
    low = -1 if allow_none_id else 0
    if not low <= v < vocab:
        more = " or -1 (no end token)" if allow_none_id else ""
        raise RequestError(f"{name}={v} is out of range: token ids must be in [0, {vocab}){more} (the model's "
                           "vocabulary)")
    return v


def word_ids(arr: np.ndarray, name: str, vocab: int) -> list[list[int]]:
    """TensorRT-LLM's [1, 2, L] (or [2, L]) word list: L bounded, offsets -1-padded and increasing, ids in the
    vocabulary (upstream preprocessing `_to_word_list_format` writes them so)."""
    if arr.ndim == 3 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim != 2 or arr.shape[0] != 2:
        raise RequestError(f"{name} has shape {list(arr.shape)}; send [1, 2, L]: ids, then -1-padded end offsets")
    width = arr.shape[1]
    if width > MAX_WORD_IDS:
        raise RequestError(f"{name} holds {width} ids > {MAX_WORD_IDS}; send fewer or shorter stop words")
    offsets = [int(o) for o in arr[1].tolist()]
    used = [o for o in offsets if o != -1]
    if len(used) > MAX_STOP_WORDS:
        raise RequestError(f"{name} holds {len(used)} words > {MAX_STOP_WORDS}")
    if offsets[len(used):] != [-1] * (width - len(used)) or any(
            not 0 < b <= width or b <= a for a, b in zip([0, *used], used)):
        raise RequestError(f"{name}: end offsets {used} must increase within 1..{width}, then -1 padding")
    end = used[-1] if used else 0
    ids = [int(x) for x in arr[0, :end].tolist()]
    for i, t in enumerate(ids):
        if not 0 <= t < vocab:
            raise RequestError(f"{name}[0][{i}]={t} is out of range: token ids must be in [0, {vocab})")
    words, start = [], 0
    for e in used:
        words.append(ids[start:e])
        start = e
    return words
