"""Engine limits against what one engine rank can hold: `engine.memory_budget_gib` must cover the target's weights,
its KV cache at the configured limits and one step's logits. Checked at config load, so limits that could never be
served (a server that fails to allocate at load) are refused with the bytes named.

Bytes per rank, with the target's shape from its family's row (core/shapes.py: MLA, MoE, hybrid recurrent layers,
sliding windows); `rank_memory` is what --dry-run prints:
  weights  = every parameter (all routed experts, shared experts, dense-first layers, routers; embeddings, untied
             LM head) x weight bytes / tp: the checkpoint's own quantization as TensorRT-LLM reads it, else what
             quantization.weights exports, else the target dtype's size (core/quant.py `weight_bytes`); with
             serving.enable_attention_dp the non-expert part whole on every rank, the routed experts / tp
  KV/token = per attention layer: 2 x kv_heads x head_dim / tp (dense; not divided with attention DP) or
             kv_lora_rank + qk_rope_head_dim whole on every rank (MLA), plus a DSA indexer's keys, x KV bytes (1 for an
             FP8 KV cache), as KVCacheManager.get_cache_size_per_token counts them (`kv_ranks`); sliding-window layers
             hold at most their window on TensorRT-LLM;
             recurrent layers (gated delta-net, Mamba-2) hold no KV but a state per sequence (x the target dtype;
             the reference engine's per-token states of one verification are not counted)
  logits   = max_num_tokens x vocab x 4      (one engine step's float32 logits)
The reference engine allocates its KV cache for max_batch_size x max_seq_len tokens up front, in its own layout
(engines/runtime.py: K and V slots for every layer; MLA: its latents in slots of max(kv_lora_rank, qk_rope));
TensorRT-LLM's paged KV cache needs at least one full sequence of max_seq_len tokens.
The draft head's own small KV cache and activations are not counted: the check is a lower bound.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any, Protocol

from builders.published import target_weight_bytes
from core.kinds import BACKENDS
from core import trees
from core.families import family_of
from core.hfconfig import ModelConfigError, read_config
from core.quant import QuantConfigError
from core.shapes import ShapeError, TargetShape, shape_of_config


class BuildConfig(Protocol):
    """What the budget reads of builders.config.BuildConfig (a Protocol, so that module and this one import in one
    direction only)."""

    engine: Any
    quantization: Any
    parallel: Any
    target: Any
    triton: Any

    def limits(self) -> Any: ...

GIB = 1 << 30
# build.py sets it while loading the config: the capacity check then joins the preflight's problems (all at once)
DEFER_CAPACITY: ContextVar[bool] = ContextVar("defer_capacity", default=False)
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def weight_bytes(shape: TargetShape, nbytes: int) -> int:
    return shape.params * nbytes


def kv_bytes_per_token(shape: TargetShape, nbytes: int, backend: str = "pytorch") -> int:
    """KV bytes one token takes in TensorRT-LLM's layout, or in the reference engine's (`backend` reference)."""
    return (shape.reference_kv_per_token if BACKENDS[backend].reference_engine else shape.kv_per_token) * nbytes


def _gib(n: int) -> str:
    return f"{n / GIB:,.2f} GiB"


@dataclass(frozen=True)
class RankMemory:
    """One rank's bytes at the engine limits (the plan prints it; the refusal names it)."""

    weights: int
    kv: int  # the KV cache the check needs: one max_seq_len sequence (TensorRT-LLM) or every slot (reference)
    state: int
    logits: int
    budget: int
    per_token: int  # KV bytes one token takes on this rank
    kv_what: str
    state_sequences: int
    seq_bytes: int  # KV + recurrent state of one max_seq_len sequence on this rank
    pool_fraction: float  # of what is left after weights and logits, the share TensorRT-LLM gives its KV cache

    @property
    def need(self) -> int:
        return self.weights + self.kv + self.state + self.logits

    def sequences(self) -> int:
        """Sequences of max_seq_len whose KV cache (and state) fit this rank's pool."""
        left = self.budget - self.weights - self.logits
        return max(int(left * self.pool_fraction) // self.seq_bytes, 0) if self.seq_bytes else 0


def attention_dp(cfg: BuildConfig) -> bool:
    """serving.enable_attention_dp where TensorRT-LLM serves it (the reference engine keeps its own layout)."""
    serving = getattr(cfg, "serving", None)
    return bool(serving is not None and serving.enable_attention_dp and not cfg.engine.kind.reference_engine)


def rank_weights(cfg: BuildConfig, spec: TargetShape, dtype_bytes: int) -> int:
    """Weight bytes per rank: everything split over tp; with attention data parallelism every rank holds the whole
    non-expert part (attention, dense MLPs, shared experts, embeddings, LM head: an upper bound where upstream still
    splits some of them) and a 1/tp share of the routed experts (expert x MoE tensor parallelism = tp)."""
    tp, total = cfg.parallel.tp, target_weight_bytes(cfg, spec, dtype_bytes)
    if not attention_dp(cfg):
        return total // tp
    dense = target_weight_bytes(cfg, replace(spec, params=spec.params - spec.expert_params), dtype_bytes)
    return dense + (total - dense) // tp  # the routed experts at the checkpoint's width, split over the ranks


def kv_ranks(cfg: BuildConfig, spec: TargetShape) -> int:
    """How many ranks one token's KV is split over: TensorRT-LLM's KVCacheManager.get_cache_size_per_token
    (tensorrt_llm/_torch/pyexecutor/resource_manager.py at d2a5560a) keeps MLA's whole latent (kv_lora_rank +
    qk_rope_head_dim, kv_factor 1) on every rank and divides GQA heads by tp only without attention DP (tp_size = 1
    with enable_attention_dp); the reference engine splits its slots by tp."""
    if cfg.engine.kind.reference_engine:
        return cfg.parallel.tp
    return 1 if spec.latent_kv or attention_dp(cfg) else cfg.parallel.tp


def rank_memory(cfg: BuildConfig, spec: TargetShape) -> RankMemory:
    e, q, tp = cfg.engine, cfg.quantization, cfg.parallel.tp
    dt = DTYPE_BYTES[cfg.target.dtype]
    weights = rank_weights(cfg, spec, dt)  # the checkpoint's own quantization or the export's
    kv_dt = 1 if q.kv_cache == "fp8" else dt
    ranks = kv_ranks(cfg, spec)
    per_token = kv_bytes_per_token(spec, kv_dt, e.backend) // ranks
    reference = e.kind.reference_engine  # allocates every sequence's KV cache up front
    one_seq = spec.kv_elements(e.max_seq_len) * kv_dt // ranks
    kv = e.max_batch_size * e.max_seq_len * per_token if reference else one_seq
    sequences = e.max_batch_size if reference else 1
    state_seq = spec.state_per_sequence * dt // tp
    what = (f"max_batch_size x max_seq_len = {e.max_batch_size} x {e.max_seq_len} tokens (the reference engine "
            "allocates them up front)" if reference else f"one max_seq_len={e.max_seq_len} sequence")
    fraction = 1.0 if reference else cfg.triton.kv_cache_free_gpu_mem_fraction
    return RankMemory(weights, kv, sequences * state_seq, cfg.limits().max_num_tokens * spec.vocab_size * 4,
                      int(e.memory_budget_gib * GIB), per_token, what, sequences,
                      (e.max_seq_len * per_token if reference else one_seq) + state_seq, fraction)


def capacity_problems(cfg: BuildConfig, spec: TargetShape) -> list[str]:
    """Why the engine limits cannot fit `engine.memory_budget_gib` for this target (empty when they can)."""
    e = cfg.engine
    if e.max_batch_size is None or e.max_seq_len is None:
        return []
    m = rank_memory(cfg, spec)
    if m.need <= m.budget:
        return []
    return [
        f"engine limits need at least {_gib(m.need)} per rank but engine.memory_budget_gib={e.memory_budget_gib:g}: "
        f"weights {_gib(m.weights)} + KV cache for {m.kv_what} at {m.per_token:,} bytes/token = {_gib(m.kv)} + "
        + (f"recurrent state for {m.state_sequences} sequence(s) {_gib(m.state)} + " if m.state else "") + "one "
        f"step's logits ({cfg.limits().max_num_tokens} tokens x vocab {spec.vocab_size} x 4 bytes) "
        f"{_gib(m.logits)}; lower engine.max_batch_size / max_seq_len / max_num_tokens, raise parallel.tp, or state "
        "the memory the engine really has in engine.memory_budget_gib"
    ]


def target_shape_of(cfg: BuildConfig) -> TargetShape | None:
    """The target's shape from its config.json (None: unreadable or outside the family table; ShapeError: a row's
    config without what its kind is sized by)."""
    from sources.targets import ModelSourceError, resolve_target

    try:
        raw = read_config(resolve_target(cfg.target.model))
    except (ModelSourceError, ModelConfigError, OSError):
        return None
    if family_of((raw.get("architectures") or [None])[0]) is None:
        return None
    return shape_of_config(raw, f"{cfg.target.model}/config.json")


def capacity_rule(cfg: BuildConfig) -> list[str]:
    """The config's cross-field rule: `capacity_problems` against the target's config.json. An unreadable target is
    the convert preflight's to report, an invalid tree the tree rule's."""
    if cfg.engine.max_batch_size is None or cfg.engine.max_input_len is None or DEFER_CAPACITY.get():
        return []
    try:
        spec = target_shape_of(cfg)  # None: outside the family table (the convert preflight refuses it) / unreadable
        return [] if spec is None else capacity_problems(cfg, spec) + _moe_problems(cfg, spec)
    except ShapeError as e:  # a row's config without what its kind is sized by: said, not skipped
        return [f"target.model {e}: engine.memory_budget_gib cannot be checked against it; complete the config.json"]
    except QuantConfigError:  # the convert preflight names it (builders/published.py `published_problems`)
        return []
    except trees.TreeError:
        return []


def _moe_problems(cfg: BuildConfig, spec: TargetShape) -> list[str]:
    serving = getattr(cfg, "serving", None)
    if serving is None or spec.expert_params:
        return []
    return [f"serving.{f}: {spec.architecture} has no routed experts; remove it" for f in
            ("moe_expert_parallel_size", "moe_backend") if getattr(serving, f) is not None]
