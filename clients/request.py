"""What the clients send and receive: a ready-to-send `Request` built from the model's schema, the responses'
text and speculative-decoding counters read straight from Triton's raw wire bytes, and per-request stats."""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import tritonclient.grpc as grpcclient

from clients import schema as sch
from clients.schema import Schema


@dataclass
class Chunk:
    """One response: its text (the new text when streaming), arrival time (time.perf_counter()) and index."""

    text: str
    time: float
    index: int


@dataclass
class GenerationStats:
    """Timing and speculative-decoding statistics of one request (times are time.perf_counter() seconds)."""

    start: float
    streamed: bool
    first_response: float | None = None
    end: float | None = None
    responses: int = 0
    last_response: float | None = None  # O(1) bookkeeping per response: the reports need first and last only
    acceptance_rate: float | None = None
    accepted_draft_tokens: int | None = None
    draft_tokens: int | None = None
    request_id: str | None = None  # the id the request was sent with (new_request_id); set when it is sent
    stop_key: str | None = None  # the secret its stop presents (new_stop_key); set when it is sent
    output_tokens: int | None = None  # the server's own count, where it reports one (OpenAI usage); else counted

    @property
    def ttft(self) -> float | None:
        return None if self.first_response is None else self.first_response - self.start

    @property
    def e2e(self) -> float | None:
        return None if self.end is None else self.end - self.start


@dataclass
class Generation:
    text: str
    stats: GenerationStats


@dataclass(frozen=True)
class Request:
    """A ready-to-send request: tritonclient inputs and requested outputs for one prompt. It only reads its
    inputs when sent, so one Request can be sent any number of times, also concurrently (the load tester does);
    hence no request id here: every send gets a new one (new_request_id)."""

    model: str
    inputs: list[grpcclient.InferInput]
    outputs: list[grpcclient.InferRequestedOutput]  # empty: all of the model's outputs
    stream: bool
    perf: bool
    cumulative: bool = False  # every response carries the whole text so far (the llmapi model), not a new chunk


def build_request(
    schema: Schema, prompt: str, max_tokens: int, *, stream: bool, perf: bool | None = None, **sampling: Any
) -> Request:
    """Inputs for `prompt` (validated against the schema). `sampling` keys are input names of the model
    (temperature, top_p, top_k, seed, stop_words, end_id, pad_id, ...). `perf=None` asks for speculative stats when
    the model offers them. Non-streamed requests exclude the prompt from the output when the model lets us."""
    if max_tokens < 1:
        raise sch.SchemaError(f"max_tokens={max_tokens}: must be >= 1")
    d = schema.dialect
    values: dict[str, Any] = {sch.PROMPT: prompt, d.max_tokens: max_tokens}
    schema.require(sch.PROMPT, "the prompt")
    schema.require(d.max_tokens, "max_tokens")
    if stream or d.stream in schema.inputs:
        schema.require(d.stream, "streaming")
        values[d.stream] = stream
    if perf is None:
        perf = schema.has_perf_metrics
    if perf:
        schema.require(d.perf_flag, "speculative-decoding statistics")
        values[d.perf_flag] = True
    if not stream and d.exclude_input in schema.inputs:
        values[d.exclude_input] = True
    values.update({d.input_name(k): v for k, v in sampling.items()})
    arrays = schema.encode(values)
    inputs = []
    for name, arr in arrays.items():
        t = grpcclient.InferInput(name, list(arr.shape), schema.inputs[name].datatype)
        t.set_data_from_numpy(arr)
        inputs.append(t)
    wanted = [sch.TEXT_OUTPUT, *(sch.PERF_OUTPUTS if perf else ())]
    # No requested outputs means every output of the model (triton-inference-server/common
    # protobuf/grpc_service.proto, ModelInferRequest.outputs: "if not specified all outputs produced by the model
    # will be returned"). Naming them costs a protobuf message each on every request, so name them only to ask
    # for fewer than all (the ensemble contract's outputs are exactly text_output + the perf outputs).
    all_outputs = set(wanted) == set(schema.outputs)
    outputs = [] if all_outputs else [grpcclient.InferRequestedOutput(n) for n in wanted]
    return Request(schema.model, inputs, outputs, stream, perf, d.cumulative_text)


def raw_outputs(result: grpcclient.InferResult) -> dict[str, bytes]:
    """Output name -> raw little-endian bytes of one response (Triton's gRPC server fills raw_output_contents)."""
    resp = result.get_response()
    return {o.name: resp.raw_output_contents[i] for i, o in enumerate(resp.outputs)}


def bytes_elements(raw: bytes) -> list[bytes]:
    """Elements of a serialized BYTES tensor: each is a 4-byte little-endian length, then that many bytes."""
    out, i = [], 0
    while i + 4 <= len(raw):
        n = int.from_bytes(raw[i : i + 4], "little")
        out.append(raw[i + 4 : i + 4 + n])
        i += 4 + n
    return out


def text_bytes(result: grpcclient.InferResult) -> bytes:
    """UTF-8 bytes of one response's text_output, undecoded. Reads the raw bytes directly: tritonclient's as_numpy
    builds numpy object arrays and was the largest per-response client cost (bench/bench_client.py)."""
    resp = result.get_response()
    if resp.raw_output_contents:
        for i, out in enumerate(resp.outputs):  # absent in an empty final response
            if out.name == sch.TEXT_OUTPUT:
                return b"".join(bytes_elements(resp.raw_output_contents[i]))
        return b""
    arr = result.as_numpy(sch.TEXT_OUTPUT)  # a server that sends typed contents instead of raw bytes
    return b"" if arr is None else b"".join(v for v in arr.reshape(-1))


def decode_text(pieces: list[bytes]) -> str:
    """The text of a request's responses, decoded once: cheaper than decoding every response, and a character
    whose UTF-8 bytes are split across two responses decodes whole instead of as two U+FFFD."""
    return b"".join(pieces).decode("utf-8", errors="replace")


def note_response(stats: GenerationStats, now: float) -> None:
    if stats.first_response is None:
        stats.first_response = now
    stats.responses += 1
    stats.last_response = now


def read_response(result: grpcclient.InferResult, stats: GenerationStats, now: float) -> str:
    """Text of one response (for callers that show every chunk); records its arrival in the stats."""
    note_response(stats, now)
    return text_bytes(result).decode("utf-8", errors="replace")


def _number(raw: bytes, datatype: str, kind: str) -> float:
    """One FP32 / INT32 scalar, little-endian (Triton's raw wire format), or one that came as a string (the llmapi
    model sends its perf outputs in text_output's dtype)."""
    if datatype == "BYTES":
        return float(bytes_elements(raw)[0])
    return struct.unpack("<f", raw[:4])[0] if kind == "f" else int.from_bytes(raw[:4], "little", signed=True)


def read_perf(result: grpcclient.InferResult, stats: GenerationStats) -> None:
    """Speculative counters of the request's last response (they are cumulative, so the last one is the total);
    read once per request, not per response."""
    resp = result.get_response()
    if resp.raw_output_contents:
        raw = raw_outputs(result)
        types = {o.name: o.datatype for o in resp.outputs}
        if any(types.get(n) == "BYTES" for n in sch.PERF_OUTPUTS):
            rate_b, acc_b, drafted_b = (raw.get(n) for n in sch.PERF_OUTPUTS)
            if acc_b is not None and drafted_b is not None:
                stats.accepted_draft_tokens = int(_number(acc_b, types[sch.ACCEPTED_DRAFT], "i"))
                stats.draft_tokens = int(_number(drafted_b, types[sch.DRAFT_TOKENS], "i"))
                stats.acceptance_rate = None if rate_b is None else _number(rate_b, types[sch.ACCEPTANCE_RATE], "f")
            return
        rate_b, acc_b, drafted_b = (raw.get(n) for n in sch.PERF_OUTPUTS)
        if acc_b is not None and drafted_b is not None:
            stats.accepted_draft_tokens = int.from_bytes(acc_b[:4], "little", signed=True)
            stats.draft_tokens = int.from_bytes(drafted_b[:4], "little", signed=True)
            stats.acceptance_rate = None if rate_b is None else struct.unpack("<f", rate_b[:4])[0]
        return
    rate, acc, drafted = (result.as_numpy(n) for n in sch.PERF_OUTPUTS)
    if acc is not None and drafted is not None:
        stats.accepted_draft_tokens = int(acc.reshape(-1)[0])
        stats.draft_tokens = int(drafted.reshape(-1)[0])
        stats.acceptance_rate = None if rate is None else float(rate.reshape(-1)[0])


def sampling_of(values: Mapping[str, Any | None]) -> dict[str, Any]:
    """Drop unset (None) sampling options, so only what the user chose is sent (the server applies defaults)."""
    return {k: v for k, v in values.items() if v is not None}
