"""Greedy agreement between two decodings of the same prompt, and why they part where they do.

In float32 EAGLE's greedy output equals target-only greedy decoding token for token (the acceptance rule picks the
target's argmax at every position). In 16 bits the same rule holds for the logits the engine computes, but those
logits differ by rounding between the paths that compute them: one token after the cache (target-only) or a tree
node among T verified together (other products, other attention lengths and masks). Where the target's two best
tokens are closer than that rounding, the two decodings can choose differently, and from there on they continue
from different prefixes. `explain` measures this at the first divergence: the logit gap between the two chosen
tokens in float32 (the exact oracle) and in the 16-bit engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engines.api import ReferenceEngine
from engines.cache import KVCache, Rows


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token, the shorter length if one is a prefix of the other, None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def next_logits(engine: ReferenceEngine, ids: list[int]) -> torch.Tensor:
    """The target's float32 logits for the token after `ids` (one prefill forward)."""
    rt = engine._rt
    t = rt.target
    cache = KVCache.allocate(len(t.layers), 1, len(ids) + 1, t.kv_heads, t.head_dim, rt.dtype, rt.device)
    n = len(ids)
    causal = torch.ones(n, n, dtype=torch.bool, device=rt.device).tril()[None]
    with torch.inference_mode():
        step = Rows.of([0], [0], rt.device).step(torch.arange(n, device=rt.device)[None], causal)
        hidden, _ = t.forward(torch.tensor([ids], device=rt.device), step, cache)
        return t.lm_head(hidden[0, -1]).float().cpu()


@dataclass(frozen=True)
class Divergence:
    index: int  # output position where the decodings first differ
    token_a: int  # chosen by decoding a there
    token_b: int  # chosen by decoding b there
    gap_fp32: float  # logit[token_a] - logit[token_b] of the float32 target after the common prefix
    gap_engine: float  # the same gap in the 16-bit engine's logits (prefill path)

    @property
    def rounding(self) -> float:
        """How much the 16-bit engine moved the gap: a divergence is a rounding flip when this exceeds |gap_fp32|."""
        return abs(self.gap_engine - self.gap_fp32)


def explain(
    oracle: ReferenceEngine, engine: ReferenceEngine, prompt: list[int], a: list[int], b: list[int]
) -> Divergence | None:
    """The first divergence of outputs `a` and `b` of `prompt` with the logit gap between the two tokens, by the
    float32 `oracle` and by `engine`; None when one output is a prefix of the other (a stop cut one short)."""
    i = first_divergence(a, b)
    if i is None or i >= min(len(a), len(b)):
        return None
    ctx = prompt + a[:i]
    l32, l16 = next_logits(oracle, ctx), next_logits(engine, ctx)
    return Divergence(i, a[i], b[i], float(l32[a[i]] - l32[b[i]]), float(l16[a[i]] - l16[b[i]]))
