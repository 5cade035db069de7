"""`trtllm-build` for an EAGLE-1 `EagleForCausalLM` checkpoint: a pure argv function. TensorRT-LLM's constraints
on these values live in builders/trtllm/rules.py (checked when the config is loaded); every flag is in the ledger.

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

TRTLLM_BUILD = "trtllm-build"
FP8_GEMM_PLUGIN_MAX_BATCH = 4  # useful-build-time-flags.md: FP8 GEMM plugin helps only for batch <= 4
FP8_MIN_COMPUTE_CAPABILITY = (8, 9)  # FP8 tensor cores: Ada (8.9), Hopper (9.0) and newer


def gemm_plugin(cfg: BuildConfig) -> str:
    """Value of `--gemm_plugin`: the model dtype for 16/32-bit weights; for FP8 weights the FP8 plugin at small
    batch and no plugin otherwise (TRT's native FP8 GEMMs are faster there, per the tuning guide)."""
    if cfg.quantization.weights == "fp8":
        return "fp8" if cfg.request_limits().max_batch_size <= FP8_GEMM_PLUGIN_MAX_BATCH else "disable"
    return cfg.target.dtype


def uses_fp8_context_fmha(cfg: BuildConfig) -> bool:
    return cfg.quantization.weights == "fp8" and cfg.quantization.kv_cache == "fp8"


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
    ]
    if uses_fp8_context_fmha(cfg):
        argv += ["--use_fp8_context_fmha", "enable"]
    argv += ["--workers", str(e.workers)]
    return argv
