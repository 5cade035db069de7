"""Engine limits against what one engine rank can hold: `engine.memory_budget_gib` must cover the target's weights,
its KV cache at the configured limits and one step's logits. Checked at config load, so limits that could never be
served (a server that fails to allocate at load) are refused with the bytes named.

Bytes per rank (tp ranks split weights and KV heads; the arithmetic is exact for the tensors counted):
  weights  = (embed + lm_head (untied) + layers x (q + k + v + o + gate + up + down + 2 norms) + final norm)
             x weight bytes / tp            (1 byte for FP8 weights, else the target dtype's size)
  KV/token = 2 (K and V) x layers x kv_heads x head_dim x KV bytes / tp   (1 byte for an FP8 KV cache)
  logits   = max_num_tokens x vocab x 4      (one engine step's float32 logits)
The reference engine allocates its KV cache for max_batch_size x max_seq_len tokens up front
(engines/runtime.py); TensorRT-LLM's paged KV cache needs at least one full sequence of max_seq_len tokens.
The draft head's own small KV cache and activations are not counted: the check is a lower bound.
"""

from __future__ import annotations

from typing import Any, Protocol

from core import trees
from core.hfconfig import LlamaSpec, ModelConfigError, llama_spec


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


def weight_bytes(spec: LlamaSpec, nbytes: int) -> int:
    h, i, q, kv = spec.hidden_size, spec.intermediate_size, spec.q_size, spec.kv_size
    per_layer = q * h + 2 * kv * h + h * q + 3 * i * h + 2 * h
    heads = spec.vocab_size * h * (1 if spec.tie_word_embeddings else 2)
    return (heads + spec.num_hidden_layers * per_layer + h) * nbytes


def kv_bytes_per_token(spec: LlamaSpec, nbytes: int) -> int:
    return 2 * spec.num_hidden_layers * spec.kv_size * nbytes


def _gib(n: int) -> str:
    return f"{n / GIB:,.2f} GiB"


def capacity_problems(cfg: BuildConfig, spec: LlamaSpec) -> list[str]:
    """Why the engine limits cannot fit `engine.memory_budget_gib` for this target (empty when they can)."""
    e, q = cfg.engine, cfg.quantization
    if e.max_batch_size is None or e.max_seq_len is None:
        return []
    tp = cfg.parallel.tp
    dt = DTYPE_BYTES[cfg.target.dtype]
    weights = weight_bytes(spec, 1 if q.weights == "fp8" else dt) // tp
    per_token = kv_bytes_per_token(spec, 1 if q.kv_cache == "fp8" else dt) // tp
    tokens = e.max_batch_size * e.max_seq_len if e.backend == "reference" else e.max_seq_len
    kv = tokens * per_token
    logits = cfg.limits().max_num_tokens * spec.vocab_size * 4
    need, budget = weights + kv + logits, int(e.memory_budget_gib * GIB)
    if need <= budget:
        return []
    what = (f"max_batch_size x max_seq_len = {e.max_batch_size} x {e.max_seq_len} tokens (the reference engine "
            "allocates them up front)" if e.backend == "reference" else f"one max_seq_len={e.max_seq_len} sequence")
    return [
        f"engine limits need at least {_gib(need)} per rank but engine.memory_budget_gib={e.memory_budget_gib:g}: "
        f"weights {_gib(weights)} + KV cache for {what} at {per_token:,} bytes/token = {_gib(kv)} + one step's "
        f"logits ({cfg.limits().max_num_tokens} tokens x vocab {spec.vocab_size} x 4 bytes) {_gib(logits)}; lower "
        "engine.max_batch_size / max_seq_len / max_num_tokens, raise parallel.tp, or state the memory the engine "
        "really has in engine.memory_budget_gib"
    ]


def capacity_rule(cfg: BuildConfig) -> list[str]:
    """The config's cross-field rule: `capacity_problems` against the target's config.json. An unreadable target is
    the convert preflight's to report, an invalid tree the tree rule's."""
    from measure.model_source import ModelSourceError, resolve_target

    if cfg.engine.max_batch_size is None or cfg.engine.max_input_len is None:
        return []
    try:
        spec = llama_spec(resolve_target(cfg.target.model), require_arch=False)
        return capacity_problems(cfg, spec)
    except (ModelSourceError, ModelConfigError, OSError, trees.TreeError):
        return []
