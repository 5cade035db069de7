"""Ledger rows: a quantized target on the current line, ModelOpt's Hugging Face export in `checkpoint/hf_quantized/`
(builders/convert/hf_quant.py), as TensorRT-LLM's PyTorch backend loads it.

- `hf_quant.config`: hf_quant_config.json, which ModelConfig.from_pretrained reads first and treats as authoritative
  (quant_algo, kv_cache_quant_algo, group_size, exclude_modules);
- `hf_quant.inline`: config.json's `quantization_config` (ModelOpt writes it too): read only when there is no
  hf_quant_config.json, compared with the file otherwise (a warning when they differ);
- `hf_quant.tensor`: the tensors per decoder layer (HF names; upstream fuses q/k/v and gate/up at load);
- `published.quantization_config`: the keys of a target's own config.json `quantization_config` (a checkpoint published
  quantized, e.g. DeepSeek-V3's 128x128 FP8 blocks) that ModelConfig.load_hf_quant_config reads, which this builder
  reads the same way to size and check the target (core/quant.py) and hands over unchanged.
Flags (`when`): w_fp8 / w_nvfp4 = FP8 / NVFP4 weights, kv_fp8 = FP8 KV cache, qk_norm = a Qwen3 target (dense or
MoE), dense_mlp = a dense MLP per layer (the native rows), moe = routed experts per layer (Qwen3-MoE, GLM-4.5).
"""

from __future__ import annotations

from ledger.rows import LLMAPI_LAYOUT, Row, Source, rows_of

TRT = "NVIDIA/TensorRT-LLM"
FROM_PRETRAINED = Source(TRT, "tensorrt_llm/_torch/model_config.py",
                         "ModelConfig.from_pretrained (hf_quant_config.json first) / _build_modelopt_quant_config")
INLINE = Source(TRT, "tensorrt_llm/_torch/model_config.py",
                "ModelConfig.from_pretrained (warn_if_inline_diverges; load_hf_quant_config without the file)")
FP8_LINEAR = Source(TRT, "tensorrt_llm/_torch/modules/linear.py",
                    "FP8QDQLinearMethod (load_weight_scales; rescale_fused_weights for q/k/v and gate/up)")
NVFP4_LINEAR = Source(TRT, "tensorrt_llm/_torch/modules/linear.py",
                      "NVFP4LinearMethod (create_weights; load_weight_scales: input_scale / weight_scale_2 shared)")
KV_SCALES = Source(TRT, "tensorrt_llm/_torch/modules/linear.py", "FP8QDQLinearMethod.load_kv_scales (k_scale, v_scale)")
# The Hugging Face parameter names are the model's own, as ModelOpt's export writes them; which upstream mapper fuses
# them (q/k/v -> qkv_proj, gate/up -> gate_up_proj) was not read at a commit (docs/contracts.md, "Not verified").
LLAMA = Source("eagle-deploy", "builders/convert/hf_quant.py", "LINEARS (the HF names ModelOpt's export keeps)")
HF_QUANT = Source(TRT, "tensorrt_llm/_torch/model_config.py",
                  "ModelConfig.load_hf_quant_config (quant_method fp8 / mxfp4 / mxfp8 / nvfp4 / compressed-tensors)")
PRODUCER = Source("eagle-deploy", "builders/convert/hf_quant.py", "export_quantized (ModelOpt export_hf_checkpoint)")

V = LLMAPI_LAYOUT
_LAYER = "model.layers.{i}."
_ATTN = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
_MLP = ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")  # dense rows (flag dense_mlp)
_EXPERTS = tuple(f"mlp.experts.{{e}}.{x}" for x in ("gate_proj", "up_proj", "down_proj"))  # MoE rows (flag moe)
MOE_LOADER = Source(TRT, "tensorrt_llm/_torch/models/checkpoints/hf/qwen2_moe_weight_mapper.py",
                    "Qwen2MoeHfWeightMapper.handle_special_instance_module (gate_proj/up_proj/down_proj -> w1/w3/w2, "
                    "MoE.load_weights; Qwen3MoeHfWeightMapper derives from it)")
MOE_FP8 = Source(TRT, "tensorrt_llm/_torch/modules/fused_moe/quantization.py",
                 "FP8QDQFusedMoEMethod (load_quant_scales, load_activation_scales_fp8_qdq, "
                 "requantize_expert_w3_w1_weight_fp8_qdq, process_weights_after_loading)")
GLM_LOADER = Source(TRT, "tensorrt_llm/_torch/models/modeling_glm.py",
                    "Glm4MoeForCausalLM.load_weights (_load_weights_impl; experts renamed w1/w3/w2, shared_experts a "
                    "GatedMLP with fused gate_up; GLM4Attention: q/k/v biases; DeepseekV3Gate e_score_correction_bias)")
_SHARED = tuple(f"mlp.shared_experts.{x}" for x in ("gate_proj", "up_proj", "down_proj"))
_NOTE_MOE = ("each expert's w1/w3 requantized to its larger weight_scale; one input scale per MoE layer for each GEMM: "
             "the largest of all experts' (the reference engine's mirror does the same)")
_NOTE_FUSED = ("q/k/v and gate/up are fused at load: each part is requantized to the group's largest weight_scale, "
               "the group's largest input_scale is used (the reference engine's copy does the same)")

ROWS: list[Row] = (
    rows_of("hf_quant.config", ("quantization", "quantization.quant_algo"), FROM_PRETRAINED, versions=V,
            type="dict / 'FP8' | 'NVFP4' | null (QuantAlgo)", required=True)
    + rows_of("hf_quant.config", ("quantization.kv_cache_quant_algo",), FROM_PRETRAINED, versions=V,
              type="'FP8' | null (QuantAlgo)")
    + rows_of("hf_quant.config", ("quantization.exclude_modules",), FROM_PRETRAINED, versions=V,
              type="list[str] (module names / fnmatch patterns kept 16-bit)",
              note="ModelOpt lists lm_head and model.embed_tokens")
    + rows_of("hf_quant.config", ("quantization.quantized_layers",), FROM_PRETRAINED, versions=V,
              type="dict (per-layer algorithms; ModelOpt writes {} for a KV-cache-only export)",
              note="read for quant_algo MIXED_PRECISION only (and, quant_algo null with it present, as DeepSeek-V4's "
                   "layer-only config); this builder writes no MIXED_PRECISION export")
    + rows_of("hf_quant.config", ("quantization.group_size",), FROM_PRETRAINED, versions=V, type="int (16 for NVFP4)",
              when=("w_nvfp4",), required=True)
    + rows_of("hf_quant.config", ("producer", "producer.name", "producer.version"), PRODUCER, versions=V,
              type="dict / str (ModelOpt's record)", note="not read by TensorRT-LLM")
    + rows_of("hf_quant.inline", ("quant_method", "quant_algo", "config_groups", "ignore", "kv_cache_scheme",
                                  "producer"), INLINE, versions=V, type="ModelOpt's inline copy",
              note="TensorRT-LLM reads hf_quant_config.json; the inline copy is compared with it")
    + rows_of("hf_quant.tensor", ("model.embed_tokens.weight", "model.norm.weight",
                                  f"{_LAYER}input_layernorm.weight", f"{_LAYER}post_attention_layernorm.weight"),
              LLAMA, versions=V, type="16-bit", required=True)
    + rows_of("hf_quant.tensor", ("lm_head.weight",), LLAMA, versions=V, type="16-bit",
              note="absent with tie_word_embeddings (the embedding is used)")
    + rows_of("hf_quant.tensor", tuple(f"{_LAYER}{m}.weight" for m in _ATTN), LLAMA, versions=V,
              type="float8_e4m3fn (FP8) / uint8, two e2m1 per byte (NVFP4) / 16-bit (excluded)", required=True)
    + rows_of("hf_quant.tensor", tuple(f"{_LAYER}{m}.weight" for m in _MLP), LLAMA, versions=V,
              type="float8_e4m3fn (FP8) / uint8, two e2m1 per byte (NVFP4) / 16-bit (excluded)", required=True,
              when=("dense_mlp",))
    + rows_of("hf_quant.tensor", tuple(f"{_LAYER}{m}.{s}" for m in _ATTN for s in ("weight_scale", "input_scale")),
              FP8_LINEAR, versions=V, type="float32 scalar (FP8) / float8_e4m3fn [out, in/16] weight_scale (NVFP4)",
              required=True, when=("w_quant",), note=_NOTE_FUSED)
    + rows_of("hf_quant.tensor", tuple(f"{_LAYER}{m}.{s}" for m in _MLP for s in ("weight_scale", "input_scale")),
              FP8_LINEAR, versions=V, type="float32 scalar (FP8) / float8_e4m3fn [out, in/16] weight_scale (NVFP4)",
              required=True, when=("w_quant", "dense_mlp"), note=_NOTE_FUSED)
    + rows_of("hf_quant.tensor", tuple(f"{_LAYER}{m}.weight_scale_2" for m in _ATTN + _MLP), NVFP4_LINEAR,
              versions=V, type="float32 scalar (global weight scale, equal across a fused group)", required=True,
              when=("w_nvfp4",))
    + rows_of("hf_quant.tensor", tuple(f"{_LAYER}{m}.weight" for m in _EXPERTS), MOE_LOADER, versions=V,
              type="float8_e4m3fn (FP8) / 16-bit (KV cache only)", required=True, when=("moe",),
              note="a routed expert's linears, one per expert (ModelOpt's export unfuses transformers' 3-D experts)")
    + rows_of("hf_quant.tensor", tuple(f"{_LAYER}{m}.{s}" for m in _EXPERTS for s in ("weight_scale", "input_scale")),
              MOE_FP8, versions=V, type="float32 scalar", required=True, when=("w_quant", "moe"), note=_NOTE_MOE)
    + rows_of("hf_quant.tensor", (f"{_LAYER}mlp.gate.weight",), MOE_LOADER, versions=V, type="16-bit (excluded)",
              required=True, when=("moe",), note="the router: ModelOpt lists it in exclude_modules")
    + rows_of("hf_quant.tensor", tuple(f"{_LAYER}{m}.weight" for m in _SHARED), GLM_LOADER, versions=V,
              type="float8_e4m3fn (FP8) / 16-bit (KV cache only)", note="GLM-4.5's shared experts (fused gate/up)")
    + rows_of("hf_quant.tensor", tuple(f"{_LAYER}{m}.{s}" for m in _SHARED for s in ("weight_scale", "input_scale")),
              FP8_LINEAR, versions=V, type="float32 scalar", note=_NOTE_FUSED)
    + rows_of("hf_quant.tensor", tuple(f"{_LAYER}self_attn.{x}_proj.bias" for x in "qkv")
              + (f"{_LAYER}mlp.gate.e_score_correction_bias",), GLM_LOADER, versions=V, type="16-bit / float32",
              note="GLM-4.5: q/k/v biases (attention_bias), the router's correction bias")
    + rows_of("hf_quant.tensor", (f"{_LAYER}self_attn.k_proj.k_scale", f"{_LAYER}self_attn.v_proj.v_scale"),
              KV_SCALES, versions=V, type="float32 scalar", required=True, when=("kv_fp8",),
              note="loaded (load_kv_scales) but applied to an NVFP4 KV cache only; an FP8 KV cache is scaled by 1.0 "
                   "(TrtllmAttention.kv_cache_scaling_factor), as the reference engine's copy is")
    + rows_of("hf_quant.tensor", (f"{_LAYER}self_attn.q_norm.weight", f"{_LAYER}self_attn.k_norm.weight"),
              LLAMA,
              versions=V, type="16-bit", when=("qk_norm",), required=True)

    + rows_of("published.quantization_config", ("quant_method",), HF_QUANT, versions=V, required=True,
              type="'fp8' | 'mxfp4' | 'mxfp8' | 'nvfp4' | 'compressed-tensors' (else no quant_algo is set)")
    + rows_of("published.quantization_config", ("weight_block_size",), HF_QUANT, versions=V,
              type="[128, 128] for fp8 (asserted; FP8_BLOCK_SCALES, group_size 128), [1, 32] for mxfp8",
              note="fp8 without it needs activation_scheme 'static'; kv_b_proj, k_b_proj, eh_proj are excluded")
    + rows_of("published.quantization_config", ("activation_scheme", "group_size", "config_groups"), HF_QUANT,
              versions=V, type="'static' | 'dynamic' / int (16 for nvfp4) / compressed-tensors groups")
    + rows_of("published.quantization_config", ("modules_to_not_convert", "ignored_layers", "ignore"), HF_QUANT,
              versions=V, type="list[str] (merged into exclude_modules: kept 16-bit)")
)
