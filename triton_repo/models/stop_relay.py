"""Postprocessing's half of the ensemble's one cancellation mechanism: tensorrtllm_backend's `stop` request by id.

An ensemble client ends its request by sending the LLM model a `stop` with the request's id (clients/aio.py). A
streaming client that goes away without sending it is seen by no LLM model: Triton 2.51 does not pass an ensemble
client's cancellation to a composing step already running (core r24.10 src/ensemble_scheduler/ensemble_scheduler.cc
`EnsembleContext::ScheduleSteps` cancels only the steps scheduled after it). The postprocessing steps of that
sequence's next responses are such later steps: they arrive cancelled, and postprocessing sends the same `stop`, with
the same id, on the client's behalf (the ensemble gives its composing requests the client's request id).

A stop reaches only the request sent with its id and its `stop_key` request parameter (models/ownership.py): the
relay presents the LLM model's handle for that request when the step carries one (contract.HANDLE_INPUT: the key the
python LLM model holds for it, the client's or one it made when the client sent none), else the client's own key
(the ensemble passes its request's parameters to every step). A request with neither (the C++ backend, no key) is
not relayed; on the reference backend `triton.request_deadline_s` bounds it. The relay keys what it remembers by
(id, key), so two requests sharing an id are two requests, and it remembers a relayed pair for RELAYED_FOR_S only:
long enough that the sequence's few later cancelled steps send nothing, short enough that a request retried with the
same id and key, abandoned again, is stopped too (a pair remembered forever leaked that retry's slot until the
deadline). At most RECENT pairs of at most ownership.MAX_ID_BYTES + MAX_KEY_CHARS bytes each are held.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from triton_repo import contract as C
from triton_repo.models import llm_io, ownership

RECENT = 1024  # (id, key) pairs relayed, remembered so the later cancelled steps of a sequence send nothing
RELAYED_FOR_S = 2.0  # how long a relayed pair is remembered (a stopped sequence ends at its next step)


def handle_of(pb_utils: Any, request: Any) -> str | None:
    """The LLM model's per-request handle on this step (contract.HANDLE_INPUT), or None when it carries none."""
    t = pb_utils.get_input_tensor_by_name(request, C.HANDLE_INPUT.name)
    if t is None:
        return None
    v = t.as_numpy().reshape(-1)
    lo, hi = ownership.MIN_KEY_CHARS, ownership.MAX_KEY_CHARS
    if v.size != 1 or not isinstance(v[0], bytes) or not lo <= len(v[0]) <= hi:
        return None
    return v[0].decode("ascii", "replace")


class StopRelay:
    """Sends the LLM model a `stop` for each cancelled request it observes, once per (id, key) and RELAYED_FOR_S."""

    def __init__(self, pb_utils: Any, llm_model: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.pb_utils, self.llm_model, self.clock = pb_utils, llm_model, clock
        self.relayed: OrderedDict[tuple[str, str], float] = OrderedDict()  # (id, key) -> when relayed

    def should_relay(self, request_id: str, key: str | None, is_cancelled: Callable[[], bool]) -> bool:
        """A cancelled step of a request with a stop_key, not relayed in the last RELAYED_FOR_S; remembers it.
        `is_cancelled` is asked last: in the python backend it is a round trip to the server process."""
        if key is None or ownership.id_problem(request_id) or len(key) > ownership.MAX_KEY_CHARS:
            return False
        now, pair = self.clock(), (request_id, key)
        while self.relayed and next(iter(self.relayed.values())) <= now - RELAYED_FOR_S:
            self.relayed.popitem(last=False)  # forgotten: its request has ended by now
        if pair in self.relayed or not is_cancelled():
            return False
        self.relayed[pair] = now
        if len(self.relayed) > RECENT:
            self.relayed.popitem(last=False)
        return True

    def observe(self, request: Any) -> bool:
        """Relay `request`'s cancellation if it is one; True when a stop was sent and answered without error. The
        stop presents the LLM model's handle for that request (handle_of), else the client's stop_key."""
        request_id, key = request.request_id(), handle_of(self.pb_utils, request) or ownership.stop_key(request)
        if not self.should_relay(request_id, key, request.is_cancelled):
            return False
        pb = self.pb_utils
        stop = pb.InferenceRequest(model_name=self.llm_model, inputs=llm_io.stop_request_tensors(pb),
                                   requested_output_names=[], request_id=request_id,
                                   parameters={ownership.STOP_KEY: key})
        try:
            for resp in stop.exec(decoupled=True):
                if resp.has_error():
                    raise RuntimeError(resp.error().message())
        except Exception as e:  # the LLM model refused it: nothing more postprocessing can do for that sequence
            pb.Logger.log_warn(f"postprocessing: the stop request for {request_id!r} failed: {e}")
            return False
        return True
