"""Engine limits against what one engine rank can hold: `engine.memory_budget_gib` must cover the target's weights,
its KV cache at the configured limits and one step's logits. Checked at config load, so limits that could never be
served (a server that fails to allocate at load) are refused with the bytes named.

Bytes per rank (tp ranks split weights and KV heads; the arithmetic is exact for the tensors counted), with the
target's shape from its family's row (core/shapes.py: MLA, MoE, hybrid recurrent layers, sliding windows):
  weights  = every parameter (all routed experts, shared experts, dense-first layers, routers; embeddings, untied
             LM head) x weight bytes / tp: the checkpoint's own quantization as TensorRT-LLM reads it, else what
             quantization.weights exports, else the target dtype's size (core/quant.py `weight_bytes`)
  KV/token = per attention layer: 2 x kv_heads x head_dim (dense) or kv_lora_rank + qk_rope_head_dim (MLA), x KV
             bytes / tp (1 byte for an FP8 KV cache); sliding-window layers hold at most their window on TensorRT-LLM;
             recurrent layers (gated delta-net, Mamba-2) hold no KV but a state per sequence (x the target dtype;
             the reference engine's per-token states of one verification are not counted)
  logits   = max_num_tokens x vocab x 4      (one engine step's float32 logits)
The reference engine allocates its KV cache for max_batch_size x max_seq_len tokens up front, in its own layout
(engines/runtime.py: K and V slots for every layer; MLA: its latents in slots of max(kv_lora_rank, qk_rope));
TensorRT-LLM's paged KV cache needs at least one full sequence of max_seq_len tokens.
The draft head's own small KV cache and activations are not counted: the check is a lower bound.
"""

from __future__ import annotations

from typing import Any, Protocol

from builders.published import target_weight_bytes
from builders.kinds import BACKENDS
from core import trees
from core.families import family_of
from core.hfconfig import ModelConfigError, read_config
from core.shapes import ShapeError, TargetShape, shape_of_config


class BuildConfig(Protocol):
    """What the budget reads of builders.config.BuildConfig (a Protocol, so that module and this one import in one
    direction only)."""

    engine: Any
    quantization: Any
    parallel: Any
    target: Any

    def limits(self) -> Any: ...

GIB = 1 << 30
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def weight_bytes(shape: TargetShape, nbytes: int) -> int:
    return shape.params * nbytes


def kv_bytes_per_token(shape: TargetShape, nbytes: int, backend: str = "pytorch") -> int:
    """KV bytes one token takes in TensorRT-LLM's layout, or in the reference engine's (`backend` reference)."""
    return (shape.reference_kv_per_token if BACKENDS[backend].reference_engine else shape.kv_per_token) * nbytes


def _gib(n: int) -> str:
    return f"{n / GIB:,.2f} GiB"


def capacity_problems(cfg: BuildConfig, spec: TargetShape) -> list[str]:
    """Why the engine limits cannot fit `engine.memory_budget_gib` for this target (empty when they can)."""
    e, q = cfg.engine, cfg.quantization
    if e.max_batch_size is None or e.max_seq_len is None:
        return []
    tp = cfg.parallel.tp
    dt = DTYPE_BYTES[cfg.target.dtype]
    weights = target_weight_bytes(cfg, spec, dt) // tp  # the checkpoint's own quantization or the export's
    kv_dt = 1 if q.kv_cache == "fp8" else dt
    per_token = kv_bytes_per_token(spec, kv_dt, e.backend) // tp
    reference = e.kind.reference_engine  # allocates every sequence's KV cache up front
    kv = e.max_batch_size * e.max_seq_len * per_token if reference else spec.kv_elements(e.max_seq_len) * kv_dt // tp
    sequences = e.max_batch_size if reference else 1
    state = sequences * spec.state_per_sequence * dt // tp
    logits = cfg.limits().max_num_tokens * spec.vocab_size * 4
    need, budget = weights + kv + state + logits, int(e.memory_budget_gib * GIB)
    if need <= budget:
        return []
    what = (f"max_batch_size x max_seq_len = {e.max_batch_size} x {e.max_seq_len} tokens (the reference engine "
            "allocates them up front)" if reference else f"one max_seq_len={e.max_seq_len} sequence")
    return [
        f"engine limits need at least {_gib(need)} per rank but engine.memory_budget_gib={e.memory_budget_gib:g}: "
        f"weights {_gib(weights)} + KV cache for {what} at {per_token:,} bytes/token = {_gib(kv)} + "
        + (f"recurrent state for {sequences} sequence(s) {_gib(state)} + " if state else "") + "one step's "
        f"logits ({cfg.limits().max_num_tokens} tokens x vocab {spec.vocab_size} x 4 bytes) {_gib(logits)}; lower "
        "engine.max_batch_size / max_seq_len / max_num_tokens, raise parallel.tp, or state the memory the engine "
        "really has in engine.memory_budget_gib"
    ]


def capacity_rule(cfg: BuildConfig) -> list[str]:
    """The config's cross-field rule: `capacity_problems` against the target's config.json. An unreadable target is
    the convert preflight's to report, an invalid tree the tree rule's."""
    from sources.targets import ModelSourceError, resolve_target

    if cfg.engine.max_batch_size is None or cfg.engine.max_input_len is None:
        return []
    try:
        hf_dir = resolve_target(cfg.target.model)
        raw = read_config(hf_dir)
        if family_of((raw.get("architectures") or [None])[0]) is None:
            return []  # outside the family table: the convert preflight refuses it, naming the table
        return capacity_problems(cfg, shape_of_config(raw, str(hf_dir / "config.json")))
    except ShapeError as e:  # a row's config without what its kind is sized by: said, not skipped
        return [f"target.model {e}: engine.memory_budget_gib cannot be checked against it; complete the config.json"]
    except (ModelSourceError, ModelConfigError, OSError, trees.TreeError):
        return []
