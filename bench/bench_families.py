"""Reference-engine step cost per target family next to HF eager, in one run.

    python bench/bench_families.py [--families llama,qwen3,qwen2,mistral,qwen3_moe] [--ts 1,4] [--repeats 20]
        [--threads 1] [--dtype float32] [--json FILE]

Each family is a random model of SmolLM2-135M's shape (hidden 576, 30 layers, 9 heads / 3 KV heads, MLP 1536, vocab
49,152; MoE families: 8 experts of 256, 2 per token, and one shared expert where the family has them; DeepSeek-V3 /
V3.2 / GLM-5: MLA with q_lora_rank 192, kv_lora_rank 64, V3.2's indexer keeping 64 keys (GLM-5: 9 indexer layers
of 30, the others reusing a selection); Kimi-K2.5: DeepSeek-V3's shape as the text model of the multimodal wrapper,
a one-layer vision encoder beside it (not run); Llama 4: experts every second layer, every fourth layer NoPE;
Qwen3-Next / Qwen3.5: three gated delta-net layers per attention layer; Nemotron-H: Mamba-2 and MLP layers, one
attention layer in seven; DeepSeek-V4: one K=V head, 4 hyper-connection streams, compressed attention every 4 / 128
tokens as published), written by transformers. The families the table marks native
are converted (builders/convert) and run by the engine's own forward; the generic ones run through the generic
target (transformers' own model class, engines/generic.py). For T in --ts: one forward with T new tokens after a
200-token context plus the lm_head at the last position, the engine and HF eager (transformers, no compile,
DynamicCache rewound after each call: attention layers drop what the call wrote; a recurrent layer's fixed-size
state stays advanced, which does not change the next call's cost; DeepSeek-V4's windows and compressors, on both
sides, are put back to the context's state) called round-robin (measure/costs.py
interleaved_ms), median of --repeats. The engine's T-token forward of a recurrent family also keeps each token's
state (what a verification needs). Random weights: the cost of a forward does not depend on their values. Compare
ratios within one run; absolute times depend on the machine and its load.

Inputs:  none (the models are generated)
Outputs: a table on stdout (ms per forward, engine / HF ratio); --json the figures
Guide:   docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from measure.costs import forward_fns, interleaved_ms

SHAPE = {"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
         "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "max_position_embeddings": 2048,
         "rms_norm_eps": 1e-5, "rope_theta": 1e5, "tie_word_embeddings": True}
CLASSES = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
           "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"), "mistral": ("MistralConfig", "MistralForCausalLM"),
           "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
           "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM"),
           "glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM"),
           "exaone_moe": ("ExaoneMoeConfig", "ExaoneMoeForCausalLM"),
           "seed_oss": ("SeedOssConfig", "SeedOssForCausalLM"), "apertus": ("ApertusConfig", "ApertusForCausalLM"),
           "deepseek_v32": ("DeepseekV32Config", "DeepseekV32ForCausalLM"),
           "glm_moe_dsa": ("GlmMoeDsaConfig", "GlmMoeDsaForCausalLM"),
           "llama4": ("Llama4Config", "Llama4ForConditionalGeneration"),
           "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM"),
           "qwen3_5": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM"),
           "qwen3_5_moe": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM"),
           "nemotron_h": ("NemotronHConfig", "NemotronHForCausalLM"),
           "laguna": ("LagunaConfig", "LagunaForCausalLM"),
           "kimi_k25": ("Kimi_K25Config", "Kimi_K25ForConditionalGeneration"),
           "deepseek_v4": ("DeepseekV4Config", "DeepseekV4ForCausalLM")}
MOE = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 256, "decoder_sparse_step": 1,
       "norm_topk_prob": True, "mlp_only_layers": []}
_ROUTED = {"n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1, "moe_intermediate_size": 256,
           "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1}
_LINEAR = {"layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 7 + ["linear_attention", "full_attention"],
           "linear_num_key_heads": 3, "linear_num_value_heads": 6, "linear_key_head_dim": 64,
           "linear_value_head_dim": 64, "linear_conv_kernel_dim": 4}
_PATTERN = "M-M-M*-" * 4 + "M-"
# What each family adds to the shape (the families' own layouts at SmolLM2-135M's size; 8 experts of 256, 2 per token)
EXTRA: dict[str, dict[str, Any]] = {
    "qwen3_moe": MOE,
    "deepseek_v3": {**_ROUTED, "num_key_value_heads": 9, "head_dim": 32, "q_lora_rank": 192, "kv_lora_rank": 64,
                    "qk_rope_head_dim": 32, "qk_nope_head_dim": 64, "v_head_dim": 64},
    "glm4_moe": {**_ROUTED, "partial_rotary_factor": 0.5, "use_qk_norm": True, "attention_bias": True},
    "exaone_moe": {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 256, "num_shared_experts": 1,
                   "sliding_window": 4096, "layer_types": (["sliding_attention"] * 3 + ["full_attention"]) * 7
                   + ["sliding_attention", "full_attention"], "mlp_layer_types": ["dense"] + ["sparse"] * 29},
    "seed_oss": {"attention_bias": True},
    # DeepSeek-V3.2: DeepSeek-V3's shape with the sparse-attention indexer keeping 64 of the 200+ keys
    "deepseek_v32": {**_ROUTED, "num_key_value_heads": 9, "q_lora_rank": 192, "kv_lora_rank": 64,
                     "qk_rope_head_dim": 32, "qk_nope_head_dim": 64, "v_head_dim": 64, "index_topk": 64,
                     "index_head_dim": 64, "index_n_heads": 8},
    # GLM-5: DeepSeek-V3.2's shape above, where after the third layer three layers of four reuse the previous full
    # layer's selection (transformers' index_topk_freq 4 / index_skip_topk_offset 3: 9 indexers of 30)
    "glm_moe_dsa": {**_ROUTED, "num_key_value_heads": 9, "q_lora_rank": 192, "kv_lora_rank": 64,
                    "qk_rope_head_dim": 32, "qk_nope_head_dim": 64, "v_head_dim": 64, "index_topk": 64,
                    "index_head_dim": 64, "index_n_heads": 8, "index_topk_freq": 4, "index_skip_topk_offset": 3},
    # Llama 4: MoE every second layer (a shared expert), every fourth layer NoPE, chunks of 8192
    "llama4": {"intermediate_size": 256, "intermediate_size_mlp": 1536, "num_local_experts": 8,
               "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "attention_chunk_size": 8192},
    # Qwen3-Next / Qwen3.5: three gated delta-net layers per full-attention layer; Nemotron-H: Mamba-2 and MLP
    # layers with one attention layer in seven
    "qwen3_next": {**_LINEAR, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 256,
                   "shared_expert_intermediate_size": 256},
    "qwen3_5": dict(_LINEAR),
    "qwen3_5_moe": {**_LINEAR, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 256,
                    "shared_expert_intermediate_size": 256},
    "nemotron_h": {"hybrid_override_pattern": _PATTERN, "layers_block_type": [
        {"M": "mamba", "-": "mlp", "*": "attention"}[c] for c in _PATTERN], "mamba_num_heads": 18,
        "mamba_head_dim": 64, "n_groups": 1, "ssm_state_size": 64, "conv_kernel": 4, "layer_norm_epsilon": 1e-5,
        "mlp_hidden_act": "relu2"},
    # Laguna: three sliding-window layers per full-attention layer (RoPE per layer type, partial on the full ones),
    # per-head output gates, 8 sigmoid-routed experts of 256 (2 per token) and a shared expert after a dense layer
    "laguna": {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 256,
               "shared_expert_intermediate_size": 256, "sliding_window": 4096, "gating": True,
               "layer_types": (["sliding_attention"] * 3 + ["full_attention"]) * 7
               + ["sliding_attention", "full_attention"], "mlp_layer_types": ["dense"] + ["sparse"] * 29,
               "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e5,
                                                      "partial_rotary_factor": 0.5},
                                   "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
    # DeepSeek-V4: one shared K=V head of 64, 4 hyper-connection streams, two sliding-only layers then CSA (every 4
    # tokens, the indexer keeping 64) and HCA (every 128) alternating, as published, the first 3 layers hash-routed;
    # a 4096-token window so that the engine takes the 200-token context (published: 128)
    "deepseek_v4": {"n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1,
                    "moe_intermediate_size": 256, "num_key_value_heads": 1, "head_dim": 64, "qk_rope_head_dim": 32,
                    "q_lora_rank": 192, "o_groups": 3, "o_lora_rank": 192, "hc_mult": 4, "index_n_heads": 8,
                    "index_head_dim": 32, "index_topk": 64, "sliding_window": 4096, "num_hash_layers": 3,
                    "compress_ratios": [0, 0] + [4, 128] * 14, "compress_rope_theta": 1.6e5},
    "apertus": {"hidden_act": "xielu", "rope_parameters": {"rope_type": "default", "rope_theta": 1e5}},
}
EXTRA["kimi_k25"] = EXTRA["deepseek_v3"]  # Kimi-K2.5: DeepSeek-V3's text model (text_config) beside MoonViT3d
_UPSTREAM = {"exaone_moe": "ExaoneMoEForCausalLM", "kimi_k25": "KimiK25ForConditionalGeneration"}  # upstream's spelling


def reference_path(family: str) -> str:
    """native / generic, from the family table's row of this class (core/families.py)."""
    from core.families import BY_NAME

    row = BY_NAME.get(_UPSTREAM.get(family, CLASSES[family][1]))
    if row is None or row.reference is None:
        raise SystemExit(f"error: {family}: the family table has no reference-engine path for it")
    return row.reference


def write_model(family: str, out: Path, dtype: torch.dtype) -> Any:
    import transformers

    conf_cls, model_cls = (getattr(transformers, n) for n in CLASSES[family])
    torch.manual_seed(0)
    keys = {**SHAPE, **EXTRA.get(family, {})}
    if family == "llama4":  # the text model in text_config, a small vision tower beside it (not run)
        from testkit.tiny_families import _LLAMA4_VISION

        conf = conf_cls(text_config=keys, vision_config=_LLAMA4_VISION, tie_word_embeddings=True)
    elif family == "kimi_k25":  # the text model in text_config, a one-layer MoonViT3d beside it (not run)
        from testkit.tiny_families import KIMI_K25_VISION

        conf = conf_cls(text_config={**keys, "model_type": "deepseek_v3"}, vision_config=KIMI_K25_VISION,
                        projection_hidden_size=KIMI_K25_VISION["hidden_size"], tie_word_embeddings=True)
    else:
        conf = conf_cls(**keys)
    model = model_cls(conf).to(dtype).eval()
    model.save_pretrained(out)
    if family in _UPSTREAM:  # the architecture name upstream registers (the family table's row)
        cfg = json.loads((out / "config.json").read_text())
        (out / "config.json").write_text(json.dumps({**cfg, "architectures": [_UPSTREAM[family]]}))
    from testkit.tiny_models import make_tokenizer

    make_tokenizer(out)
    return model


def engine_target(family: str, hf_dir: Path, work: Path, dtype: str) -> Any:
    if reference_path(family) == "generic":
        from engines.generic import load_generic

        return load_generic(hf_dir, getattr(torch, dtype), torch.device("cpu"), max_seq_len=2048)
    from builders.convert import convert_llama
    from engines.api import ReferenceEngine

    convert_llama(hf_dir, work, dtype=dtype)
    return ReferenceEngine.from_checkpoint(work, tree=None, dtype=dtype, device="cpu")._rt.target


def hf_fns(model: Any, ts: list[int], context: int = 200) -> dict[int, Any]:
    from transformers import DynamicCache

    g = torch.Generator().manual_seed(0)
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(torch.randint(0, _vocab(model), (1, context), generator=g), past_key_values=cache)

    saved = _state(cache) if _compressed(cache) else None

    def make(t: int) -> Any:
        tokens = torch.randint(0, _vocab(model), (1, t), generator=g)

        @torch.inference_mode()
        def one() -> None:
            model(tokens, past_key_values=cache, logits_to_keep=1)
            if saved is not None:  # DeepSeek-V4: windows and compressors back to the context's state
                for layer, state in zip(cache.layers, saved):
                    layer.__dict__.update(_copy(state))
            else:
                _rewind(cache, t)

        return one

    return {t: make(t) for t in ts}


def _compressed(cache: Any) -> bool:
    return any(hasattr(layer, "compressed_kv") for layer in cache.layers)


def _copy(state: dict[str, Any]) -> dict[str, Any]:
    return {k: dict(v) if isinstance(v, dict) else v for k, v in state.items()}


def _state(cache: Any) -> list[dict[str, Any]]:
    """Every cache layer's attributes (transformers' DeepSeek-V4 cache layers replace their tensors, never write them
    in place, so shallow copies keep a state to go back to)."""
    return [_copy(layer.__dict__) for layer in cache.layers]


def _vocab(model: Any) -> int:
    return int(model.config.get_text_config().vocab_size)


def _rewind(cache: Any, t: int) -> None:
    """The next call writes the same positions: attention layers drop the t keys/values written. A recurrent layer
    (gated delta-net, Mamba-2) keeps a fixed-size state that cannot be rewound without recording past states; it
    stays advanced, which does not change the cost of the next call."""
    from transformers.cache_utils import DynamicLayer, LinearAttentionLayer

    for layer in cache.layers:
        if isinstance(layer, LinearAttentionLayer) and not isinstance(layer, DynamicLayer):
            continue
        if isinstance(layer, LinearAttentionLayer):  # a hybrid layer's attention half
            DynamicLayer.crop(layer, -t)
        else:
            layer.crop(-t)


def _kept(target: Any, fn: Any) -> Any:
    """DeepSeek-V4 on the engine: each timed forward leaves the row's compressor state as the context left it (as
    HF's cache is put back), by the store's own restore (engines/compressed.py)."""
    store = getattr(target, "compressed", None)
    if store is None:
        return fn
    saved = store._snapshot(0)

    def one() -> None:
        fn()
        store._restore(0, saved)
        store.pending.clear()

    return one


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_families.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default="llama,qwen3,qwen2,mistral,qwen3_moe",
                    help=f"comma-separated, of {', '.join(CLASSES)}")
    ap.add_argument("--ts", default="1,4", help="new tokens per forward (default 1,4)")
    ap.add_argument("--repeats", type=int, default=20, help="timed calls per function (default 20)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args(argv)
    families = args.families.split(",")
    bad = [f for f in families if f not in CLASSES]
    if bad or args.repeats < 1 or args.threads < 1:
        print(f"error: unknown families {bad} (use {', '.join(CLASSES)}), or --repeats/--threads < 1", file=sys.stderr)
        return 2
    ts = [int(t) for t in args.ts.split(",")]
    torch.set_num_threads(args.threads)
    dt = getattr(torch, args.dtype)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for fam in families:
            hf_dir, work = Path(tmp) / fam, Path(tmp) / f"{fam}-ckpt"
            model = write_model(fam, hf_dir, dt)
            target = engine_target(fam, hf_dir, work, args.dtype)
            fns = {("engine", t): _kept(target, f) for t, f in forward_fns(target, dt, torch.device("cpu"),
                                                                            ts).items()}
            fns |= {("hf", t): f for t, f in hf_fns(model, ts).items()}
            ms = interleaved_ms(fns, args.repeats)
            path = reference_path(fam)
            for t in ts:
                rows.append({"family": fam, "path": path, "t": t, "engine_ms": ms[("engine", t)],
                             "hf_ms": ms[("hf", t)], "ratio": ms[("hf", t)] / ms[("engine", t)]})
            del model, target, fns
    print(f"{'family':<12} {'path':<8} {'T':>3} {'engine ms':>10} {'HF eager ms':>12} {'HF / engine':>12}")
    for r in rows:
        print(f"{r['family']:<12} {r['path']:<8} {r['t']:>3} {r['engine_ms']:>10.2f} {r['hf_ms']:>12.2f} "
              f"{r['ratio']:>11.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"dtype": args.dtype, "threads": args.threads, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
