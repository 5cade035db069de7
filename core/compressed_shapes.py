"""DeepSeek-V4's shape (the family table's COMPRESSED kind), read from its config.json (torch-free; core/shapes.py
`target_shape` hands the row here).

Parameters, per transformers' DeepseekV4ForCausalLM (models/deepseek_v4/modeling_deepseek_v4.py, 5.25) and the
tensors TensorRT-LLM's DeepseekV4WeightLoader reads (modeling_deepseekv4.py at 02586bf0):
- attention (every layer): q_a_proj / q_a_norm / q_b_proj (q_lora_rank), one shared K=V head (kv_proj, kv_norm of
  head_dim), the grouped output projection o_a_proj (heads x head_dim x o_lora_rank) and o_b_proj
  (o_groups x o_lora_rank -> hidden), one attention sink per head;
- compressor of a compressed-sparse-attention (CSA) layer: kv / gate projections to 2 x head_dim (two overlapping
  series), a position bias per slot of its window, its norm, and the lightning indexer (the same at index_head_dim,
  q_b_proj from the q latent, weights_proj per indexer head); of a heavily-compressed (HCA) layer: kv / gate
  projections to head_dim, position bias, norm (no indexer);
- hyper-connections: per layer two mixers (attention, MoE) of fn ((2 + hc_mult) x hc_mult, hc_mult x hidden), base
  and 3 scales; the HC head before the final norm (hc_mult x hc_mult x hidden, hc_mult, 1);
- MoE (every layer): the router, every routed expert, n_shared_experts x moe_intermediate_size shared width
  (upstream's DeepseekV4MoE), and per layer either the score-correction bias (top-k layers) or the frozen
  token -> experts table tid2eid (vocab x num_experts_per_tok; hash-routed layers, the first num_hash_layers);
- the checkpoint's MTP layers (num_nextn_predict_layers; compress_ratios lists them after the decoder layers) are
  not decoder layers and are not counted;
- Engram (has_engram, which transformers does not implement; TensorRT-LLM's modules/engram/engram.py, read at
  6eac3ea64802a6eeb79c94a06ee894bc03c25d18, configured by DeepseekV4Model at 02586bf0): on each layer of
  engram_layer_ids, a multi-head embedding of (engram_n_embed_per_ngram / engram_n_head_per_ngram) per row over one
  table per head and n-gram order (2..engram_max_ngram_size), each table a prime number of rows (the next unused prime
  after engram_vocab_size[order - 2] - 1, `_calculate_vocab_size_across_layers`), a depthwise short convolution over
  hc_mult x hidden channels (engram_kernel_size taps) with its per-stream norm, kv_proj ((max_ngram_size - 1) x
  n_embed_per_ngram -> (1 + hc_mult) x hidden) and the key / query norms (hc_mult x hidden each).

Cache per sequence (in the cache dtype; an upper bound where upstream keeps parts in FP8): every layer keeps the
shared K=V (head_dim) of the last sliding_window tokens; a CSA layer adds one compressed entry of head_dim plus one
indexer key of index_head_dim per compress rate tokens (4 published), an HCA layer one head_dim entry per its rate
(128 published). `TargetShape.kv_elements` counts exactly that; `kv_per_token` is the per-token growth before the
window caps (the window part plus the compressed entries' share, rounded up).
"""

from __future__ import annotations

from typing import Any

CSA, HCA, SWA = "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"
RATIO_KIND = {0: SWA, 1: SWA, 4: CSA, 128: HCA}  # legacy compress_ratios (upstream: 0 and 1 both uncompressed)
DEFAULT_RATES = {CSA: 4, HCA: 128}  # transformers' DeepseekV4Config.default_compress_rates
DEFAULT_HASH_LAYERS = 3  # transformers' DeepseekV4Config.default_num_hash_layers


class CompressedShapeError(ValueError):
    """A DeepSeek-V4 config.json without what sizes it; the message names the key."""


def _int(cfg: dict[str, Any], *keys: str) -> list[int]:
    missing = [k for k in keys if cfg.get(k) is None]
    if missing:
        raise CompressedShapeError(f"missing key(s) {', '.join(missing)}")
    return [int(cfg[k]) for k in keys]


def layer_kinds(cfg: dict[str, Any]) -> tuple[list[str], dict[str, int]]:
    """Attention kind of each decoder layer and the compress rate of each kind: layer_types (transformers 5) or the
    published compress_ratios, of which only the first num_hidden_layers entries are decoder layers (the rest
    describe the MTP layers, as transformers' DeepseekV4Config truncates them)."""
    (n,) = _int(cfg, "num_hidden_layers")
    rates = dict(DEFAULT_RATES)
    if isinstance(cfg.get("compress_rates"), dict):
        rates.update({k: int(v) for k, v in cfg["compress_rates"].items()})
    for kind, key in ((CSA, "compress_rate_csa"), (HCA, "compress_rate_hca")):
        if cfg.get(key) is not None:
            rates[kind] = int(cfg[key])
    types = cfg.get("layer_types")
    if isinstance(types, list):
        kinds = [str(t) for t in types[:n]]
    elif isinstance(cfg.get("compress_ratios"), list):
        ratios = [int(r) for r in cfg["compress_ratios"][:n]]
        bad = sorted({r for r in ratios if r not in RATIO_KIND})
        if bad:
            raise CompressedShapeError(f"compress_ratios {bad}: only 0 (sliding window), 4 (CSA), 128 (HCA) exist")
        kinds = [RATIO_KIND[r] for r in ratios]
    else:
        raise CompressedShapeError("missing key(s) layer_types (or compress_ratios): the attention kind per layer")
    other = sorted({k for k in kinds if k not in (CSA, HCA, SWA)})
    if len(kinds) != n or other:
        raise CompressedShapeError(f"layer_types must name {n} layers of {SWA} / {CSA} / {HCA} (got {other or kinds})")
    return kinds, rates


def hash_layers(cfg: dict[str, Any]) -> list[bool]:
    """Whether each decoder layer routes by the token -> experts table (mlp_layer_types hash_moe, else the first
    num_hash_layers)."""
    (n,) = _int(cfg, "num_hidden_layers")
    if isinstance(cfg.get("mlp_layer_types"), list):
        return [t == "hash_moe" for t in cfg["mlp_layer_types"][:n]]
    k = cfg.get("num_hash_layers", cfg.get("n_hash_layers", DEFAULT_HASH_LAYERS))
    return [j < int(k) for j in range(n)]


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    k = 2
    while k * k <= n:
        if n % k == 0:
            return False
        k += 1
    return True


def engram_params(cfg: dict[str, Any], h: int, hc: int) -> int:
    """Parameters of TensorRT-LLM's Engram modules (module docstring), 0 without has_engram."""
    if not cfg.get("has_engram"):
        return 0
    orders, per_order, heads, kernel = _int(cfg, "engram_max_ngram_size", "engram_n_embed_per_ngram",
                                            "engram_n_head_per_ngram", "engram_kernel_size")
    vocab, layers = cfg.get("engram_vocab_size"), cfg.get("engram_layer_ids")
    if not isinstance(vocab, list) or len(vocab) != orders - 1 or not isinstance(layers, list):
        raise CompressedShapeError(f"engram_vocab_size must list {orders - 1} sizes (n-gram orders 2..{orders}) and "
                                   "engram_layer_ids the layers")
    seen: set[int] = set()
    params = 0
    for _ in layers:
        rows = 0
        for size in vocab:
            candidate = int(size) - 1
            for _ in range(heads):  # upstream's _find_next_prime: the next prime after the last, unused so far
                candidate += 1
                while not _is_prime(candidate) or candidate in seen:
                    candidate += 1
                seen.add(candidate)
                rows += candidate
        params += rows * (per_order // heads) + hc * h * kernel + hc * h
        params += (orders - 1) * per_order * (1 + hc) * h + 2 * hc * h
    return params


def compressed_shape(cfg: dict[str, Any]) -> dict[str, Any]:
    """params, kv_per_token, window layers and width, and the compressed caches ((rate, width) per layer) of a
    DeepSeek-V4 config.json."""
    vocab, h, heads, hd, ql, groups, o_rank = _int(
        cfg, "vocab_size", "hidden_size", "num_attention_heads", "head_dim", "q_lora_rank", "o_groups", "o_lora_rank")
    experts, inter, topk, hc, window = _int(cfg, "n_routed_experts", "moe_intermediate_size", "num_experts_per_tok",
                                            "hc_mult", "sliding_window")
    shared = int(cfg.get("n_shared_experts") or 0)
    kinds, rates = layer_kinds(cfg)
    attn = heads + h * ql + ql + ql * heads * hd + h * hd + hd + heads * hd * o_rank + groups * o_rank * h
    mix = (2 + hc) * hc
    hyper = 2 * (mix * hc * h + mix + 3)
    moe = experts * h + 3 * experts * h * inter + 3 * h * inter * shared
    params = vocab * h * (1 if cfg.get("tie_word_embeddings") else 2) + h + hc * hc * h + hc + 1
    params += engram_params(cfg, h, hc)
    compressed: list[tuple[int, int]] = []
    for kind, hashed in zip(kinds, hash_layers(cfg)):
        params += attn + hyper + moe + 2 * h + (vocab * topk if hashed else experts)
        if kind == HCA:
            m = rates[HCA]
            params += m * hd + 2 * h * hd + hd
            compressed.append((m, hd))
        elif kind == CSA:
            m = rates[CSA]
            ih, ihd = _int(cfg, "index_n_heads", "index_head_dim")
            params += m * 2 * hd + 2 * h * 2 * hd + hd
            params += m * 2 * ihd + 2 * h * 2 * ihd + ihd + ql * ih * ihd + h * ih
            compressed.append((m, hd + ihd))
    n = len(kinds)
    per_token = n * hd + sum(-(-w // m) for m, w in compressed)
    return {"params": params, "kv_per_token": per_token, "window_layers": tuple(range(n)), "window": window,
            "kv_per_token_per_layer": hd, "compressed": tuple(compressed), "num_hidden_layers": n,
            "vocab_size": vocab, "hidden_size": h}
