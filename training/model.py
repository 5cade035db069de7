"""The EAGLE-1/2 head exactly as SafeAILab/EAGLE defines it (eagle/model/cnets1.py), for training.

    x_emb  = embed_tokens(token_{t+1})                    frozen copy of the target's embedding
    h      = fc(concat[x_emb, f_t])                       Linear(2H -> H), bias unless config "bias": false
    h      = h + o_proj(attn(q/k/v_proj(h)))              layer 0 has NO input_layernorm
    out_t  = h + mlp(post_attention_layernorm(h))         no final norm
    logits = target lm_head(out_t)                        the head has no lm_head of its own

`out_t` predicts the target feature f_{t+1} (post-norm last hidden state). State dict keys are the SafeAILab ones
(embed_tokens.weight, fc.weight, fc.bias, layers.0.self_attn.*, layers.0.mlp.*, layers.0.post_attention_layernorm.*).
Attention takes an explicit boolean mask so the trainer can also evaluate multi-step drafting (see loop.py).
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        h, bias = cfg.hidden_size, bool(getattr(cfg, "attention_bias", False))
        self.q_proj = nn.Linear(h, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """[B,T,H] -> rotated q [B,heads,T,d], k and v [B,heads,T,d] (kv heads repeated for GQA)."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        rep = self.heads // self.kv_heads
        return q, k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """mask: bool [Tq, Tk] (True = may attend) or None for plain causal attention."""
        if mask is None:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        b, _, t, _ = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        h, i, bias = cfg.hidden_size, cfg.intermediate_size, bool(getattr(cfg, "mlp_bias", False))
        self.gate_proj = nn.Linear(h, i, bias=bias)
        self.up_proj = nn.Linear(h, i, bias=bias)
        self.down_proj = nn.Linear(i, h, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Llama decoder layer WITHOUT input_layernorm (EAGLE layer 0)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def finish(self, h: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        h = h + attn_out
        return h + self.mlp(self.post_attention_layernorm(h))


class EagleHead(nn.Module):
    def __init__(self, cfg: LlamaConfig, bias: bool = True) -> None:
        super().__init__()
        self.config = cfg
        h = cfg.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h)
        self.embed_tokens.weight.requires_grad_(False)  # the target's embedding, frozen (EAGLE load_emb)
        self.fc = nn.Linear(2 * h, h, bias=bias)
        self.layers = nn.ModuleList([DecoderLayer(cfg)])
        self.rotary = LlamaRotaryEmbedding(cfg)

    @property
    def layer(self) -> DecoderLayer:
        """The head's one decoder layer."""
        return cast(DecoderLayer, self.layers[0])

    def rope(self, positions: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin for integer positions [B,T] (the target's rope, scaling included)."""
        return self.rotary(like, positions)

    def fuse(self, features: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
        """fc(concat[embed(token_{t+1}), f_t]): embedding FIRST, then the feature."""
        emb = self.embed_tokens(next_ids.long()).to(features.dtype)
        return self.fc(torch.cat([emb, features], dim=-1))

    def forward(self, features: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
        """Teacher-forced pass: features [B,T,H] (f_0..f_{T-1}), next_ids [B,T] (token_1..token_T) -> [B,T,H]
        predictions of f_1..f_T. Causal attention; right padding only (padded tail positions are ignored)."""
        b, t, _ = features.shape
        h = self.fuse(features, next_ids)
        pos = torch.arange(t, device=h.device).expand(b, t)
        cos, sin = self.rope(pos, h)
        layer = self.layer
        q, k, v = layer.self_attn.qkv(h, cos, sin)
        return layer.finish(h, layer.self_attn.attend(q, k, v, None))


def head_from_target(target_cfg: dict, embed: torch.Tensor, seed: int, bias: bool = True) -> EagleHead:
    """A freshly initialized head (torch default init under `seed`) carrying the target's embedding."""
    cfg = LlamaConfig(**head_config_dict(target_cfg, bias))
    torch.manual_seed(seed)
    head = EagleHead(cfg, bias=bias)
    with torch.no_grad():
        head.embed_tokens.weight.copy_(embed)
    return head


def head_config_dict(target_cfg: dict, bias: bool) -> dict:
    """config.json of the head: the target's Llama config with one layer (SafeAILab layout) + "bias"."""
    drop = {"eagle_deploy_source", "_name_or_path", "transformers_version", "quantization_config"}
    cfg = {k: v for k, v in target_cfg.items() if k not in drop}
    cfg.update(num_hidden_layers=1, bias=bias, architectures=["LlamaForCausalLM"])
    return with_transformers4_rope(cfg)


def with_transformers4_rope(cfg: dict) -> dict:
    """Also write the RoPE settings where transformers-4 readers look. transformers 5 keeps them only inside
    `rope_parameters` ({"rope_type", "rope_theta", scaling fields}); transformers-4 code (TensorRT-LLM 1.1's
    converters, SafeAILab EAGLE, vLLM/SGLang on 4.x) reads top-level `rope_theta` (default 10000 when absent, so a
    head of a base-100000 target would silently draft with the wrong rotation) and `rope_scaling`."""
    params = cfg.get("rope_parameters")
    if not isinstance(params, dict) or "rope_theta" not in params:
        return cfg
    out = dict(cfg)
    out.setdefault("rope_theta", params["rope_theta"])
    if params.get("rope_type", "default") != "default":
        out.setdefault("rope_scaling", {k: v for k, v in params.items() if k != "rope_theta"})
    return out


MODEL_CARD = "MODEL_CARD.md"  # hand-written, with measured figures: an export keeps the one already there


def export_dtype_keys(cfg: dict, dtype: str) -> dict:
    """The weights' dtype under both names: `torch_dtype` (transformers 4) and `dtype` (transformers 5)."""
    return dict(cfg, torch_dtype=dtype, dtype=dtype)


def safeailab_state_dict(head: EagleHead, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """State dict with the SafeAILab key names (the rotary buffers are not weights)."""
    return {
        k: v.detach().to("cpu", dtype).contiguous() for k, v in head.state_dict().items() if not k.startswith("rotary.")
    }
