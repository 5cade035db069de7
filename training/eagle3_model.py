"""The EAGLE-3 head as SafeAILab/EAGLE eagle/traineagle3/cnets.py defines it, with its training-time-test unroll.

    f      = fc(concat[a_j1, a_j2, a_j3])                  captured target layer INPUTS, Linear(n*H -> H), no bias
    h      = concat[input_layernorm(embed(token)), hidden_norm(f)]          2H, the attention input
    x      = f + o_proj(attn(q/k/v_proj(h)))               the feature is the residual
    out    = x + mlp(post_attention_layernorm(x))          fed back as f at the next drafting step
    logits = lm_head(norm(out))                            over the DRAFT vocabulary (draft_vocab_size rows)

This is what the reference engine runs (engines/heads.py Eagle3Drafter) and TensorRT-LLM's Eagle3DraftModel
(tensorrt_llm/_torch/models/modeling_speculative.py). State dict keys are the exported names (midlayer.*, fc, norm,
lm_head, d2t, t2d, embed_tokens).

Training-time test (cnets.py LlamaAttention with cache_hidden): step 0 is a causal pass over the true features.
Step k >= 1 feeds step k-1's `out` at every index t as the feature, with the token of position t+1+k, at rope
position t+k (cnets: position_ids + len(cache)); its query attends to the step-0 keys at indices <= t and to the
keys of steps 1..k at the SAME index t (a diagonal per step), i.e. exactly the draft-chain KV cache a root t sees
at inference.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from training.model import MLP, RMSNorm, with_transformers4_rope
from core.families import eagle3_head_config


class Eagle3Attention(nn.Module):
    """Llama attention whose q/k/v read the 2H concatenation [embedding; feature] (no biases, as upstream)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        h = cfg.hidden_size
        self.q_proj = nn.Linear(2 * h, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * h, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * h, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """[B,T,2H] -> rotated q, k and v [B,heads,T,d] (kv heads repeated for GQA)."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        rep = self.heads // self.kv_heads
        return q, k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)

    def ttt_attend(self, q: torch.Tensor, keys: list[torch.Tensor], vals: list[torch.Tensor]) -> torch.Tensor:
        """Softmax over [causal step-0 keys (<= t); step-1..k keys at index t] jointly; keys[0]/vals[0] are step 0."""
        b, _, t, d = q.shape
        s0 = q @ keys[0].transpose(2, 3)
        s0 = s0.masked_fill(~torch.ones(t, t, dtype=torch.bool, device=q.device).tril(), float("-inf"))
        diag = [(q * k).sum(-1, keepdim=True) for k in keys[1:]]  # [B,heads,T,1] each
        w = (torch.cat([s0, *diag], dim=-1) / d**0.5).softmax(-1)
        o = w[..., :t] @ vals[0]
        for i, v in enumerate(vals[1:]):
            o = o + w[..., t + i : t + i + 1] * v
        return self.o_proj(o.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class Midlayer(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(h, eps)
        self.hidden_norm = RMSNorm(h, eps)
        self.self_attn = Eagle3Attention(cfg)
        self.mlp = MLP(cfg)
        self.post_attention_layernorm = RMSNorm(h, eps)

    def finish(self, feats: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        x = feats + attn_out
        return x + self.mlp(self.post_attention_layernorm(x))


class Eagle3Head(nn.Module):
    d2t: torch.Tensor  # buffers (register_buffer below): draft id -> target id offset
    t2d: torch.Tensor  # target id -> in the draft vocabulary

    def __init__(self, cfg: LlamaConfig, n_aux: int, draft_ids: torch.Tensor) -> None:
        super().__init__()
        self.config = cfg
        h, vocab, n = cfg.hidden_size, cfg.vocab_size, draft_ids.shape[0]
        self.embed_tokens = nn.Embedding(vocab, h)
        self.embed_tokens.weight.requires_grad_(False)  # the target's embedding, frozen (cnets load_emb)
        self.fc = nn.Linear(n_aux * h, h, bias=False)
        self.midlayer = Midlayer(cfg)
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(h, n, bias=False)
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[draft_ids] = True
        self.register_buffer("d2t", draft_ids - torch.arange(n))
        self.register_buffer("t2d", t2d)
        self.rotary = LlamaRotaryEmbedding(cfg)

    def draft_to_target(self, draft: torch.Tensor) -> torch.Tensor:
        return draft + self.d2t[draft]

    def step(self, feats: torch.Tensor, ids: torch.Tensor, offset: int, keys: list, vals: list) -> torch.Tensor:
        """One TTT step over all indices: appends this step's k/v to `keys`/`vals`, returns out [B,T,H]."""
        b, t, _ = feats.shape
        mid = self.midlayer
        emb = self.embed_tokens(ids.long()).to(feats.dtype)
        h2 = torch.cat([mid.input_layernorm(emb), mid.hidden_norm(feats)], dim=-1)
        pos = (torch.arange(t, device=feats.device) + offset).expand(b, t)
        cos, sin = self.rotary(h2, pos)
        q, k, v = mid.self_attn.qkv(h2, cos, sin)
        keys.append(k)
        vals.append(v)
        return mid.finish(feats, mid.self_attn.ttt_attend(q, keys, vals))

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(out))

    def unroll(
        self, aux: torch.Tensor, steps: int, tokens: Callable[[int, torch.Tensor | None], torch.Tensor]
    ) -> list[torch.Tensor]:
        """TTT unroll: aux [B,T,n*H]; `tokens(k, prev_out)` gives the [B,T] token ids of step k (teacher tokens,
        or the drafts of step k-1 computed from prev_out). Returns out [B,T,H] of every step."""
        feats = self.fc(aux)
        keys: list[torch.Tensor] = []
        vals: list[torch.Tensor] = []
        outs: list[torch.Tensor] = []
        prev = None
        for k in range(steps):
            prev = self.step(feats, tokens(k, prev), k, keys, vals)
            outs.append(prev)
            feats = prev
        return outs


def eagle3_head_from_target(
    target_cfg: dict, embed: torch.Tensor, lm_head: torch.Tensor, final_norm: torch.Tensor, draft_ids: torch.Tensor,
    n_aux: int, seed: int, lm_head_init: str,
) -> Eagle3Head:
    """A fresh head (torch default init under `seed`) with the target's embedding; lm_head_init "target" starts
    lm_head at the target's rows for the draft ids and norm at the target's final norm weight."""
    # the layout the head is exported in (eagle3_config_dict): Llama keys only, none of the target's stack
    cfg = LlamaConfig(**eagle3_head_config({k: v for k, v in target_cfg.items() if k not in NON_LLAMA_KEYS})
                      | {"attention_bias": False, "mlp_bias": False})  # upstream: no biases in the midlayer
    torch.manual_seed(seed)
    head = Eagle3Head(cfg, n_aux, draft_ids)
    with torch.no_grad():
        head.embed_tokens.weight.copy_(embed)
        if lm_head_init == "target":
            head.lm_head.weight.copy_(lm_head[draft_ids])
            head.norm.weight.copy_(final_norm)
    return head


NON_LLAMA_KEYS = {"eagle_deploy_source", "_name_or_path", "transformers_version", "quantization_config"}


def eagle3_config_dict(target_cfg: dict, draft_vocab: int, layer_ids: list[int]) -> dict:
    """config.json of the head (LlamaForCausalLMEagle3 layout read by builders/convert/eagle3.py and TRT-LLM)."""
    cfg = {k: v for k, v in target_cfg.items() if k not in NON_LLAMA_KEYS}
    cfg.update(
        architectures=["LlamaForCausalLMEagle3"],
        num_hidden_layers=1,
        draft_vocab_size=draft_vocab,
        target_hidden_size=target_cfg["hidden_size"],
        eagle_aux_hidden_state_layer_ids=list(layer_ids),
        bias=False,
        attention_bias=False,  # the midlayer has no biases (cnets.py; the engines load none)
        mlp_bias=False,
        tie_word_embeddings=False,  # the head's lm_head is its own (draft vocabulary rows)
    )
    return with_transformers4_rope(eagle3_head_config(cfg))


def eagle3_state_dict(head: Eagle3Head, dtype: torch.dtype, *, embedding: bool) -> dict[str, torch.Tensor]:
    """Float tensors in `dtype`; d2t int64 and t2d bool as they are; rotary buffers are not weights."""
    out = {}
    for k, v in head.state_dict().items():
        if k.startswith("rotary.") or (k == "embed_tokens.weight" and not embedding):
            continue
        out[k] = (v.to("cpu", dtype) if v.is_floating_point() else v.cpu()).detach().contiguous()
    return out
