"""`trtllm-build` for an EAGLE-1 `EagleForCausalLM` checkpoint: a pure argv function + TensorRT-LLM's constraints.

Flags and rules checked against upstream TensorRT-LLM (release 1.2 line, the last with the engine flow):
- tensorrt_llm/commands/build.py: flag names (`--speculative_decoding_mode eagle`, `--max_draft_len`,
  `--kv_cache_type paged`, `--workers`, plugin flags from tensorrt_llm/plugin/plugin.py), and the refusal of
  `--gather_context_logits` with draft tokens (we never pass it).
- examples/eagle/README.md: the recipe `--gemm_plugin float16 --use_paged_context_fmha enable
  --speculative_decoding_mode eagle`; EAGLE needs the paged KV cache, no pipeline parallelism, no chunked context.
- tensorrt_llm/models/eagle/config.py: max_draft_len <= 256; runtime: max_batch_size <= 512 for EAGLE.
- docs/source/performance/performance-tuning-guide/useful-build-time-flags.md: the GEMM plugin is recommended for
  FP16/BF16 and *disabled* for FP8, except the FP8 GEMM plugin (`--gemm_plugin fp8`) for batch <= 4.
- cpp/tensorrt_llm/common/attentionOp.cpp: FP8 context FMHA only on SM 89/90 (+ Blackwell) and only inside the
  FP8 quantization workflow; with paged context FMHA it reads an FP8 KV cache, so we enable it only when both the
  weights and the KV cache are FP8.
"""

from __future__ import annotations

from pathlib import Path

from builders.config import BuildConfig
from builders.trees import MAX_DRAFT_LEN_LIMIT, TreeError, check_engine_limits

TRTLLM_BUILD = "trtllm-build"
MAX_BATCH_SIZE_LIMIT = 512  # TRT-LLM EAGLE runtime limit (examples/eagle, speculative decoding docs)
FP8_GEMM_PLUGIN_MAX_BATCH = 4  # useful-build-time-flags.md: FP8 GEMM plugin helps only for batch <= 4
FP8_MIN_COMPUTE_CAPABILITY = (8, 9)  # FP8 tensor cores: Ada (8.9), Hopper (9.0) and newer


def gemm_plugin(cfg: BuildConfig) -> str:
    """Value of `--gemm_plugin`: the model dtype for 16/32-bit weights; for FP8 weights the FP8 plugin at small
    batch and no plugin otherwise (TRT's native FP8 GEMMs are faster there, per the tuning guide)."""
    if cfg.quantization.weights == "fp8":
        return "fp8" if cfg.engine.max_batch_size <= FP8_GEMM_PLUGIN_MAX_BATCH else "disable"
    return cfg.target.dtype


def uses_fp8_context_fmha(cfg: BuildConfig) -> bool:
    return cfg.quantization.weights == "fp8" and cfg.quantization.kv_cache == "fp8"


def constraint_problems(cfg: BuildConfig) -> list[str]:
    """TensorRT-LLM's build/runtime rules for EAGLE engines, checked before anything runs.

    Each message names the field, the value and the fix. Empty list = the build can start.
    """
    p: list[str] = []
    e, lim = cfg.engine, cfg.limits()
    if e.backend != "tensorrt":
        return [f"engine.backend={e.backend}: trtllm-build is only for engine.backend=tensorrt"]
    if cfg.draft.type != "eagle":
        p.append(f"draft.type={cfg.draft.type}: the TensorRT engine flow runs EAGLE-1/2 heads only; use draft.type=eagle")
    tree = cfg.static_tree()
    if tree is None:
        p.append("tree.dynamic: the engine flow via Triton takes a static tree; set tree.choices")
    else:
        try:  # depth == num_eagle_layers, size <= max_draft_len, non-leaves per level: the runtime's own checks
            check_engine_limits(
                tree,
                max_draft_len=lim.max_draft_len,
                num_eagle_layers=lim.num_eagle_layers,
                max_non_leaves_per_layer=lim.max_non_leaves_per_layer,
            )
        except TreeError as err:
            p.append(f"tree.choices: {err}")
    if e.max_batch_size > MAX_BATCH_SIZE_LIMIT:
        p.append(f"engine.max_batch_size={e.max_batch_size} exceeds TensorRT-LLM's EAGLE limit {MAX_BATCH_SIZE_LIMIT}")
    if lim.max_draft_len > MAX_DRAFT_LEN_LIMIT:
        p.append(f"max_draft_len={lim.max_draft_len} (tree size) exceeds TensorRT-LLM's limit {MAX_DRAFT_LEN_LIMIT}")
    need = e.max_batch_size * (lim.max_draft_len + 1)
    if lim.max_num_tokens < need:
        p.append(
            f"engine.max_num_tokens={lim.max_num_tokens} < max_batch_size * (max_draft_len + 1) = "
            f"{e.max_batch_size} * {lim.max_draft_len + 1} = {need}: every sequence verifies its whole tree in one "
            "step; raise engine.max_num_tokens"
        )
    # EAGLE engines do not support chunked context (examples/eagle/README.md, "Known issues"), so a full prompt
    # must fit into one step's token budget: the runtime caps "maxInputLen = min(maxSequenceLen - 1, maxNumTokens)
    # since context FMHA and usePackedInput are enabled" (TrtGptModelInflightBatching log), i.e. it would silently
    # refuse prompts the config promises.
    if lim.max_num_tokens < e.max_input_len:
        p.append(
            f"max_num_tokens={lim.max_num_tokens} < engine.max_input_len={e.max_input_len}: EAGLE engines have no "
            f"chunked context, so a whole prompt must fit in one step; set engine.max_num_tokens >= {e.max_input_len} "
            "(or lower engine.max_input_len)"
        )
    if cfg.parallel.pp != 1:
        p.append(f"parallel.pp={cfg.parallel.pp}: EAGLE engines do not support pipeline parallelism; set pp=1")
    world = cfg.parallel.tp * cfg.parallel.pp
    if e.workers > world:
        p.append(f"engine.workers={e.workers} > {world} rank engine(s) to build; set engine.workers <= {world}")
    if cfg.quantization.kv_cache == "fp8" and cfg.quantization.weights != "fp8":
        # Paged context FMHA with 16-bit Q and an FP8 paged KV cache has no precompiled kernel ("FMHA kernels are
        # not found", NVIDIA/TensorRT-LLM PR #8862); with FP8 weights Q is FP8 too (FP8 context FMHA).
        p.append(
            "quantization.kv_cache=fp8 with quantization.weights=none: EAGLE engines need paged context FMHA, which "
            "has no kernel for 16-bit queries over an FP8 KV cache; set quantization.weights=fp8 as well"
        )
    if cfg.target.dtype == "float32":
        # The fused (paged) context attention kernels exist for fp16/bf16 (and fp8) only, and EAGLE engines need
        # paged context FMHA; FP8 engines also keep 16-bit activations.
        p.append(
            "target.dtype=float32: TensorRT-LLM's paged context FMHA, which EAGLE engines need, has no float32 "
            "kernels; set target.dtype to float16 or bfloat16 (or use engine.backend=reference)"
        )
    return p


def trtllm_build_argv(cfg: BuildConfig, checkpoint_dir: Path, output_dir: Path) -> list[str]:
    """The `trtllm-build` command for this config (pure: no filesystem access, no checks)."""
    lim, e = cfg.limits(), cfg.engine
    argv = [
        TRTLLM_BUILD,
        "--checkpoint_dir", str(checkpoint_dir),
        "--output_dir", str(output_dir),
        "--speculative_decoding_mode", "eagle",
        "--max_draft_len", str(lim.max_draft_len),
        "--max_batch_size", str(e.max_batch_size),
        "--max_input_len", str(e.max_input_len),
        "--max_seq_len", str(e.max_seq_len),
        "--max_num_tokens", str(lim.max_num_tokens),
        "--gpt_attention_plugin", cfg.target.dtype,
        "--gemm_plugin", gemm_plugin(cfg),
        "--remove_input_padding", "enable",
        "--kv_cache_type", "paged",
        "--use_paged_context_fmha", "enable",
    ]  # fmt: skip
    if uses_fp8_context_fmha(cfg):
        argv += ["--use_fp8_context_fmha", "enable"]
    argv += ["--workers", str(e.workers)]
    return argv
