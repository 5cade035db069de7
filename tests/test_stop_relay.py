"""Postprocessing's stop relay (triton_repo/models/stop_relay.py) and the ownership rules (models/ownership.py) without
a server: which cancelled steps it relays, once per (id, key) and window, and what it does when the LLM model
refuses; which ids and keys are refused. On the real server: tests/test_cancel_paths.py and
tests/test_triton_llmapi_model.py."""

from __future__ import annotations

import json
import secrets
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from triton_repo.models import ownership, stop_relay

UUID_HEX = "9b1d7c4e2f6a48b0a3c5d7e9f1b2c4d6"  # a uuid4().hex-shaped id, fixed so every test run collects the same ids


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

    @staticmethod
    def get_input_tensor_by_name(request: Any, name: str) -> Any:
        """The step's SEQUENCE_HANDLE input (the LLM model's handle), when the request carries one."""
        handle = getattr(request, "handle", None)
        if name != "SEQUENCE_HANDLE" or handle is None:
            return None
        arr = np.array([[handle]], dtype=object)
        return type("T", (), {"as_numpy": lambda _: arr})()


@dataclass
class _Request:
    rid: str
    cancelled: bool = True
    key: str | None = field(default_factory=lambda: secrets.token_hex(16))
    handle: bytes | None = None  # the LLM model's handle for the request, on its postprocessing steps

    def request_id(self) -> str:
        return self.rid

    def is_cancelled(self) -> bool:
        return self.cancelled

    def parameters(self) -> str:
        return json.dumps({} if self.key is None else {ownership.STOP_KEY: self.key})


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_relays_a_cancelled_step_once_as_a_stop_request_with_the_requests_own_key() -> None:
    pb, req = _Pb(), _Request(f"r7-{uuid.uuid4().hex}")
    relay = stop_relay.StopRelay(pb, "tensorrt_llm")
    assert relay.observe(req) is True
    assert relay.observe(req) is False  # the sequence's later cancelled steps send nothing
    [sent] = pb.sent
    assert sent["model_name"] == "tensorrt_llm" and sent["request_id"] == req.rid
    assert sent["requested_output_names"] == []
    assert sent["parameters"] == {"stop_key": req.key}
    inputs = dict(sent["inputs"])
    assert inputs["stop"].dtype == bool and inputs["stop"].tolist() == [[True]]
    assert set(inputs) == {"input_ids", "input_lengths", "request_output_len", "stop"}


@pytest.mark.parametrize("rid", ["", "1", "req-7", "a" * 31, UUID_HEX, "x" * 128])
def test_ids_of_any_shape_are_relayed_with_their_key_and_two_owners_of_one_id_are_two_requests(rid: str) -> None:
    """Ownership is the key, not the id: short, guessable or shared ids are relayed for each owner separately."""
    pb = _Pb()
    relay = stop_relay.StopRelay(pb, "tensorrt_llm")
    first, second = _Request(rid), _Request(rid)
    assert relay.observe(first) and relay.observe(second) and not relay.observe(first)
    assert [s["parameters"]["stop_key"] for s in pb.sent] == [first.key, second.key]


def test_does_not_relay_steps_not_cancelled_without_a_key_or_with_an_id_or_key_over_the_bound() -> None:
    pb = _Pb()
    relay = stop_relay.StopRelay(pb, "tensorrt_llm")
    assert relay.observe(_Request(uuid.uuid4().hex, cancelled=False)) is False
    assert relay.observe(_Request(uuid.uuid4().hex, key=None)) is False
    for rid in ("x" * 129, "é" * 65, "x" * 8_000_000):
        assert relay.observe(_Request(rid)) is False
    assert relay.observe(_Request("1", key="k" * 129)) is False
    assert pb.sent == [] and relay.relayed == {}


def test_a_refused_stop_is_logged_and_not_retried_at_once() -> None:
    pb, req = _Pb(answer="stop: no such request"), _Request(uuid.uuid4().hex)
    relay = stop_relay.StopRelay(pb, "tensorrt_llm")
    assert relay.observe(req) is False
    assert relay.observe(req) is False
    assert len(pb.sent) == 1
    assert pb.warnings == [f"postprocessing: the stop request for {req.rid!r} failed: stop: no such request"]


def test_a_relayed_pair_is_forgotten_after_its_window_so_a_retry_with_the_same_id_and_key_is_stopped_too() -> None:
    """A client that retries with the same id (and even the same key) and abandons again: each abandoned attempt
    is relayed, never remembered forever (that leaked the retry's slot until the request deadline)."""
    clock, pb = _Clock(), _Pb()
    relay = stop_relay.StopRelay(pb, "tensorrt_llm", clock=clock)
    req = _Request("retry-me", key="k" * 32)
    for attempt in range(3):
        assert relay.observe(req), attempt
        clock.now += 0.5
        assert not relay.observe(req)  # the same attempt's later steps
        clock.now += stop_relay.RELAYED_FOR_S
    assert len(pb.sent) == 3 and len(relay.relayed) == 1


def test_remembers_at_most_recent_pairs() -> None:
    relay = stop_relay.StopRelay(_Pb(), "tensorrt_llm", clock=lambda: 5.0)
    ids = [uuid.uuid4().hex for _ in range(stop_relay.RECENT + 1)]
    assert all(relay.should_relay(i, "k" * 32, lambda: True) for i in ids)
    assert len(relay.relayed) == stop_relay.RECENT
    assert relay.should_relay(ids[0], "k" * 32, lambda: True)  # forgotten, so relayed again (harmless)
    assert not relay.should_relay(ids[-1], "k" * 32, lambda: True)


def test_asks_whether_the_step_is_cancelled_only_for_requests_it_could_relay() -> None:
    """is_cancelled() is a round trip to the server in the python backend: not paid for requests without a key,
    nor for pairs relayed just now."""
    asked: list[str] = []
    relay = stop_relay.StopRelay(_Pb(), "tensorrt_llm")

    def cancelled(rid: str) -> bool:
        asked.append(rid)
        return True

    rid, key = uuid.uuid4().hex, secrets.token_hex(16)
    assert not relay.should_relay("req-7", None, lambda: cancelled("req-7"))
    assert relay.should_relay(rid, key, lambda: cancelled(rid))
    assert not relay.should_relay(rid, key, lambda: cancelled(rid))
    assert asked == [rid]


class _Owned:
    def __init__(self, rid: str, params: Any) -> None:
        self.rid, self.params = rid, params

    def request_id(self) -> str:
        return self.rid

    def parameters(self) -> str:
        return self.params if isinstance(self.params, str) else json.dumps(self.params)


@pytest.mark.parametrize(("rid", "params", "found"), [
    ("x" * 129, {}, "request id has 129 bytes > 128"),
    ("é" * 65, {}, "request id has 130 bytes > 128"),
    ("x" * 8_000_000, {"stop_key": "k" * 32}, "request id has 8000000 bytes > 128"),
    ("1", {"stop_key": "short"}, "parameter stop_key is 5 characters; send a string of 16 to 128"),
    ("1", {"stop_key": "k" * 129}, "parameter stop_key is 129 characters"),
    ("1", {"stop_key": 12345678901234567890}, "parameter stop_key is a int"),
    ("1", {"stop_key": True}, "parameter stop_key is a bool"),
])
def test_ids_and_stop_keys_over_their_bounds_are_refused_naming_the_limit(rid: str, params: Any, found: str) -> None:
    problem = ownership.problem(_Owned(rid, params))
    assert problem is not None and found in problem


@pytest.mark.parametrize(("rid", "params"), [
    ("", {}), ("1", {}), ("x" * 128, {}), ("é" * 64, {"stop_key": "k" * 16}), ("r", {"stop_key": "k" * 128}),
    ("r", "not json"), ("r", "[1, 2]"), ("r", {"other": 1}),
])
def test_ids_and_keys_within_their_bounds_pass(rid: str, params: Any) -> None:
    assert ownership.problem(_Owned(rid, params)) is None


def test_owns_needs_both_keys_and_equality() -> None:
    k = secrets.token_hex(16)
    assert ownership.owns(k, k)
    assert not ownership.owns(k, secrets.token_hex(16))
    assert not ownership.owns(None, k) and not ownership.owns(k, None) and not ownership.owns(None, None)


@pytest.mark.parametrize("key", [None, "k" * 32])
@pytest.mark.parametrize("rid", ["", "1", UUID_HEX])
def test_a_step_carrying_the_llm_models_handle_is_relayed_with_it_whatever_the_clients_key(rid: str,
                                                                                          key: str | None) -> None:
    """The handle (contract.HANDLE_INPUT) names exactly one request: the stop presents it, with or without the
    client's own stop_key; a malformed handle (too short, too long, not bytes) is not one."""
    pb = _Pb()
    relay = stop_relay.StopRelay(pb, "tensorrt_llm")
    handle = secrets.token_hex(16)
    assert relay.observe(_Request(rid, key=key, handle=handle.encode()))
    assert pb.sent[-1]["parameters"] == {ownership.STOP_KEY: handle} and pb.sent[-1]["request_id"] == rid
    for bad in (b"short", b"x" * (ownership.MAX_KEY_CHARS + 1)):
        relay2 = stop_relay.StopRelay(_Pb(), "tensorrt_llm")
        got = relay2.observe(_Request(rid, key=key, handle=bad))
        assert got is (key is not None)  # only the client's own key, if any, is left to present
