"""The target families the reference engine runs natively, and how each differs from Llama (torch-free).

The numerics follow transformers' modeling files of each family (models/<family>/modeling_<family>.py):
- LlamaForCausalLM: the base (engines/model.py);
- MistralForCausalLM: Llama's computation; `sliding_window` masks keys more than the window behind the query, which
  the engine does not do, so it refuses sequences longer than the window (engines/runtime.py `check_window`);
- Qwen2ForCausalLM (Qwen2 / Qwen2.5): q/k/v projections with biases, o_proj without; `use_sliding_window` true is
  refused (the published configs ship it false);
- Qwen3ForCausalLM: per-head RMSNorm of q and k over head_dim (weights of head_dim, shared by the heads) after the
  projections and before RoPE; head_dim is a config key of its own (not hidden_size / heads).

FAMILIES is the one table of target architectures (every row cited to the upstream registration it was read at);
NATIVE, QKV_BIAS, QK_NORM and SLIDING_WINDOW are derived from it. The converter (builders/convert/families.py) writes
the checkpoint keys `family_keys` returns; the engine reads them back with `traits`. builders/trtllm/architectures.py
adds the per-version columns (registry) and the preflight; core/shapes.py sizes each row's weights and caches.
Also here, torch-free for the builders: the published EAGLE-3 head config layout (`eagle3_head_config`) and what the
generic path (engines/generic.py) computes exactly (`check_generic`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROPE_TYPES = ("default", "linear", "llama3", "yarn")  # the RoPE scalings the engine's native forward computes

# ---- the family table: the one place a target architecture is declared ------------------------------------------

TRT = "NVIDIA/TensorRT-LLM"
ONE, TWO = "one-model", "two-model"
DENSE, MLA, LINEAR, MAMBA = "dense", "mla", "hybrid-linear", "hybrid-mamba"  # attention kinds (core/shapes.py)
COMPRESSED = "compressed"  # DeepSeek-V4: sliding-window K=V plus compressed entries (CSA / HCA), hc_mult streams
# Kinds whose per-sequence state is not a slot KV cache the engine compacts: the reference engine verifies only chain
# drafts for them (engines/recurrent.py, engines/compressed.py); the reason names what reads the tokens in order.
CHAIN_ONLY = {LINEAR: "recurrent layers read a forward's tokens in order",
              MAMBA: "recurrent layers read a forward's tokens in order",
              COMPRESSED: "compressed attention pools a forward's tokens in order into its compressed entries"}


@dataclass(frozen=True)
class Family:
    """One target architecture: what it is, what upstream TensorRT-LLM registers for it, and what this toolkit does
    with it. Everything else (NATIVE and the traits below, the architecture table and its preflight, docs tables, the
    tests' family matrix, capacity sizing by `attention`) is derived from these rows."""

    name: str  # config.json architectures[0], as TensorRT-LLM's @register_auto_model names it
    label: str  # what users call it
    model_type: str  # config.json model_type (transformers' AutoConfig key)
    attention: str  # DENSE | MLA | LINEAR | MAMBA | COMPRESSED: how core/shapes.py sizes weights, KV cache, state
    moe: bool  # routed experts (core/shapes.py counts every expert, shared experts and the router)
    eagle3: str  # ONE | TWO: how TensorRT-LLM's PyTorch backend runs EAGLE-3 with it
    path: str  # upstream modeling file (repo TRT)
    symbol: str  # the registration read there
    read: str  # the commit(s) the registration was read at
    reference: str | None  # "native" | "generic" | None: how the reference engine runs it
    trainer: bool  # training/train_head.py trains EAGLE-3 heads from its features
    engine_flow: bool = False  # EAGLE-1/2 engine flow (EagleForCausalLM subclasses LLaMAForCausalLM)
    qkv_bias: bool = False  # native forward: q/k/v biases without an o_proj bias
    qk_norm: bool = False  # native forward: per-head q/k RMSNorm before RoPE
    sliding: str = "never"  # native forward: "never" | "switch" (use_sliding_window turns it on) | "always"
    note: str = ""  # what differs (docs); for reference None: why the reference engine cannot run it
    versions: tuple[str, ...] | None = None  # trtllm_version keys it is claimed for (None: every version whose
    # PyTorch backend runs EAGLE-3, as established for the first rows); rows read on main only claim the current line
    text_model: str | None = None  # transformers' class is an image-text-to-text wrapper (AutoModelForCausalLM does
    # not map its model_type): its text model is `model.<text_model>` (engines/text_model.py loads that one)


CURRENT = ("1.4",)  # rows read on main: claimed for the current line only; earlier releases were not opened for them


def _spec(cls: str, base: str = "SpecDecOneEngineForCausalLM") -> str:
    return f"@register_auto_model('{cls}') class {cls}({base})"


FAMILIES: tuple[Family, ...] = (
    Family("LlamaForCausalLM", "Llama 2 / 3.x, SmolLM2, Vicuna", "llama", DENSE, False, ONE,
           "tensorrt_llm/_torch/models/modeling_llama.py", _spec("LlamaForCausalLM"),
           "commit 3a5901cd0d77bed18baaf402d1d12fab468d44a9", "native", True, engine_flow=True,
           note="HF checkpoint read directly by the PyTorch backend"),
    Family("Qwen3ForCausalLM", "Qwen3 dense", "qwen3", DENSE, False, ONE,
           "tensorrt_llm/_torch/models/modeling_qwen3.py", _spec("Qwen3ForCausalLM"),
           "commit 5dedf53b14d94f0b53c1bff0e560af11dc3eaf5d", "native", True, qk_norm=True, sliding="switch",
           note="per-head q/k RMSNorm; head_dim independent of hidden_size / heads"),
    Family("Qwen2ForCausalLM", "Qwen2 / Qwen2.5", "qwen2", DENSE, False, TWO,
           "tensorrt_llm/_torch/models/modeling_qwen.py",
           "@register_auto_model('Qwen2ForCausalLM') class Qwen2ForCausalLM(DecoderModelForCausalLM); "
           "QwenDecoderLayer.forward: spec_metadata.maybe_capture_hidden_states",
           "commits 047098b74c51f488abcfcd72f7d4a988a56442f6 (a transformers-5 era file), "
           "87b279a9719cc257bb89d19ea794296857e2f83f", "native", True, qkv_bias=True, sliding="switch",
           note="q/k/v biases; a config with use_sliding_window true is refused"),
    Family("MistralForCausalLM", "Mistral", "mistral", DENSE, False, TWO,
           "tensorrt_llm/_torch/models/modeling_mistral.py",
           "@register_auto_model('MistralForCausalLM') class MistralForCausalLM(DecoderModelForCausalLM); "
           "MistralDecoderLayer.forward: spec_metadata.maybe_capture_hidden_states",
           "commits 002f3cc3d0554c4ebd530d1354f96e89666d93b8, 0dcfa87b9636e749e3656c1e1e6ee61e4d090a5f",
           "native", True, sliding="always",
           note="Llama-shaped; contexts beyond a configured sliding_window are refused"),
    Family("Qwen3MoeForCausalLM", "Qwen3 MoE (30B-A3B, 235B-A22B)", "qwen3_moe", DENSE, True, ONE,
           "tensorrt_llm/_torch/models/modeling_qwen3_moe.py", _spec("Qwen3MoeForCausalLM"),
           "commit a678b91aafbeff265cd0b764abb59d7def624ac2", "generic", True,
           note="mixture of experts; reference engine: transformers' own model class"),
    Family("GptOssForCausalLM", "gpt-oss", "gpt_oss", DENSE, True, ONE,
           "tensorrt_llm/_torch/models/modeling_gpt_oss.py", _spec("GptOssForCausalLM"),
           "commit 7924c7f1d3b4a3286b62c13fc890900295dc39cb", "generic", True,
           note="mixture of experts, attention sinks, sliding-window layers (reference engine: sequences up to the "
                "window)"),
    Family("DeepseekV3ForCausalLM", "DeepSeek-V3 / R1 (and checkpoints of the same architecture)", "deepseek_v3",
           MLA, True, ONE,
           "tensorrt_llm/_torch/models/modeling_deepseekv3.py", _spec("DeepseekV3ForCausalLM"),
           "commit 000561df0bd751d793257102bbe59cb4a64b2fd5", "generic", True,
           note="multi-head latent attention (KV cache: kv_lora_rank + qk_rope_head_dim per layer per token), "
                "routed + shared experts after first_k_dense_replace dense layers; the checkpoint's MTP layers "
                "(num_nextn_predict_layers) are not decoder layers",
           versions=CURRENT),
    Family("DeepseekV32ForCausalLM", "DeepSeek-V3.2", "deepseek_v32", MLA, True, ONE,
           "tensorrt_llm/_torch/models/modeling_deepseekv3.py",
           "@register_auto_model('DeepseekV32ForCausalLM') @register_auto_model('DeepseekV3ForCausalLM') "
           "class DeepseekV3ForCausalLM(SpecDecOneEngineForCausalLM[DeepseekV3Model, PretrainedConfig])",
           "commit a43cf9e363d5657061b5ce0e12f3d993a08d8158", "generic", True,
           note="DeepSeek-V3's MLA and experts with the sparse-attention indexer (DSA: each query attends to the "
                "index_topk keys its indexer scores highest; KV cache: the MLA latents + index_head_dim indexer keys "
                "per layer per token)",
           versions=CURRENT),
    Family("Glm4MoeForCausalLM", "GLM-4.5 / 4.6", "glm4_moe", DENSE, True, ONE,
           "tensorrt_llm/_torch/models/modeling_glm.py", _spec("Glm4MoeForCausalLM"),
           "commit 0406f8aa75104e96d80105563defd26ea0d9009a", "generic", True,
           note="GQA with partial RoPE, routed + shared experts after first_k_dense_replace dense layers",
           versions=CURRENT),
    Family("Qwen3NextForCausalLM", "Qwen3-Next", "qwen3_next", LINEAR, True, ONE,
           "tensorrt_llm/_torch/models/modeling_qwen3_next.py", _spec("Qwen3NextForCausalLM"),
           "commit 00022b040996780da248347927318fecb55ae7e9", "generic", True,
           note="gated delta-net (linear attention) layers keep a recurrent state, not a KV cache; the reference "
                "engine keeps each token's state of a verification and keeps the accepted one, which needs chain "
                "drafts (tree.choices chain-N)",
           versions=CURRENT),
    Family("Qwen3_5ForCausalLM", "Qwen3.5 dense", "qwen3_5_text", LINEAR, False, ONE,
           "tensorrt_llm/_torch/models/modeling_qwen3_5.py",
           _spec("Qwen3_5ForCausalLM", "Qwen3NextForCausalLM") + " (Qwen3NextForCausalLM is a "
           "SpecDecOneEngineForCausalLM)", "commit 00620eb025e7c24895986e1042380bd1be4426d9", "generic", True,
           note="Qwen3-Next's hybrid layers with a dense MLP; on the reference engine with chain drafts",
           versions=CURRENT),
    Family("Qwen3_5MoeForCausalLM", "Qwen3.5 MoE", "qwen3_5_moe_text", LINEAR, True, ONE,
           "tensorrt_llm/_torch/models/modeling_qwen3_5.py",
           _spec("Qwen3_5MoeForCausalLM", "Qwen3NextForCausalLM") + " (Qwen3NextForCausalLM is a "
           "SpecDecOneEngineForCausalLM)", "commit 00620eb025e7c24895986e1042380bd1be4426d9", "generic", True,
           note="Qwen3-Next's hybrid layers and experts; on the reference engine with chain drafts",
           versions=CURRENT),
    Family("NemotronHForCausalLM", "Nemotron-H", "nemotron_h", MAMBA, False, ONE,
           "tensorrt_llm/_torch/models/modeling_nemotron_h.py", _spec("NemotronHForCausalLM"),
           "commit 00620eb025e7c24895986e1042380bd1be4426d9", "generic", True,
           note="Mamba-2 layers (hybrid_override_pattern) keep a recurrent state, not a KV cache; the reference "
                "engine keeps each token's state of a verification and keeps the accepted one, which needs chain "
                "drafts (tree.choices chain-N)",
           versions=CURRENT),
    Family("SeedOssForCausalLM", "Seed-OSS", "seed_oss", DENSE, False, ONE,
           "tensorrt_llm/_torch/models/modeling_seedoss.py", _spec("SeedOssForCausalLM"),
           "commit 22de8b34df71bb6653612c1f3de00c7288482eb4", "generic", True,
           note="Llama-shaped with q/k/v biases (an o_proj bias where attention_out_bias is set)",
           versions=CURRENT),
    Family("ApertusForCausalLM", "Apertus", "apertus", DENSE, False, ONE,
           "tensorrt_llm/_torch/models/modeling_apertus.py", _spec("ApertusForCausalLM"),
           "commit 373783016c99f0d5c6740416511413050aba063b", "generic", True,
           note="xIELU MLP without a gate, q/k norms",
           versions=CURRENT),
    Family("Llama4ForConditionalGeneration", "Llama 4 (Scout, Maverick)", "llama4", DENSE, True, ONE,
           "tensorrt_llm/_torch/models/modeling_llama.py",
           "@register_auto_model('Llama4ForConditionalGeneration') class Llama4ForConditionalGeneration("
           "SpecDecOneEngineForCausalLM[Llama4Model, Llama4Config]) (the text model of config.json's text_config)",
           "commit 3a5901cd0d77bed18baaf402d1d12fab468d44a9", "generic", True,
           note="text model in text_config; routed experts + a shared expert every interleave_moe_layer_step layers; "
                "RoPE layers with a weightless q/k norm and chunked attention, NoPE layers (no_rope_layers) with "
                "attention temperature tuning by position; reference engine: sequences up to attention_chunk_size "
                "(upstream also drops the chunking for speculative decoding before Blackwell and on non-TRTLLM "
                "attention backends)",
           versions=CURRENT),
    Family("LagunaForCausalLM", "Laguna", "laguna", DENSE, True, ONE,
           "tensorrt_llm/_torch/models/modeling_laguna.py",
           "@register_auto_model('LagunaForCausalLM') class LagunaForCausalLM("
           "SpecDecOneEngineForCausalLM[LagunaModel, PretrainedConfig])",
           "commit 01dcc21a28bd9b95e15ebc1aa56b60bca128123c", "generic", True,
           note="GQA with a per-layer head count (num_attention_heads_per_layer), q/k norms and a softplus output "
                "gate per head (g_proj), sliding-window layers (reference engine: sequences up to the window) with "
                "their own RoPE, sigmoid-routed experts + a shared expert after dense layers (mlp_layer_types)",
           versions=CURRENT),
    Family("GlmMoeDsaForCausalLM", "GLM-5", "glm_moe_dsa", MLA, True, ONE,
           "tensorrt_llm/_torch/models/modeling_deepseekv3.py",
           "@register_auto_model('GlmMoeDsaForCausalLM') @register_auto_model('DeepseekV32ForCausalLM') "
           "@register_auto_model('DeepseekV3ForCausalLM') class DeepseekV3ForCausalLM(SpecDecOneEngineForCausalLM"
           "[DeepseekV3Model, PretrainedConfig]) (its __init__ reads model_type glm_moe_dsa as deepseek_v32; "
           "DeepseekV3DecoderLayer.forward: spec_metadata.maybe_capture_hidden_states)",
           "commit 5d5bb2cb3914279edd289a25d787e05ad637073a of michaelfeil/TensorRT-LLM, a fork of "
           "NVIDIA/TensorRT-LLM (the decorators); NVIDIA/TensorRT-LLM commit "
           "065ff9e93780bc0bdbfdbc7156a306ca14f5850c, tensorrt_llm/_torch/models/_arch_index.py: "
           "MODEL_ARCH_TO_MODULE['GlmMoeDsaForCausalLM'] = 'modeling_deepseekv3', whose one public class is "
           "DeepseekV3ForCausalLM (a table that, its docstring says, test_lazy_model_zoo.py checks against the "
           "decorators)",
           "generic", True,
           note="DeepSeek-V3.2's MLA, experts and sparse-attention indexer, where indexer_types 'shared' layers "
                "reuse the previous 'full' layer's selection and have no indexer of their own (KV cache: the MLA "
                "latents per layer + index_head_dim indexer keys per 'full' layer per token)",
           versions=CURRENT),
    Family("KimiK25ForConditionalGeneration", "Kimi-K2.5", "kimi_k25", MLA, True, ONE,
           "tensorrt_llm/_torch/models/modeling_kimi_k25.py",
           "@register_auto_model('KimiK25ForConditionalGeneration') class KimiK25ForConditionalGeneration("
           "PreTrainedModel): self.llm = DeepseekV3ForCausalLM(text_model_config) (a SpecDecOneEngineForCausalLM, "
           "built from config.text_config), draft_config / draft_model / load_draft_weights forwarded to it, "
           "forward ends in self.llm.forward(attn_metadata, input_ids, ..., **kwargs); a MoonViT3d vision encoder "
           "(KimiK25VisionModel) + PatchMergerMLP projector beside it",
           "commit 010373d3b4e9165d22f253d981df48484877336f", "generic", True,
           note="DeepSeek-V3's MLA and experts as the text model in text_config (text_config.model_type kimi_k2), a "
                "MoonViT3d vision encoder and patch-merger projector beside it (sized, not run: the reference engine "
                "loads the wrapper and serves its text model on token ids)",
           versions=CURRENT, text_model="language_model"),
    Family("DeepseekV4ForCausalLM", "DeepSeek-V4 (Flash, Pro)", "deepseek_v4", COMPRESSED, True, ONE,
           "tensorrt_llm/_torch/models/modeling_deepseekv4.py",
           "@register_auto_model('DeepseekV4ForCausalLM') class DeepseekV4ForCausalLM("
           "SpecDecOneEngineForCausalLM[DeepseekV4Model, PretrainedConfig]); EAGLE-3 features: "
           "DeepseekV4DecoderLayer.forward_MoE spec_metadata.maybe_capture_hidden_states(layer_idx, <the MoE "
           "output>) (the block's output before hc_ffn.post_mapping, hidden_size wide)",
           "commit 02586bf0b0f59d29967bf4aa27d5714a0b4788f6", "generic", True,
           note="the residual is hc_mult streams (manifold hyper-connections; an HC head collapses them before the "
                "final norm); every layer attends to a sliding window of shared K=V plus compressed entries "
                "(compressed sparse attention with a lightning indexer every compress rate tokens, heavily "
                "compressed attention); hash-routed then top-k routed experts + a shared expert; EAGLE-3 features "
                "are the MoE outputs; reference engine: chain drafts (tree.choices chain-N), sequences up to the "
                "window, no Engram",
           versions=CURRENT),
)

BY_NAME = {f.name: f for f in FAMILIES}
NATIVE = tuple(sorted(f.name for f in FAMILIES if f.reference == "native"))
QKV_BIAS = frozenset(f.name for f in FAMILIES if f.qkv_bias)
QK_NORM = frozenset(f.name for f in FAMILIES if f.qk_norm)
SLIDING_WINDOW = frozenset(f.name for f in FAMILIES if f.sliding == "switch")  # `use_sliding_window` switches it on


def family_of(architecture: str | None) -> Family | None:
    return BY_NAME.get(architecture or "")


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The text model's keys of a config.json: a multimodal checkpoint (Llama 4's Llama4ForConditionalGeneration)
    nests them in `text_config`, which TensorRT-LLM's registration and transformers' causal LM both read; its
    `architectures` and `model_type` stay the checkpoint's."""
    text = cfg.get("text_config")
    if not isinstance(text, dict):
        return cfg
    return {**text, "architectures": cfg.get("architectures"), "model_type": cfg.get("model_type")}


@dataclass(frozen=True)
class Traits:
    """What a checkpoint's target computes beyond Llama (read from its config.json)."""

    qkv_bias: bool = False  # q/k/v biases without an o_proj bias
    qk_norm: bool = False  # per-head q/k RMSNorm before RoPE
    sliding_window: int | None = None  # keys beyond this distance are masked upstream: longer contexts are refused


def family_keys(architecture: str, hf_config: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint config.json keys of a target (written by the converter)."""
    window = hf_config.get("sliding_window")
    if architecture in SLIDING_WINDOW and not hf_config.get("use_sliding_window"):
        window = None  # transformers: sliding_window applies only when use_sliding_window is true
    row = BY_NAME.get(architecture)
    if row is None or row.sliding == "never":
        window = None
    return {"qkv_bias": architecture in QKV_BIAS, "qk_norm": architecture in QK_NORM,
            "sliding_window": None if window is None else int(window)}


def traits(ckpt_config: dict[str, Any]) -> Traits:
    """A checkpoint's traits; a Llama checkpoint written before these keys existed has none of them."""
    window = ckpt_config.get("sliding_window")
    return Traits(bool(ckpt_config.get("qkv_bias", False)), bool(ckpt_config.get("qk_norm", False)),
                  None if window is None else int(window))


# Keys of a target's config that describe its own stack, not a one-layer EAGLE-3 head: a head config that copied
# them (trainers start from the target's config) fails to load, e.g. a Qwen3 target's `layer_types` has one entry per
# target layer and transformers refuses a 1-layer config with 36 of them ("num_hidden_layers (1) must be equal to the
# number of layer types").
_TARGET_ONLY = ("layer_types", "max_window_layers", "moe_intermediate_size", "num_experts", "num_experts_per_tok",
                "num_local_experts", "experts_per_token", "swiglu_limit", "decoder_sparse_step", "norm_topk_prob",
                "mlp_only_layers", "output_router_logits", "router_aux_loss_coef", "qkv_bias", "qk_norm",
                # MLA, routed / shared experts, MTP layers, partial RoPE and hybrid layers of the newer families: a
                # head is one Llama layer whatever its target (e.g. partial_rotary_factor would change its RoPE)
                "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "rope_interleave",
                "n_routed_experts", "n_shared_experts", "num_shared_experts", "first_k_dense_replace", "n_group",
                "topk_group", "topk_method", "routed_scaling_factor", "scoring_func", "moe_layer_freq", "ep_size",
                "num_nextn_predict_layers", "mlp_layer_types", "partial_rotary_factor", "use_qk_norm",
                "attention_out_bias", "sliding_window_pattern", "shared_expert_intermediate_size",
                "full_attention_interval", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                "linear_value_head_dim", "linear_conv_kernel_dim", "hybrid_override_pattern", "layers_block_type",
                "mamba_num_heads", "mamba_head_dim", "n_groups", "ssm_state_size", "conv_kernel", "mlp_hidden_act",
                # Llama 4: interleaved experts, NoPE layers, chunked attention, attention temperature tuning
                "intermediate_size_mlp", "interleave_moe_layer_step", "moe_layers", "no_rope_layers",
                "no_rope_layer_interval", "attention_chunk_size", "attn_temperature_tuning", "floor_scale",
                "attn_scale", "router_jitter_noise",
                # DeepSeek-V3.2 / GLM-5 sparse attention
                "index_topk", "index_head_dim", "index_n_heads", "indexer_types",
                # Laguna: per-layer query heads, attention output gates, its router's options
                "num_attention_heads_per_layer", "gating", "moe_routed_scaling_factor",
                "moe_apply_router_weight_on_input", "moe_router_logit_softcapping",
                # DeepSeek-V4: hyper-connection streams, compressed attention and its indexer, grouped output
                # projection, hash routing, the legacy spellings of its compression schedule
                "hc_mult", "hc_sinkhorn_iters", "hc_eps", "compress_rates", "compress_ratios", "compress_rate_csa",
                "compress_rate_hca", "compress_rope_theta", "o_groups", "o_lora_rank", "num_hash_layers",
                "n_hash_layers", "has_engram", "expert_dtype")


def eagle3_head_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """An EAGLE-3 head's config.json in the layout the heads people publish for any target use (SpecForge
    configs/qwen3-4b-eagle3.json, configs/qwen3-30B-A3B-eagle3.1.json: `model_type: llama`,
    `architectures: [LlamaForCausalLMEagle3]`, the target's head_dim kept): Llama keys only, no sliding window,
    SwiGLU."""
    out = {k: v for k, v in cfg.items() if k not in _TARGET_ONLY}
    out["model_type"] = "llama"
    out["hidden_act"] = "silu"  # the head's MLP is SwiGLU whatever the target's (training/model.py, engines/model.py)
    if "use_sliding_window" in out or "sliding_window" in out:
        out.update(use_sliding_window=False, sliding_window=None)
    rope = out.get("rope_parameters")
    if cfg.get("model_type") == "deepseek_v4":  # transformers' attribute_map: intermediate_size is the experts' width
        out.setdefault("intermediate_size", cfg.get("moe_intermediate_size"))
        # the head takes the sliding-only layers' plain RoPE (rope_theta, no scaling): a published config's
        # rope_scaling (YaRN) applies to the compressed layers only (transformers' DeepseekV4Config.__post_init__,
        # TensorRT-LLM's _deepseek_v4_pos_embd_params at 02586bf0), at compress_rope_theta
        main = rope.get("main") if isinstance(rope, dict) else None
        theta = main.get("rope_theta") if isinstance(main, dict) else cfg.get("rope_theta", 10000.0)
        out.pop("rope_scaling", None)
        out["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
        out["rope_theta"] = theta
        rope = None
    if isinstance(rope, dict) and isinstance(rope.get("full_attention"), dict):
        # RoPE per layer type (Laguna): the head is one full-attention layer (their base and scaling, e.g. YaRN),
        # rotating its whole head_dim
        out["rope_parameters"] = {k: v for k, v in rope["full_attention"].items() if k != "partial_rotary_factor"}
        if "rope_theta" in out:
            out["rope_theta"] = out["rope_parameters"].get("rope_theta", out["rope_theta"])
    return out


def feature_source(model_type: str | None, j: int) -> tuple[str, int]:
    """Where EAGLE-3 feature id j (TensorRT-LLM's captured layer j - 1) is read: ("input", j), the input of decoder
    layer j (id 0: the embeddings), for every family but DeepSeek-V4, whose layers carry hc_mult residual streams
    and whose upstream capture is a layer's MoE output, the block's output before hc_ffn's post-mapping
    (DeepseekV4DecoderLayer.forward_MoE, modeling_deepseekv4.py at 02586bf0): ("mlp", j - 1), and ("embed", 0) for
    id 0 (the streams' common start). The reference engine (engines/compressed.py) and the trainer's features
    (training/features.py) read the same."""
    if model_type == "deepseek_v4":
        return ("embed", 0) if j == 0 else ("mlp", j - 1)
    return "input", j


# ---- the generic path (engines/generic.py): what transformers' own model class computes exactly ----------------


class GenericTargetError(ValueError):
    """A model the generic path cannot run exactly; the message says why and what to do."""


def sliding_window_of(hf_config: dict[str, Any]) -> int | None:
    """The window of a config whose layers (some or all) attend to a sliding window, else None."""
    hf_config = text_config(hf_config)
    window = hf_config.get("sliding_window")
    if window is None or hf_config.get("use_sliding_window") is False:
        return None
    layer_types = hf_config.get("layer_types")
    if hf_config.get("model_type") == "deepseek_v4":  # every DeepSeek-V4 layer attends to its window (+ compressed)
        return int(window)
    if layer_types is not None and "sliding_attention" not in layer_types:
        return None
    return int(window)


def chunk_of(hf_config: dict[str, Any]) -> int | None:
    """Llama 4's attention_chunk_size where some layers attend within chunks of it (layer_types chunked_attention;
    transformers' Llama4TextConfig names the RoPE layers so when the key is set), else None."""
    cfg = text_config(hf_config)
    chunk = cfg.get("attention_chunk_size")
    if chunk is None:
        return None
    types = cfg.get("layer_types")
    if types is not None and "chunked_attention" not in types:
        return None
    if types is None and not any(cfg.get("no_rope_layers") or [1]):
        return None
    return int(chunk)


def attention_window_of(hf_config: dict[str, Any]) -> tuple[str, int] | None:
    """The config key and length of the narrowest local attention (sliding window or attention chunk): the
    generic path computes sequences up to it exactly and refuses longer ones."""
    found = [(k, w) for k, w in (("sliding_window", sliding_window_of(hf_config)),
                                 ("attention_chunk_size", chunk_of(hf_config))) if w is not None]
    return min(found, key=lambda kw: kw[1]) if found else None


def check_generic(hf_config: dict[str, Any], where: Path, max_seq_len: int | None) -> None:
    """Refuse what the generic path would compute wrongly. transformers returns the engine's 4D mask as is for
    sliding-window and chunked-attention layers too, so they attend to every earlier key: exact while no sequence
    is longer than the window or chunk (the local mask then equals the causal one), wrong beyond it (None: checked
    per request instead)."""
    hf_config = text_config(hf_config)
    chunk = chunk_of(hf_config)
    if chunk is not None and max_seq_len is not None and max_seq_len > chunk:
        raise GenericTargetError(
            f"{where}: attention_chunk_size={chunk} but sequences may reach {max_seq_len} tokens; the generic path "
            "gives chunked-attention layers the engine's own tree mask, which sees every earlier key (not only the "
            f"query's chunk), so tokens beyond the first chunk would be computed wrongly. Set engine.max_seq_len <= "
            f"{chunk}")
    window = sliding_window_of(hf_config)
    if window is not None and max_seq_len is not None and max_seq_len > window:
        raise GenericTargetError(
            f"{where}: sliding_window={window} but sequences may reach {max_seq_len} tokens; the generic path gives "
            "sliding-window layers the engine's own tree mask, which sees every earlier key, so tokens beyond the "
            f"window would be computed wrongly. Set engine.max_seq_len <= {window}")
    row = family_of((hf_config.get("architectures") or [None])[0])
    if row is not None and row.reference is None:
        raise GenericTargetError(f"{where}: {row.name}: {row.note}")
    kind = hf_config.get("model_type")
    if row is not None and kind is not None and kind != row.model_type:
        raise GenericTargetError(
            f"{where}: {row.name} with model_type {kind!r}: the generic path runs transformers' own class of "
            f"model_type {row.model_type!r} (the row's); a checkpoint of another model_type (e.g. Kimi-K2's "
            "'kimi_k2', which ships its own modeling code through auto_map) is not what that class computes, and "
            "the reference engine runs no checkpoint code. Use engine.backend pytorch for it")
    if row is not None and row.model_type == "laguna" and hf_config.get("attention_bias"):
        raise GenericTargetError(
            f"{where}: LagunaForCausalLM with attention_bias true: transformers then gives o_proj a bias, "
            "TensorRT-LLM's LagunaAttention builds o_proj without one (dense_bias=False, modeling_laguna.py at "
            "01dcc21a), so the reference engine would not compute what the served model does")
    if row is not None and row.attention == COMPRESSED and hf_config.get("has_engram"):
        raise GenericTargetError(
            f"{where}: {row.name} with has_engram true: TensorRT-LLM adds Engram n-gram embeddings to the residual "
            "at the layers engram_layer_ids names (modeling_deepseekv4.py at 02586bf0, DeepseekV4DecoderLayer."
            "_entry_boundary), which transformers' DeepseekV4ForCausalLM does not compute, so the reference engine "
            "would not compute what the served model does. Use engine.backend pytorch for it")
    recurrent = row is not None and row.attention in (LINEAR, MAMBA)
    compressed = ("compressed_sparse_attention", "heavily_compressed_attention")
    kinds = ("full_attention", "sliding_attention", "chunked_attention", "indexed_attention",
             *(("linear_attention",) if recurrent else ()),
             *(compressed if row is not None and row.attention == COMPRESSED else ()))
    other = sorted({t for t in hf_config.get("layer_types") or () if t not in kinds})
    if other:
        raise GenericTargetError(f"{where}: layer_types {other}: only attention layers that take the engine's 4D "
                                 "mask (full_attention, sliding_attention) can run on the generic path")
