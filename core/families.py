"""The target families the reference engine runs natively, and how each differs from Llama (torch-free).

The numerics follow transformers' modeling files of each family (models/<family>/modeling_<family>.py):
- LlamaForCausalLM: the base (engines/model.py);
- MistralForCausalLM: Llama's computation; `sliding_window` masks keys more than the window behind the query, which
  the engine does not do, so it refuses sequences longer than the window (engines/runtime.py `check_window`);
- Qwen2ForCausalLM (Qwen2 / Qwen2.5): q/k/v projections with biases, o_proj without; `use_sliding_window` true is
  refused (the published configs ship it false);
- Qwen3ForCausalLM: per-head RMSNorm of q and k over head_dim (weights of head_dim, shared by the heads) after the
  projections and before RoPE; head_dim is a config key of its own (not hidden_size / heads).

The converter (builders/convert/families.py) writes the checkpoint keys `family_keys` returns; the engine reads them
back with `traits`. The architecture table (builders/trtllm/architectures.py) lists NATIVE as its `native` rows.
Also here, torch-free for the builders: the published EAGLE-3 head config layout (`eagle3_head_config`) and what the
generic path (engines/generic.py) computes exactly (`check_generic`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROPE_TYPES = ("default", "linear", "llama3", "yarn")  # the RoPE scalings the engine's native forward computes
NATIVE = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
QKV_BIAS = frozenset({"Qwen2ForCausalLM"})
QK_NORM = frozenset({"Qwen3ForCausalLM"})
SLIDING_WINDOW = frozenset({"Qwen2ForCausalLM", "Qwen3ForCausalLM"})  # `use_sliding_window` switches it on


@dataclass(frozen=True)
class Traits:
    """What a checkpoint's target computes beyond Llama (read from its config.json)."""

    qkv_bias: bool = False  # q/k/v biases without an o_proj bias
    qk_norm: bool = False  # per-head q/k RMSNorm before RoPE
    sliding_window: int | None = None  # keys beyond this distance are masked upstream: longer contexts are refused


def family_keys(architecture: str, hf_config: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint config.json keys of a target (written by the converter)."""
    window = hf_config.get("sliding_window")
    if architecture in SLIDING_WINDOW and not hf_config.get("use_sliding_window"):
        window = None  # transformers: sliding_window applies only when use_sliding_window is true
    if architecture not in SLIDING_WINDOW and architecture != "MistralForCausalLM":
        window = None
    return {"qkv_bias": architecture in QKV_BIAS, "qk_norm": architecture in QK_NORM,
            "sliding_window": None if window is None else int(window)}


def traits(ckpt_config: dict[str, Any]) -> Traits:
    """A checkpoint's traits; a Llama checkpoint written before these keys existed has none of them."""
    window = ckpt_config.get("sliding_window")
    return Traits(bool(ckpt_config.get("qkv_bias", False)), bool(ckpt_config.get("qk_norm", False)),
                  None if window is None else int(window))


# Keys of a target's config that describe its own stack, not a one-layer EAGLE-3 head: a head config that copied
# them (trainers start from the target's config) fails to load, e.g. a Qwen3 target's `layer_types` has one entry per
# target layer and transformers refuses a 1-layer config with 36 of them ("num_hidden_layers (1) must be equal to the
# number of layer types").
_TARGET_ONLY = ("layer_types", "max_window_layers", "moe_intermediate_size", "num_experts", "num_experts_per_tok",
                "num_local_experts", "experts_per_token", "swiglu_limit", "decoder_sparse_step", "norm_topk_prob",
                "mlp_only_layers", "output_router_logits", "router_aux_loss_coef", "qkv_bias", "qk_norm")


def eagle3_head_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """An EAGLE-3 head's config.json in the layout the heads people publish for any target use (SpecForge
    configs/qwen3-4b-eagle3.json, configs/qwen3-30B-A3B-eagle3.1.json: `model_type: llama`,
    `architectures: [LlamaForCausalLMEagle3]`, the target's head_dim kept): Llama keys only, no sliding window."""
    out = {k: v for k, v in cfg.items() if k not in _TARGET_ONLY}
    out["model_type"] = "llama"
    if "use_sliding_window" in out or "sliding_window" in out:
        out.update(use_sliding_window=False, sliding_window=None)
    return out


# ---- the generic path (engines/generic.py): what transformers' own model class computes exactly ----------------


class GenericTargetError(ValueError):
    """A model the generic path cannot run exactly; the message says why and what to do."""


def sliding_window_of(hf_config: dict[str, Any]) -> int | None:
    """The window of a config whose layers (some or all) attend to a sliding window, else None."""
    window = hf_config.get("sliding_window")
    if window is None or hf_config.get("use_sliding_window") is False:
        return None
    layer_types = hf_config.get("layer_types")
    if layer_types is not None and "sliding_attention" not in layer_types:
        return None
    return int(window)


def check_generic(hf_config: dict[str, Any], where: Path, max_seq_len: int | None) -> None:
    """Refuse what the generic path would compute wrongly. transformers returns the engine's 4D mask as is for
    sliding-window layers too, so they attend to every earlier key: exact while no sequence is longer than the
    window (the sliding mask then equals the causal one), wrong beyond it (None: checked per request instead)."""
    window = sliding_window_of(hf_config)
    if window is not None and max_seq_len is not None and max_seq_len > window:
        raise GenericTargetError(
            f"{where}: sliding_window={window} but sequences may reach {max_seq_len} tokens; the generic path gives "
            "sliding-window layers the engine's own tree mask, which sees every earlier key, so tokens beyond the "
            f"window would be computed wrongly. Set engine.max_seq_len <= {window}")
    other = sorted({t for t in hf_config.get("layer_types") or () if t not in ("full_attention", "sliding_attention")})
    if other:
        raise GenericTargetError(f"{where}: layer_types {other}: only attention layers that take the engine's 4D "
                                 "mask (full_attention, sliding_attention) can run on the generic path")
