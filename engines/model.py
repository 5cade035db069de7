"""A compact Llama forward with a preallocated KV cache and tree attention, plus the EAGLE-1/2 and EAGLE-3 drafters.

Numerics follow Hugging Face's LlamaForCausalLM (transformers/models/llama/modeling_llama.py) so that logits match:
RMSNorm in float32 then `weight * x.to(dtype)`, neox-style RoPE (`rotate_half`) with cos/sin computed in float32
and cast to the compute dtype, SwiGLU `down(silu(gate(x)) * up(x))`.

Every forward appends T new tokens per sequence to a cache: `Step` says which cache rows, which slots the new K/V
go to, the RoPE position of each new token, and which keys each new token may see (the tree mask). A causal chain
is the special case of a tree that is a line.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from core.families import ROPE_TYPES
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


# ---- cache and step -------------------------------------------------------------------------------------------------


@dataclass
class KVCache:
    """Preallocated keys/values: k[layer] is (rows, slots, kv_heads, head_dim)."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]

    @classmethod
    def allocate(
        cls, layers: int, rows: int, slots: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device
    ) -> KVCache:
        shape = (rows, slots, kv_heads, head_dim)
        return cls(
            [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)],
            [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)],
        )

    @property
    def slots(self) -> int:
        return self.k[0].shape[1]

    def move(self, row: int, src: torch.Tensor, dst: torch.Tensor) -> None:
        """KV compaction: copy the entries at slots `src` to slots `dst` in one row, every layer."""
        for k, v in zip(self.k, self.v):
            k[row, dst] = k[row, src]
            v[row, dst] = v[row, src]


@dataclass
class Step:
    """Where T new tokens per sequence go and what they may attend to.

    rows (B,): cache rows; slots (B, T): cache slots of the new K/V; positions (B, T): RoPE positions;
    mask (B, 1, T, kv_len) bool over cache slots [0, kv_len), or None when every new token sees every slot < kv_len
    (a single sequence, single token). Every position is < kv_len (a token's position is at most its slot)."""

    rows: torch.Tensor
    slots: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor | None
    kv_len: int
    row_slice: slice | None = None  # rows as a slice when they are contiguous: avoids gathering the cache

    def gather(self, cache: torch.Tensor) -> torch.Tensor:
        if self.row_slice is not None:
            return cache[self.row_slice, : self.kv_len]
        return cache[self.rows, : self.kv_len]


@dataclass(frozen=True)
class Rows:
    """The cache rows of one forward and their committed lengths, on the device and as host lists."""

    idx: torch.Tensor  # (B,)
    lens: torch.Tensor  # (B,)
    host: list[int]
    host_lens: list[int]

    @classmethod
    def of(cls, rows: list[int], lens: list[int], device: torch.device) -> Rows:
        return cls(torch.tensor(rows, device=device), torch.tensor(lens, device=device), rows, lens)

    def step(self, positions: torch.Tensor, visible: torch.Tensor, start: int = 0) -> Step:
        return make_step(
            self.idx, self.lens, positions, visible, start=start, host_rows=self.host, host_lens=self.host_lens
        )


def contiguous_slice(rows: list[int]) -> slice | None:
    if rows == list(range(rows[0], rows[0] + len(rows))):
        return slice(rows[0], rows[0] + len(rows))
    return None


def make_step(
    rows: torch.Tensor, lens: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor, *, start: int = 0,
    host_rows: list[int] | None = None, host_lens: list[int] | None = None,
) -> Step:
    """T new tokens per row written after the row's `lens` committed entries, in a scratch region of R slots.

    New token t goes to scratch slot start + t (cache slot lens + start + t); positions (B, T): RoPE positions;
    visible (B, T, R): new token t may see scratch slot r (itself, and for trees its ancestors). Every new token also
    sees all committed entries of its own row. `host_rows` / `host_lens` are `rows` / `lens` as Python lists when the
    caller has them (on CUDA reading them back would cost a device -> host sync per step)."""
    b, t = positions.shape
    r = visible.shape[-1]
    dev = lens.device
    host_rows = rows.tolist() if host_rows is None else host_rows
    host_lens = lens.tolist() if host_lens is None else host_lens
    slots = lens[:, None] + torch.arange(start, start + t, device=dev)
    if b == 1 and t == 1 and r == 1:
        return Step(rows, slots, positions, None, host_lens[0] + 1, contiguous_slice(host_rows))
    kv_len = max(host_lens) + r
    rel = torch.arange(kv_len, device=dev)[None, :] - lens[:, None]  # (B, S): slot relative to the scratch region
    committed = rel < 0
    in_scratch = (rel >= 0) & (rel < r)
    scratch = torch.gather(visible, 2, rel.clamp(0, r - 1)[:, None, :].expand(b, t, kv_len))  # (B, T, S)
    mask = (committed[:, None, :] | (in_scratch[:, None, :] & scratch))[:, None]
    return Step(rows, slots, positions, mask, kv_len, contiguous_slice(host_rows))


# ---- layers ---------------------------------------------------------------------------------------------------------


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


# ---- drafters -------------------------------------------------------------------------------------------------------


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
