"""Token choice and draft verification.

Greedy (EAGLE eagle/model/utils.py `evaluate_posterior`, TRT-LLM EagleSampleAndAcceptDraftTokens with
greedy_sampling): a draft node is correct when its token equals the target's argmax at its parent; a node is
accepted when it and all its ancestors are correct; take the deepest accepted node (first in tree order on ties)
and append the target's argmax there (the bonus token). The output equals target-only greedy decoding.

Sampling (drafts are the deterministic top-k of the drafter; EAGLE-2/3 `evaluate_posterior` with sampling): at the
current node with target distribution p, try its children in rank order; accept child x with probability
p(x) / sum(p); on rejection set p(x) = 0 and renormalize; if every child is rejected (or the node is a leaf),
sample the next token from what is left of p. Each step therefore outputs x with probability exactly p(x)
(the rejections remove x only from the mass that a later draw can still hit), so the output distribution equals
target-only sampling with the same temperature / top-k / top-p.
"""

from __future__ import annotations

import torch

from engines.api import SamplingParams


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


def accept_greedy(tokens: torch.Tensor, parent: torch.Tensor, depth: torch.Tensor, anc: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched greedy verification. Returns (best node (B,), bonus token (B,)).

    tokens/parent/depth (B, T), anc (B, T, T), logits (B, T, V)."""
    top = logits.argmax(-1)  # (B, T): the target's choice after each node
    correct = tokens == torch.gather(top, 1, parent)
    correct[:, 0] = True  # the root is already chosen
    accepted = ~(anc & ~correct[:, None, :]).any(-1)  # every node on the path is correct
    best = torch.argmax(depth * accepted, dim=1)  # deepest; argmax returns the first on ties
    bonus = torch.gather(top, 1, best[:, None])[:, 0]
    return best, bonus


def accept_sampling(
    tokens: list[int], children: list[list[int]], logits: torch.Tensor, sp: SamplingParams, gen: torch.Generator
) -> tuple[int, int]:
    """Walk one sequence's tree with sibling rejection. Returns (deepest accepted node, next token).

    tokens: node tokens (T,); children: per node, children in rank order; logits (T, V) of this sequence."""
    node = 0
    while True:
        p = target_probs(logits[node], sp).cpu()
        for child in children[node]:
            x = tokens[child]
            mass = float(p.sum())
            if mass > 0 and float(torch.rand((), generator=gen)) * mass < float(p[x]):
                node = child
                break
            p[x] = 0.0  # rejected: x cannot be the token at this position; renormalize over the rest
        else:
            return node, draw(p, gen)
