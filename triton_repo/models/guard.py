"""Internal models answer only the server's own models, unless the build exposes them (triton.expose_internal_models).

Triton 2.51 has no per-model access control, and a python model cannot tell an ensemble step from a client's direct
call. So every start of the server gets a fresh secret (triton_repo/launch.py, `secrets.token_hex(32)`), handed to
the python-backend stubs through the server's environment (`KEY_ENV`; the stubs are started by tritonserver and
inherit its environment). The secret itself never leaves the server's processes:

- The BLS model (tensorrt_llm_bls) holds the secret and sends it in the request parameters (`PARAMETER`) of its
  LLM and stop requests (pb_utils.InferenceRequest `parameters=`).
- The ensemble cannot add parameters to its steps, so its first step, preprocessing, emits `TOKEN` = HMAC-SHA256 of
  the LLM-bound tensors it produced under the secret: a token valid for exactly those tensors. A client calling
  preprocessing directly gets a token for the LLM request the ensemble would have run for that same text, nothing
  more: it cannot forge a token for other ids or limits, or learn the secret (HMAC is one-way). The
  ensemble does not declare the token as one of its outputs, so its clients never see it.
- The python LLM models (`tensorrt_llm`, engine.backend reference and pytorch) refuse every request that carries
  neither, comparing in constant time (hmac.compare_digest). The reference model's `stop` requests keep their own
  rule instead: they reach only the requests sent with their id and `stop_key` (models/ownership.py),
  and our clients (and postprocessing, for a streaming client that went away: models/stop_relay.py) send them to
  end an ensemble request.

Preprocessing stays callable: it is cheap, every input is bounded before any work (models/bounds.py), and what it
returns is the token above. The C++ tensorrtllm backend cannot check anything: with engine.backend tensorrt, only
the entry models may be exposed by the gateway in front of the server (docs/deploy.md, "Internal models").
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from typing import Any

import numpy as np

from triton_repo import contract as C
from triton_repo.exposure import INTERNAL_KEY_ENV as KEY_ENV

PARAMETER = "eagle_internal_key"
TOKEN = "INTERNAL_TOKEN"  # preprocessing output and python LLM input
TOKEN_TENSOR = "_INTERNAL_TOKEN"  # its name inside the ensemble
MIN_KEY_CHARS = 32
# (preprocessing output, LLM input) pairs the token covers: every tensor preprocessing hands the LLM model.
BOUND = tuple(sorted(
    (pre, llm) for pre, mid in C.PREPROCESSING_OUTPUT_MAP.items() for llm, src in C.LLM_INPUT_MAP.items() if src == mid
))


class Unset(RuntimeError):
    """The server was not started with a secret: the internal models cannot tell their callers apart."""


def load_key(guarded: bool, model: str) -> bytes | None:
    """The secret from the environment when `guarded` (None when the build exposes internal models)."""
    if not guarded:
        return None
    key = os.environ.get(KEY_ENV, "")
    if len(key) < MIN_KEY_CHARS:
        raise Unset(f"model {model}: the environment has no {KEY_ENV} of at least {MIN_KEY_CHARS} characters; start "
                    "the server with triton_repo/launch.py (it sets a fresh one at each start), or build with "
                    "triton.expose_internal_models: true to let clients call the internal models")
    return key.encode()


def token(key: bytes, arrays: list[np.ndarray]) -> str:
    """HMAC-SHA256 under `key` of the arrays' dtype, shape and bytes, in order (hex)."""
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for a in arrays:
        a = np.ascontiguousarray(a)
        mac.update(f"{a.dtype.str}:{','.join(map(str, a.shape))};".encode())
        mac.update(a.tobytes())
    return mac.hexdigest()


def token_tensor(pb_utils: Any, key: bytes, outputs: dict[str, np.ndarray]) -> Any:
    """Preprocessing's `TOKEN` output for its LLM-bound `outputs` (by preprocessing output name)."""
    value = token(key, [outputs[pre] for pre, _ in BOUND])
    return pb_utils.Tensor(TOKEN, np.array([[value.encode("ascii")]], dtype=object))


def refusal(model: str, entry_models: str) -> str:
    return (f"model {model!r} is internal to this server and answers only its entry models; send the request to "
            f"{entry_models} (a build with triton.expose_internal_models: true lets clients call it directly)")


def allowed(pb_utils: Any, request: Any, key: bytes) -> bool:
    """True when `request` carries the secret in its parameters, or a token matching its LLM-bound inputs."""
    given = _parameter(request)
    if given is not None:
        return hmac.compare_digest(given.encode("utf-8", "replace"), key)
    t = pb_utils.get_input_tensor_by_name(request, TOKEN)
    if t is None:
        return False
    sent = t.as_numpy().reshape(-1)
    if sent.size != 1 or not isinstance(sent[0], bytes):
        return False
    arrays = []
    for _, llm in BOUND:
        x = pb_utils.get_input_tensor_by_name(request, llm)
        if x is None:
            return False
        arrays.append(x.as_numpy())
    return hmac.compare_digest(sent[0], token(key, arrays).encode("ascii"))


def _parameter(request: Any) -> str | None:
    """`PARAMETER` of the request's parameters (python backend: a JSON object as a string), or None."""
    try:
        params = json.loads(request.parameters() or "{}")
    except (TypeError, ValueError):
        return None
    value = params.get(PARAMETER) if isinstance(params, dict) else None
    return value if isinstance(value, str) else None
