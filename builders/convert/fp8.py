"""FP8 target quantization with NVIDIA ModelOpt, merged into our TRT-LLM checkpoint.

Flow (called by the convert stage after it wrote the 16-bit checkpoint):
1. load the HF target in float32, `mtq.quantize(model, FP8_DEFAULT_CFG [+ FP8_KV_CFG], forward_loop)` where the
   loop runs the calibration prompts (chat template applied when the tokenizer has one, else the raw text of a base
   model; truncated to calibration.max_length) under a tqdm bar;
   ModelOpt records per-tensor amax of every linear's weight and input (and of K/V with the KV config);
2. `export_tensorrt_llm_checkpoint(model, "llama", dtype, dir, inference_tensor_parallel=tp)`: float8_e4m3fn
   weights with `weights_scaling_factor` = amax_w / 448 and `activation_scaling_factor` = amax_x / 448 per linear,
   `attention.kv_cache_scaling_factor` with FP8 KV (modelopt/torch/export/model_config_export.py); lm_head stays
   16-bit (FP8_DEFAULT_CFG disables `*lm_head*`, the export lists it in exclude_modules);
3. merge: every target linear of our checkpoint is replaced by the exported FP8 weight + scales (same TRT-LLM
   names and shapes, or we stop); embeddings, norms and lm_head stay as our converter wrote them (its layout, e.g.
   replicated embedding under tp, is the one our config.json describes). With an FP8 KV cache the EAGLE-1 drafter's
   attentions get their own `kv_cache_scaling_factor`, measured on the 16-bit checkpoint by
   builders/convert/fp8_drafter.py (TensorRT-LLM requires one on every Attention), and `eagle_net_config.quantization`
   repeats the block.
   config.json gets quantization {quant_algo FP8, kv_cache_quant_algo, exclude_modules [lm_head, eagle_nets.*]}:
   the drafter's linears stay 16-bit (upstream's EAGLE FP8 recipe quantizes them and excludes only
   `eagle_nets.{i}.lm_head`; docs/fp8.md has the tau measured both ways and the reason for the choice).
The EAGLE-3 flow keeps its head in checkpoint/eagle3/ (never quantized).
"""

from __future__ import annotations

import sys

import copy
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from builders import layout
from builders.config import BuildConfig

HEAD_PREFIX = "eagle_nets."
LINEAR_SUFFIXES = tuple(f".{m}.weight" for m in ("attention.qkv", "attention.dense", "mlp.fc", "mlp.gate", "mlp.proj"))
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
QUANTIZED = ("fp8", "nvfp4")  # quantization.weights values that quantize the target


class Fp8Error(ValueError):
    """FP8 quantization cannot proceed; the message names the cause and the fix."""


def fp8_problems(cfg: BuildConfig) -> list[str]:
    q = cfg.quantization
    if q.weights == "none" and q.kv_cache == "none":
        return []
    p = []
    if cfg.target.dtype not in DTYPES:
        p.append(f"quantization with target.dtype={cfg.target.dtype}: FP8 checkpoints keep 16-bit activations and "
                 "non-quantized tensors; set target.dtype to float16 or bfloat16")
    return p


def quant_config(weights: str, kv_fp8: bool) -> dict[str, Any]:
    """ModelOpt's FP8 (or NVFP4) default config (per-tensor e4m3 weights and inputs, or e2m1 with e4m3 scales per 16,
    lm_head disabled) and/or its FP8 KV config. KV only = every quantizer disabled except the K/V ones (the default
    config's first rule disables '*')."""
    import modelopt.torch.quantization as mtq

    cfg = copy.deepcopy(mtq.NVFP4_DEFAULT_CFG if weights == "nvfp4" else mtq.FP8_DEFAULT_CFG)
    if weights == "none":
        cfg["quant_cfg"] = [e for e in cfg["quant_cfg"] if e.get("enable") is False]
    if kv_fp8:
        cfg["quant_cfg"] = list(cfg["quant_cfg"]) + copy.deepcopy(list(mtq.FP8_KV_CFG["quant_cfg"]))
    return cfg


def prompt_format(tokenizer: Any) -> str:
    """"chat" when the tokenizer has a chat template (an instruct model is served chat-formatted prompts), else
    "raw": a base model sees plain text, so it is calibrated on the plain prompt text."""
    return "chat" if getattr(tokenizer, "chat_template", None) else "raw"


def encode_prompts(tokenizer: Any, prompts: list[str], max_length: int) -> list[torch.Tensor]:
    """Truncated token ids of what the target sees in serving: chat-formatted (sources.data.chat_ids) for a tokenizer
    with a chat template, the raw text (with the tokenizer's special tokens, as preprocessing adds them) otherwise."""
    from sources.data import chat_ids

    if prompt_format(tokenizer) == "chat":
        ids = [chat_ids(tokenizer, p) for p in prompts]
    else:
        ids = [[int(i) for i in tokenizer(p, add_special_tokens=True)["input_ids"]] for p in prompts]
    return [torch.tensor([x[:max_length]], dtype=torch.long) for x in ids]


def calibration_prompts(cfg: BuildConfig) -> list[str]:
    """`quantization.calibration.num_samples` prompts from MT-bench (first turns) or ShareGPT (first human turns)."""
    from sources import data

    c = cfg.quantization.calibration
    if c.dataset == "mtbench":
        prompts = [q.turns[0] for q in data.mtbench_questions(limit=c.num_samples)]
    else:
        prompts = data.sharegpt_prompts(c.num_samples)
    if len(prompts) < c.num_samples:
        raise Fp8Error(f"quantization.calibration.num_samples={c.num_samples} but {c.dataset} has only "
                       f"{len(prompts)} prompts; lower num_samples or use dataset sharegpt")
    return prompts


def calibrate(hf_dir: Path, prompts: list[str], max_length: int, weights_fp8: bool, kv_fp8: bool) -> torch.nn.Module:
    """Load the HF target (float32, CPU or CUDA) and run ModelOpt FP8 calibration over the prompts."""
    return calibrate_model(hf_dir, prompts, max_length, "fp8" if weights_fp8 else "none", kv_fp8)


def calibrate_model(hf_dir: Path, prompts: list[str], max_length: int, weights: str, kv_fp8: bool) -> torch.nn.Module:
    """Load the HF target (float32, CPU or CUDA) and run ModelOpt calibration (`weights` fp8 / nvfp4 / none) over
    the prompts."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import modelopt.torch.quantization as mtq
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not prompts:
        raise Fp8Error("no calibration prompts; raise quantization.calibration.num_samples")
    tok = AutoTokenizer.from_pretrained(hf_dir)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device).eval()
    batches = encode_prompts(tok, prompts, max_length)

    def forward_loop(m: torch.nn.Module) -> None:
        with torch.no_grad():
            for ids in tqdm(batches, desc="FP8 calibration", unit="prompt"):
                m(ids.to(device))

    return mtq.quantize(model, quant_config(weights, kv_fp8), forward_loop)


def export_fp8(model: torch.nn.Module, dtype: str, tp: int, out_dir: Path) -> None:
    import warnings

    from modelopt.torch.export import export_tensorrt_llm_checkpoint

    with warnings.catch_warnings():  # without tensorrt_llm installed ModelOpt writes config.json by hand (warns)
        warnings.simplefilter("ignore")
        export_tensorrt_llm_checkpoint(model, "llama", DTYPES[dtype], out_dir, inference_tensor_parallel=tp)


def _load(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path))


def merge_rank(ours: dict[str, torch.Tensor], fp8: dict[str, torch.Tensor], rank_file: str) -> dict[str, torch.Tensor]:
    """Our 16-bit checkpoint with its quantized linears replaced by the export's FP8 weights + scales.

    Our converter stays the source of truth for the layout (embedding sharding, vocab padding, head copies): only
    float8 weights and `*_scaling_factor` tensors are taken from the export, each must replace a tensor of ours with
    the same name and shape, and every target linear must be covered; anything else means the two disagree on the
    layout and would load wrong weights, so we stop.
    """
    merged = dict(ours)
    replaced = set()
    for k, v in fp8.items():
        # ModelOpt also writes separate `k_cache_scaling_factor` / `v_cache_scaling_factor` next to their maximum,
        # `kv_cache_scaling_factor` (modelopt/torch/export/model_config_utils.py); TensorRT-LLM's Attention declares
        # only `kv_cache_scaling_factor` (tensorrt_llm/layers/attention.py), so the checkpoint keeps exactly that.
        if k.endswith((".k_cache_scaling_factor", ".v_cache_scaling_factor")):
            continue
        if k.endswith("_scaling_factor"):
            merged[k] = v
        elif v.dtype == torch.float8_e4m3fn:
            if k not in ours or tuple(ours[k].shape) != tuple(v.shape):
                got = tuple(ours[k].shape) if k in ours else "missing"
                raise Fp8Error(f"{rank_file}: FP8 export has {k} {tuple(v.shape)} but the checkpoint has {got}; "
                               "report this (converter and ModelOpt export disagree on the layout)")
            check_dequantized(k, v, fp8[k.removesuffix(".weight") + ".weights_scaling_factor"], ours[k], rank_file)
            merged[k] = v
            replaced.add(k)
    linears = {k for k in ours if not k.startswith(HEAD_PREFIX) and k.endswith(LINEAR_SUFFIXES)}
    if replaced and replaced != linears:
        missing = sorted(linears - replaced)
        raise Fp8Error(f"{rank_file}: the FP8 export did not quantize {missing[:4]}; report this")
    return merged


def check_dequantized(name: str, w8: torch.Tensor, scale: torch.Tensor, w16: torch.Tensor, rank_file: str) -> None:
    """fp8 * scale must reproduce our 16-bit weight element by element: e4m3 keeps 3 mantissa bits (relative error
    <= 2^-4) above its subnormal range (absolute step scale * 2^-9), plus 16-bit rounding of ours (<= 2^-8). A
    same-shaped tensor in another row order (e.g. a different q/k/v split under tp) fails this by far."""
    w = w16.float()
    err = (w8.float() * scale.float().reshape(-1, 1) - w).abs() if scale.numel() > 1 else \
        (w8.float() * scale.float().reshape(()) - w).abs()
    bound = w.abs() * (2**-4 + 2**-7) + float(scale.float().max()) * 2**-8
    if not bool((err <= bound).all()):
        raise Fp8Error(f"{rank_file}: FP8 {name} does not dequantize to the checkpoint's 16-bit weight (max error "
                       f"{float(err.max()):.3g}); the export's row layout differs from the converter's: report this")


def quantization_json(cfg: BuildConfig) -> dict[str, Any]:
    from builders.convert.fp8_drafter import drafter_exclude

    exclude = drafter_exclude(cfg.limits().num_eagle_layers, False) if not cfg.draft.kind.eagle3 else ["lm_head"]
    return {
        "quant_algo": "FP8" if cfg.quantization.weights == "fp8" else None,
        "kv_cache_quant_algo": "FP8" if cfg.quantization.kv_cache == "fp8" else None,
        "exclude_modules": exclude,
    }


def merge_checkpoint(ckpt_dir: Path, fp8_dir: Path, cfg: BuildConfig, extra: dict[str, torch.Tensor]) -> None:
    """Rewrite ckpt_dir's rank files and config.json in place with the FP8 target; `extra` (the drafter's KV
    scales: per-tensor, the same on every rank) is added to every rank. An EagleForCausalLM's `eagle_net_config`
    gets the same quantization block, as upstream's examples/eagle/convert_checkpoint.py writes it: the drafter's
    attention layers are built from that config, so its KV cache type must match the target's."""
    from safetensors.torch import save_file

    world = cfg.parallel.tp * cfg.parallel.pp
    for r in range(world):
        name = f"rank{r}.safetensors"
        merged = merge_rank(_load(ckpt_dir / name), _load(fp8_dir / name), name)
        merged.update(extra)
        save_file({k: v.contiguous() for k, v in merged.items()}, str(ckpt_dir / name), metadata={"format": "pt"})
    conf = json.loads((ckpt_dir / "config.json").read_text())
    conf["quantization"] = quantization_json(cfg)
    if isinstance(conf.get("eagle_net_config"), dict):
        conf["eagle_net_config"]["quantization"] = dict(conf["quantization"])
    (ckpt_dir / "config.json").write_text(json.dumps(conf, indent=2) + "\n")


@dataclass
class Fp8Report:
    prompts: int
    tau_16bit: float | None
    tau_fp8: float | None
    max_tau_drop: float

    @property
    def drop(self) -> float | None:
        if self.tau_16bit is None or self.tau_fp8 is None or self.tau_16bit == 0:
            return None
        return (self.tau_16bit - self.tau_fp8) / self.tau_16bit

    @property
    def warning(self) -> str | None:
        d = self.drop
        if d is not None and d > self.max_tau_drop:
            return (f"WARNING: FP8 costs {d:.1%} of tau ({self.tau_16bit:.3f} -> {self.tau_fp8:.3f}) on the "
                    f"calibration prompts, more than quantization.calibration.max_tau_drop={self.max_tau_drop:.0%}; "
                    "consider quantization.weights=none or more calibration samples")
        return None

    def to_json(self) -> dict[str, Any]:
        return {"calibration_prompts": self.prompts, "tau_16bit": self.tau_16bit, "tau_fp8": self.tau_fp8,
                "relative_drop": self.drop, "max_tau_drop": self.max_tau_drop, "warning": self.warning}


TauFn = Callable[[Path], float | None]


def quantize_checkpoint(
    cfg: BuildConfig, hf_dir: Path, ckpt_dir: Path, prompts: list[str], tau_of: TauFn | None = None,
) -> Fp8Report:
    """Calibrate, export and merge FP8 into `ckpt_dir` (a finished 16-bit checkpoint). `tau_of(checkpoint_dir)`
    measures tau with the reference engine (None = skip); it runs on the 16-bit copy and on the FP8 result."""
    problems = fp8_problems(cfg)
    if problems:
        raise Fp8Error("; ".join(problems))
    tau16 = None
    with tempfile.TemporaryDirectory(prefix="eagle-fp8-") as tmp:
        ref16 = Path(tmp) / "ckpt16"
        if tau_of is not None or _drafter_kv_needed(cfg):
            shutil.copytree(ckpt_dir, ref16)
        if tau_of is not None:
            tau16 = tau_of(ref16)
        extra = drafter_kv_scales(cfg, hf_dir, ref16, Path(tmp), prompts) if _drafter_kv_needed(cfg) else {}
        q = cfg.quantization
        model = calibrate(hf_dir, prompts, q.calibration.max_length, q.weights == "fp8", q.kv_cache == "fp8")
        export_dir = Path(tmp) / "fp8_export"
        export_fp8(model, cfg.target.dtype, cfg.parallel.tp, export_dir)
        del model
        merge_checkpoint(ckpt_dir, export_dir, cfg, extra)
    tau8 = tau_of(ckpt_dir) if tau_of is not None else None
    return Fp8Report(len(prompts), tau16, tau8, cfg.quantization.calibration.max_tau_drop)


DRAFTER_CALIB_PROMPTS = 16  # prompts the drafter's K/V amax is measured on (greedy speculative decoding)
DRAFTER_CALIB_TOKENS = 32


def _drafter_kv_needed(cfg: BuildConfig) -> bool:
    return not cfg.draft.kind.eagle3 and cfg.quantization.kv_cache == "fp8"  # its drafter is in the checkpoint


def drafter_kv_scales(
    cfg: BuildConfig, hf_dir: Path, ckpt16: Path, tmp: Path, prompts: list[str]
) -> dict[str, torch.Tensor]:
    """The drafter's `kv_cache_scaling_factor` tensors, measured on the 16-bit checkpoint `ckpt16` (a tp=1 copy is
    converted when the build is tensor-parallel: the reference engine runs tp>1 only inside torch.distributed)."""
    from builders.convert.eagle import convert_eagle
    from builders.convert.fp8_drafter import calibrate_drafter, kv_scale_tensors

    lim = cfg.limits()
    if cfg.parallel.tp > 1:
        head = ckpt16 / "random_head" if cfg.draft.model == "random" else Path(cfg.draft.model)
        one = tmp / "ckpt16_tp1"
        convert_eagle(
            hf_dir,
            head,
            one,
            dtype=cfg.target.dtype,
            max_draft_len=lim.max_draft_len,
            num_eagle_layers=lim.num_eagle_layers,
            max_non_leaves_per_layer=lim.max_non_leaves_per_layer,
            tp=1,
        )
        ckpt16 = one
    n = min(DRAFTER_CALIB_PROMPTS, len(prompts))
    max_len = cfg.quantization.calibration.max_length

    def encode(tok: Any) -> list[list[int]]:
        return [t[0].tolist() for t in encode_prompts(tok, prompts[:n], max_len)]

    stats = calibrate_drafter(ckpt16, cfg.draft_tree, cfg.target.dtype, cfg.engine.device,
                              encode, DRAFTER_CALIB_TOKENS)
    return kv_scale_tensors(stats, lim.num_eagle_layers)


def reference_tau(cfg: BuildConfig, prompts: list[str], max_new_tokens: int = 32) -> TauFn:
    """tau_of(checkpoint_dir) for `quantize_checkpoint`: greedy speculative decoding with the reference engine on
    the calibration prompts, aggregate (forward-weighted) tau. EAGLE-1 checkpoints carry their head; the EAGLE-3
    head is read from `<checkpoint>/eagle3`."""

    def tau_of(ckpt: Path) -> float | None:
        from engines.api import GenerationRequest, ReferenceEngine, SamplingParams

        tree = cfg.draft_tree
        head3 = ckpt / layout.EAGLE3_HEAD if cfg.draft.kind.eagle3 else None
        eng = ReferenceEngine.from_checkpoint(ckpt, tree=tree, dtype=cfg.target.dtype, device=cfg.engine.device,
                                              eagle3_head_dir=head3)
        tok = eng.tokenizer
        ids = [t[0].tolist() for t in encode_prompts(tok, prompts, cfg.quantization.calibration.max_length)]
        eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
        reqs = [GenerationRequest(prompt_ids=i, max_new_tokens=max_new_tokens, sampling=SamplingParams(),
                                  stop_token_ids=eos) for i in ids]
        desc = f"tau on {checkpoint_label(ckpt)} ({len(reqs)} prompts x {max_new_tokens} tokens, reference engine)"
        results = generate_with_progress(eng, reqs, desc, cfg.engine.max_batch_size or len(reqs))
        return ReferenceEngine.aggregate(results).tau

    return tau_of


def checkpoint_label(ckpt: Path) -> str:
    """What a checkpoint holds, for progress lines: its quantization (config.json `quantization.quant_algo`)."""
    try:
        q = json.loads((ckpt / "config.json").read_text()).get("quantization") or {}
    except (OSError, ValueError):
        return ckpt.name
    algo, kv = q.get("quant_algo"), q.get("kv_cache_quant_algo")
    return (f"the {algo} target" if algo else "the 16-bit target") + (f" with an {kv} KV cache" if kv else "")


def generate_with_progress(eng: Any, reqs: list[Any], desc: str, batch: int) -> list[Any]:
    """Greedy speculative decoding of `reqs` in batches of `batch` (greedy tokens do not depend on the batch), with a
    progress bar on stderr: what is being measured and how far."""
    from tqdm import tqdm

    b = max(1, batch)
    out: list[Any] = []
    with tqdm(total=len(reqs), desc=desc, unit="prompt", file=sys.stderr) as bar:
        for i in range(0, len(reqs), b):
            out += eng.generate(reqs[i:i + b], speculative=True)
            bar.update(len(reqs[i:i + b]))
    return out


TAU_PROMPTS = 8  # tau is measured on the first calibration prompts (two reference-engine runs per build)
TAU_NEW_TOKENS = 32


def run_fp8(ctx: Any, hf_dir: Path) -> Fp8Report:
    """The convert stage's FP8 step: quantize `ctx.out` in place, record and print the tau report."""
    import sys

    cfg = ctx.cfg
    prompts = calibration_prompts(cfg)
    n_tau = min(TAU_PROMPTS, len(prompts))
    # The reference engine loads a tp>1 checkpoint only inside a torch.distributed group of that size (engines/
    # parallel.py), which a build step does not start: tau is then not measured, and the report says so.
    tau_of = reference_tau(cfg, prompts[:n_tau], TAU_NEW_TOKENS) if cfg.parallel.tp == 1 else None
    report = quantize_checkpoint(cfg, hf_dir, ctx.out, prompts, tau_of=tau_of)
    from transformers import AutoTokenizer

    fmt = prompt_format(AutoTokenizer.from_pretrained(hf_dir))
    ctx.notes["fp8"] = dict(report.to_json(), tau_prompts=n_tau if tau_of else 0, prompt_format=fmt)
    if report.tau_16bit is not None and report.tau_fp8 is not None:
        line = (f"FP8: tau 16-bit {report.tau_16bit:.3f} vs FP8 {report.tau_fp8:.3f} on {n_tau} calibration prompts "
                f"({len(prompts)} used for calibration)")
    else:
        line = (f"FP8: calibrated on {len(prompts)} prompts; tau NOT measured (parallel.tp={cfg.parallel.tp}: run "
                "the reference engine under torch.distributed to compare FP8 with 16-bit)")
    if fmt == "raw":
        line += "; the target's tokenizer has no chat template (a base model): calibrated on the raw prompt text"
    for msg in [line] + ([report.warning] if report.warning else []):
        with ctx.log_path.open("a") as f:
            f.write(msg + "\n")
        print(f"[checkpoint] {msg}", file=sys.stderr, flush=True)
    return report
