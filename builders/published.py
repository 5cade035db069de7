"""Targets published already quantized (a `quantization_config` in config.json, or ModelOpt's hf_quant_config.json):
what the build does with them, decided before anything is written.

- Sizing (builders/capacity.py `weight_bytes` call site): `target_weight_bytes`, the checkpoint's real bytes from
  core/quant.py (its quantization as TensorRT-LLM reads it, or what `quantization.weights` will export).
- `published_problems` (the convert preflight): the quantization config validated as TensorRT-LLM's loader reads it
  (every problem at once); `quantization.weights` on an already quantized target refused (quantizing its float8
  weights again is not what ModelOpt's export takes: serve the checkpoint as published); and a path that would read
  the quantized tensors without their scales refused:
  * engine.backend pytorch: TensorRT-LLM loads the directory as it is (its options and model.yaml name it);
  * the reference engine's generic path (transformers' own model class: DeepSeek-V3 and the other non-native rows):
    transformers' FineGrainedFP8 integration dequantizes `quant_method: fp8` block-scaled weights (weight x
    weight_scale_inv per 128x128 block) when no GPU is present; other methods are refused there;
  * this converter's native path (Llama, Mistral, Qwen2, Qwen3) and the engine flow: refused (the converter reads
    16-bit tensors; serve the checkpoint with engine.backend pytorch, or build from the 16-bit target with
    `quantization.weights: fp8`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.families import NATIVE
from core.quant import MODELOPT_FILE, CheckpointQuant, QuantConfigError, build_quant, checkpoint_quant, kv_b_params
from core.quant import weight_bytes as quant_weight_bytes


def read_quant(hf_dir: Path, config: dict[str, Any] | None = None) -> CheckpointQuant | None:
    """The target directory's own quantization (QuantConfigError when TensorRT-LLM would misread it)."""
    if config is None:
        config = json.loads((hf_dir / "config.json").read_text())
    f = hf_dir / MODELOPT_FILE
    modelopt = None
    if f.is_file():
        try:
            modelopt = json.loads(f.read_text())
        except ValueError as e:
            raise QuantConfigError(f"{f}: not valid JSON ({e}); re-export the checkpoint") from None
    return checkpoint_quant(config, modelopt, str(hf_dir))


def target_weight_bytes(cfg: Any, spec: Any, dtype_bytes: int) -> int:
    """Bytes of the target's weights as the build serves them (all ranks): the checkpoint's own quantization, else
    what `quantization.weights` exports, else every parameter at `dtype_bytes`."""
    from sources.targets import resolve_target

    hf_dir = resolve_target(cfg.target.model)
    raw = json.loads((hf_dir / "config.json").read_text())
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    quant = read_quant(hf_dir, raw) or build_quant(cfg.quantization.weights)
    return quant_weight_bytes(spec.params, vocab=spec.vocab_size, hidden=spec.hidden_size,
                              tied=bool(text.get("tie_word_embeddings", raw.get("tie_word_embeddings"))),
                              dtype_bytes=dtype_bytes, quant=quant, kv_b_params=kv_b_params(text))


def weights_label(cfg: Any) -> str:
    """How the plan names the target's weight format: the checkpoint's own quantization, else the export's, else the
    target dtype."""
    from sources.targets import resolve_target

    quant = read_quant(resolve_target(cfg.target.model))
    if quant is not None and quant.algo != "KV_ONLY":
        return f"as published: {quant.describe()}"
    return cfg.quantization.weights if cfg.quantization.weights != "none" else cfg.target.dtype


def published_problems(cfg: Any, hf_dir: Path, architecture: str) -> list[str]:
    """Why the build cannot serve this (possibly pre-quantized) target as published; empty when it can."""
    where = f"target.model {hf_dir}"
    try:
        quant = read_quant(hf_dir)
    except QuantConfigError as e:
        return [f"target.model {e}"]
    except (OSError, ValueError) as e:
        return [f"{where}: {e}"]
    if quant is None or quant.algo == "KV_ONLY":
        return []
    what = f"{where} is already quantized: {quant.describe()}"
    p = []
    if cfg.quantization.weights != "none":
        p.append(f"{what}; quantization.weights={cfg.quantization.weights} would quantize it again: set "
                 "quantization.weights: none to serve it as published, or give the 16-bit checkpoint")
    kind = cfg.engine.kind
    if kind.loads_hf_target and not kind.reference_engine:
        return p  # TensorRT-LLM's PyTorch backend reads the directory and its quantization itself
    if architecture in NATIVE or not kind.reference_engine:
        p.append(f"{what}; this converter reads 16-bit tensors and would cast the quantized ones without their "
                 f"scales (engine.backend {cfg.engine.backend}): serve it with engine.backend pytorch, or build from "
                 "the 16-bit checkpoint with quantization.weights: fp8")
    elif quant.algo != "FP8_BLOCK_SCALES" or quant.source.endswith(MODELOPT_FILE):
        p.append(f"{what}; the reference engine runs pre-quantized targets of its generic path with quant_method "
                 "fp8 and 128x128 weight blocks only (dequantized with their scales): serve it with "
                 "engine.backend pytorch")
    return p


ISSUE_FP8_HEAD = "TensorRT-LLM issue #7842"


def fp8_head_warning(cfg: Any, hf_dir: Path) -> str | None:
    """The warning for an FP8 target (published so, or `quantization.weights: fp8`) served with a 16-bit EAGLE-3 head
    by TensorRT-LLM's PyTorch backend on the current line: NVIDIA/TensorRT-LLM issue #7842 (open) reports that pair
    failing in one-model EAGLE-3 (on 1.0.0rc6); None otherwise."""

    if cfg.version.engine_flow or not cfg.draft.kind.eagle3 or not cfg.engine.kind.runs_trtllm:
        return None
    try:
        quant = read_quant(hf_dir)
    except (QuantConfigError, OSError, ValueError):
        return None  # the preflight names it
    quant = quant or build_quant(cfg.quantization.weights)
    if quant is None or not quant.algo.startswith("FP8"):
        return None
    return (f"warning: an FP8 target ({quant.describe()}) with a 16-bit EAGLE-3 head: {ISSUE_FP8_HEAD} (open, "
            "reported on 1.0.0rc6) has this pair failing in TensorRT-LLM's one-model EAGLE-3; check greedy outputs "
            "with and without speculation on your GPU before deploying (docs/check-before-deploy.md)")
