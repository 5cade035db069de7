"""A cost MODEL of a decoding step on a named GPU, for `tune_tree.py --objective schedule --cost-model GPU` where the
GPU cannot be run. It is a model, not a measurement: each part of a step costs the larger of its bytes over the
GPU's memory bandwidth and its FLOPs over its peak dense 16-bit tensor throughput (a roofline with no efficiency
factor, no kernel launch or host overhead, no overlap between parts), so it overstates what a real engine reaches and
places the memory/compute crossover where the datasheet figures put it.

A step of B sequences verifying n tokens each (n = draft tokens + 1; target-only: n = 1) at context length L:
    target = max((P_t * s + B * L * kv) / BW, (2 * P_t * B * n + 4 * layers * hidden * L * B * n) / peak)
    with kv = 2 * layers * kv_heads * head_dim * s bytes per cached token, s = 2 (16-bit weights and cache)
    draft  = sum over the d drafting levels of max(P_h * s / BW, 2 * P_h * B * w / peak), w = the level's nodes
plus, when speculating, one more drafter pass over the accepted tokens (as the engine does). P_t: the target's
parameters (embedding included: its lm_head product reads it), P_h: the head's (one decoder layer, its fc and the
lm_head). The figures below are the vendors' datasheet numbers (dense, no sparsity).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from core.speculation import truncate
from core.trees import DraftTree


@dataclass(frozen=True)
class Gpu:
    name: str
    bandwidth: float  # bytes/s of HBM/GDDR
    peak: float  # dense BF16/FP16 tensor FLOP/s


GPUS = {g.name: g for g in (
    Gpu("H100-SXM", 3.35e12, 989e12),
    Gpu("H200-SXM", 4.8e12, 989e12),
    Gpu("A100-SXM-80GB", 2.039e12, 312e12),
    Gpu("L40S", 0.864e12, 362e12),
)}
BYTES = 2  # 16-bit weights and KV cache


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    layers: int
    intermediate: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int

    @classmethod
    def from_checkpoint(cls, config_json: Path) -> ModelShape:
        """The target's shape from a TensorRT-LLM checkpoint's config.json (the build's checkpoint/config.json)."""
        c = json.loads(config_json.read_text())
        return cls(c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"], c["vocab_size"],
                   c["num_attention_heads"], c["num_key_value_heads"], c.get("head_size") or c["hidden_size"] // c[
                       "num_attention_heads"])

    def layer_params(self) -> int:
        attn = self.hidden * self.head_dim * (self.heads * 2 + self.kv_heads * 2)  # q, o, k, v
        return attn + 3 * self.hidden * self.intermediate

    def params(self) -> int:
        return self.layers * self.layer_params() + self.vocab * self.hidden

    def head_params(self) -> int:
        """An EAGLE head: one decoder layer, the fc fusing features, and its lm_head."""
        return self.layer_params() + 2 * self.hidden * self.hidden + self.vocab * self.hidden

    def kv_bytes(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * BYTES


def _roof(gpu: Gpu, nbytes: float, flops: float) -> float:
    return max(nbytes / gpu.bandwidth, flops / gpu.peak)


def step_ms(gpu: Gpu, m: ModelShape, batch: int, tree: DraftTree | None, context: int) -> float:
    """Modelled ms of one decoding step of `batch` sequences drafting `tree` (None: target-only decoding)."""
    n = 1 + (tree.size if tree is not None else 0)
    p = m.params()
    t = _roof(gpu, p * BYTES + batch * context * m.kv_bytes(),
              2 * p * batch * n + 4 * m.layers * m.hidden * context * batch * n)
    if tree is not None:
        ph = m.head_params()
        widths = [sum(1 for q in tree.paths if len(q) == d) for d in range(1, tree.depth + 1)]
        for w in [*widths, 1]:  # the drafting levels, then the pass over the accepted tokens
            t += _roof(gpu, ph * BYTES, 2 * ph * batch * w)
    return 1e3 * t


def modelled_costs(gpu: Gpu, m: ModelShape, tree: DraftTree, batch_sizes: list[int],
                   context: int) -> tuple[dict[int, list[float]], dict[int, float]]:
    """(ms per step at each batch size and draft length 0..depth, target-only ms per step at each batch size); draft
    length 0 is modelled as a target-only step (TensorRT-LLM drafts nothing there)."""
    step = {b: [step_ms(gpu, m, b, None, context)] + [step_ms(gpu, m, b, truncate(tree, d), context)
                                                    for d in range(1, tree.depth + 1)] for b in batch_sizes}
    return step, {b: step[b][0] for b in batch_sizes}
