"""What the converter does beyond Llama for the other native families of the architecture table
(builders/trtllm/architectures.py): their extra HF tensors, how they are split across TP ranks, the checkpoint keys
that tell the reference engine about them, and the configs it must refuse.

The families' attention differs from Llama's in three ways (core/families.py has the engine's side):
- Qwen2 / Qwen2.5: q/k/v projections carry biases, o_proj does not (transformers Qwen2Attention: bias=True on q/k/v,
  False on o). Written as `attention.qkv.bias` ([q_r; k_r; v_r], split like the weight) and `qkv_bias: true`.
- Qwen3: per-head RMSNorm of q and k over head_dim before RoPE (Qwen3Attention q_norm / k_norm), one weight of
  head_dim shared by every head, so replicated on each rank: `attention.q_layernorm` / `attention.k_layernorm`
  (TensorRT-LLM's Attention names for qk_layernorm) and `qk_norm: true`.
- Mistral: Llama-shaped, with `sliding_window` (keys beyond the window are masked). The reference engine attends to
  every key, so a build whose max_seq_len exceeds the window is refused rather than computed wrongly.
A non-Llama checkpoint of ours is read by the reference engine only: TensorRT-LLM's engine flow serves Llama targets
only and its PyTorch backend reads the Hugging Face target directory itself.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import torch

from builders.convert.weights import OutTensor, WeightSource
from core.hfconfig import LlamaSpec
from core.families import NATIVE, QK_NORM, QKV_BIAS, SLIDING_WINDOW, family_keys
from core.families import ROPE_TYPES, GenericTargetError, check_generic


def extra_shapes(spec: LlamaSpec, layer: int) -> dict[str, tuple[int, ...]]:
    """HF tensors a family adds to decoder layer `layer`, with their shapes."""
    p = f"model.layers.{layer}.self_attn"
    out: dict[str, tuple[int, ...]] = {}
    if spec.architecture in QKV_BIAS:
        out.update({f"{p}.q_proj.bias": (spec.q_size,), f"{p}.k_proj.bias": (spec.kv_size,),
                    f"{p}.v_proj.bias": (spec.kv_size,)})
    if spec.architecture in QK_NORM:
        out.update({f"{p}.q_norm.weight": (spec.head_dim,), f"{p}.k_norm.weight": (spec.head_dim,)})
    return out


def extra_layer_plan(src: WeightSource, hf: str, out: str, spec: LlamaSpec, dt: torch.dtype,
                     q_rows: tuple[int, int], kv_rows: tuple[int, int]) -> list[OutTensor]:
    """The family's extra tensors of one layer on one TP rank (`q_rows` / `kv_rows`: this rank's rows of q / k, v)."""
    plan: list[OutTensor] = []
    if spec.architecture in QKV_BIAS:
        (qa, qb), (ka, kb) = q_rows, kv_rows

        def bias() -> torch.Tensor:
            a = f"{hf}.self_attn"
            parts = [src.read(f"{a}.q_proj.bias", 0, qa, qb), src.read(f"{a}.k_proj.bias", 0, ka, kb),
                     src.read(f"{a}.v_proj.bias", 0, ka, kb)]
            return torch.cat(parts, 0).to(dt)

        plan.append(OutTensor(f"{out}.attention.qkv.bias", ((qb - qa) + 2 * (kb - ka),), dt, bias))
    if spec.architecture in QK_NORM:
        for hf_name, trt in (("q_norm", "q_layernorm"), ("k_norm", "k_layernorm")):
            name = f"{hf}.self_attn.{hf_name}.weight"
            plan.append(OutTensor(f"{out}.attention.{trt}.weight", (spec.head_dim,), dt,
                                  partial(src.read_as, name, dt)))
    return plan


def config_keys(spec: LlamaSpec) -> dict[str, Any]:
    """Checkpoint config.json keys of the family (core/families.py reads them back)."""
    return family_keys(spec.architecture, spec.raw)


def problems(spec: LlamaSpec, *, reference_engine: bool, max_seq_len: int | None, tp: int) -> list[str]:
    """Configs of the family that the reference engine would compute wrongly, refused before anything is written
    (`reference_engine`: the build's backend is it, core/kinds.py)."""
    raw, where = spec.raw, spec.path
    p: list[str] = []
    if spec.architecture not in NATIVE:  # the generic path (engines/generic.py)
        if reference_engine and tp != 1:
            p.append(f"target.model {where}: {spec.architecture} runs on the reference engine's generic path "
                     f"(transformers' own model class), which has no tensor parallelism; set parallel.tp: 1")
        if reference_engine and max_seq_len is not None:
            try:
                check_generic(raw, where, max_seq_len)
            except GenericTargetError as e:
                p.append(f"target.model {e}")
        return p
    kind = None if spec.rope_scaling is None else spec.rope_scaling.get("rope_type")
    if reference_engine and kind not in (None, *ROPE_TYPES):
        p.append(f"target.model {where}: rope_scaling type {kind!r}: the reference engine computes "
                 f"{', '.join(ROPE_TYPES)} RoPE only; use engine.backend pytorch for this target")
    if spec.attention_bias or spec.mlp_bias:
        p.append(f"target.model {where}: attention_bias/mlp_bias=true: this converter writes q/k/v biases only for "
                 "Qwen2-family targets (no o_proj or MLP biases); use a checkpoint without them")
    if spec.architecture in SLIDING_WINDOW and raw.get("use_sliding_window") and reference_engine:
        p.append(f"target.model {where}: use_sliding_window=true (window {raw.get('sliding_window')}): the reference "
                 "engine attends to every key and would compute sliding-window layers wrongly; set "
                 "use_sliding_window: false as the published configs ship it, or use engine.backend pytorch")
    window = raw.get("sliding_window") if spec.architecture == "MistralForCausalLM" else None
    if window is not None and reference_engine and max_seq_len is not None and max_seq_len > int(window):
        p.append(f"target.model {where}: sliding_window={window} but engine.max_seq_len={max_seq_len}: the reference "
                 "engine attends to every key and would compute positions beyond the window wrongly; set "
                 f"engine.max_seq_len <= {window}")
    return p


def generic_checkpoint(spec: LlamaSpec, hf_dir: Path, *, dtype: str, tp: int) -> dict[str, Any]:
    """config.json of a target the reference engine runs through transformers' own model class (engines/generic.py):
    no converted weights; `generic_target` names the Hugging Face directory the engine loads (absolute, like
    reference.json's hf_target_dir). TensorRT-LLM never reads it: its PyTorch backend takes the HF directory; the
    reference engine runs it at tp=1 only (the preflight refuses more on engine.backend reference)."""
    return {"architecture": spec.architecture, "dtype": dtype, "generic_target": str(Path(hf_dir).resolve()),
            "num_hidden_layers": spec.num_hidden_layers, "num_attention_heads": spec.num_attention_heads,
            "vocab_size": spec.vocab_size,
            "hidden_size": spec.hidden_size, "mapping": {"world_size": tp, "tp_size": tp, "pp_size": 1},
            "quantization": {"quant_algo": None, "kv_cache_quant_algo": None, "exclude_modules": None}}
