"""RoPE scalings beyond Llama-3's (engines/layers.py `inv_freq` keeps default / linear / llama3): YaRN, as Qwen2.5 and
Qwen3 ship it for long contexts (`rope_scaling: {rope_type: yarn, factor, original_max_position_embeddings}`).

Follows transformers' modeling_rope_utils `_compute_yarn_parameters`: frequencies between the correction range of
`beta_fast` / `beta_slow` rotations over the original context are blended from the extrapolated (1 / base^(2i/d))
and interpolated (divided by `factor`) ones with a linear ramp; cos and sin are multiplied by the attention factor
(0.1 * ln(factor) + 1 unless `attention_factor` is given, or the mscale ratio when `mscale` and `mscale_all_dim`
are). A YaRN config without `factor` takes max_position_embeddings / original_max_position_embeddings.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def _mscale(scale: float, m: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def yarn(base: float, head_dim: int, s: dict[str, Any], max_position_embeddings: int) -> tuple[torch.Tensor, float]:
    """(inverse frequencies, attention factor) of a YaRN scaling `s`."""
    original = float(s["original_max_position_embeddings"])
    factor = float(s["factor"]) if s.get("factor") is not None else max_position_embeddings / original
    attention = s.get("attention_factor")
    if attention is None:
        m, m_all = s.get("mscale"), s.get("mscale_all_dim")
        attention = _mscale(factor, m) / _mscale(factor, m_all) if m and m_all else _mscale(factor)
    beta_fast, beta_slow = float(s.get("beta_fast") or 32), float(s.get("beta_slow") or 1)

    def dim_of(rotations: float) -> float:  # the dimension that turns `rotations` times over the original context
        return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim_of(beta_fast), dim_of(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos = base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    keep = 1 - ramp  # 1: extrapolate (high frequencies), 0: interpolate
    return (1.0 / (factor * pos)) * (1 - keep) + (1.0 / pos) * keep, float(attention)


def attention_factor(base: float, head_dim: int, s: dict[str, Any] | None, max_position_embeddings: int) -> float:
    """What cos and sin are multiplied by: YaRN's attention factor, else 1."""
    if s is None or s.get("rope_type", s.get("type")) != "yarn":
        return 1.0
    return yarn(base, head_dim, s, max_position_embeddings)[1]
