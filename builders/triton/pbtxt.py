"""Protobuf helpers for Triton `config.pbtxt` files, shared by the ensemble renderer (render.py) and the llmapi
renderer (render_llmapi.py)."""

from __future__ import annotations

from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from builders.config import BuildConfig
from triton_repo import contract as C


class RenderError(ValueError):
    """A value the repository needs is missing or invalid; the message names it and the fix."""


def _io(msg: Any, t: C.Tensor) -> None:
    msg.name = t.name
    msg.data_type = mc.DataType.Value(t.dtype)
    msg.dims.extend(t.dims)


def _add_inputs(
    cfg: mc.ModelConfig, tensors: tuple[C.Tensor, ...], *, cpp: bool = False, checked_by_model: tuple[str, ...] = ()
) -> None:
    """`cpp`: the C++ tensorrtllm backend's input attributes (scalars reshaped to [], ragged batching).
    `checked_by_model`: required inputs declared optional because a python model refuses their absence."""
    for t in tensors:
        i = cfg.input.add()
        _io(i, t)
        i.optional = t.optional or t.name in checked_by_model
        if cpp and tuple(t.dims) == (1,):
            i.reshape.SetInParent()  # `reshape: { shape: [ ] }`
        if cpp and t.name in C.CPP_RAGGED_INPUTS:
            i.allow_ragged_batch = True


def _add_outputs(cfg: mc.ModelConfig, tensors: tuple[C.Tensor, ...]) -> None:
    for t in tensors:
        _io(cfg.output.add(), t)


def _params(
    cfg: mc.ModelConfig, params: dict[str, str | int | float | bool | None], empty_ok: tuple[str, ...] = ()
) -> None:
    """`empty_ok`: parameters whose empty value is meaningful (the backend reads them and treats "" as off)."""
    for k, v in params.items():
        if v is None or (isinstance(v, str) and ((v == "" and k not in empty_ok) or "${" in v)):
            raise RenderError(f"model {cfg.name}: parameter {k} has no value ({v!r})")
        text = ("true" if v else "false") if isinstance(v, bool) else str(v)
        cfg.parameters[k].string_value = text


def _base(name: str, max_batch_size: int, *, backend: str | None = None, platform: str | None = None) -> mc.ModelConfig:
    cfg = mc.ModelConfig(name=name, max_batch_size=max_batch_size)
    if backend:
        cfg.backend = backend
    if platform:
        cfg.platform = platform
    return cfg


def _instances(cfg: mc.ModelConfig, count: int) -> None:
    g = cfg.instance_group.add()
    g.kind = mc.ModelInstanceGroup.KIND_CPU
    g.count = count


def _decoupled(cfg: mc.ModelConfig, on: bool) -> None:
    cfg.model_transaction_policy.decoupled = on


def _batching(cfg: mc.ModelConfig, bc: BuildConfig, queue: bool) -> None:
    db = cfg.dynamic_batching
    db.max_queue_delay_microseconds = bc.triton.max_queue_delay_microseconds
    if queue:
        # Requests beyond the queue are refused by Triton with UNAVAILABLE ("Exceeds maximum queue size").
        db.default_queue_policy.max_queue_size = bc.triton.max_queue_size


def to_text(cfg: mc.ModelConfig) -> str:
    return text_format.MessageToString(cfg)
