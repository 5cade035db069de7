"""The target's token distribution and token choice: temperature, top-k, top-p, a categorical draw.

The prefill and target-only steps choose a token with `choose` (engines/decode.py); the speculative step's
acceptance rules (engines/step.py `greedy_node`, `sampling_node`) test draft tokens against `target_probs` and draw
with `draw`, so speculative sampling and target-only sampling share one definition of the distribution.
"""

from __future__ import annotations

import torch

from core.types import SamplingParams


def target_probs(logits: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
    """Float32 probabilities after temperature, top-k, top-p (last dim = vocab). Not for greedy requests."""
    x = logits.float() / sp.temperature
    if sp.top_k > 0 and sp.top_k < x.shape[-1]:
        kth = torch.topk(x, sp.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    p = torch.softmax(x, dim=-1)
    if sp.top_p < 1.0:
        sp_sorted, idx = torch.sort(p, dim=-1, descending=True)
        before = torch.cumsum(sp_sorted, dim=-1) - sp_sorted  # mass of strictly more likely tokens
        drop = before >= sp.top_p  # keep the smallest prefix reaching top_p (always >= 1 token)
        p = p.scatter(-1, idx, sp_sorted.masked_fill(drop, 0.0))
        p = p / p.sum(-1, keepdim=True)
    return p


def draw(p: torch.Tensor, gen: torch.Generator) -> int:
    """One categorical draw from a 1-D probability vector with the request's generator (on CPU)."""
    return int(torch.multinomial(p.cpu(), 1, generator=gen))


def choose(logits: torch.Tensor, sp: SamplingParams, gen: torch.Generator) -> int:
    """Target-only next token from a 1-D logits row."""
    if sp.greedy:
        return int(torch.argmax(logits))
    return draw(target_probs(logits, sp), gen)
