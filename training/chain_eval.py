"""Offline acceptance estimate: greedy CHAIN drafting unrolled over every position of held-out sequences.

At inference, from a root position t the head gets (f_t, token_{t+1}) and drafts d_1; then it is fed its OWN
output feature with d_1 at position t+1, attending to the true context <= t plus its earlier drafts for this root
(the EAGLE draft KV cache), and so on. Here all roots are drafted at once: step m adds one key per root, and the
attention mask lets root t's step-m query see true keys j <= t and root t's own drafted keys (steps 2..m).

The target's greedy token after position p is argmax(lm_head(f_p)); draft step m from root t is accepted when it
equals the target's greedy token at position t+m (and all earlier steps were accepted), as in SafeAILab/EAGLE
eagle/train/main.py `getkacc`. chain_tau = 1 + mean accepted drafts over answer roots (the +1 is the bonus token),
i.e. tau of a depth-`depth` chain tree. Trees accept more than a chain; measure.verify measures the real thing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from training.model import EagleHead


class ChainExample(Protocol):
    """What the chain evaluation reads of one example (training/loop.py Example)."""

    features: torch.Tensor  # [T, H]
    input_ids: torch.Tensor  # [T]
    loss_mask: torch.Tensor  # [T]


@torch.no_grad()
def chain_accept(
    head: EagleHead, lm_head: torch.Tensor, examples: Sequence[ChainExample], depth: int
) -> dict[str, float]:
    accepted = torch.zeros(0, dtype=torch.long)
    for e in examples:
        accepted = torch.cat([accepted, _accepted_per_root(head, lm_head, e, depth)])
    if accepted.numel() == 0:
        return {"chain_tau": float("nan")}
    out = {"chain_tau": 1.0 + accepted.float().mean().item()}
    for m in range(1, depth + 1):  # P(step m accepted | steps < m accepted)
        reached = (accepted >= m - 1).sum().item()
        out[f"chain_p{m}"] = (accepted >= m).sum().item() / max(reached, 1)
    return out


def _accepted_per_root(head: EagleHead, lm_head: torch.Tensor, e: ChainExample, depth: int) -> torch.Tensor:
    L = len(e.input_ids) - 1
    dev = lm_head.device
    feats = e.features[:-1].float()[None].to(dev)
    ids = e.input_ids[1:].long()[None].to(dev)
    greedy = (e.features[1:].to(dev, lm_head.dtype) @ lm_head.T).argmax(-1)  # greedy[t] = target's token after x_{t+1}
    roots = e.loss_mask[1:].nonzero().flatten().to(dev)
    if roots.numel() == 0:
        return torch.zeros(0, dtype=torch.long)
    layer = head.layer
    attn = layer.self_attn
    pos = torch.arange(L, device=dev)[None]
    causal = torch.ones(L, L, dtype=torch.bool, device=dev).tril()
    eye = torch.eye(L, dtype=torch.bool, device=dev)
    h = head.fuse(feats, ids)
    cos, sin = head.rope(pos, h)
    q, k, v = attn.qkv(h, cos, sin)
    out = layer.finish(h, attn.attend(q, k, v, None))
    keys, vals, mask = k, v, causal
    alive = torch.ones(L, dtype=torch.bool, device=dev)
    accepted = torch.zeros(L, dtype=torch.long, device=dev)
    for m in range(1, depth + 1):
        draft = (out[0].to(lm_head.dtype) @ lm_head.T).argmax(-1)  # [L] draft token of step m for each root t
        target_pos = torch.arange(L, device=dev) + (m - 1)
        valid = target_pos < L
        ok = valid & (draft == greedy[target_pos.clamp(max=L - 1)])
        alive &= ok
        accepted += alive.long()
        if m == depth:
            break
        h = head.fuse(out, draft[None])  # next step input: (own feature, own draft) at position t + m
        cos, sin = head.rope(pos + m, h)
        q, k, v = attn.qkv(h, cos, sin)
        keys, vals = torch.cat([keys, k], 2), torch.cat([vals, v], 2)
        mask = torch.cat([mask, eye], 1)
        out = layer.finish(h, attn.attend(q, keys, vals, mask))
    return accepted[roots].cpu()
