"""Token choice and draft verification.

Verification walks each sequence's tree from the root, one node at a time (the engine computes the target's logits
only at the nodes the walk reaches, see engines/decode.py `walk`).

Greedy (EAGLE eagle/model/utils.py `evaluate_posterior`, TRT-LLM EagleSampleAndAcceptDraftTokens with
greedy_sampling): a draft node is correct when its token equals the target's argmax at its parent; the walk moves to
the child drafted with the argmax until no child was, and appends the target's argmax there (the bonus token). That
node is the deepest node whose whole path is correct, and the output equals target-only greedy decoding.

Sampling (drafts are the deterministic top-k of the drafter; EAGLE-2/3 `evaluate_posterior` with sampling): at the
current node with target distribution p, try its children in rank order; accept child x with probability
p(x) / sum(p); on rejection set p(x) = 0 and renormalize; if every child is rejected (or the node is a leaf),
sample the next token from what is left of p. Each step therefore outputs x with probability exactly p(x)
(the rejections remove x only from the mass that a later draw can still hit), so the output distribution equals
target-only sampling with the same temperature / top-k / top-p.
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


def greedy_node(top: int, kids: list[int], tokens: list[int]) -> int | None:
    """Greedy verification at one node where the target's argmax is `top`: the child drafted with it (None when no
    child was; siblings carry distinct tokens, so at most one matches)."""
    return next((c for c in kids if tokens[c] == top), None)


def sampling_node(
    logits: torch.Tensor, kids: list[int], tokens: list[int], sp: SamplingParams, gen: torch.Generator
) -> tuple[int | None, int | None]:
    """Sibling rejection at one node: try the children in rank order against the target distribution p there.
    Returns (accepted child, None), or (None, token drawn from what is left of p) when every child is rejected
    or the node is a leaf."""
    p = target_probs(logits, sp).cpu()
    for child in kids:
        x = tokens[child]
        mass = float(p.sum())
        if mass > 0 and float(torch.rand((), generator=gen)) * mass < float(p[x]):
            return child, None
        p[x] = 0.0  # rejected: x cannot be the token at this position; renormalize over the rest
    return None, draw(p, gen)
