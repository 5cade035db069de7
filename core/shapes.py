"""The shape of a target, read from its config.json by its family's row (core/families.py `attention`, `moe`): how
many parameters it holds, how many KV-cache bytes one token takes and how much recurrent state one sequence keeps.
Torch-free: builders/capacity.py sizes engine limits with it. tests/test_shapes.py checks `params` equals the
parameter count of transformers' own model class for a tiny config of every family transformers implements.

Per decoder layer (the checkpoint's MTP layers, `num_nextn_predict_layers`, are not decoder layers and not counted):
- attention: dense GQA q/k/v/o (+ biases, q/k norms, gpt-oss sinks, Qwen3-Next's output gate doubling q_proj);
  MLA (DeepSeek-V3): q_a/q_b (or q_proj without q_lora_rank), kv_a_proj_with_mqa, kv_b_proj, o_proj and the two
  latent norms; KV per token per layer: 2 x kv_heads x head_dim (dense), kv_lora_rank + qk_rope_head_dim (MLA),
  plus, where a sparse-attention indexer runs (DeepSeek-V3.2, GLM-5 'full' layers), index_head_dim FP8 keys and a
  float32 scale per 128 of them (index_head_dim + index_head_dim // 128 x 4), which TensorRT-LLM's
  DSACacheManager.get_cache_size_per_token counts in the cache dtype's bytes (tensorrt_llm/_torch/attention_backend/
  sparse/dsa.py at eaf50262; its indexer blocks are 64 tokens, as the cache's);
- recurrent mixers keep no KV: Qwen3-Next's gated delta-net (state n_v_heads x d_k x d_v + its conv window) and
  Nemotron-H's Mamba-2 (state heads x head_dim x d_state + its conv window), per sequence;
- MLP: gated (3 x hidden x inter), ungated (2 x, Apertus' xIELU, Nemotron-H's relu2), or MoE: every routed expert,
  the shared experts, the router (and its score-correction bias), dense layers first where the config says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.families import COMPRESSED, LINEAR, MAMBA, MLA, Family, text_config
from core.vision_towers import VisionShapeError, kimi_k25_vision


INDEXER_QUANT_BLOCK = 128  # DSA indexer keys: one float32 scale per 128 FP8 values (dsa.py quant_block_size)


class ShapeError(ValueError):
    """A config.json that lacks what its family needs to be sized; the message names the key."""


@dataclass(frozen=True)
class TargetShape:
    architecture: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    params: int  # every parameter of the decoder stack, embeddings and LM head
    kv_per_token: int  # KV-cache elements one token takes over all attention layers (TensorRT-LLM's layout)
    state_per_sequence: int  # recurrent-state elements one sequence keeps over all recurrent layers
    window_layers: tuple[int, ...] = field(default=())  # sliding-window attention layers (their KV is capped)
    window: int | None = None
    kv_per_token_per_layer: int = 0
    reference_kv_per_token: int = 0  # the reference engine's layout: K and V slots, every layer (MLA: latents)
    compressed: tuple[tuple[int, int], ...] = ()  # DeepSeek-V4: (rate, elements) of each layer's compressed entries
    expert_params: int = 0  # the routed experts' parameters (split over the ranks whatever the attention layout)
    latent_kv: bool = False  # MLA / compressed K=V: every rank keeps each token's whole cache entry (not split by tp)

    def kv_elements(self, tokens: int) -> int:
        """KV elements of one sequence of `tokens` tokens: sliding-window layers hold at most their window; a
        compressed cache holds one entry per `rate` tokens (core/compressed_shapes.py)."""
        pooled = sum(-(-w // m) for m, w in self.compressed)
        full = self.kv_per_token - len(self.window_layers) * self.kv_per_token_per_layer - pooled
        capped = tokens if self.window is None else min(tokens, self.window)
        return (full * tokens + len(self.window_layers) * self.kv_per_token_per_layer * capped
                + sum(w * (tokens // m) for m, w in self.compressed))


def _need(cfg: dict[str, Any], *keys: str) -> list[int]:
    missing = [k for k in keys if cfg.get(k) is None]
    if missing:
        raise ShapeError(f"missing key(s) {', '.join(missing)}")
    return [int(cfg[k]) for k in keys]


def _layer_kinds(fam: Family, cfg: dict[str, Any], n: int) -> list[str]:
    """'attention' / 'linear' / 'mamba' mixer per layer, plus Nemotron-H's mixer-less MLP / MoE layers."""
    if fam.attention == MAMBA:  # published configs: hybrid_override_pattern; transformers 5: layers_block_type
        blocks = cfg.get("layers_block_type")
        if isinstance(blocks, list) and len(blocks) == n:
            by_name = {"mamba": "mamba", "linear_attention": "mamba", "attention": "attention",
                       "full_attention": "attention", "mlp": "mlp", "moe": "moe"}
            if all(b in by_name for b in blocks):
                return [by_name[b] for b in blocks]
        pattern = str(cfg.get("hybrid_override_pattern") or "")
        kinds = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
        if len(pattern) != n or any(c not in kinds for c in pattern):
            raise ShapeError(f"hybrid_override_pattern {pattern!r} must have one of M * - E per layer ({n})")
        return [kinds[c] for c in pattern]
    types = cfg.get("layer_types")
    if fam.attention == LINEAR:
        if not types or len(types) != n:
            raise ShapeError(f"layer_types must list {n} layers (linear_attention / full_attention)")
        return ["linear" if t == "linear_attention" else "attention" for t in types]
    return ["attention"] * n


def _dense_attention(fam: Family, cfg: dict[str, Any], h: int, j: int = 0) -> tuple[int, int]:
    heads = int(cfg["num_attention_heads"])
    if isinstance(cfg.get("num_attention_heads_per_layer"), list):  # Laguna: query heads per layer
        heads = int(cfg["num_attention_heads_per_layer"][j])
    kvh = int(cfg.get("num_key_value_heads") or heads)
    hd = int(cfg.get("head_dim") or h // heads)
    q, kv = heads * hd, kvh * hd
    gate = 2 if fam.attention == LINEAR else 1  # Qwen3-Next / 3.5: q_proj also yields the output gate
    p = h * q * gate + 2 * h * kv + q * h
    if cfg.get("attention_bias") or fam.qkv_bias:
        out_bias = cfg.get("attention_out_bias", False) if fam.model_type == "seed_oss" else fam.model_type == "gpt_oss"
        p += q * gate + 2 * kv + (h if out_bias else 0)
    if fam.model_type == "laguna":  # softplus output gate per head (gating true / "per-head") or per channel
        p += h * (heads if cfg.get("gating", True) in (True, "per-head") else q)
    if fam.model_type in ("qwen3", "qwen3_moe", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "apertus",
                          "exaone_moe", "laguna"):
        p += 2 * hd  # per-head q/k RMSNorm
    if fam.model_type == "glm4_moe" and cfg.get("use_qk_norm"):
        p += 2 * hd
    if fam.model_type == "gpt_oss":
        p += heads  # attention sinks
    return p, 2 * kv


def _mla(cfg: dict[str, Any], h: int) -> tuple[int, int]:
    heads, kvl, rope, nope, v = _need(cfg, "num_attention_heads", "kv_lora_rank", "qk_rope_head_dim",
                                      "qk_nope_head_dim", "v_head_dim")
    ql = cfg.get("q_lora_rank")
    qk = nope + rope
    q = h * heads * qk if ql is None else h * int(ql) + int(ql) + int(ql) * heads * qk
    p = q + h * (kvl + rope) + kvl + kvl * heads * (nope + v) + heads * v * h
    return p, kvl + rope


def _indexer(fam: Family, cfg: dict[str, Any], h: int, j: int) -> tuple[int, int]:
    """DeepSeek-V3.2 / GLM-5's sparse-attention indexer of layer j (wq_b, wk, its LayerNorm, weights_proj) and the
    indexer keys it caches per token; GLM-5's 'shared' layers reuse the previous selection and have none."""
    if fam.model_type not in ("deepseek_v32", "glm_moe_dsa"):
        return 0, 0
    if fam.model_type == "glm_moe_dsa" and _glm_indexer_types(cfg)[j] != "full":
        return 0, 0
    ql, heads, dim = _need(cfg, "q_lora_rank", "index_n_heads", "index_head_dim")
    return ql * heads * dim + h * dim + 2 * dim + h * heads, dim + dim // INDEXER_QUANT_BLOCK * 4


def _glm_indexer_types(cfg: dict[str, Any]) -> list[str]:
    """GLM-5's indexer per layer as transformers' GlmMoeDsaConfig reads it: `indexer_types`, else the pattern
    `index_topk_pattern` ("F" full, "S" shared), else layer i is full where max(i - index_skip_topk_offset + 1, 0)
    is a multiple of index_topk_freq (defaults 2 and 1: every layer full)."""
    n = int(cfg["num_hidden_layers"])
    types = cfg.get("indexer_types")
    if types is None and cfg.get("index_topk_pattern") is not None:
        pattern = cfg["index_topk_pattern"]
        types = [{"F": "full", "S": "shared"}[c] for c in pattern] if isinstance(pattern, str) else list(pattern)
    if types is None:
        freq, offset = max(int(cfg.get("index_topk_freq", 1)), 1), int(cfg.get("index_skip_topk_offset", 2))
        types = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n)]
    if len(types) != n or not set(types) <= {"full", "shared"}:
        raise ShapeError(f"indexer_types must give 'full' or 'shared' for each of the {n} layers, got {types!r}")
    return list(types)


def _linear_mixer(cfg: dict[str, Any], h: int) -> tuple[int, int]:
    nk, nv, dk, dv, kernel = _need(cfg, "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                   "linear_value_head_dim", "linear_conv_kernel_dim")
    key, value = nk * dk, nv * dv
    conv = 2 * key + value
    p = h * (2 * key + 2 * value) + h * 2 * nv + conv * kernel + 2 * nv + dv + value * h
    return p, nv * dk * dv + conv * (kernel - 1)


def _mamba_mixer(cfg: dict[str, Any], h: int) -> tuple[int, int]:
    heads, hd, groups, state, kernel = _need(cfg, "mamba_num_heads", "mamba_head_dim", "n_groups", "ssm_state_size",
                                             "conv_kernel")
    inner = heads * hd
    conv = inner + 2 * groups * state
    p = h * (2 * inner + 2 * groups * state + heads) + conv * kernel + 3 * heads + inner + inner * h
    if cfg.get("use_conv_bias", True):
        p += conv
    if cfg.get("use_bias") or cfg.get("mamba_proj_bias"):
        p += 2 * inner + 2 * groups * state + heads + h
    return p, heads * hd * state + conv * (kernel - 1)


def _vision(cfg: dict[str, Any], text_hidden: int) -> int:
    """Llama 4's vision tower and projector (transformers' Llama4VisionModel, Llama4MultiModalProjector), which the
    checkpoint ships and TensorRT-LLM's Llama4ForConditionalGeneration loads beside the text model."""
    vh, vi, layers, image, patch, proj_in, proj_out, out_dim = _need(
        cfg, "hidden_size", "intermediate_size", "num_hidden_layers", "image_size", "patch_size",
        "projector_input_dim", "projector_output_dim", "vision_output_dim")
    channels = int(cfg.get("num_channels") or 3)
    p = channels * patch * patch * vh + vh + ((image // patch) ** 2 + 1) * vh + 4 * vh  # patches, class, pos, norms
    p += layers * (4 * (vh * vh + vh) + 2 * vh * vi + vi + vh + 4 * vh)  # attention (biases), MLP (biases), norms
    return p + vi * proj_in + proj_out * proj_out + out_dim * text_hidden  # pixel-shuffle MLP, projector


def _mlp(fam: Family, cfg: dict[str, Any], h: int, i: int) -> int:
    if fam.model_type in ("apertus",):
        return 2 * h * i + 4  # up/down; xIELU's alpha_p, alpha_n and its saved beta, eps
    if fam.model_type == "nemotron_h":
        return 2 * h * i
    return 3 * h * i + (3 * i + h if cfg.get("mlp_bias") else 0)


def _moe(fam: Family, cfg: dict[str, Any], h: int) -> int:
    experts = int(cfg.get("n_routed_experts") or cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
    inter = int(cfg.get("moe_intermediate_size") or cfg.get("intermediate_size") or 0)
    if not experts or not inter:
        raise ShapeError("an MoE family needs its expert count (n_routed_experts / num_experts / num_local_experts) "
                         "and moe_intermediate_size")
    if fam.model_type == "gpt_oss":  # fused gate_up with biases, down with bias, router with bias
        return experts * (h * 2 * inter + 2 * inter + inter * h + h) + experts * h + experts
    if fam.model_type == "llama4":  # fused gate_up, down, router; a shared expert of intermediate_size
        return experts * 3 * h * inter + experts * h + 3 * h * inter
    if fam.model_type == "nemotron_h":
        p = experts * 2 * h * inter + experts * h + experts
        shared = int(cfg.get("moe_shared_expert_intermediate_size") or 0)
        return p + 2 * h * shared * int(cfg.get("n_shared_experts") or 1) if shared else p
    p = experts * 3 * h * inter + experts * h
    if fam.model_type == "laguna":  # router + its score-correction bias, a shared expert with no output gate
        return p + experts + 3 * h * int(cfg.get("shared_expert_intermediate_size") or inter)
    if fam.model_type in ("deepseek_v3", "deepseek_v32", "glm_moe_dsa", "glm4_moe", "exaone_moe", "kimi_k25"):
        p += experts  # e_score_correction_bias
        p += int(cfg.get("n_shared_experts") or cfg.get("num_shared_experts") or 0) * 3 * h * inter
    shared = int(cfg.get("shared_expert_intermediate_size") or 0)
    if shared:  # Qwen3-Next / 3.5 MoE: one shared expert and its sigmoid gate
        p += 3 * h * shared + h
    return p


def _routed(fam: Family, cfg: dict[str, Any], h: int) -> int:
    """The routed experts' share of `_moe` (what expert parallelism splits; the router, shared experts stay)."""
    experts = int(cfg.get("n_routed_experts") or cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
    inter = int(cfg.get("moe_intermediate_size") or cfg.get("intermediate_size") or 0)
    if fam.model_type == "gpt_oss":
        return experts * (h * 2 * inter + 2 * inter + inter * h + h)
    return experts * (2 if fam.model_type == "nemotron_h" else 3) * h * inter


def _is_moe_layer(fam: Family, cfg: dict[str, Any], j: int) -> bool:
    if not fam.moe:
        return False
    if fam.model_type == "llama4":  # transformers' moe_layers, else every interleave_moe_layer_step-th layer
        if isinstance(cfg.get("moe_layers"), list):
            return j in cfg["moe_layers"]
        return (j + 1) % int(cfg.get("interleave_moe_layer_step") or 1) == 0
    if isinstance(cfg.get("mlp_layer_types"), list):
        return cfg["mlp_layer_types"][j] == "sparse"
    if "first_k_dense_replace" in cfg:
        return j >= int(cfg["first_k_dense_replace"])
    if isinstance(cfg.get("is_moe_layer"), list):
        return bool(cfg["is_moe_layer"][j])
    if j in (cfg.get("mlp_only_layers") or ()):
        return False
    step = int(cfg.get("decoder_sparse_step") or 1)
    return (j + 1) % step == 0


def target_shape(fam: Family, cfg: dict[str, Any]) -> TargetShape:
    """Size a target of family `fam` from its config.json (a `text_config` block is read where the model nests it;
    a `vision_config` beside it is sized as Llama 4's or Kimi-K2.5's vision tower)."""
    vision = cfg.get("vision_config") if fam.model_type in ("llama4", "kimi_k25") else None
    cfg = text_config(cfg)
    if cfg.get("num_hidden_layers") is None and fam.attention == MAMBA:  # transformers 5 derives it from the blocks
        blocks = cfg.get("layers_block_type") or cfg.get("hybrid_override_pattern")
        cfg = {**cfg, "num_hidden_layers": len(blocks) if blocks else None}
    if fam.attention == COMPRESSED:
        return _compressed(fam, cfg)
    vocab, h, n = _need(cfg, "vocab_size", "hidden_size", "num_hidden_layers")
    if fam.attention == MLA:
        attn, kv_layer = _mla(cfg, h)
    else:
        _need(cfg, "num_attention_heads")
        attn, kv_layer = _dense_attention(fam, cfg, h)
    params, kv, state = vocab * h * (1 if cfg.get("tie_word_embeddings") else 2) + h, 0, 0
    routed = 0
    window_layers: list[int] = []
    for j, kind in enumerate(_layer_kinds(fam, cfg, n)):
        norms = h if fam.model_type == "nemotron_h" else 2 * h
        if kind == "attention":
            if fam.model_type == "laguna":
                attn, kv_layer = _dense_attention(fam, cfg, h, j)
            p_index, kv_index = _indexer(fam, cfg, h, j)
            params += attn + p_index
            kv += kv_layer + kv_index
            if (cfg.get("layer_types") or [None] * n)[j] == "sliding_attention" and cfg.get("sliding_window"):
                window_layers.append(j)
        elif kind == "linear":
            p, s = _linear_mixer(cfg, h)
            params, state = params + p, state + s
        elif kind == "mamba":
            p, s = _mamba_mixer(cfg, h)
            params, state = params + p, state + s
        if fam.model_type == "nemotron_h":
            if kind == "mlp":
                params += _mlp(fam, cfg, h, int(cfg["intermediate_size"]))
            elif kind == "moe":
                params, routed = params + _moe(fam, cfg, h), routed + _routed(fam, cfg, h)
        elif _is_moe_layer(fam, cfg, j):
            params, routed = params + _moe(fam, cfg, h), routed + _routed(fam, cfg, h)
        else:
            params += _mlp(fam, cfg, h, int(cfg.get("intermediate_size_mlp") or cfg["intermediate_size"])
                           if fam.model_type == "llama4" else int(cfg["intermediate_size"]))
        params += norms
    if isinstance(vision, dict):  # Kimi-K2.5: MoonViT3d and its projector (core/vision_towers.py)
        try:
            params += kimi_k25_vision(vision, h) if fam.model_type == "kimi_k25" else _vision(vision, h)
        except VisionShapeError as e:
            raise ShapeError(str(e)) from None
    window = int(cfg["sliding_window"]) if window_layers else None
    return TargetShape(fam.name, vocab, h, n, params, kv, state, tuple(window_layers), window, kv_layer,
                       2 * n * reference_kv_width(fam, cfg), expert_params=routed, latent_kv=fam.attention == MLA)


def _compressed(fam: Family, cfg: dict[str, Any]) -> TargetShape:
    """DeepSeek-V4 (core/compressed_shapes.py). The reference engine keeps K and V slots of the one head_dim head
    for every token and layer, plus the compressed entries per row (engines/compressed.py)."""
    from core.compressed_shapes import CompressedShapeError, compressed_shape

    try:
        s = compressed_shape(cfg)
    except CompressedShapeError as e:
        raise ShapeError(str(e)) from None
    pooled = sum(-(-w // m) for m, w in s["compressed"])
    return TargetShape(fam.name, s["vocab_size"], s["hidden_size"], s["num_hidden_layers"], s["params"],
                       s["kv_per_token"], 0, s["window_layers"], s["window"], s["kv_per_token_per_layer"],
                       2 * s["num_hidden_layers"] * s["kv_per_token_per_layer"] + pooled, s["compressed"],
                       latent_kv=True)


def reference_kv_width(fam: Family, cfg: dict[str, Any]) -> int:
    """Elements per token per layer of K (and of V) in the reference engine's cache: kv_heads x head_dim. MLA keeps
    the compressed latents transformers' DeepseekV3Attention hands its cache (one "head": the kv_lora_rank latent as
    K, the qk_rope_head_dim rotated key as V), in slots of the wider one."""
    if fam.attention == MLA:  # DSA: the indexer keys after the rope key (engines/generic.py `_SlotCache`)
        return max(int(cfg["kv_lora_rank"]), int(cfg["qk_rope_head_dim"]) + int(cfg.get("index_head_dim") or 0))
    heads = int(cfg["num_attention_heads"])
    kvh = int(cfg.get("num_key_value_heads") or heads)
    return kvh * int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)


def shape_of_config(cfg: dict[str, Any], where: str) -> TargetShape:
    """The shape of a config.json whose architecture is a row of the family table (else ShapeError naming it)."""
    from core.families import family_of

    arch = (cfg.get("architectures") or [None])[0]
    fam = family_of(arch)
    if fam is None:
        raise ShapeError(f"{where}: architecture {arch!r} is not in the family table (core/families.py)")
    try:
        return target_shape(fam, cfg)
    except ShapeError as e:
        raise ShapeError(f"{where}: {fam.name}: {e}") from None
