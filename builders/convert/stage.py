"""The convert stage: target (+ head) -> `<output_dir>/checkpoint/`.

- draft.type eagle  -> EagleForCausalLM checkpoint (tree limits from cfg.limits(), the single source of truth)
- draft.type eagle3 -> target checkpoint (LlamaForCausalLM layout, plus the family's tensors for Qwen2 / Qwen3 /
  Mistral; a `generic_target` config for the generic families) + normalized head in checkpoint/eagle3/, from a head
  in any layout the doctor reads (SafeAILab, SpecForge, ModelOpt, speculators / vLLM, this project's). On
  engine.backend pytorch the target's weights are not copied (TensorRT-LLM loads the HF target itself): config.json
  (its shape), tokenizer/ and eagle3/ are what the later stages and the serving path read (plan_outputs says who).
- draft.model random -> a random SafeAILab head is written to checkpoint/random_head/ first and converted; RANDOM
  appears in the checkpoint config (`eagle_deploy.random_head`), the manifest notes and the stage log.
The checkpoint is 16-bit (target.dtype) unless quantization.weights or quantization.kv_cache is fp8: then the FP8
branch below (builders/convert/fp8.py: ModelOpt calibration + export) replaces the target's linears with FP8 weights
and scales.
"""

from __future__ import annotations

import sys
from pathlib import Path

from builders.config import BuildConfig
from builders.convert.checks import preflight
from builders.published import fp8_head_warning
from builders.convert.eagle import convert_eagle
from builders.convert.eagle3 import EAGLE3_DIR, convert_eagle3
from builders.convert.head_layout import flat_head, named_as_given
from builders.convert.hf_quant_stage import (FP8_REFERENCE, HF_QUANTIZED, current_line, generic_row, quantizes,
                                             run_hf_quant)
from builders.convert.llama import Provenance
from builders.convert.random_head import RANDOM_LABEL, write_random_head
from sources.targets import ModelSourceError, resolve_target
from builders.convert.hf_compat import needs_transformers4_copy, write_transformers4_copy
from builders.layout import CHECKPOINT, HF_MODEL, HF_TARGET_NOTE, TRTLLM_MODEL_NOTE
from builders.pipeline import Output, Stage, StageContext, StageError
from core.hfconfig import read_config
from core.records import record_path


def target_architecture(hf: Path) -> str:
    return str((read_config(hf).get("architectures") or ["?"])[0])

STAGE_NAME = CHECKPOINT
RANDOM_HEAD_DIR = "random_head"


def _log(ctx: StageContext, msg: str) -> None:
    with ctx.log_path.open("a") as f:
        f.write(msg + "\n")
    print(f"[{STAGE_NAME}] {msg}", file=sys.stderr, flush=True)


def external_inputs(cfg: BuildConfig) -> list[Path]:
    """Target directory (resolved: GGUF / pip targets map to their cached HF dir) and the head directory."""
    try:
        target = resolve_target(cfg.target.model)
    except ModelSourceError:
        target = Path(cfg.target.model)  # preflight has reported it; the fingerprint records it as missing
    return [target] + ([] if cfg.draft.model == "random" else [Path(cfg.draft.model)])


def writes_target_weights(cfg: BuildConfig) -> bool:
    """The converted target weights (rank*.safetensors) are read by trtllm-build (engine.backend tensorrt) and the
    reference engine only: the PyTorch backend's TensorRT-LLM loads the Hugging Face target itself."""
    return not cfg.engine.kind.loads_hf_target


def plan_outputs(cfg: BuildConfig) -> list[Output]:
    world = cfg.parallel.tp * cfg.parallel.pp
    arch, backend = cfg.draft.kind.checkpoint_architecture, cfg.engine.kind
    if writes_target_weights(cfg):
        out = [Output("config.json", f"TensorRT-LLM checkpoint config ({arch}, {cfg.target.dtype}, "
                      f"tp={cfg.parallel.tp})", backend.target_weights_reader)]
        out += [Output(f"rank{r}.safetensors", "the target's weights (+ the EAGLE-1 head's) of one rank",
                       backend.target_weights_reader) for r in range(world)]
    else:
        out = [Output("config.json", f"the target's shape ({arch}); no weights: TensorRT-LLM's PyTorch backend loads "
                      "the Hugging Face target", "the engine stage (architecture, layer count for "
                      "eagle3_layers_to_capture), python -m ledger.check")]
    tok_reader = backend.tokenizer_reader
    out.append(Output("tokenizer/", "the target's tokenizer", tok_reader))
    if cfg.draft.kind.eagle3:
        out.append(Output(f"{EAGLE3_DIR}/", "normalized EAGLE-3 head: config.json + model.safetensors",
                          backend.eagle3_head_reader))
    if needs_transformers4_copy(cfg):
        out.append(Output(f"{HF_MODEL}/", "the target's HF directory as TensorRT-LLM's transformers 4 reads it "
                          "(weights linked, not copied)", "trtllm-serve, the Triton llmapi model (model.yaml)"))
    if backend.loads_hf_target and current_line(cfg) and quantizes(cfg):
        out.append(Output(f"{HF_QUANTIZED}/", f"the target quantized by ModelOpt ({cfg.quantization.weights} weights, "
                          f"{cfg.quantization.kv_cache} KV cache): Hugging Face unified format + tokenizer",
                          "trtllm-serve, the Triton llmapi model (model.yaml)"))
    if backend.reference_engine and current_line(cfg) and quantizes(cfg) and _generic_quantized(cfg):
        out.append(Output(f"{FP8_REFERENCE}/", "the ModelOpt export as TensorRT-LLM's loader leaves it (dequantized "
                          "weights + the FP8 activation and KV scales): a Hugging Face directory",
                          "the reference engine (config.json generic_target)"))
    if cfg.draft.model == "random":
        out.append(Output(f"{RANDOM_HEAD_DIR}/", f"{RANDOM_LABEL} EAGLE-1 head, seed {cfg.draft.seed}: acceptance ~0",
                          "this stage (converted into the checkpoint)"))
    return out


def _generic_quantized(cfg: BuildConfig) -> bool:
    try:
        return generic_row(resolve_target(cfg.target.model))
    except (ModelSourceError, OSError, ValueError):
        return False  # the preflight names the target


def _trtllm_model_dir(ctx: StageContext, hf: Path) -> Path:
    if not needs_transformers4_copy(ctx.cfg):
        return hf
    changed = write_transformers4_copy(hf, ctx.out / HF_MODEL)
    _log(ctx, f"{HF_MODEL}/: {hf} as transformers 4 reads it (config keys {changed} rewritten, tokenizer_config.json "
              "as tokenizer/, weights linked)")
    return ctx.final / HF_MODEL


def run(ctx: StageContext) -> None:
    cfg = ctx.cfg
    hf = resolve_target(cfg.target.model)
    ctx.notes[HF_TARGET_NOTE] = str(hf)  # resolved once here; later stages and tools read this note
    ctx.notes["dtype"] = cfg.target.dtype
    _log(ctx, f"target {cfg.target.model} -> {hf}")
    warning = fp8_head_warning(cfg, hf)  # an upstream issue users should hear of (builders/published.py)
    if warning:
        _log(ctx, warning)
        ctx.notes["upstream_warning"] = warning
    random = cfg.draft.model == "random"
    if random:
        head_dir = ctx.out / RANDOM_HEAD_DIR
        _log(ctx, f"{RANDOM_LABEL} head: writing a randomly initialized EAGLE-1 head (seed {cfg.draft.seed}) to "
                  f"{RANDOM_HEAD_DIR}/; drafts will be noise (acceptance ~0)")
        write_random_head(hf, head_dir, cfg.draft.seed)
        ctx.notes["random_head"] = f"{RANDOM_LABEL}: randomly initialized head, seed {cfg.draft.seed}"
    else:
        head_dir = Path(cfg.draft.model)
    prov = Provenance(  # sources relative to the build directory (core/records.py)
        random_head=random,
        target_source=record_path(cfg.target.model, ctx.build_dir),
        head_source=f"{RANDOM_LABEL} (seed {cfg.draft.seed})" if random else record_path(head_dir, ctx.build_dir),
    )
    ctx.notes["head_source"] = prov.head_source
    try:
        if not cfg.draft.kind.eagle3:
            lim = cfg.limits()
            _log(ctx, f"EagleForCausalLM: max_draft_len={lim.max_draft_len} num_eagle_layers={lim.num_eagle_layers} "
                      f"max_non_leaves_per_layer={lim.max_non_leaves_per_layer} tp={cfg.parallel.tp}")
            convert_eagle(hf, head_dir, ctx.out, dtype=cfg.target.dtype, max_draft_len=lim.max_draft_len,
                          num_eagle_layers=lim.num_eagle_layers, max_non_leaves_per_layer=lim.max_non_leaves_per_layer,
                          tp=cfg.parallel.tp, provenance=prov)
        else:
            _log(ctx, f"{target_architecture(hf)} target + EAGLE-3 head -> {EAGLE3_DIR}/, tp={cfg.parallel.tp}")
            if not writes_target_weights(cfg):
                _log(ctx, "target weights not copied: engine.backend pytorch loads the Hugging Face target "
                          f"({hf}); config.json records its shape only")
            with flat_head(head_dir) as flat:  # any layout the doctor reads (builders/convert/head_layout.py)
                if flat != head_dir:
                    _log(ctx, f"{head_dir}: a speculators (vLLM) head, read through its flat view")
                try:
                    convert_eagle3(hf, flat, ctx.out, dtype=cfg.target.dtype, tp=cfg.parallel.tp,
                                   layers_to_capture=cfg.draft.eagle3.layers_to_capture, provenance=prov,
                                   target_weights=writes_target_weights(cfg))
                except ValueError as e:
                    raise ValueError(named_as_given(str(e), flat, head_dir)) from e
    except ValueError as e:  # ModelConfigError / WeightFileError: inputs changed since preflight
        raise StageError(str(e)) from e
    _log(ctx, "checkpoint written")
    ctx.notes[TRTLLM_MODEL_NOTE] = str(_trtllm_model_dir(ctx, hf))
    if quantizes(cfg):
        _quantize(ctx, hf)


def _quantize(ctx: StageContext, hf: Path) -> None:
    """The current line: ModelOpt's Hugging Face export (builders/convert/hf_quant_stage.py); the engine flow's
    versions: FP8 merged into the TRT-LLM checkpoint just written (builders/convert/fp8.py)."""
    from builders.convert.fp8 import Fp8Error, run_fp8

    try:
        if current_line(ctx.cfg):
            run_hf_quant(ctx, hf)
        elif ctx.cfg.engine.kind.loads_hf_target:  # 1.1 / 1.2, KV cache only (the rules refuse FP8 weights there)
            _log(ctx, "quantization.kv_cache=fp8: TensorRT-LLM's PyTorch backend takes kv_cache_config.dtype fp8 "
                      "from the LLM API options; no calibration is written for it")
        else:
            run_fp8(ctx, hf)
    except Fp8Error as e:
        raise StageError(str(e)) from e


CONVERT_STAGE = Stage(
    name=STAGE_NAME,
    description="convert the target (+ EAGLE head) to a TensorRT-LLM checkpoint",
    external_inputs=external_inputs,
    depends_on=(),
    run=run,
    preflight=preflight,
    plan_outputs=plan_outputs,
)
