"""What TensorRT-LLM's PyTorch backend does with each family row (core/families.py), read from its code path, with
the upstream line each fact was read at (torch-free). docs/contracts.md and docs/bring-your-own-model.md render these
columns (ledger/docs.py); builders/trtllm/rules.py refuses what the tree column rules out.

- capture: where the row's decoder writes EAGLE-3's features (its model's forward hands spec_metadata to the layers
  and a layer calls spec_metadata.maybe_capture_hidden_states). "" = not read in the code path at a pinned commit:
  the row was admitted on its registration (a SpecDecOneEngineForCausalLM); `unverified_capture()` lists them.
- trees: the draft trees served. Dynamic trees are not served for sliding-window or MLA attention (TREES_DOC);
  compressed (DeepSeek-V4) and recurrent (gated delta-net, Mamba-2) layers read a forward's tokens in order, as the
  reference engine does (core/families.py CHAIN_ONLY), so chains only there too. `dynamic_tree_max_topK: 1` is a chain:
  upstream routes it to the linear path (TOPK1).
- KV layout per rank: KVCacheManager.get_cache_size_per_token (KV_RULE), DSA's (DSA_RULE).
- NVIDIA's support matrix (SUPPORT_MATRIX): its EAGLE-3 one-model cell, beside the code-path status.
"""

from __future__ import annotations

from typing import Any

from core.families import COMPRESSED, LINEAR, MAMBA, MLA, Family, sliding_window_of

TRT = "NVIDIA/TensorRT-LLM"
TREES_DOC = (f"{TRT} commit 04c8822cc42ffd1f5b6270874e5b9a64a20e7a58 (PR #13081), docs/source/features/"
             "speculative-decoding.md, 'Dynamic Tree Mode': not supported for models that use sliding window "
             "attention or MLA")
TOPK1 = (f"{TRT} PR #15842 (commit edf63e8185), tensorrt_llm/_torch/speculative/utils.py _is_effective_dynamic_tree: "
         "dynamic_tree_max_topK 1 is routed to the linear EAGLE-3 one-model path")
KV_RULE = (f"{TRT} commit d2a5560abdadfbdf496ce057696103e0509a71ed, tensorrt_llm/_torch/pyexecutor/resource_manager.py "
           "KVCacheManager.get_cache_size_per_token")
DSA_RULE = (f"{TRT} commit eaf502624e92146c48724b22f90735d999e5a097, tensorrt_llm/_torch/attention_backend/sparse/"
            "dsa.py DSACacheManager.get_cache_size_per_token")
SUPPORT_MATRIX = (f"{TRT} commit 11d6485830b79d9ec2a1f110a9f5f33a99e694b0 (PR #9893), tensorrt_llm/llmapi/"
                  "model_support_matrix.py KEY_MODEL_MATRIX / SUPPORTED_MODELS_PYTORCH")

# KEY_MODEL_MATRIX's 'EAGLE-3(One Model Engine)' cell as read; SUPPORTED_MODELS_PYTORCH lists the others named here
# without a feature row.
_MATRIX = {"DeepseekV3ForCausalLM": "No", "DeepseekV32ForCausalLM": "No", "Qwen3MoeForCausalLM": "Yes",
           "Qwen3NextForCausalLM": "No", "Llama4ForConditionalGeneration": "Yes", "GptOssForCausalLM": "Yes"}
_LISTED = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "NemotronHForCausalLM"}

def _read(model: str, layer: str, commit: str) -> str:
    return (f"{model}.forward hands spec_metadata to every decoder layer; {layer} calls "
            f"spec_metadata.maybe_capture_hidden_states (commit {commit})")


_DSV3 = _read("DeepseekV3Model", "DeepseekV3DecoderLayer.forward_MoE / forward_mlp (where is_layer_capture)",
              "a43cf9e363d5657061b5ce0e12f3d993a08d8158")
_NEXT = _read("Qwen3NextModel", "Qwen3NextLinearDecoderLayer.forward and Qwen3NextFullAttentionDecoderLayer.forward",
              "00022b040996780da248347927318fecb55ae7e9")
# name -> where the capture was read in the row's modeling file (tensorrt_llm/_torch/models/, NVIDIA/TensorRT-LLM)
CAPTURE = {
    "LlamaForCausalLM": _read("LlamaModel", "LlamaDecoderLayer.forward", "3a5901cd0d77bed18baaf402d1d12fab468d44a9"),
    "Llama4ForConditionalGeneration": _read("Llama4Model", "Llama4DecoderLayer.forward",
                                            "3a5901cd0d77bed18baaf402d1d12fab468d44a9"),
    "Qwen3ForCausalLM": _read("Qwen3Model", "Qwen3DecoderLayer.forward", "010bb95fbad3c678792a9edf659970299a1a320b"),
    "Qwen3MoeForCausalLM": _read("Qwen3MoEModel", "Qwen3MoEDecoderLayer.forward (where is_layer_capture)",
                                 "03441af14b6675ec38275167cfd514595defb505"),
    "Qwen2ForCausalLM": "QwenDecoderLayer.forward: spec_metadata.maybe_capture_hidden_states (commit 87b279a9)",
    "MistralForCausalLM": "MistralDecoderLayer.forward: spec_metadata.maybe_capture_hidden_states (commit 0dcfa87b)",
    "GptOssForCausalLM": _read("Transformer", "TransformerBlock.forward_normal / forward_tp",
                               "050b6cb92871a4ed73486c5e5a573d4198d1a6d9"),
    "DeepseekV3ForCausalLM": _DSV3, "DeepseekV32ForCausalLM": _DSV3,
    "GlmMoeDsaForCausalLM": _DSV3 + " (the class GLM-5's registration names)",
    "KimiK25ForConditionalGeneration": "self.llm = DeepseekV3ForCausalLM, forward hands **kwargs (spec_metadata) to "
                                       "it (commit 010373d3); " + _DSV3,
    "Glm4MoeForCausalLM": _read("DeepseekV3Model (modeling_glm.py)", "DeepseekV3DecoderLayer.forward_MoE / "
                                "forward_mlp", "0406f8aa75104e96d80105563defd26ea0d9009a"),
    "Qwen3NextForCausalLM": _NEXT,
    "Qwen3_5ForCausalLM": _NEXT + "; inherited through Qwen3NextForCausalLM (modeling_qwen3_5.py not re-read)",
    "Qwen3_5MoeForCausalLM": _NEXT + "; inherited through Qwen3NextForCausalLM (modeling_qwen3_5.py not re-read)",
    "NemotronHForCausalLM": _read("NemotronHModel", "NemotronHLayer.forward (where is_layer_capture)",
                                  "00620eb025e7c24895986e1042380bd1be4426d9"),
    "SeedOssForCausalLM": _read("SeedOssModel", "SeedOssDecoderLayer.forward",
                                "22de8b34df71bb6653612c1f3de00c7288482eb4"),
    "ApertusForCausalLM": _read("ApertusModel", "ApertusDecoderLayer.forward",
                                "373783016c99f0d5c6740416511413050aba063b"),
    "LagunaForCausalLM": _read("LagunaModel", "LagunaDecoderLayer.forward", "01dcc21a28bd9b95e15ebc1aa56b60bca128123c"),
    "DeepseekV4ForCausalLM": "DeepseekV4DecoderLayer.forward_MoE: spec_metadata.maybe_capture_hidden_states "
                             "(commit 02586bf0)",
}


def capture_of(f: Family) -> str:
    return CAPTURE.get(f.name, "")


def unverified_capture(families: tuple[Family, ...]) -> list[str]:
    """Rows whose capture was not read in the code path at a pinned commit (admitted on their registration)."""
    return [f.name for f in families if not capture_of(f)]


def matrix_status(f: Family) -> str:
    if f.name in _MATRIX:
        return f"EAGLE-3 one-model: {_MATRIX[f.name]}"
    return "listed, no feature row" if f.name in _LISTED else "not listed"


def chain_only_reason(f: Family, hf_config: dict[str, Any] | None = None) -> str | None:
    """Why the PyTorch backend serves only chains for this row (and this config.json, where given), else None."""
    if f.attention == MLA:
        return f"{f.name} uses multi-head latent attention (MLA): {TREES_DOC}"
    if f.attention == COMPRESSED:
        return f"{f.name}'s compressed attention pools a forward's tokens in order (as for sliding-window attention, "\
               f"which it also uses: {TREES_DOC})"
    if f.attention in (LINEAR, MAMBA):
        return f"{f.name}'s recurrent layers read a forward's tokens in order"
    windowed = f.model_type in ("gpt_oss", "laguna") or (
        hf_config is not None and f.sliding != "never" and sliding_window_of(hf_config) is not None)
    if windowed:
        return f"{f.name} uses sliding-window attention: {TREES_DOC}"
    return None


def trees_of(f: Family) -> str:
    """The tree kinds the PyTorch backend serves for a row (a config with a sliding window: chains only)."""
    if chain_only_reason(f) is not None:
        return "chain"
    return "chain, dynamic" + (" (chain with a sliding window)" if f.sliding != "never" else "")


def kv_layout(f: Family) -> str:
    if f.attention == MLA:
        extra = " + DSA indexer keys (FP8 + a float32 scale per 128, per full layer)" if f.model_type in (
            "deepseek_v32", "glm_moe_dsa") else ""
        return f"kv_lora_rank + qk_rope_head_dim per layer, whole on every rank{extra}"
    if f.attention == COMPRESSED:
        return "window K=V + compressed entries per layer, whole on every rank"
    if f.attention in (LINEAR, MAMBA):
        return "2 x kv_heads x head_dim per full-attention layer / tp (whole with attention DP) + a recurrent state"
    return "2 x kv_heads x head_dim per layer / tp (whole with attention DP)"


# ---- ModelOpt FP8 on the current line: which rows the build quantizes (builders/convert/hf_quant_stage.py) ---------

MODELOPT = "nvidia-modelopt 0.47.0 (modelopt/torch/export/unified_export_hf.py export_hf_checkpoint)"
MOE_FP8 = (f"{TRT} commit 002366a4074cacd4f7be481727bea2e1eb9136a5, tensorrt_llm/_torch/modules/fused_moe/"
           "quantization.py FP8QDQFusedMoEMethod (load_activation_scales_fp8_qdq, "
           "requantize_expert_w3_w1_weight_fp8_qdq, process_weights_after_loading)")
MOE_NAMES = {  # where the row's loader hands ModelOpt's per-expert names to the fused MoE (w1 / w3 / w2)
    "Qwen3MoeForCausalLM": f"{TRT} commit 7a1198904a380af40fc09862bb5fd6b1131c3f7e, tensorrt_llm/_torch/models/"
                           "checkpoints/hf/qwen2_moe_weight_mapper.py Qwen2MoeHfWeightMapper."
                           "handle_special_instance_module (Qwen3MoeHfWeightMapper derives from it)",
    "Glm4MoeForCausalLM": f"{TRT} commit 0406f8aa75104e96d80105563defd26ea0d9009a, tensorrt_llm/_torch/models/"
                          "modeling_glm.py Glm4MoeForCausalLM.load_weights (params_map: experts' gate/up/down_proj -> "
                          "w1/w3/w2, shared_experts left to the fused gate_up GatedMLP)",
}
DENSE_FP8 = "the native mirror (builders/convert/hf_quant.py: FP8QDQLinearMethod's fused q/k/v and gate/up)"
# Rows quantized with ModelOpt FP8 (weights and/or KV cache) and how the reference engine mirrors them: "native"
# (converted TRT-LLM-layout checkpoint, builders/convert/hf_quant.py) or "generic" (transformers' model with the
# export's weights as the loader leaves them, builders/convert/hf_quant_generic.py). Every other row: the reason.
_MODELOPT_OK = {"LlamaForCausalLM": "native", "MistralForCausalLM": "native", "Qwen2ForCausalLM": "native",
                "Qwen3ForCausalLM": "native", "Qwen3MoeForCausalLM": "generic", "Glm4MoeForCausalLM": "generic"}
_MLA_FP8 = ("ModelOpt's FP8 export quantizes the MLA projections per tensor (weight_scale, input_scale); "
            "TensorRT-LLM's DeepSeek-V3 loader reads them as 128x128 blocks only: q_a_proj and kv_a_proj_with_mqa are "
            "concatenated into fused_a with their weight_scale_inv, kv_b_proj is split into k_b_proj_trans / "
            "v_b_proj with weight_scale_inv per 128 (DeepseekV3ForCausalLM.load_weights, tensorrt_llm/_torch/models/"
            "modeling_deepseekv3.py at 000561df), so two per-tensor scales fused into one weight are not what it "
            "reads. Serve the checkpoint published in FP8 128x128 blocks as it is (quantization.weights: none)")
_NOT_MIRRORED = ("ModelOpt's export of it completes, but this builder neither checks it against TensorRT-LLM's "
                 "loader nor mirrors it on the reference engine")
_HYBRID = ("ModelOpt's export quantizes the gated delta-net projections (linear_attn.in_proj_qkvz, out_proj) and the "
           "experts; the reference engine has no FP8 path for linear-attention layers, so the build could neither "
           "check nor measure the quantized target")
_INSTEAD = ("; quantize it with ModelOpt yourself and give the export as target.model with engine.backend pytorch "
            "(quantization.weights: none), or keep it 16-bit")
MODELOPT_REFUSED = {
    "GptOssForCausalLM": "ModelOpt's export writes gpt-oss's experts as fused 3-D FP8 tensors "
                         "(mlp.experts.gate_up_proj / down_proj, no per-expert linears), which this builder neither "
                         "checks nor mirrors; gpt-oss is published in MXFP4: serve that checkpoint as it is "
                         "(quantization.weights: none)",
    "DeepseekV3ForCausalLM": _MLA_FP8, "DeepseekV32ForCausalLM": _MLA_FP8, "GlmMoeDsaForCausalLM": _MLA_FP8,
    "KimiK25ForConditionalGeneration": "calibration loads the target with AutoModelForCausalLM, which has no class "
                                       "for Kimi-K2.5's wrapper config; and " + _MLA_FP8,
    "SeedOssForCausalLM": _NOT_MIRRORED + " (which of its linears TensorRT-LLM fuses is not covered)" + _INSTEAD,
    "ApertusForCausalLM": _NOT_MIRRORED + " (its xIELU MLP without a gate is not covered)" + _INSTEAD,
    "LagunaForCausalLM": _NOT_MIRRORED + " (its per-head output gates g_proj and per-layer heads are not covered)"
                         + _INSTEAD,
    "Qwen3NextForCausalLM": _HYBRID + _INSTEAD, "Qwen3_5ForCausalLM": _HYBRID + _INSTEAD,
    "Qwen3_5MoeForCausalLM": _HYBRID + _INSTEAD,
    "NemotronHForCausalLM": "ModelOpt's export writes exclude_modules names with a sentinel appended "
                            "('lm_head.\\x00backbone.pt_name_sentinel'), which match no module TensorRT-LLM loads"
                            + _INSTEAD,
    "Llama4ForConditionalGeneration": "ModelOpt's export fails on it (modelopt/torch/export/model_utils.py "
                                      "is_multimodal_model: TypeError on the text model's config, whose "
                                      "architectures is None)" + _INSTEAD,
    "DeepseekV4ForCausalLM": "ModelOpt's export leaves attn.wo_a 16-bit without naming it in exclude_modules and "
                             "names the LM head `head` while excluding `lm_head`, so TensorRT-LLM would read "
                             "16-bit weights as FP8; DeepSeek-V4 is published quantized: serve that checkpoint as "
                             "it is (quantization.weights: none)",
}


def modelopt_mirror(f: Family) -> str | None:
    """"native" / "generic": the row is quantized with ModelOpt FP8 and mirrored so on the reference engine; None:
    refused (`modelopt_refusal`)."""
    return _MODELOPT_OK.get(f.name)


def modelopt_refusal(f: Family) -> str:
    """Why a row is not quantized with ModelOpt by this builder, and what to do instead ("" where it is)."""
    if f.name in _MODELOPT_OK:
        return ""
    return MODELOPT_REFUSED.get(f.name, f"{f.name}: not covered by this builder's ModelOpt export check" + _INSTEAD)


def modelopt_cell(f: Family) -> str:
    """The docs cell: yes (how it is mirrored) or no (why)."""
    how = _MODELOPT_OK.get(f.name)
    if how == "native":
        return "yes (dense linears, " + DENSE_FP8 + ")"
    if how == "generic":
        return ("yes (dense attention, dense and shared-expert MLPs, per-expert linears: " + MOE_FP8 + "; the "
                "experts' names as " + MOE_NAMES.get(f.name, "") + ")")
    return "no: " + modelopt_refusal(f)
