"""The EAGLE drafters the reference engine runs: EAGLE-1/2 (`Eagle1Drafter`) and EAGLE-3 (`Eagle3Drafter`), built from
the engine's layers (engines/layers.py) over their own KV cache (engines/cache.py).

The trainer defines the same heads as torch modules (training/model.py, training/eagle3_model.py): those train with
autograd over whole teacher-forced sequences (and EAGLE-3's training-time-test unroll), these run inference over a
preallocated cache with fused, FP8 or tensor-parallel linears and a tree mask. Both read and write the same state
dict (SafeAILab's keys); tests/test_heads_agree.py checks that a head the trainer builds computes the same features
and logits here as there.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from engines.cache import KVCache, Step
from engines.layers import MLP, Attention, DecoderLayer, LMHead, Rope, rms_norm
from engines.linear import Linear
from engines.parallel import TPGroup


@dataclass
class Eagle1Drafter:
    """EAGLE-1/2 head: h = decoder_layers(fc(concat[embed(x_{t+1}), f_t])), logits = target lm_head(h).

    f_t is the target's post-norm last hidden state; the first layer has no input_layernorm and there is no final
    norm (SafeAILab EAGLE eagle/model/cnets1.py; TensorRT-LLM models/eagle/model.py: fc_after_embed,
    use_input_layernorm_in_first_layer=False, use_last_layernorm=False)."""

    embed: torch.Tensor
    fc: Linear
    fc_gather: TPGroup | None  # set when fc is column-split across ranks (gather its output)
    layers: list[DecoderLayer]
    lm_head: LMHead
    rope: Rope
    kv_heads: int
    head_dim: int
    capture: tuple[int, ...] = ()  # EAGLE-1 uses only the last hidden state
    draft_ids: torch.Tensor | None = None  # target ids of a restricted draft vocabulary (`restricted`)

    def features(self, hidden: torch.Tensor, captured: list[torch.Tensor]) -> torch.Tensor:
        return hidden

    def forward(self, tokens: torch.Tensor, feats: torch.Tensor, step: Step, cache: KVCache) -> torch.Tensor:
        x = self.fc(torch.cat([F.embedding(tokens, self.embed), feats], dim=-1))
        if self.fc_gather is not None:
            x = self.fc_gather.all_gather_last(x)
        rope = self.rope(step.positions, x.dtype, step.kv_len)
        for i, layer in enumerate(self.layers):
            x = layer(x, rope, step, cache.k[i], cache.v[i])
        return x

    def restricted(self, ids: list[int]) -> Eagle1Drafter:
        """This head drafting over the target tokens `ids` only: its lm_head keeps their rows (a new Linear; the
        layers are shared), draft id i is target id ids[i]. The target still verifies over its full vocabulary, so
        outputs do not change; only what the head can propose (and so tau) does."""
        if self.draft_ids is not None:
            raise ValueError("the draft vocabulary is already restricted")
        if self.lm_head.group.size > 1:
            raise ValueError("draft_vocab needs tp=1 in the reference engine (the head's lm_head is split by vocab)")
        vocab = self.lm_head.vocab_size
        bad = [i for i in ids if not 0 <= i < vocab]
        if not ids or bad or len(set(ids)) != len(ids):
            raise ValueError(
                f"draft_vocab must be distinct target token ids in 0..{vocab - 1} (got {len(ids)} ids, "
                f"{len(ids) - len(set(ids))} repeated, out of range: {bad[:5]})"
            )
        at = torch.tensor(ids, device=self.embed.device)
        lin = self.lm_head.linear
        head = LMHead(Linear(lin.weight[at].contiguous(), None if lin.bias is None else lin.bias[at]), len(ids),
                      self.lm_head.group)
        return dataclasses.replace(self, lm_head=head, draft_ids=at)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(h)

    def to_target_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return ids if self.draft_ids is None else self.draft_ids[ids]


@dataclass
class Eagle3Drafter:
    """EAGLE-3 head (SafeAILab EAGLE eagle/model/cnets.py): the target's layer inputs at `capture` are fused by
    fc (3H -> H); the midlayer attends over concat[input_layernorm(embed(x_{t+1})), hidden_norm(feature)] with the
    feature as residual; logits = lm_head(norm(h)) over the draft vocabulary, mapped to target ids by
    target_id = draft_id + d2t[draft_id]. Later drafting steps feed the midlayer output back (no fc)."""

    embed: torch.Tensor
    fc: Linear
    input_norm: torch.Tensor
    hidden_norm: torch.Tensor
    attn: Attention
    post_norm: torch.Tensor
    mlp: MLP
    norm: torch.Tensor
    lm_head: Linear
    d2t: torch.Tensor | None
    rope: Rope
    eps: float
    kv_heads: int
    head_dim: int
    capture: tuple[int, ...] = field(default_factory=tuple)

    @property
    def layers(self) -> list[None]:
        return [None]  # one cache layer

    def features(self, hidden: torch.Tensor, captured: list[torch.Tensor]) -> torch.Tensor:
        return self.fc(torch.cat(captured, dim=-1))

    def forward(self, tokens: torch.Tensor, feats: torch.Tensor, step: Step, cache: KVCache) -> torch.Tensor:
        emb = F.embedding(tokens, self.embed)
        h = torch.cat([rms_norm(emb, self.input_norm, self.eps), rms_norm(feats, self.hidden_norm, self.eps)], dim=-1)
        rope = self.rope(step.positions, feats.dtype, step.kv_len)
        x = feats + self.attn(h, rope, step, cache.k[0], cache.v[0])
        return x + self.mlp(rms_norm(x, self.post_norm, self.eps))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(rms_norm(h, self.norm, self.eps)).float()

    def to_target_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return ids if self.d2t is None else ids + self.d2t[ids]


Drafter = Eagle1Drafter | Eagle3Drafter
