"""The reference engine's layers, numerically as Hugging Face's LlamaForCausalLM (transformers/models/llama/
modeling_llama.py) so that logits match: RMSNorm in float32 then `weight * x.to(dtype)`, neox-style RoPE
(`rotate_half`) with cos/sin computed in float32 and cast to the compute dtype, attention over the KV cache with the
step's tree mask (engines/cache.py), SwiGLU `down(silu(gate(x)) * up(x))`, the lm_head. The target (engines/model.py)
and the drafters (engines/heads.py) are built from them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from core.families import ROPE_TYPES
from engines.cache import Step
from engines.linear import Linear, fake_quant_fp8, fuse_rows
from engines.parallel import TPGroup
from engines.rope_scaling import attention_factor, yarn


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype)


# ---- RoPE -----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RopeConfig:
    head_dim: int
    base: float
    scaling: dict | None  # None = plain RoPE; {"rope_type": "llama3", factor, low/high_freq_factor, original_max...}
    max_position_embeddings: int = 2048  # YaRN without `factor` derives it from this (engines/rope_scaling.py)


def inv_freq(cfg: RopeConfig) -> torch.Tensor:
    """RoPE inverse frequencies, incl. Llama-3.1 scaling (transformers
    modeling_rope_utils._compute_llama3_parameters)."""
    d = cfg.head_dim
    freqs = 1.0 / (cfg.base ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    s = cfg.scaling
    if s is None:
        return freqs
    kind = s.get("rope_type", s.get("type"))
    if kind in ("default", None):
        return freqs
    if kind == "linear":
        return freqs / float(s["factor"])
    if kind == "yarn":
        return yarn(cfg.base, d, s, cfg.max_position_embeddings)[0]
    if kind != "llama3":
        raise ValueError(f"rotary_scaling type {kind!r} is not supported by the reference engine "
                         f"({', '.join(ROPE_TYPES)})")
    factor, lo, hi = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old_len = float(s["original_max_position_embeddings"])
    wavelen = 2 * math.pi / freqs
    # Long wavelengths (low frequencies) are slowed down by `factor`, short ones kept, the band between blended.
    scaled = torch.where(wavelen > old_len / lo, freqs / factor, freqs)
    smooth = (old_len / wavelen - lo) / (hi - lo)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / hi) & ~(wavelen > old_len / lo)
    return torch.where(medium, blended, scaled)


class Rope:
    """cos/sin tables in float32, grown on demand, indexed by position ids."""

    def __init__(self, cfg: RopeConfig, device: torch.device) -> None:
        self.inv = inv_freq(cfg).to(device)
        self.scale = attention_factor(cfg.base, cfg.head_dim, cfg.scaling, cfg.max_position_embeddings)
        self.cos = torch.empty(0, cfg.head_dim, device=device)
        self.sin = torch.empty(0, cfg.head_dim, device=device)

    def _grow(self, n: int) -> None:
        n = max(n, 2 * self.cos.shape[0], 256)
        t = torch.arange(n, device=self.inv.device, dtype=torch.float32)
        emb = torch.outer(t, self.inv)
        emb = torch.cat([emb, emb], dim=-1)
        self.cos, self.sin = emb.cos() * self.scale, emb.sin() * self.scale

    def __call__(self, positions: torch.Tensor, dtype: torch.dtype, bound: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin at `positions`, all < `bound` (a host-side bound: no read-back of the positions)."""
        if bound > self.cos.shape[0]:
            self._grow(bound)
        return self.cos[positions].to(dtype), self.sin[positions].to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, T, heads, D); cos/sin: (B, T, D)."""
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    return x * cos + _rotate_half(x) * sin


@dataclass
class QKNorm:
    """Qwen3: RMSNorm of each query and key head over head_dim after the projections, before RoPE, one weight for
    all query heads and one for all key heads (transformers Qwen3Attention q_norm / k_norm)."""

    q_weight: torch.Tensor  # (head_dim,)
    k_weight: torch.Tensor
    heads: int  # query heads of this rank: the first `heads` of the fused q/k heads
    eps: float

    def __call__(self, qk: torch.Tensor) -> torch.Tensor:
        q, k = qk.split([self.heads, qk.shape[2] - self.heads], dim=2)
        return torch.cat([rms_norm(q, self.q_weight, self.eps), rms_norm(k, self.k_weight, self.eps)], dim=2)


@dataclass
class Attention:
    qkv: Linear  # output [q (heads*D) ; k (kv_heads*D) ; v (kv_heads*D)] for this rank
    dense: Linear
    heads: int  # local (this rank)
    kv_heads: int  # local
    head_dim: int
    group: TPGroup
    kv_scale: torch.Tensor | None = None  # FP8 KV cache: fake-quantize K/V with this scale before caching
    qk_norm: QKNorm | None = None  # Qwen3: per-head q/k RMSNorm before RoPE

    def __call__(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        step: Step,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        b, t, _ = x.shape
        d = self.head_dim
        qk, v = self.qkv(x).split([(self.heads + self.kv_heads) * d, self.kv_heads * d], dim=-1)
        # q and k heads are adjacent in the fused output: one RoPE for both.
        qk = qk.view(b, t, self.heads + self.kv_heads, d)
        if self.qk_norm is not None:
            qk = self.qk_norm(qk)
        q, k = apply_rope(qk, *rope).split([self.heads, self.kv_heads], dim=2)
        v = v.view(b, t, self.kv_heads, d)
        if self.kv_scale is not None:
            k, v = fake_quant_fp8(k, self.kv_scale), fake_quant_fp8(v, self.kv_scale)
        k_cache[step.rows[:, None], step.slots] = k
        v_cache[step.rows[:, None], step.slots] = v
        keys = step.gather(k_cache).transpose(1, 2)  # (B, kv_heads, S, D)
        values = step.gather(v_cache).transpose(1, 2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys, values, attn_mask=step.mask, enable_gqa=self.kv_heads != self.heads
        )
        return self.group.all_reduce(self.dense(out.transpose(1, 2).reshape(b, t, self.heads * d)))


@dataclass
class MLP:
    fc: Linear | None  # HF gate_proj (TRT-LLM names the activated branch `fc`); None once fused
    gate: Linear | None  # HF up_proj; None once fused
    proj: Linear  # HF down_proj
    group: TPGroup
    fc_gate: Linear | None = None  # [fc; gate] stacked by rows: one product for both branches (`fuse`)

    def fuse(self) -> bool:
        """Replace fc and gate by one stacked Linear (one product instead of two per call) where they can share it
        (not with FP8 activation scales). Returns whether it did."""
        if self.fc_gate is None and self.fc is not None and self.gate is not None:
            self.fc_gate = fuse_rows([self.fc, self.gate])
            if self.fc_gate is not None:
                self.fc = self.gate = None
        return self.fc_gate is not None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.fc_gate is not None:
            a, b = self.fc_gate(x).chunk(2, dim=-1)
        else:
            assert self.fc is not None and self.gate is not None
            a, b = self.fc(x), self.gate(x)
        return self.group.all_reduce(self.proj(F.silu(a) * b))


@dataclass
class DecoderLayer:
    input_norm: torch.Tensor | None  # None for EAGLE-1's first drafter layer
    attn: Attention
    post_norm: torch.Tensor
    mlp: MLP
    eps: float

    def __call__(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], step: Step, kc: torch.Tensor, vc: torch.Tensor
    ) -> torch.Tensor:
        h = x if self.input_norm is None else rms_norm(x, self.input_norm, self.eps)
        x = x + self.attn(h, rope, step, kc, vc)
        return x + self.mlp(rms_norm(x, self.post_norm, self.eps))


@dataclass
class LMHead:
    linear: Linear  # this rank's vocab slice (TRT-LLM pads the vocab to a multiple of tp)
    vocab_size: int
    group: TPGroup

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        """Float32 logits over the full vocabulary (TRT-LLM logits_dtype float32)."""
        return self.group.all_gather_last(self.linear(h))[..., : self.vocab_size].float()
