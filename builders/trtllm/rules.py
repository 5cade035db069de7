"""TensorRT-LLM's limits, in one place: `trtllm_problems(cfg)`, called by the config validation (builders/config.py)
so that a config its TensorRT-LLM version cannot run is refused before anything is written.

Each message names the field, the value, the version and the fix. What a version allows comes from the registry
(core/trtllm_versions.py); the bounds are upstream's (cited in docs/contracts.md):
- tensorrt_llm/builder.py build(): EAGLE asserts max_batch_size <= 512 and max_draft_len <= 256, and raises
  max_num_tokens to max_batch_size * (max_draft_len + 1);
- examples/eagle/README.md: EAGLE engines need the paged KV cache and have no chunked context and no pipeline
  parallelism;
- triton_backend/inflight_batcher_llm/src/model_instance_state.cc: the C++ backend takes `eagle_choices` only
  (no dynamic tree);
- tensorrt_llm/_torch/attention_backend/trtllm.py (1.1): "only chained/linear tree is supported now";
  tensorrt_llm/llmapi/llm_args.py EagleDecodingConfig: which tree fields exist per version.
"""

from __future__ import annotations

from typing import Any, Protocol

from core import trtllm_versions
from core.trtllm_versions import TrtllmVersion
from core import trees


class BuildConfig(Protocol):
    """What these rules read of a build config: builders/config.py's BuildConfig, whose validation calls them. A
    protocol, so that the rules do not import the module that imports them."""

    trtllm_version: str
    draft: Any
    engine: Any
    parallel: Any
    quantization: Any
    target: Any
    tree: Any

    def limits(self) -> Any: ...

    def static_tree(self) -> trees.DraftTree | None: ...

    @property
    def version(self) -> TrtllmVersion: ...  # the entry trtllm_version names


def _needs(version: TrtllmVersion, capability: str, what: str, alternatives: str) -> str:
    """'<what> needs TensorRT-LLM >= X (trtllm_version: 'X'); <version> has no <capability>. Or: <alternatives>'."""
    first = trtllm_versions.lowest(capability)
    where = f"{version.name} (trtllm_version '{version.key}')"
    if first is None:
        return f"{what} is not supported by {where} nor by any supported TensorRT-LLM version; {alternatives}"
    return f"{what} is not supported by {where}; set trtllm_version: '{first.key}' ({first.name}), or {alternatives}"


def _tree_values(cfg: BuildConfig) -> tuple[int, int, int] | None:
    try:
        lim = cfg.limits()
    except (trees.TreeError, AssertionError, TypeError, AttributeError):
        return None  # the tree or engine rules report it
    return lim.max_draft_len, lim.num_eagle_layers, lim.max_num_tokens


_OLDER_LINES = (
    "set trtllm_version: '1.2' (or '1.1', the pinned NGC image) with engine.backend tensorrt (the engine flow)"
)


def _eagle3_only(cfg: BuildConfig, v: TrtllmVersion) -> list[str]:
    """Versions without EAGLE-1/2 heads or static trees refuse them on every backend: the reference engine mirrors
    what that version can serve (tensorrt_llm/llmapi/llm_args.py TorchLlmArgs.validate_speculative_config turns
    `Eagle` into `Eagle3`, whose loader cannot read an EAGLE-1/2 checkpoint; PR #18210 removed eagle_choices)."""
    where = f"{v.name} (trtllm_version '{v.key}')"
    p: list[str] = []
    if not cfg.draft.kind.eagle3 and not v.eagle12_heads:
        p.append(f"draft.type=eagle (an EAGLE-1/2 head) cannot run on {where}: it runs EAGLE-3 heads only "
                 "(speculative_config.decoding_type Eagle3 on the PyTorch backend; EAGLE-1/2 checkpoints are "
                 "incompatible and the engine flow that ran them was removed). Either retrain the head as EAGLE-3 with "
                 "this toolkit's trainer (`python training/train_head.py CONFIG` with `head: eagle3`, e.g. "
                 f"configs/train/smollm2-eagle3.yaml) and set draft.type=eagle3, or {_OLDER_LINES}")
    if cfg.tree.choices is not None and not v.static_trees:
        try:
            tree = cfg.static_tree()
        except trees.TreeError:
            return p  # the tree rule reports it
        if tree is not None and not tree.is_chain():
            p.append(f"tree.choices (a static tree, {tree.size} nodes, depth {tree.depth}) cannot run on {where}: "
                     "static trees (eagle_choices) were removed (TensorRT-LLM PR #18210: they worked only on the "
                     "deprecated two-model path). Use a dynamic tree (tree.dynamic: {top_k, depth, "
                     f"total_draft_tokens}}) or a chain (tree.choices: chain-{tree.depth}), or {_OLDER_LINES}")
    return p


def engine_flow_draft_problems(cfg: BuildConfig, v: TrtllmVersion) -> list[str]:
    """engine.backend tensorrt: which versions and heads the engine flow runs."""
    p = []
    if not v.engine_flow:
        p.append(
            _needs(v, "engine_flow", "engine.backend=tensorrt (trtllm-build engines)", "set engine.backend=pytorch")
        )
    if cfg.draft.kind.eagle3:
        p.append(
            "draft.type=eagle3 with engine.backend=tensorrt: TensorRT-LLM runs EAGLE-3 only on its PyTorch backend "
            "(LLM API); set engine.backend pytorch or reference"
        )
    return p


def pytorch_draft_problems(cfg: BuildConfig, v: TrtllmVersion) -> list[str]:
    """engine.backend pytorch: the PyTorch backend runs EAGLE-3 heads only, from the version that has them."""
    if not cfg.draft.kind.eagle3:
        if not v.eagle12_heads:
            return []  # _eagle3_only says it for every backend
        return ["draft.type=eagle with engine.backend=pytorch: TensorRT-LLM's PyTorch backend runs EAGLE-3 heads only "
                "(EAGLE-1/2 checkpoints are incompatible); use draft.type=eagle3, or engine.backend tensorrt/reference"]
    if not v.pytorch_eagle3:
        return [_needs(v, "pytorch_eagle3", "EAGLE-3 on engine.backend=pytorch", "use engine.backend reference")]
    return []


def engine_flow_problems(cfg: BuildConfig, v: TrtllmVersion) -> list[str]:
    """trtllm-build + the Triton C++ backend."""
    e, q = cfg.engine, cfg.quantization
    p: list[str] = []
    if cfg.tree.dynamic is not None:
        p.append("tree.dynamic with engine.backend=tensorrt: the Triton tensorrtllm backend passes only eagle_choices "
                 "(no dynamic tree); use tree.choices or engine.backend pytorch/reference")
    if cfg.parallel.pp != 1:
        p.append(f"parallel.pp={cfg.parallel.pp}: EAGLE engines do not support pipeline parallelism; set pp=1")
    if e.max_batch_size is not None and e.max_batch_size > v.eagle_max_batch_size:
        p.append(f"engine.max_batch_size={e.max_batch_size} exceeds {v.name}'s EAGLE engine limit "
                 f"{v.eagle_max_batch_size} (trtllm-build asserts it); lower it")
    world = cfg.parallel.tp * cfg.parallel.pp
    if e.workers > world:
        p.append(f"engine.workers={e.workers} > {world} rank engine(s) to build; set engine.workers <= {world}")
    if q.kv_cache == "fp8" and q.weights != "fp8":
        # Paged context FMHA with 16-bit Q over an FP8 paged KV cache has no kernel (NVIDIA/TensorRT-LLM PR #8862);
        # builder.py then turns paged context FMHA off, which EAGLE engines need.
        p.append(
            "quantization.kv_cache=fp8 with quantization.weights=none: EAGLE engines need paged context FMHA, which "
            "has no kernel for 16-bit queries over an FP8 KV cache; set quantization.weights=fp8 as well"
        )
    if cfg.target.dtype == "float32":
        p.append("target.dtype=float32: TensorRT-LLM's paged context FMHA, which EAGLE engines need, has no float32 "
                 "kernels; set target.dtype to float16 or bfloat16 (or use engine.backend=reference)")
    p += _engine_tree(cfg, v)
    return p


def _engine_tree(cfg: BuildConfig, v: TrtllmVersion) -> list[str]:
    values = _tree_values(cfg)
    static = cfg.static_tree() if cfg.tree.choices is not None else None
    if values is None or static is None:
        return []
    mdl, layers, mnt = values
    e = cfg.engine
    p: list[str] = []
    try:  # depth == num_eagle_layers, size <= max_draft_len, non-leaves per level: the runtime's own checks
        lim = cfg.limits()
        trees.check_engine_limits(static, max_draft_len=mdl, num_eagle_layers=layers,
                                  max_non_leaves_per_layer=lim.max_non_leaves_per_layer)
    except trees.TreeError as err:
        p.append(f"tree.choices: {err}")
    if mdl > v.max_draft_len_limit:
        p.append(f"max_draft_len={mdl} (tree size) exceeds {v.name}'s EAGLE limit {v.max_draft_len_limit}")
    if e.max_batch_size is not None:
        need = e.max_batch_size * (mdl + 1)
        if mnt < need:
            p.append(f"engine.max_num_tokens={mnt} < max_batch_size * (max_draft_len + 1) = {e.max_batch_size} * "
                     f"{mdl + 1} = {need}: every sequence verifies its whole tree in one step; raise it or remove it "
                     "(derived)")
    # EAGLE engines have no chunked context: a whole prompt must fit into one step's token budget.
    if e.max_input_len is not None and mnt < e.max_input_len:
        p.append(f"max_num_tokens={mnt} < engine.max_input_len={e.max_input_len}: EAGLE engines have no chunked "
                 f"context, so a whole prompt must fit in one step; set engine.max_num_tokens >= {e.max_input_len} "
                 "(or lower engine.max_input_len)")
    return p


# TensorRT-LLM's PyTorch backend runs its own CUDA kernels, which dispatch float16 / bfloat16 only: a float32 model
# fails in the fused RMSNorm (NVIDIA/TensorRT-LLM issue #5260, "failed to dispatch data type Float"; the maintainers:
# most custom kernels do not support float32) and in FlashInfer's paged KV append (issue #10458, open in 2026).
PYTORCH_FLOAT32 = ("target.dtype=float32 with engine.backend=pytorch: TensorRT-LLM's PyTorch backend kernels do not "
                   "dispatch float32 (fused RMSNorm and the paged KV cache fail with 'failed to dispatch data type "
                   "Float': TensorRT-LLM issues #5260, #10458); set target.dtype to bfloat16 or float16 (float32 runs "
                   "only on engine.backend=reference)")


def pytorch_problems(cfg: BuildConfig, v: TrtllmVersion) -> list[str]:
    """The LLM API (trtllm-serve / Triton llmapi-style model)."""
    p: list[str] = [PYTORCH_FLOAT32] if cfg.target.dtype == "float32" else []
    if cfg.quantization.weights != "none" and v.engine_flow:
        p.append(f"quantization.weights={cfg.quantization.weights} with engine.backend=pytorch on {v.name}: this "
                 "builder writes a quantized Hugging Face checkpoint (ModelOpt's unified export) for the current "
                 "line, whose loader it cites; set trtllm_version: '1.4', or use engine.backend tensorrt (FP8)")
    static, dyn = cfg.tree.choices, cfg.tree.dynamic
    if static is not None:
        try:
            tree = cfg.static_tree()
        except trees.TreeError:
            return p  # the tree rule reports it
        if tree is not None and not tree.is_chain() and not v.pytorch_static_tree and v.static_trees:
            p.append(
                _needs(
                    v,
                    "pytorch_static_tree",
                    f"a draft tree ({tree.size} nodes, depth {tree.depth}) with engine.backend=pytorch",
                    f"use tree.choices: chain-{tree.depth}, or engine.backend tensorrt",
                )
            )
    if dyn is not None:
        if not v.pytorch_dynamic_tree:
            p.append(_needs(v, "pytorch_dynamic_tree", "tree.dynamic with engine.backend=pytorch",
                            "use tree.choices (a static tree, or chain-N), or engine.backend reference"))
        if dyn.total_draft_tokens > dyn.top_k * dyn.depth:
            p.append(
                f"tree.dynamic.total_draft_tokens={dyn.total_draft_tokens} > top_k * depth = {dyn.top_k * dyn.depth}: "
                "TensorRT-LLM's dynamic tree keeps at most dynamic_tree_max_topK * max_draft_len tokens; lower it"
            )
        if dyn.total_draft_tokens < dyn.depth:
            p.append(f"tree.dynamic.total_draft_tokens={dyn.total_draft_tokens} < depth={dyn.depth}; raise it")
    return p


def tree_kind_problems(cfg: BuildConfig) -> list[str]:
    """A dynamic tree (top_k > 1) for a target the PyTorch backend serves chains only for (core/capabilities.py:
    MLA, sliding-window, compressed and recurrent attention), with the alternative. top_k 1 is written as a chain."""
    from core.capabilities import chain_only_reason
    from core.families import family_of
    from core.hfconfig import ModelConfigError, read_config
    from sources.targets import ModelSourceError, resolve_target

    dyn = cfg.tree.dynamic
    if dyn is None or dyn.top_k == 1:
        return []
    try:
        raw = read_config(resolve_target(cfg.target.model))
    except (ModelSourceError, ModelConfigError, OSError):
        return []  # the convert preflight reports an unreadable target
    row = family_of((raw.get("architectures") or [None])[0])
    reason = None if row is None else chain_only_reason(row, raw)
    if reason is None:
        return []
    return [f"tree.dynamic (top_k {dyn.top_k}) for TensorRT-LLM's PyTorch backend: {reason}. Use a chain: "
            f"tree.choices: chain-{dyn.depth} (or tree.dynamic.top_k: 1, written as a chain)"]


def _load_aware(cfg: BuildConfig, v: TrtllmVersion) -> list[str]:
    """tree.draft_len_schedule / max_concurrency / acceptance_rate_*: LLM API fields of the current line only
    (DecodingBaseConfig, PR #10860); the engine flow's C++ runtime has none. The reference engine follows them on
    every version (engines/schedule.py)."""
    t = cfg.tree
    set_ = [f"tree.{f}" for f in ("draft_len_schedule", "max_concurrency", "acceptance_rate_window_size",
                                  "acceptance_rate_threshold") if getattr(t, f) not in (None, 0)]
    if not set_ or cfg.engine.kind.reference_engine:
        return []
    what = f"{', '.join(set_)} with engine.backend={cfg.engine.backend}"
    if cfg.engine.kind.engine_flow:
        return [f"{what}: the engine flow (trtllm-build + the C++ runtime) has no per-batch-size draft length nor "
                "acceptance switch; use engine.backend pytorch on trtllm_version '1.4', or engine.backend reference, "
                "or remove " + ", ".join(set_)]
    if not v.load_aware_speculation:
        return [_needs(v, "load_aware_speculation", what, "remove " + ", ".join(set_))]
    return []


def _penalty(cfg: BuildConfig, v: TrtllmVersion) -> list[str]:
    """tree.enable_penalty: DecodingBaseConfig.enable_penalty (PR #17701), which only the one-model speculative
    sampler reads (tensorrt_llm/_torch/speculative/spec_sampler_base.py SpecSampler.validate_request), and which
    cannot serve a tree: tensorrt_llm/_torch/speculative/utils.py get_spec_decoder sets penalty_supported False for
    eagle_choices and dynamic trees, so every penalized request is still refused there."""
    if not cfg.tree.enable_penalty:
        return []
    backend = cfg.engine.kind
    if not backend.speculative_penalties:
        return [f"tree.enable_penalty=true with engine.backend={backend.name}: it turns on TensorRT-LLM's "
                "occurrence penalties on the PyTorch backend's one-model speculative path; "
                + ("the reference engine applies no penalties" if backend.reference_engine else
                   "the engine flow has no such switch") + "; use engine.backend pytorch or remove tree.enable_penalty"]
    if not v.speculative_penalties:
        return [_needs(v, "speculative_penalties", "tree.enable_penalty (speculative_config.enable_penalty)",
                       "remove tree.enable_penalty")]
    try:
        static = cfg.static_tree() if cfg.tree.choices is not None else None
    except trees.TreeError:
        return []  # the tree rules report it
    if cfg.tree.dynamic is not None or (static is not None and not static.is_chain()):
        return ["tree.enable_penalty=true with a tree: TensorRT-LLM refuses penalized requests under tree "
                "speculation (get_spec_decoder: penalty_supported is False for dynamic trees and eagle_choices), so "
                "the switch would serve none; use a chain (tree.choices: chain-N) or remove tree.enable_penalty"]
    return []


def trtllm_problems(cfg: BuildConfig) -> list[str]:
    """Every TensorRT-LLM limit this config breaks for its `trtllm_version`. engine.backend=reference has the
    reference engine's own limits, except that an EAGLE-3-only version refuses EAGLE-1/2 heads and static trees
    there too (the reference engine then serves that version's Triton layout and nothing it could not serve)."""
    v = cfg.version
    backend = cfg.engine.kind
    p = _eagle3_only(cfg, v)
    if backend.engine_flow:
        p += engine_flow_draft_problems(cfg, v)
    if backend.llmapi_model:
        p += pytorch_draft_problems(cfg, v)
    p += _load_aware(cfg, v) + _penalty(cfg, v) + _nvfp4(cfg, v)
    if backend.engine_flow:
        p += engine_flow_problems(cfg, v)
    if backend.llmapi_model:
        p += pytorch_problems(cfg, v) + tree_kind_problems(cfg)
    return p


def _nvfp4(cfg: BuildConfig, v: TrtllmVersion) -> list[str]:
    """NVFP4 is written as ModelOpt's Hugging Face export for the current line's PyTorch backend (and its reference
    mirror); it runs on Blackwell GPUs only (FP4 tensor cores, compute capability 10.0 and later)."""
    if cfg.quantization.weights != "nvfp4":
        return []
    if v.engine_flow or cfg.engine.kind.engine_flow:
        return [f"quantization.weights=nvfp4 on {v.name} with engine.backend={cfg.engine.backend}: NVFP4 is written "
                "as ModelOpt's Hugging Face checkpoint for the current line only; set trtllm_version: '1.4' with "
                "engine.backend pytorch (served on Blackwell GPUs) or reference (the CPU acceptance check)"]
    return []


def capture_problems(version_key: str, capture: list[int], num_target_layers: int) -> list[str]:
    """EAGLE-3 on the PyTorch backend: `capture` (TensorRT-LLM's output-indexed `eagle3_layers_to_capture`) must be
    upstream's default {1, L//2 - 1, L - 4} on a version where the field is not proven to exist, because the YAML
    then cannot carry it."""
    v = trtllm_versions.get(version_key)
    default = default_capture(num_target_layers)
    if v.eagle3_layers_to_capture or sorted(capture) == default:
        return []
    return [_needs(v, "eagle3_layers_to_capture",
                   f"an EAGLE-3 head capturing target layer outputs {sorted(capture)} (TensorRT-LLM's default for "
                   f"{num_target_layers} layers is {default})", "use a head trained on the default layers")]


def default_capture(num_target_layers: int) -> list[int]:
    """TensorRT-LLM's default `eagle3_layers_to_capture` (output-indexed) for a target of L layers."""
    return sorted({1, num_target_layers // 2 - 1, num_target_layers - 4})
