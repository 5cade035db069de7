"""Tiny random targets of the families beyond Llama, written by transformers' own classes (so the weights, names and
config keys are exactly what `from_pretrained` reads), with the shared test tokenizer (testkit/tiny_models.py).

`make_family_target(dir, family, **options)`: family is one of FAMILIES; every parameter is drawn from a seeded
normal (biases and q/k norm weights included, so a missing bias or norm changes the logits). Options cover what the
families ship: GQA, tied or untied embeddings, a head_dim independent of hidden_size / heads, rope_theta 1e6, YaRN
or linear RoPE scaling, sliding windows, and for MoE the expert counts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from core.families import text_config
from testkit.tiny_models import HIDDEN, INTER, VOCAB, make_tokenizer

FAMILIES = ("qwen3", "qwen2", "mistral", "qwen3_moe", "gpt_oss")  # the session fixture `family_targets` builds these
# The rows added with the family table (core/families.py), built where a test needs them: the generic ones run on
# the reference engine (the recurrent ones, gated delta-net or Mamba-2 layers, with chain drafts); a build-only one
# would be sized and built for the PyTorch backend but not run there (none is).
GENERIC_FAMILIES = ("deepseek_v3", "glm4_moe", "seed_oss", "apertus", "llama4", "deepseek_v32",
                    "laguna", "glm_moe_dsa", "kimi_k25")
RECURRENT_FAMILIES = ("qwen3_next", "qwen3_5", "qwen3_5_moe", "nemotron_h")
# Rows whose caches are not slot KV caches and that the reference engine verifies with chain drafts only: the recurrent
# ones and DeepSeek-V4 (compressed attention, engines/compressed.py).
CHAIN_FAMILIES = (*RECURRENT_FAMILIES, "deepseek_v4")
BUILD_ONLY_FAMILIES: tuple[str, ...] = ()

_CLASSES = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM"),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM"),
    "glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM"),
    "exaone_moe": ("ExaoneMoeConfig", "ExaoneMoeForCausalLM"),
    "seed_oss": ("SeedOssConfig", "SeedOssForCausalLM"),
    "apertus": ("ApertusConfig", "ApertusForCausalLM"),
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM"),
    "qwen3_5": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM"),
    "qwen3_5_moe": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM"),
    "nemotron_h": ("NemotronHConfig", "NemotronHForCausalLM"),
    "llama4": ("Llama4Config", "Llama4ForConditionalGeneration"),  # text_config + a vision tower, as published
    "deepseek_v32": ("DeepseekV32Config", "DeepseekV32ForCausalLM"),
    "glm_moe_dsa": ("GlmMoeDsaConfig", "GlmMoeDsaForCausalLM"),
    "laguna": ("LagunaConfig", "LagunaForCausalLM"),
    "kimi_k25": ("Kimi_K25Config", "Kimi_K25ForConditionalGeneration"),  # text_config + MoonViT3d, as published
    "deepseek_v4": ("DeepseekV4Config", "DeepseekV4ForCausalLM"),
}
# Every row of the family table (core/families.py FAMILIES) and the tiny family that stands for it.
TINY = {"LlamaForCausalLM": "llama", "Qwen3ForCausalLM": "qwen3", "Qwen2ForCausalLM": "qwen2",
        "MistralForCausalLM": "mistral", "Qwen3MoeForCausalLM": "qwen3_moe", "GptOssForCausalLM": "gpt_oss",
        "DeepseekV3ForCausalLM": "deepseek_v3", "Glm4MoeForCausalLM": "glm4_moe",
        "SeedOssForCausalLM": "seed_oss", "ApertusForCausalLM": "apertus", "Qwen3NextForCausalLM": "qwen3_next",
        "Qwen3_5ForCausalLM": "qwen3_5", "Qwen3_5MoeForCausalLM": "qwen3_5_moe", "NemotronHForCausalLM": "nemotron_h",
        "Llama4ForConditionalGeneration": "llama4", "DeepseekV32ForCausalLM": "deepseek_v32",
        "LagunaForCausalLM": "laguna", "GlmMoeDsaForCausalLM": "glm_moe_dsa",
        "KimiK25ForConditionalGeneration": "kimi_k25", "DeepseekV4ForCausalLM": "deepseek_v4"}
# Tiny models of architectures transformers implements that are not rows yet (core/families.py NOT_ROWS says why):
# ready for their row, not built or served by the tests.
NOT_ROW_FAMILIES: tuple[str, ...] = ("exaone_moe",)
# The architecture name upstream TensorRT-LLM registers, where transformers' class is spelled differently.
_ARCH = {"exaone_moe": "ExaoneMoEForCausalLM", "kimi_k25": "KimiK25ForConditionalGeneration"}
_LINEAR = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
               linear_conv_kernel_dim=4)

# Qwen3's switch as its chat template implements it: with enable_thinking false the generation prompt ends in an
# empty reasoning block, so the model answers without thinking (Qwen3 model card, "Switching Between Thinking and
# Non-Thinking Mode"). Written for these tests, same variable and effect.
QWEN3_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}
LINEAR = {"rope_type": "linear", "factor": 2.0}


def family_config(family: str, *, tie: bool = False, head_dim: int | None = None, heads: int = 4, kv_heads: int = 2,
                  layers: int = 3, rope_theta: float = 1e6, rope_scaling: dict | None = None,
                  sliding_window: int | None = None, **extra: Any) -> dict[str, Any]:
    """The config.json keys of a tiny `family` model (transformers-4 spelling: rope_theta / rope_scaling)."""
    cfg: dict[str, Any] = {
        "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": INTER, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim or HIDDEN // heads,
        "hidden_act": "silu", "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": rope_theta,
        "tie_word_embeddings": tie, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
    }
    if rope_scaling is not None:
        cfg["rope_scaling"] = dict(rope_scaling)
    if family in ("qwen2", "qwen3", "qwen3_moe"):
        cfg.update(use_sliding_window=sliding_window is not None, sliding_window=sliding_window,
                   max_window_layers=0 if sliding_window is not None else layers)
    if family == "mistral":
        cfg["sliding_window"] = sliding_window
    if family == "gpt_oss":  # alternating sliding / full layers and attention sinks, as gpt-oss ships
        cfg.update(num_local_experts=4, num_experts_per_tok=2, intermediate_size=64,
                   sliding_window=sliding_window or 128, rope_theta=rope_theta)
        cfg.pop("rope_scaling", None)
    if family == "qwen3_moe":
        cfg.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=1,
                   norm_topk_prob=True, mlp_only_layers=[])
    cfg.update(_NEW.get(family, {}))
    if family in ("qwen3_next", "qwen3_5", "qwen3_5_moe"):
        cfg["layer_types"] = ["linear_attention"] * (layers - 1) + ["full_attention"]
    if family == "nemotron_h":
        pattern = ("M-" * layers)[: layers - 1] + "*"
        cfg.update(hybrid_override_pattern=pattern, layers_block_type=[
            {"M": "mamba", "-": "mlp", "*": "attention"}[c] for c in pattern])
    if family == "glm_moe_dsa":  # every second layer reuses the previous layer's selection
        cfg["indexer_types"] = ["shared" if j % 2 else "full" for j in range(layers)]
    if family == "laguna":  # query heads per layer, sliding layers then a full one, a dense first layer
        cfg["num_attention_heads_per_layer"] = [heads, kv_heads, heads] + [heads] * (layers - 3)
        cfg["layer_types"] = ["sliding_attention"] * (layers - 1) + ["full_attention"]
        cfg["mlp_layer_types"] = ["dense"] + ["sparse"] * (layers - 1)
        cfg["sliding_window"] = sliding_window or 128
    if family == "deepseek_v4":  # sliding-only, CSA and HCA layers; hash routing first; published compress_ratios
        cfg["compress_ratios"] = ([0, 4, 128] * layers)[:layers] + [0]  # + one entry for the MTP layer, as shipped
        cfg["sliding_window"] = sliding_window or 128
        for k in ("intermediate_size", "rope_scaling"):
            cfg.pop(k, None)
    if family == "exaone_moe":
        cfg["layer_types"] = ["sliding_attention"] * (layers - 1) + ["full_attention"]
        cfg["mlp_layer_types"] = ["dense"] + ["sparse"] * (layers - 1)
    cfg.update(extra)
    return cfg


# Shapes as the published checkpoints have them, scaled down: MLA with q_lora_rank and v_head_dim != qk head dim,
# dense-first layers then routed + shared experts, GLM's partial RoPE and q/k norms, sliding-window layers, biases.
_NEW: dict[str, dict[str, Any]] = {
    "deepseek_v3": dict(num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16,
                        v_head_dim=12, head_dim=8, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                        moe_intermediate_size=32, first_k_dense_replace=1, n_group=2, topk_group=1,
                        num_nextn_predict_layers=1),
    # DeepSeek-V3.2 / GLM-5: MLA with the sparse-attention indexer keeping the top 4 keys (published: 2048), so that
    # most queries of the tests attend to a subset; GLM-5's second layer reuses the first one's selection
    "deepseek_v32": dict(num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
                         qk_nope_head_dim=16, v_head_dim=12, n_routed_experts=4, num_experts_per_tok=2,
                         n_shared_experts=1, moe_intermediate_size=32, first_k_dense_replace=1, n_group=2, topk_group=1,
                         index_topk=4, index_head_dim=16, index_n_heads=8),
    "glm_moe_dsa": dict(num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
                        qk_nope_head_dim=16, v_head_dim=12, n_routed_experts=4, num_experts_per_tok=2,
                        n_shared_experts=1, moe_intermediate_size=32, first_k_dense_replace=1, n_group=1, topk_group=1,
                        index_topk=4, index_head_dim=16, index_n_heads=8),
    "glm4_moe": dict(partial_rotary_factor=0.5, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                     moe_intermediate_size=32, first_k_dense_replace=1, n_group=1, topk_group=1, use_qk_norm=True,
                     attention_bias=True),
    "exaone_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, num_shared_experts=1,
                       sliding_window=128, first_k_dense_replace=1),
    # Laguna: per-head softplus output gates, sigmoid-routed experts + a shared expert, RoPE per layer type as upstream
    # reads the published config (modeling_laguna.py: global = YaRN on half the head_dim, SWA = linear on all of it)
    "laguna": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                   gating=True, moe_routed_scaling_factor=2.5,
                   rope_parameters={"full_attention": {"rope_type": "yarn", "rope_theta": 5e5, "factor": 4.0,
                                                       "original_max_position_embeddings": 128,
                                                       "partial_rotary_factor": 0.5},
                                    "sliding_attention": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0,
                                                          "partial_rotary_factor": 1.0}}),
    "seed_oss": dict(attention_bias=True, attention_out_bias=False),
    "apertus": dict(hidden_act="xielu", rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
    "qwen3_next": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                       shared_expert_intermediate_size=32, **_LINEAR),
    "qwen3_5": dict(_LINEAR),
    "qwen3_5_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                        shared_expert_intermediate_size=32, **_LINEAR),
    # Llama 4: MoE every second layer (routed experts + a shared expert), RoPE layers with chunked attention and a
    # weightless q/k norm, every second layer NoPE with attention temperature tuning; floor_scale 8 so that the
    # temperature changes within the tests' sequences (published: 8192), chunks of 128 tokens (published: 8192)
    "llama4": dict(intermediate_size_mlp=64, num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2,
                   no_rope_layer_interval=2, attention_chunk_size=128, use_qk_norm=True, attn_temperature_tuning=True,
                   floor_scale=8, attn_scale=0.5),
    # DeepSeek-V4: one shared K=V head of 16 with 8 rotated, q latent 24, grouped output projection (2 groups of 8),
    # 2 hyper-connection streams, CSA every 4 tokens with a 3-key indexer, HCA every 8 (published: 4 and 128, so
    # that the tests' sequences close several windows of each), 4 experts (top 2) + a shared one, the first layer
    # hash-routed (published: 3 of 43)
    "deepseek_v4": dict(num_key_value_heads=1, head_dim=16, qk_rope_head_dim=8, q_lora_rank=24, o_groups=2,
                        o_lora_rank=8, hc_mult=2, hc_sinkhorn_iters=20, n_routed_experts=4, num_experts_per_tok=2,
                        n_shared_experts=1, moe_intermediate_size=32, index_n_heads=2, index_head_dim=8, index_topk=3,
                        compress_rate_csa=4, compress_rate_hca=8, num_hash_layers=1, rope_theta=1e4,
                        compress_rope_theta=1.6e5, num_nextn_predict_layers=1),
    "nemotron_h": dict(mamba_num_heads=4, mamba_head_dim=16, n_groups=2, ssm_state_size=8, conv_kernel=4,
                       layer_norm_epsilon=1e-6, mlp_hidden_act="relu2"),
}
_NEW["kimi_k25"] = _NEW["deepseek_v3"]  # Kimi-K2.5's text model is DeepSeek-V3's (text_config)


_LLAMA4_VISION = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, image_size=28,
                      patch_size=14, vision_output_dim=32, projector_input_dim=32, projector_output_dim=32,
                      pixel_shuffle_ratio=0.5)


# Kimi-K2.5's MoonViT3d in transformers' spelling (published: vt_hidden_size, init_pos_emb_height, ...), one layer
KIMI_K25_VISION = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, patch_size=14,
                       pos_emb_height=4, pos_emb_width=4, pos_emb_time=2, merge_kernel_size=[2, 2])


def _model(family: str, cfg: dict[str, Any]) -> Any:
    import transformers

    conf_cls, model_cls = (getattr(transformers, n) for n in _CLASSES[family])
    if family == "llama4":  # the text model's keys in text_config, a one-layer vision tower beside it
        conf = conf_cls(text_config=cfg, vision_config=_LLAMA4_VISION, tie_word_embeddings=cfg["tie_word_embeddings"])
    elif family == "kimi_k25":  # DeepSeek-V3 keys in text_config, MoonViT3d + projector beside it
        conf = conf_cls(text_config={**cfg, "model_type": "deepseek_v3"}, vision_config=KIMI_K25_VISION,
                        projection_hidden_size=KIMI_K25_VISION["hidden_size"],
                        tie_word_embeddings=cfg["tie_word_embeddings"])
    else:
        conf = conf_cls(**cfg)
    torch.manual_seed(0)
    return model_cls(conf)


def _randomize(model: torch.nn.Module, seed: int, block_scale: float) -> None:
    """Every parameter redrawn: norms around 1, embeddings ~N(0, 1), the rest ~N(0, 0.08); the blocks' output
    projections (o_proj, down_proj) times `block_scale` (below 1: the next token depends mostly on the current one)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight", "down_proj")):
                p.copy_(0.08 * block_scale * noise)
            elif name.endswith("model.norm.weight") and "vision" not in name and block_scale < 1:
                p.copy_(torch.ones_like(p))
            elif "norm" in name:
                p.copy_(1.0 + 0.1 * noise)
            elif "embed_tokens" in name:
                p.copy_(noise)
            elif "lm_head" in name:
                p.copy_(0.5 * noise)
            else:
                p.copy_(0.08 * noise)


def make_family_target(out: Path, family: str, *, seed: int = 0, tokenizer: bool = True, block_scale: float = 1.0,
                       **options: Any) -> Path:
    """A random tiny `family` model saved by transformers (float32 safetensors), with generation_config.json and the
    test tokenizer. Same arguments, same bytes. `block_scale` < 1 makes it close to a bigram model, which
    `make_mimic_eagle3_head` predicts."""
    if family not in _CLASSES:
        raise ValueError(f"family {family!r}: one of {', '.join(_CLASSES)}")
    out.mkdir(parents=True, exist_ok=True)
    model = _model(family, family_config(family, **options))
    _randomize(model, seed, block_scale)
    model.to(torch.float32).save_pretrained(out, safe_serialization=True)
    if family not in ("laguna", "deepseek_v4"):  # RoPE per layer type (rope_parameters), a top-level theta would blur
        _transformers4_keys(out / "config.json", options.get("rope_theta", 1e6), options.get("rope_scaling"),
                            _ARCH.get(family))
    if family == "nemotron_h":  # published Nemotron-H configs carry both; transformers 5 saves layers_block_type only
        cfg = json.loads((out / "config.json").read_text())
        built = family_config(family, **options)
        cfg.update(num_hidden_layers=built["num_hidden_layers"],
                   hybrid_override_pattern=built["hybrid_override_pattern"])
        (out / "config.json").write_text(json.dumps(cfg, indent=2))
    if family == "kimi_k25":
        _kimi_k25_as_published(out)
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": [2, 0]}))
    if tokenizer:
        make_tokenizer(out)
        if family.startswith("qwen3"):
            _set_chat_template(out, QWEN3_TEMPLATE)
    return out


def _kimi_k25_as_published(out: Path) -> None:
    """transformers 5.25 saves Kimi-K2.5 by reversing its load-time renames, and its vision rename blocks -> layers
    reverses onto the text model too (`language_model.model.blocks.N`); the published checkpoints (and TensorRT-LLM's
    loader, which strips `language_model.`) have `language_model.model.layers.N`, which transformers reads back to
    the same model. Their text_config says model_type kimi_k2, which transformers reads as deepseek_v3."""
    from safetensors.torch import load_file, save_file

    weights = load_file(str(out / "model.safetensors"))
    renamed = {k.replace("language_model.model.blocks.", "language_model.model.layers."): v for k, v in weights.items()}
    save_file(renamed, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((out / "config.json").read_text())
    cfg["text_config"]["model_type"] = "kimi_k2"
    (out / "config.json").write_text(json.dumps(cfg, indent=2))


def hf_model(target: Path) -> Any:
    """transformers' own model of a target directory, float32, for its greedy `generate`: AutoModelForCausalLM, or
    the image-text-to-text wrapper where the family row names one (Kimi-K2.5; AutoModelForCausalLM does not map it)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from engines.api import text_model_of

    cls = AutoModelForCausalLM if text_model_of(target) is None else AutoModelForImageTextToText
    return cls.from_pretrained(str(target), dtype=torch.float32)


def _set_chat_template(out: Path, template: str) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out))
    tok.chat_template = template
    tok.save_pretrained(out)


def _transformers4_keys(path: Path, theta: float, scaling: dict | None, arch: str | None = None) -> None:
    """transformers 5 saves rope_parameters only; published checkpoints (and TensorRT-LLM's transformers 4) carry
    rope_theta / rope_scaling at the top level: write both, as a checkpoint converted back would. `arch`: the
    architecture name the published checkpoints (and TensorRT-LLM's registration) spell differently."""
    cfg = json.loads(path.read_text())
    if arch is not None:
        cfg["architectures"] = [arch]
    text = cfg.get("text_config", cfg)  # Llama 4: the text model's keys are in text_config
    text["rope_theta"] = theta
    if scaling is not None:
        text["rope_scaling"] = dict(scaling)
    path.write_text(json.dumps(cfg, indent=2))


def make_mimic_eagle3_head(out: Path, target_dir: Path) -> Path:
    """An EAGLE-3 head that drafts what a near-bigram target (`block_scale` < 1) says next, so that trees are partly
    accepted (accepted paths, rejections, bonus tokens and the cache roll-back all happen).

    At position t the head sees the target's captured inputs of position t (id 0 = the embedding of x_t) and drafts
    x_{t+2}. For a bigram target B, x_{t+2} = B(B(x_t)): fc passes the id-0 block through, the midlayer's attention
    and MLP outputs are zero, and lm_head row y sums the normalized embeddings of the tokens x with B(B(x)) = y, so
    argmax(lm_head(norm(embed(x)))) = B(B(x)) for most x. B is read from the target itself (transformers, one token
    at position 0). Draft vocabulary = the full vocabulary (d2t = 0)."""
    from safetensors.torch import save_file

    from engines.api import load_causal_lm

    out.mkdir(parents=True, exist_ok=True)
    tcfg = text_config(json.loads((target_dir / "config.json").read_text()))
    model = load_causal_lm(target_dir, dtype=torch.float32)
    vocab, h = int(tcfg["vocab_size"]), int(tcfg["hidden_size"])
    with torch.no_grad():
        ids = torch.arange(vocab)[:, None]
        bigram = model(input_ids=ids).logits[:, -1].argmax(-1)
        emb = model.get_input_embeddings().weight.float()
    two_steps = bigram[bigram]
    unit = emb * torch.rsqrt(emb.pow(2).mean(-1, keepdim=True) + float(tcfg["rms_norm_eps"]))
    lm_head = torch.zeros(vocab, h).index_add_(0, two_steps, unit)
    heads, kv, hd = int(tcfg["num_attention_heads"]), int(tcfg["num_key_value_heads"]), int(tcfg["head_dim"])
    g = torch.Generator().manual_seed(4)
    t = {
        "midlayer.self_attn.q_proj.weight": 0.08 * torch.randn(heads * hd, 2 * h, generator=g),
        "midlayer.self_attn.k_proj.weight": 0.08 * torch.randn(kv * hd, 2 * h, generator=g),
        "midlayer.self_attn.v_proj.weight": 0.08 * torch.randn(kv * hd, 2 * h, generator=g),
        "midlayer.self_attn.o_proj.weight": torch.zeros(h, heads * hd),
        "midlayer.mlp.gate_proj.weight": 0.08 * torch.randn(INTER, h, generator=g),
        "midlayer.mlp.up_proj.weight": 0.08 * torch.randn(INTER, h, generator=g),
        "midlayer.mlp.down_proj.weight": torch.zeros(h, INTER),
        "midlayer.input_layernorm.weight": torch.ones(h), "midlayer.hidden_norm.weight": torch.ones(h),
        "midlayer.post_attention_layernorm.weight": torch.ones(h), "norm.weight": torch.ones(h),
        "fc.weight": torch.cat([torch.eye(h), torch.zeros(h, 2 * h)], 1),
        "lm_head.weight": lm_head, "d2t": torch.zeros(vocab, dtype=torch.long),
        "t2d": torch.ones(vocab, dtype=torch.bool),
    }
    save_file(t, str(out / "model.safetensors"), metadata={"format": "pt"})
    keep = ("vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act",
            "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling", "bos_token_id", "eos_token_id")
    cfg = {k: tcfg[k] for k in keep if k in tcfg}
    cfg.update(architectures=["LlamaForCausalLMEagle3"], model_type="llama", num_hidden_layers=1,
               intermediate_size=INTER, draft_vocab_size=vocab, target_hidden_size=h, tie_word_embeddings=False,
               eagle_aux_hidden_state_layer_ids=[0, 1, int(tcfg["num_hidden_layers"]) - 1], torch_dtype="float32")
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out
