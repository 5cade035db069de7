"""Postprocessing's stop relay (triton_repo/models/stop_relay.py) without a server: which cancelled steps it relays,
once per id, and what it does when the LLM model refuses. On the real server: tests/test_cancel_paths.py and
tests/test_triton_llmapi_model.py."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from triton_repo.models import stop_relay


@dataclass
class _Response:
    message: str = ""

    def has_error(self) -> bool:
        return bool(self.message)

    def error(self) -> Any:
        return type("E", (), {"message": lambda _: self.message})()


@dataclass
class _Pb:
    """The parts of triton_python_backend_utils the relay uses; records each stop request it is asked to send."""

    answer: str = ""
    sent: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        pb = self

        class InferenceRequest:
            def __init__(self, **kw: Any) -> None:
                self.kw = kw

            def exec(self, decoupled: bool) -> list[_Response]:
                assert decoupled
                pb.sent.append(self.kw)
                return [_Response(pb.answer)]

        class Logger:
            @staticmethod
            def log_warn(msg: str) -> None:
                pb.warnings.append(msg)

        self.InferenceRequest, self.Logger = InferenceRequest, Logger

    @staticmethod
    def Tensor(name: str, value: np.ndarray[Any, Any]) -> tuple[str, np.ndarray[Any, Any]]:
        return name, value


@dataclass
class _Request:
    rid: str
    cancelled: bool = True

    def request_id(self) -> str:
        return self.rid

    def is_cancelled(self) -> bool:
        return self.cancelled


def test_relays_a_cancelled_step_once_per_id_as_a_stop_request_to_the_llm_model() -> None:
    pb, rid = _Pb(), f"r7-{uuid.uuid4().hex}"
    relay = stop_relay.StopRelay(pb, "tensorrt_llm")
    assert relay.observe(_Request(rid)) is True
    assert relay.observe(_Request(rid)) is False  # the sequence's later cancelled steps send nothing
    [sent] = pb.sent
    assert sent["model_name"] == "tensorrt_llm" and sent["request_id"] == rid and sent["requested_output_names"] == []
    inputs = dict(sent["inputs"])
    assert inputs["stop"].dtype == bool and inputs["stop"].tolist() == [[True]]
    assert set(inputs) == {"input_ids", "input_lengths", "request_output_len", "stop"}


def test_does_not_relay_steps_that_are_not_cancelled_or_ids_a_stop_may_not_name() -> None:
    pb = _Pb()
    relay = stop_relay.StopRelay(pb, "tensorrt_llm")
    assert relay.observe(_Request(uuid.uuid4().hex, cancelled=False)) is False
    for rid in ("", "1", "req-7", "a" * 31, "g" * 32):
        assert relay.observe(_Request(rid)) is False
    assert pb.sent == []


def test_a_refused_stop_is_logged_and_not_retried() -> None:
    pb, rid = _Pb(answer="stop: no such request"), uuid.uuid4().hex
    relay = stop_relay.StopRelay(pb, "tensorrt_llm")
    assert relay.observe(_Request(rid)) is False
    assert relay.observe(_Request(rid)) is False
    assert len(pb.sent) == 1
    assert pb.warnings == [f"postprocessing: the stop request for {rid!r} failed: stop: no such request"]


def test_remembers_only_the_recent_ids() -> None:
    relay = stop_relay.StopRelay(_Pb(), "tensorrt_llm")
    ids = [uuid.uuid4().hex for _ in range(stop_relay.RECENT + 1)]
    assert all(relay.should_relay(i, lambda: True) for i in ids)
    assert len(relay.relayed) == stop_relay.RECENT
    assert relay.should_relay(ids[0], lambda: True)  # forgotten, so relayed again (harmless for a finished id)
    assert not relay.should_relay(ids[-1], lambda: True)


def test_asks_whether_the_step_is_cancelled_only_for_ids_it_could_relay() -> None:
    """is_cancelled() is a round trip to the server in the python backend: not paid for ids no stop may name, nor
    for ids already relayed."""
    asked: list[str] = []
    relay = stop_relay.StopRelay(_Pb(), "tensorrt_llm")

    def cancelled(rid: str) -> bool:
        asked.append(rid)
        return True

    rid = uuid.uuid4().hex
    assert not relay.should_relay("req-7", lambda: cancelled("req-7"))
    assert relay.should_relay(rid, lambda: cancelled(rid))
    assert not relay.should_relay(rid, lambda: cancelled(rid))
    assert asked == [rid]
