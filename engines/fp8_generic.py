"""FP8 activations of a generic target mirrored from ModelOpt's export (builders/convert/hf_quant_generic.py writes
the weights dequantized and `eagle_deploy_fp8.json` beside them): what TensorRT-LLM's FP8 GEMMs see of their inputs.

- `linears`: module name -> input scale; the input of that nn.Linear is fake-quantized, fp8(x / s) * s
  (FP8QDQLinearMethod: one per-tensor input scale, a fused group's largest);
- `experts`: MoE experts module -> {gate_up, down}: one input scale per MoE layer for each GEMM
  (FP8QDQFusedMoEMethod's fc31_input_dequant and fc2_quant). transformers keeps the experts as 3-D parameters run by
  its own loop; the loop is replaced on that module by the same computation with the two inputs fake-quantized
  (`_Fp8Experts`), for experts modules of that layout (gate_up_proj [E, 2I, H], down_proj [E, H, I], act_fn), else
  the load is refused;
- `kv_cache_scale`: the FP8 KV cache's scale (the reference engine's cache stores fp8(k / s) * s).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from engines.errors import CheckpointError
from engines.linear import fake_quant_fp8

SCALES_FILE = "eagle_deploy_fp8.json"


def read_scales(hf_dir: Path) -> dict[str, Any] | None:
    f = hf_dir / SCALES_FILE
    if not f.is_file():
        return None
    try:
        return dict(json.loads(f.read_text()))
    except ValueError as e:
        raise CheckpointError(f"{f}: {e}; rebuild the checkpoint") from None


def _scale(v: Any, where: str) -> torch.Tensor:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not (v > 0 and v < float("inf")):
        raise CheckpointError(f"{where}={v!r}: a quantization scale is a finite positive number; rebuild the "
                              "checkpoint")
    return torch.tensor(float(v))


def _input_hook(scale: torch.Tensor) -> Any:
    def hook(module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (fake_quant_fp8(args[0], scale), *args[1:])
    return hook


class _Fp8Experts:
    """transformers' expert loop (one expert at a time over the tokens routed to it) with FP8 inputs."""

    def __init__(self, module: Any, gate_up: torch.Tensor, down: torch.Tensor) -> None:
        self.m, self.gate_up, self.down = module, gate_up, down

    def __call__(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                 top_k_weights: torch.Tensor) -> torch.Tensor:
        m = self.m
        out = torch.zeros_like(hidden_states)
        x = fake_quant_fp8(hidden_states, self.gate_up)
        for e in range(m.num_experts):
            tok, pos = torch.where(top_k_index == e)
            if tok.numel() == 0:
                continue
            gate, up = torch.nn.functional.linear(x[tok], m.gate_up_proj[e]).chunk(2, dim=-1)
            h = fake_quant_fp8(m.act_fn(gate) * up, self.down)
            h = torch.nn.functional.linear(h, m.down_proj[e]) * top_k_weights[tok, pos, None]
            out.index_add_(0, tok, h.to(out.dtype))
        return out


def apply_scales(model: Any, scales: dict[str, Any], where: Path) -> torch.Tensor | None:
    """Install the activation fake-quantization on `model`; returns the KV cache scale (None: 16-bit cache)."""
    modules = dict(model.named_modules())
    for name, s in (scales.get("linears") or {}).items():
        m = modules.get(name)
        if not isinstance(m, torch.nn.Linear):
            raise CheckpointError(f"{where}/{SCALES_FILE}: {name} is not a linear of the model; rebuild the checkpoint")
        m.register_forward_pre_hook(_input_hook(_scale(s, f"{name} input scale")))
    for name, s in (scales.get("experts") or {}).items():
        m = modules.get(name)
        if m is None or not all(hasattr(m, a) for a in ("gate_up_proj", "down_proj", "act_fn", "num_experts")) or \
                m.gate_up_proj.dim() != 3 or getattr(m, "has_bias", False):
            raise CheckpointError(f"{where}/{SCALES_FILE}: {name} is not an experts module of the layout the "
                                  "reference engine quantizes (gate_up_proj / down_proj 3-D, no bias)")
        m.forward = _Fp8Experts(m, _scale(s.get("gate_up"), f"{name} gate_up input scale"),
                                _scale(s.get("down"), f"{name} down input scale"))
    kv = scales.get("kv_cache_scale")
    return None if kv is None else _scale(kv, "kv_cache_scale")
