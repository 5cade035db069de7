"""FP8 for the EAGLE-1 drafter (`eagle_nets.{k}.drafter.*`) of an EagleForCausalLM checkpoint.

ModelOpt calibrates the Hugging Face target only; the drafter is measured here by running the reference engine on
the 16-bit checkpoint over the calibration prompts with observers on the drafter's linears (same per-tensor amax
recipe as ModelOpt's FP8_DEFAULT_CFG: scale = amax / 448):

- KV cache (`attention.kv_cache_scaling_factor`, needed whenever the KV cache is FP8: TensorRT-LLM's
  quantization/quantize.py kv_cache_quantize() gives every Attention of the model that parameter, the drafter's
  included, and PretrainedModel.load refuses a checkpoint without it). TensorRT-LLM keeps one scale for K and V
  (modeling_utils.py preprocess_weights takes max(k, v)). K is cached after RoPE, which rotates each pair
  (k_i, k_{i+D/2}) (GPT-NeoX layout): |rope(k)_i| <= |(k_i, k_{i+D/2})|, so the pair norm of the pre-RoPE K
  bounds the cached values from above; that bound is used (the scale is never too small, so nothing clips).
- linears (weights and activations), used only when the drafter itself is quantized (`quantize_drafter_weights`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

FP8_MAX = 448.0  # largest finite float8_e4m3fn
LINEARS = ("attention.qkv", "attention.dense", "mlp.fc", "mlp.gate", "mlp.proj")


@dataclass
class DrafterStats:
    """Per-tensor amax of the drafter, from calibration: kv[j] for layer j, inputs[name] for each linear."""

    kv: dict[int, float] = field(default_factory=dict)
    inputs: dict[str, float] = field(default_factory=dict)

    def kv_scale(self, layer: int) -> float:
        return max(self.kv[layer], 1e-12) / FP8_MAX


class _Observed:
    """Wraps an engine `Linear`: records amax of its input (and, for qkv, of the cached K / V) on every call."""

    def __init__(self, inner: Any, names: tuple[str, ...], stats: DrafterStats,
                 kv: tuple[int, int, int, int] | None) -> None:
        self.inner, self.names, self.stats, self.kv = inner, names, stats, kv

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        for name in self.names:  # a fused product (fc and gate) reads one input for several checkpoint linears
            self.stats.inputs[name] = max(self.stats.inputs.get(name, 0.0), float(x.abs().max()))
        y = self.inner(x)
        if self.kv is not None:
            layer, q, kv_width, head_dim = self.kv
            k = y[..., q:q + kv_width].float().reshape(*y.shape[:-1], -1, head_dim)
            v = y[..., q + kv_width:q + 2 * kv_width].float()
            half = head_dim // 2
            k_bound = torch.sqrt(k[..., :half] ** 2 + k[..., half:] ** 2)  # RoPE pair norms
            amax = max(float(k_bound.max()), float(v.abs().max()))
            self.stats.kv[layer] = max(self.stats.kv.get(layer, 0.0), amax)
        return y


def _observe(drafter: Any, stats: DrafterStats) -> None:
    """Replace the drafter's linears by observers (names as in the checkpoint, below `drafter.`)."""
    drafter.fc = _Observed(drafter.fc, ("fc",), stats, None)
    for j, layer in enumerate(drafter.layers):
        a = layer.attn
        kv = (j, a.heads * a.head_dim, a.kv_heads * a.head_dim, a.head_dim)
        a.qkv = _Observed(a.qkv, (f"layers.{j}.attention.qkv",), stats, kv)
        a.dense = _Observed(a.dense, (f"layers.{j}.attention.dense",), stats, None)
        m = layer.mlp
        if m.fc_gate is not None:  # the engine runs fc and gate as one stacked product of the same input
            m.fc_gate = _Observed(m.fc_gate, (f"layers.{j}.mlp.fc", f"layers.{j}.mlp.gate"), stats, None)
        else:
            m.fc = _Observed(m.fc, (f"layers.{j}.mlp.fc",), stats, None)
            m.gate = _Observed(m.gate, (f"layers.{j}.mlp.gate",), stats, None)
        m.proj = _Observed(m.proj, (f"layers.{j}.mlp.proj",), stats, None)


def calibrate_drafter(ckpt16: Path, tree: Any, dtype: str, device: str, encode: Callable[[Any], list[list[int]]],
                      max_new_tokens: int) -> DrafterStats:
    """Run greedy speculative decoding with the reference engine on a 16-bit EagleForCausalLM checkpoint (tp=1) over
    `encode(tokenizer)` (the calibration prompts' token ids) and return the drafter's amax statistics."""
    from engines.api import GenerationRequest, ReferenceEngine, SamplingParams

    eng = ReferenceEngine.from_checkpoint(ckpt16, tree=tree, dtype=dtype, device=device)
    stats = DrafterStats()
    _observe(eng._rt.drafter, stats)  # the engine object is ours for this run only
    eos = eng.tokenizer.eos_token_id
    reqs = [GenerationRequest(prompt_ids=i, max_new_tokens=max_new_tokens, sampling=SamplingParams(),
                              stop_token_ids=[eos] if eos is not None else []) for i in encode(eng.tokenizer)]
    eng.generate(reqs, speculative=True)
    return stats


def kv_scale_tensors(stats: DrafterStats, num_eagle_layers: int) -> dict[str, torch.Tensor]:
    """`eagle_nets.{k}.drafter.layers.{j}.attention.kv_cache_scaling_factor` for every head copy k (all copies hold
    the same head, so they share the scales)."""
    out = {}
    for k in range(num_eagle_layers):
        for j in sorted(stats.kv):
            name = f"eagle_nets.{k}.drafter.layers.{j}.attention.kv_cache_scaling_factor"
            out[name] = torch.tensor([stats.kv_scale(j)], dtype=torch.float32)
    return out


def _fp8_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = (w.float().abs().max().clamp(min=1e-12) / FP8_MAX).reshape(1)
    q = (w.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale.float()


def quantize_drafter_weights(tensors: dict[str, torch.Tensor], stats: DrafterStats,
                             num_eagle_layers: int) -> dict[str, torch.Tensor]:
    """The rank's tensors with every drafter linear (fc and each layer's linears, every head copy) in FP8:
    float8_e4m3fn `weight`, `weights_scaling_factor` = amax(W) / 448, `activation_scaling_factor` = amax(input) / 448
    (tensorrt_llm/quantization/layers.py FP8Linear). Biases and the drafter's lm_head stay 16-bit."""
    out = dict(tensors)
    names = ["fc"] + [f"layers.{j}.{lin}" for j in sorted(stats.kv) for lin in LINEARS]
    for k in range(num_eagle_layers):
        for n in names:
            pre = f"eagle_nets.{k}.drafter.{n}"
            w8, ws = _fp8_weight(tensors[f"{pre}.weight"])
            out[f"{pre}.weight"] = w8
            out[f"{pre}.weights_scaling_factor"] = ws
            act = max(stats.inputs[n], 1e-12) / FP8_MAX
            out[f"{pre}.activation_scaling_factor"] = torch.tensor([act], dtype=torch.float32)
    return out


def drafter_exclude(num_eagle_layers: int, drafter_fp8: bool) -> list[str]:
    """`exclude_modules` of the checkpoint: the target's lm_head always; the drafter's lm_head copies (upstream's
    examples/eagle/convert_checkpoint.py adds `eagle_nets.{i}.lm_head`) or, with a 16-bit drafter, all of it."""
    if drafter_fp8:
        return ["lm_head"] + [f"eagle_nets.{i}.lm_head" for i in range(num_eagle_layers)]
    return ["lm_head", "eagle_nets.*"]


def write_fp8_drafter(ckpt_dir: Path, stats: DrafterStats, num_eagle_layers: int) -> None:
    """Turn an FP8 (target) EagleForCausalLM checkpoint into one whose drafter linears are FP8 too, as upstream's
    EAGLE FP8 recipe quantizes them: rank0 rewritten, exclude_modules narrowed to the lm_heads (tp=1 only)."""
    import json

    from safetensors.torch import load_file, save_file

    conf = json.loads((ckpt_dir / "config.json").read_text())
    if conf["mapping"]["tp_size"] != 1:
        raise ValueError(f"{ckpt_dir}: the FP8 drafter variant is written for tp=1 checkpoints only")
    rank = ckpt_dir / "rank0.safetensors"
    tensors = quantize_drafter_weights(load_file(str(rank)), stats, num_eagle_layers)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(rank), metadata={"format": "pt"})
    for block in (conf["quantization"], conf["eagle_net_config"]["quantization"]):
        block["quant_algo"] = "FP8"
        block["exclude_modules"] = drafter_exclude(num_eagle_layers, True)
    (ckpt_dir / "config.json").write_text(json.dumps(conf, indent=2) + "\n")
