"""The convert stage's quantization on the current line (trtllm_version 1.4): ModelOpt's Hugging Face export
(builders/convert/hf_quant.py) instead of the engine flow's TensorRT-LLM checkpoint (builders/convert/fp8.py).

- engine.backend pytorch: the export is written to `checkpoint/hf_quantized/` (what trtllm-serve and the Triton llmapi
  model load: the stage records it as the directory handed to TensorRT-LLM); the reference engine's copies of the
  16-bit and the quantized target live in a temporary directory, for the acceptance check only.
- engine.backend reference: the export lives in a temporary directory and `checkpoint/rank0.safetensors` becomes the
  weights as the PyTorch backend loads them, so the CPU mirror serves what the GPU would.
Which family rows are quantized, and how the reference engine mirrors each, is a capability of the row
(core/capabilities.py `modelopt_mirror`): the dense rows through the converted checkpoint
(builders/convert/hf_quant.py), the MoE rows through transformers' own model holding the export as the loader leaves it
(builders/convert/hf_quant_generic.py, `checkpoint/fp8_reference/` on engine.backend reference); every other row is
refused at preflight with its reason (`modelopt_refusal`).
Both report tau of the EAGLE-3 head against the 16-bit and the quantized target on held-out prompts (prompts of the
calibration dataset that follow the calibration ones), with the reference engine, in the manifest's `quantization`
note and the stage log.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from builders import layout
from builders.config import BuildConfig
from builders.convert.fp8 import Fp8Error, Fp8Report, prompt_format, reference_tau
from builders.convert.hf_quant import ALGO, export_quantized, loader_problems, reference_checkpoint
from builders.convert import hf_quant_generic
from core.capabilities import modelopt_mirror, modelopt_refusal
from core.families import family_of
from core.hfconfig import llama_spec

HF_QUANTIZED = layout.HF_QUANTIZED
FP8_REFERENCE = layout.FP8_REFERENCE
TAU_PROMPTS = 8  # held-out prompts tau is measured on (after the calibration prompts of the same dataset)
TAU_NEW_TOKENS = 32


def current_line(cfg: BuildConfig) -> bool:
    """The versions without the engine flow load quantized targets as ModelOpt's HF export (the current line)."""
    return not cfg.version.engine_flow


def quantizes(cfg: BuildConfig) -> bool:
    return cfg.quantization.weights != "none" or cfg.quantization.kv_cache == "fp8"


def preflight_problems(cfg: BuildConfig, target_architecture: str) -> list[str]:
    if not (quantizes(cfg) and current_line(cfg)):
        return []
    p = []
    row = family_of(target_architecture)
    mirror = None if row is None else modelopt_mirror(row)
    if row is None:
        p.append(f"quantization on trtllm_version {cfg.trtllm_version}: the target's architecture "
                 f"{target_architecture} is not a row of the family table (docs/bring-your-own-model.md)")
    elif mirror is None:
        p.append(f"quantization on trtllm_version {cfg.trtllm_version}: this builder does not quantize "
                 f"{target_architecture} ({row.label}) with ModelOpt: {modelopt_refusal(row)}")
    elif mirror == "generic" and cfg.quantization.weights not in ("none", "fp8"):
        p.append(f"quantization.weights={cfg.quantization.weights} on {target_architecture}: this builder quantizes "
                 "that row with FP8 weights (and/or an FP8 KV cache) only; the reference engine has no NVFP4 path "
                 "for its experts. Use quantization.weights: fp8")
    if cfg.engine.kind.reference_engine and cfg.parallel.tp != 1:
        p.append("quantization with engine.backend reference on the current line: the reference engine runs the "
                 "quantized target at parallel.tp 1")
    return p


def generic_row(hf: Path) -> bool:
    """The target is quantized and mirrored on the reference engine's generic path (core/capabilities.py)."""
    import json

    arch = (json.loads((hf / "config.json").read_text()).get("architectures") or [None])[0]
    row = family_of(arch)
    return row is not None and modelopt_mirror(row) == "generic"


def prompt_sets(cfg: BuildConfig) -> tuple[list[str], list[str]]:
    """(calibration prompts, held-out prompts): the first num_samples of the dataset, then up to TAU_PROMPTS more."""
    from sources import data

    c = cfg.quantization.calibration
    n = c.num_samples + TAU_PROMPTS
    prompts = ([q.turns[0] for q in data.mtbench_questions(limit=n)] if c.dataset == "mtbench"
               else data.sharegpt_prompts(n))
    calib, held = prompts[:c.num_samples], prompts[c.num_samples:]
    if len(calib) < c.num_samples:
        raise Fp8Error(f"quantization.calibration.num_samples={c.num_samples} but {c.dataset} has only "
                       f"{len(calib)} prompts; lower num_samples or use dataset sharegpt")
    return calib, held


def _reference16(cfg: BuildConfig, hf: Path, ckpt: Path, out: Path) -> Path:
    """The 16-bit target as the reference engine loads it (tp 1), with the build's normalized EAGLE-3 head."""
    if cfg.engine.kind.reference_engine:
        shutil.copytree(ckpt, out, symlinks=True)
        return out
    from builders.convert.llama import convert_llama

    convert_llama(hf, out, dtype=cfg.target.dtype, tp=1, pp=1)
    if (ckpt / layout.EAGLE3_HEAD).is_dir():
        os.symlink((ckpt / layout.EAGLE3_HEAD).resolve(), out / layout.EAGLE3_HEAD)
    return out


def _generic16(ckpt: Path, out: Path) -> Path:
    """The checkpoint of a generic row (config.json naming the HF target, tokenizer, EAGLE-3 head), without the
    export: the 16-bit target as the reference engine runs it."""
    shutil.copytree(ckpt, out, symlinks=True, ignore=shutil.ignore_patterns(HF_QUANTIZED, FP8_REFERENCE))
    return out


def generic_reference(hf: Path, export: Path, ckpt: Path, *, weights: str, kv_fp8: bool, dtype: str) -> None:
    """`ckpt` (a generic row's checkpoint) runs the mirror of the export, written to `ckpt/FP8_REFERENCE`."""
    import json

    hf_quant_generic.check_weights(weights)
    hf_quant_generic.write_mirror(hf, export, ckpt / FP8_REFERENCE, weights=weights, kv_fp8=kv_fp8, dtype=dtype)
    conf = json.loads((ckpt / "config.json").read_text())
    conf["generic_target"] = FP8_REFERENCE  # relative: inside the checkpoint (engines/runtime.py)
    exclude = (hf_quant_generic.read_quant_config(export).get("quantization") or {}).get("exclude_modules")
    conf["quantization"] = {"quant_algo": "FP8" if weights == "fp8" else None,
                            "kv_cache_quant_algo": "FP8" if kv_fp8 else None, "exclude_modules": exclude}
    conf.setdefault("eagle_deploy", {})["hf_quantized"] = {"quant_algo": ALGO.get(weights), "kv_fp8": kv_fp8}
    (ckpt / "config.json").write_text(json.dumps(conf, indent=2) + "\n")


def _log(ctx: Any, msg: str) -> None:
    with ctx.log_path.open("a") as f:
        f.write(msg + "\n")
    print(f"[{layout.CHECKPOINT}] {msg}", file=sys.stderr, flush=True)


def run_hf_quant(ctx: Any, hf: Path) -> Fp8Report:
    """Quantize, export, check against the loader rules, mirror for the reference engine and measure tau."""
    cfg: BuildConfig = ctx.cfg
    q = cfg.quantization
    weights, kv = q.weights, q.kv_cache == "fp8"
    calib, held = prompt_sets(cfg)
    layers = llama_spec(hf, require_arch=False).num_hidden_layers
    pytorch = cfg.engine.kind.loads_hf_target  # TensorRT-LLM reads the export itself
    with tempfile.TemporaryDirectory(prefix="eagle-hfq-") as tmp_name:
        tmp = Path(tmp_name)
        export = ctx.out / HF_QUANTIZED if pytorch else tmp / HF_QUANTIZED
        _log(ctx, f"step 1/4: ModelOpt {ALGO.get(weights, 'KV-only')} calibration on {len(calib)} "
                  f"{q.calibration.dataset} "
                  f"prompts{' + FP8 KV cache' if kv else ''}; Hugging Face export -> {export.name}/")
        export_quantized(hf, export, weights=weights, kv_fp8=kv, dtype=cfg.target.dtype, prompts=calib,
                         max_length=q.calibration.max_length)
        generic = generic_row(hf)
        problems = (hf_quant_generic.loader_problems(export, weights=weights, kv_fp8=kv) if generic
                    else loader_problems(export, weights=weights, kv_fp8=kv, layers=layers))
        if problems:
            raise Fp8Error("the ModelOpt export departs from what TensorRT-LLM's loader reads (builders/trtllm/"
                           "ledger_hf_quant.py): " + "; ".join(problems[:6]))
        _log(ctx, f"step 2/4: the 16-bit reference checkpoint (to measure tau against the {ALGO.get(weights, 'KV')} "
                  "one)")
        ck16 = _reference16(cfg, hf, ctx.out, tmp / "ckpt16") if not generic else _generic16(ctx.out, tmp / "ckpt16")
        ref = ctx.out if not pytorch else tmp / "ckpt_quant"
        _log(ctx, "step 3/4: the reference engine's mirror of the export (the weights as TensorRT-LLM's loader "
                  "leaves them)")
        if generic:
            if pytorch:
                shutil.copytree(ck16, ref, symlinks=True)
            generic_reference(hf, export, ref, weights=weights, kv_fp8=kv, dtype=cfg.target.dtype)
        else:
            reference_checkpoint(ck16, export, ref, weights=weights, kv_fp8=kv, dtype=cfg.target.dtype)
        tau_of = reference_tau(cfg, held, TAU_NEW_TOKENS) if held and cfg.draft.kind.eagle3 else None
        if tau_of is not None:
            _log(ctx, f"step 4/4: tau of the head against the 16-bit and the quantized target on {len(held)} "
                      "held-out prompts (two reference-engine runs)")
        tau16 = tau_of(ck16) if tau_of else None
        tau_q = tau_of(ref) if tau_of else None
    if pytorch:
        ctx.notes[layout.TRTLLM_MODEL_NOTE] = str(ctx.final / HF_QUANTIZED)
    report = Fp8Report(len(calib), tau16, tau_q, q.calibration.max_tau_drop)
    from transformers import AutoTokenizer

    fmt = prompt_format(AutoTokenizer.from_pretrained(hf))
    ctx.notes["quantization"] = dict(
        report.to_json(), weights=weights, kv_cache=q.kv_cache, export="ModelOpt export_hf_checkpoint",
        held_out_prompts=len(held) if tau_of else 0, prompt_format=fmt,
        reference_activations="fake-quantized FP8 (input_scale)" if weights == "fp8" else
        ("16-bit (no NVFP4 activation path in the reference engine)" if weights == "nvfp4" else "16-bit"))
    label = ALGO.get(weights, "FP8 KV cache")
    if tau16 is not None and tau_q is not None:
        line = (f"{label}: tau 16-bit {tau16:.3f} vs {label} {tau_q:.3f} on {len(held)} held-out prompts "
                f"({len(calib)} used for calibration)")
    else:
        line = f"{label}: calibrated on {len(calib)} prompts; tau NOT measured (no held-out prompts left)"
    for msg in [line] + ([report.warning] if report.warning else []):
        _log(ctx, msg)
    return report
