"""The target's forward: embedding, decoder layers (engines/layers.py), final norm, lm_head, over a preallocated
KV cache with tree attention (engines/cache.py); it also returns the residual stream at the layers an EAGLE-3 head
captures. The drafters are in engines/heads.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engines.cache import KVCache, Step
from engines.layers import DecoderLayer, LMHead, Rope, rms_norm


@dataclass
class Llama:
    """The target: embedding, decoder layers, final norm, lm_head."""

    embed: torch.Tensor
    layers: list[DecoderLayer]
    norm: torch.Tensor
    lm_head: LMHead
    rope: Rope
    eps: float
    kv_heads: int  # local
    head_dim: int

    def accept(self, rows: list[int], lengths: list[int]) -> None:
        """After a verification: nothing besides the KV cache follows the accepted path (engines/step.py compacts
        the cache)."""

    def forward(
        self, tokens: torch.Tensor, step: Step, cache: KVCache, capture: tuple[int, ...] = ()
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Returns the post-norm last hidden state (B, T, H) and the residual stream at the ids in `capture`:
        id j = the INPUT of decoder layer j (0 = the embeddings; len(layers) = the last layer's output, pre-norm)."""
        x = F.embedding(tokens, self.embed)
        rope = self.rope(step.positions, x.dtype, step.kv_len)
        by_layer: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            if i in capture:
                by_layer[i] = x
            x = layer(x, rope, step, cache.k[i], cache.v[i])
        by_layer[len(self.layers)] = x
        return rms_norm(x, self.norm, self.eps), [by_layer[i] for i in capture]
