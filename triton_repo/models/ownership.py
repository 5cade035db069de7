"""Who may stop a request: its owner, the client holding the request's `stop_key`, never whoever knows its id.

tensorrtllm_backend's `stop` request names a request by its id alone, and ids are chosen by clients: two clients may
pick the same id, and an id may be guessed. So every python LLM model of ours keys a running request by its id AND
the `stop_key` request parameter it was sent with (a secret the client makes per request: clients/aio.py sends
`secrets.token_hex(16)`), and a `stop` reaches only the requests whose id and key both match. A stop without a key,
or with another key, changes nothing (the same empty answer either way: a stop tells nothing about other requests).
A request sent without a key gets one the model makes, when its config wires the per-request handle
(contract.HANDLE_OUTPUT: a streaming python LLM model in the ensemble); it is written only on the responses that go to
postprocessing, never to an ensemble client, so only postprocessing's relay can stop that request. Otherwise a
keyless request ends by its own stream's cancellation, the request deadline (`triton.request_deadline_s`) or its
length.

The ensemble passes its request's parameters to every step (triton-inference-server/core pull 261), so the LLM model
and postprocessing see the client's key: postprocessing's stop relay (models/stop_relay.py) presents it on behalf
of a streaming client that went away. The BLS model makes a key of its own for each LLM request it sends.

Ids and keys are bounded at the edge (`problem`): a request whose id or key is too long is refused (INVALID_ARGUMENT)
before any work, so no model, relay or server holds megabytes of ids. `pb_utils` is never needed here, so this
module also imports in tests.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from triton_repo.models import capture

STOP_KEY = "stop_key"  # request parameter: the owner's secret for this request
MAX_ID_BYTES = 128  # UTF-8 bytes of a request id
MIN_KEY_CHARS, MAX_KEY_CHARS = 16, 128  # a stop_key: long enough not to be guessed, short enough to hold


def parameters(request: Any) -> dict[str, Any]:
    """The request's parameters (python backend: a JSON object as a string); {} when absent or unreadable."""
    try:
        raw = request.parameters() if hasattr(request, "parameters") else None
        params = json.loads(raw or "{}")
    except (TypeError, ValueError):
        return {}
    return params if isinstance(params, dict) else {}


def stop_key(request: Any) -> str | None:
    """The request's `stop_key` parameter, or None when it has none (or not a string)."""
    value = parameters(request).get(STOP_KEY)
    return value if isinstance(value, str) and value else None


def id_problem(request_id: str) -> str | None:
    """Why a request id is refused (too long), or None. Measured in bytes before anything else looks at it."""
    n = len(request_id.encode("utf-8", "surrogatepass"))
    if n > MAX_ID_BYTES:
        return (f"request id has {n} bytes > {MAX_ID_BYTES}; send an id of at most {MAX_ID_BYTES} bytes (e.g. "
                "uuid4().hex)")
    return None


def problem(request: Any) -> str | None:
    """Why `request`'s id, stop_key or capture opt-out (models/capture.py opt_out_problem) is refused, or None:
    checked first by every client-facing model."""
    rid = request.request_id() or ""
    if found := id_problem(rid):
        return found
    raw = request.parameters() if hasattr(request, "parameters") else None
    if found := capture.opt_out_problem(raw if isinstance(raw, str) else None):
        return found
    value = parameters(request).get(STOP_KEY)
    if value is None:
        return None
    if not isinstance(value, str) or not MIN_KEY_CHARS <= len(value) <= MAX_KEY_CHARS:
        shown = f"{len(value)} characters" if isinstance(value, str) else f"a {type(value).__name__}"
        return (f"parameter {STOP_KEY} is {shown}; send a string of {MIN_KEY_CHARS} to {MAX_KEY_CHARS} characters "
                "only this client knows (e.g. secrets.token_hex(16)), or no stop_key")
    return None


def owns(held: str | None, given: str | None) -> bool:
    """True when a stop presenting `given` may stop a request sent with `held`: both set, equal (constant time)."""
    if held is None or given is None:
        return False
    return hmac.compare_digest(held.encode("utf-8", "replace"), given.encode("utf-8", "replace"))


NO_KEY_MESSAGE = (f"stop: no {STOP_KEY} parameter; a stop reaches only a request sent with the same request id and "
                  f"{STOP_KEY} parameter (a secret of {MIN_KEY_CHARS} to {MAX_KEY_CHARS} characters that its client "
                  "sends with the request and with the stop). Cancel your own stream, or send a stop_key")
