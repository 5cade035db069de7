"""Postprocessing's half of the ensemble's one cancellation mechanism: tensorrtllm_backend's `stop` request by id.

An ensemble client ends its request by sending the LLM model a `stop` with the request's id (clients/aio.py). A
streaming client that goes away without sending it is seen by no LLM model: Triton 2.51 does not pass an ensemble
client's cancellation to a composing step already running (core r24.10 src/ensemble_scheduler/ensemble_scheduler.cc
`EnsembleContext::ScheduleSteps` cancels only the steps scheduled after it). The postprocessing steps of that
sequence's next responses are such later steps: they arrive cancelled, and postprocessing sends the same `stop`, with
the same id, on the client's behalf (the ensemble gives its composing requests the client's request id).

Only ids a stop may name are relayed (models/bounds.py `stoppable`: 128 random bits, the rule every LLM model of
ours applies), and each id once (the recent ones are remembered): the later cancelled steps of a sequence send
nothing. A request without such an id is not relayed; on the reference backend `triton.request_deadline_s` bounds it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from triton_repo.models import bounds, llm_io

RECENT = 1024  # ids relayed, remembered so the later cancelled steps of a sequence send nothing


class StopRelay:
    """Sends the LLM model a `stop` for each cancelled request it observes, once per id."""

    def __init__(self, pb_utils: Any, llm_model: str) -> None:
        self.pb_utils, self.llm_model = pb_utils, llm_model
        self.relayed: OrderedDict[str, None] = OrderedDict()

    def should_relay(self, request_id: str, is_cancelled: Callable[[], bool]) -> bool:
        """A cancelled step of a request whose id a stop may name, not relayed yet; remembers it. `is_cancelled` is
        asked last: in the python backend it is a round trip to the server process."""
        if not bounds.stoppable(request_id) or request_id in self.relayed or not is_cancelled():
            return False
        self.relayed[request_id] = None
        if len(self.relayed) > RECENT:
            self.relayed.popitem(last=False)
        return True

    def observe(self, request: Any) -> bool:
        """Relay `request`'s cancellation if it is one; True when a stop was sent and answered without error."""
        request_id = request.request_id()
        if not self.should_relay(request_id, request.is_cancelled):
            return False
        pb = self.pb_utils
        stop = pb.InferenceRequest(model_name=self.llm_model, inputs=llm_io.stop_request_tensors(pb),
                                   requested_output_names=[], request_id=request_id)
        try:
            for resp in stop.exec(decoupled=True):
                if resp.has_error():
                    raise RuntimeError(resp.error().message())
        except Exception as e:  # the LLM model refused it: nothing more postprocessing can do for that sequence
            pb.Logger.log_warn(f"postprocessing: the stop request for {request_id!r} failed: {e}")
            return False
        return True
