"""Ledger rows: the TensorRT-LLM checkpoint (config.json, tensors), the normalized EAGLE-3 head, the tokenizer files,
and the engine config.json keys our cross-check reads. Flags (`when`): eagle = EagleForCausalLM checkpoint,
w_fp8 / kv_fp8 = FP8 weights / KV cache, drafter_multilayer = a head with more than one decoder layer."""

from __future__ import annotations

from ledger.rows import ENGINE_FLOW, TRANSFORMERS4, TRANSFORMERS5, Row, Source, only, rows_of

TRT = "NVIDIA/TensorRT-LLM"
PRETRAINED = Source(TRT, "tensorrt_llm/models/modeling_utils.py", "PretrainedConfig.__init__")
LLAMA = Source(TRT, "tensorrt_llm/models/llama/config.py", "LLaMAConfig.__init__")
EAGLE = Source(TRT, "tensorrt_llm/models/eagle/config.py", "EagleConfig.__init__")
QUANT = Source(TRT, "tensorrt_llm/models/modeling_utils.py", "QuantConfig (dataclass fields, QuantConfig.from_dict)")
MAPPING = Source(TRT, "tensorrt_llm/models/modeling_utils.py", "PretrainedConfig.__init__ -> Mapping.from_dict")
LOAD = Source(TRT, "tensorrt_llm/models/modeling_utils.py",
              "PretrainedModel.load ('Required but not provided tensors'; 'Exemption for embedding sharing')")
EAGLE_NET = Source(TRT, "tensorrt_llm/models/eagle/model.py", "EagleNet (drafter = LLaMAModel, lm_head)")
KV_QUANT = Source(TRT, "tensorrt_llm/quantization/quantize.py", "kv_cache_quantize (every Attention of the model)")
FP8_QUANT = Source(
    TRT, "tensorrt_llm/quantization/quantize.py", "quantize -> fp8_quantize (exclude_modules via fnmatch)"
)
EAGLE_CONVERT = Source(TRT, "examples/eagle/convert_checkpoint.py", "main: eagle_net_config['quantization'].update")
BUILDER = Source(TRT, "tensorrt_llm/builder.py", "build() / EngineConfig.to_dict (engine config.json)")
EAGLE3_HEAD = Source(TRT, "tensorrt_llm/_torch/models/modeling_speculative.py", "Eagle3DraftModel / Eagle3ForCausalLM")
HF_LLAMA = Source("huggingface/transformers", "src/transformers/models/llama/configuration_llama.py",
                  "LlamaConfig.__init__ (rope_theta, rope_scaling, torch_dtype)")
HF_ROPE5 = Source("huggingface/transformers", "src/transformers/modeling_rope_utils.py",
                  "RotaryEmbeddingConfigMixin.convert_rope_params_to_dict / standardize_rope_params")
HF_TOKENIZER = Source("huggingface/transformers", "src/transformers/models/auto/tokenization_auto.py",
                      "AutoTokenizer.from_pretrained (tokenizer_class_from_name)")
OURS_ENGINE = Source("eagle-deploy", "engines/checkpoint.py", "load_eagle3 / Runtime.load")
OURS_FAMILIES = Source("eagle-deploy", "core/families.py", "traits (the reference engine's native families)")
OURS_GENERIC = Source("eagle-deploy", "engines/runtime.py", "_target (engines/generic.py load_generic)")
OURS_STAGE = Source("eagle-deploy", "builders/engine/reference.py", "random_head_flag (reads eagle_deploy)")

_LLAMA_REQUIRED = ("architecture", "dtype", "hidden_size", "num_hidden_layers", "num_attention_heads")
_LLAMA_OPTIONAL = ("logits_dtype", "vocab_size", "intermediate_size", "num_key_value_heads", "head_size", "hidden_act",
                   "norm_epsilon", "position_embedding_type", "max_position_embeddings", "use_parallel_embedding",
                   "embedding_sharding_dim")
_LLAMA_OWN = ("rotary_base", "rotary_scaling", "attn_bias", "mlp_bias", "residual_mlp")
_KWARGS_NOTE = "no named parameter: PretrainedConfig.__init__ sets it as an attribute (logs 'Implicitly setting')"


def _llama_config(surface: str) -> list[Row]:
    return (
        rows_of(surface, _LLAMA_REQUIRED, PRETRAINED, type="keyword-only, no default", required=True)
        + rows_of(surface, _LLAMA_OPTIONAL, PRETRAINED, type="optional (default)")
        + rows_of(surface, ("mapping",), MAPPING, type="dict (Mapping.from_dict)")
        + rows_of(surface, ("quantization",), QUANT, type="dict (QuantConfig.from_dict)")
        + rows_of(surface, _LLAMA_OWN, LLAMA, type="optional (default)")
        + rows_of(surface, ("tie_word_embeddings", "share_embedding_table"), PRETRAINED, type="bool (attribute)",
                  note=_KWARGS_NOTE)
    )


_FAMILY_NOTE = ("written for Qwen2 / Qwen3 / Mistral targets only, whose checkpoint only the reference engine reads "
                "(the engine flow serves Llama targets only: docs/contracts.md, 'Target architectures')")
_CONFIG = (
    _llama_config("checkpoint.config")
    + rows_of("checkpoint.config", ("eagle_deploy",), OURS_STAGE, type="dict (this project's provenance)",
              note="TensorRT-LLM: " + _KWARGS_NOTE)
    + rows_of("checkpoint.config", ("eagle_net_config",), EAGLE, type="dict (LLaMAConfig.from_dict)", required=True,
              when=("eagle",), note="EagleConfig.__init__ reads kwargs['eagle_net_config'] (KeyError without it)")
    + rows_of("checkpoint.config", ("num_eagle_layers", "max_draft_len", "max_non_leaves_per_layer"), EAGLE,
              type="int (defaults 1 / 63 / 10)", when=("eagle",))
    + rows_of("checkpoint.config", ("qkv_bias", "qk_norm", "sliding_window"), OURS_FAMILIES,
              type="bool / bool / int | null", note=_FAMILY_NOTE)
    + rows_of("checkpoint.config", ("generic_target",), OURS_GENERIC,
              type="path (the HF target directory; relative: inside the checkpoint, a mirrored FP8 export)",
              note="a target of the generic families (no converted weights); TensorRT-LLM never reads this checkpoint")
    + _llama_config("checkpoint.eagle_net_config")
    + rows_of("checkpoint.eagle_net_config", ("head_dim",), PRETRAINED, type="int (attribute)", note=_KWARGS_NOTE)
)

_QUANT_KEYS = (
    rows_of("checkpoint.quantization", ("quant_algo", "kv_cache_quant_algo"), QUANT, type="'FP8' | null")
    + rows_of("checkpoint.quantization", ("exclude_modules",), QUANT, type="list[str] (fnmatch patterns)",
              note="upstream excludes eagle_nets.{i}.lm_head; we exclude eagle_nets.* (16-bit drafter linears)")
    + rows_of("checkpoint.mapping", ("world_size", "tp_size", "pp_size"), MAPPING, type="int")
)

_TARGET_TENSORS = (
    "transformer.vocab_embedding.weight", "transformer.ln_f.weight",
    "transformer.layers.{i}.input_layernorm.weight", "transformer.layers.{i}.post_layernorm.weight",
    "transformer.layers.{i}.attention.qkv.weight", "transformer.layers.{i}.attention.dense.weight",
    "transformer.layers.{i}.mlp.fc.weight", "transformer.layers.{i}.mlp.gate.weight",
    "transformer.layers.{i}.mlp.proj.weight",
)
_DRAFTER_TENSORS = (
    "eagle_nets.{k}.drafter.vocab_embedding.weight",
    "eagle_nets.{k}.drafter.fc.weight",
    "eagle_nets.{k}.drafter.fc.bias",
    "eagle_nets.{k}.drafter.layers.{j}.post_layernorm.weight",
    "eagle_nets.{k}.drafter.layers.{j}.attention.qkv.weight",
    "eagle_nets.{k}.drafter.layers.{j}.attention.dense.weight",
    "eagle_nets.{k}.drafter.layers.{j}.mlp.fc.weight",
    "eagle_nets.{k}.drafter.layers.{j}.mlp.gate.weight",
    "eagle_nets.{k}.drafter.layers.{j}.mlp.proj.weight",
)
_SHARED_EMBEDDING = ("PretrainedModel.load exempts every parameter named *lm_head.weight while any provided tensor "
                     "ends in vocab_embedding.weight ('Exemption for embedding sharing'); we always write it")
_LINEARS = ("attention.qkv", "attention.dense", "mlp.fc", "mlp.gate", "mlp.proj")

_TENSORS = (
    rows_of("checkpoint.tensor", _TARGET_TENSORS, LOAD, type="16-bit (or FP8 weight, see scales)", required=True)
    + rows_of("checkpoint.tensor", ("lm_head.weight",), LOAD, type="16-bit", required=True,
              exempt_if_emitted_suffix="vocab_embedding.weight", note=_SHARED_EMBEDDING)
    + rows_of("checkpoint.tensor", _DRAFTER_TENSORS, EAGLE_NET, type="16-bit", required=True, when=("eagle",),
              note="fc.bias is required (a head trained without it gets zeros; TensorRT-LLM issue 2588)")
    + rows_of("checkpoint.tensor", ("eagle_nets.{k}.lm_head.weight",), LOAD, type="16-bit", required=True,
              when=("eagle",), exempt_if_emitted_suffix="vocab_embedding.weight", note=_SHARED_EMBEDDING)
    + rows_of("checkpoint.tensor", ("eagle_nets.{k}.drafter.layers.{j}.input_layernorm.weight",), EAGLE_NET,
              type="16-bit", required=True, when=("eagle", "drafter_multilayer"),
              note="absent for drafter layer 0 (use_input_layernorm_in_first_layer=False)")
    + rows_of("checkpoint.tensor", ("transformer.layers.{i}.attention.qkv.bias",
                                    "transformer.layers.{i}.attention.q_layernorm.weight",
                                    "transformer.layers.{i}.attention.k_layernorm.weight"), OURS_FAMILIES,
              type="16-bit", note="Qwen2 q/k/v biases; Qwen3 per-head q/k RMSNorm weights (head_dim). " + _FAMILY_NOTE)
    + rows_of("checkpoint.tensor", [f"transformer.layers.{{i}}.{m}.{s}" for m in _LINEARS
                                    for s in ("weights_scaling_factor", "activation_scaling_factor")],
              FP8_QUANT, type="float32[1]", required=True, when=("w_fp8",),
              note="FP8Linear parameters (tensorrt_llm/quantization/layers.py); weight is float8_e4m3fn")
    + rows_of("checkpoint.tensor", ("transformer.layers.{i}.attention.kv_cache_scaling_factor",), KV_QUANT,
              type="float32[1]", required=True, when=("kv_fp8",),
              note="kv_cache_rcp_scaling_factor is derived at load (modeling_utils.py preprocess_weights)")
    + rows_of("checkpoint.tensor", ("eagle_nets.{k}.drafter.layers.{j}.attention.kv_cache_scaling_factor",), KV_QUANT,
              type="float32[1]", required=True, when=("eagle", "kv_fp8"),
              note="kv_cache_quantize walks model.named_modules(): the drafter's attentions get the parameter too")
)

_EAGLE3 = (
    rows_of("eagle3.config", ("draft_vocab_size", "target_hidden_size", "bias"), EAGLE3_HEAD, type="int / int / bool",
            note="not re-read at the tags in this pass (see docs/contracts.md, Sources)")
    + rows_of("eagle3.config", ("rope_theta", "rope_scaling", "torch_dtype", "num_hidden_layers"), HF_LLAMA,
              type="transformers-4 LlamaConfig keys", versions=TRANSFORMERS4,
              note="a transformers-5 head has rope_parameters only; 4.x would silently use base 10000")
    + rows_of("eagle3.config", ("torch_dtype", "num_hidden_layers"), HF_LLAMA, versions=TRANSFORMERS5,
              type="LlamaConfig keys (torch_dtype: the old name of dtype, still read by PretrainedConfig.__init__)")
    + rows_of("eagle3.config", ("rope_theta", "rope_scaling"), HF_ROPE5,
              type="legacy keys, read into rope_parameters", versions=TRANSFORMERS5,
              note="transformers 5 keeps rope_parameters first and fills its rope_theta from the top-level key "
              "(run with 5.24.0); written equal to rope_parameters for both readers")
    + rows_of("eagle3.config", ("architectures", "dtype"), HF_LLAMA, type="list[str] / str (transformers 5 name)")
    + rows_of("eagle3.config", ("eagle_aux_hidden_state_layer_ids", "eagle_deploy"), OURS_ENGINE,
              type="list[int] / dict", note="TensorRT-LLM takes the layers from eagle3_layers_to_capture instead")
)
_TOKENIZER = (
    rows_of("tokenizer.config", ("tokenizer_class",), HF_TOKENIZER, type="a class transformers 4 and 5 both have",
            note="verified by loading the written files with transformers 4.56.0 and 5.24.0 (tests/test_ledger.py "
            "checks the name)")
)
_HF_MODEL = rows_of(
    "hf_model.config",
    ("rope_theta", "rope_scaling", "torch_dtype", "dtype"),
    HF_LLAMA,
    versions=TRANSFORMERS4,
    type="transformers-4 LlamaConfig keys (dtype: the 5.x name, kept)",
    note="checkpoint/hf_model/config.json, what trtllm-serve and model.yaml `model` load on engine.backend pytorch: "
    "the "
    "target's config with the keys transformers 4 reads added where transformers 5 wrote rope_parameters / dtype only "
    "(builders/convert/hf_compat.py); its tokenizer_config.json is the tokenizer.config row's",
)
_ENGINE_CONFIG = rows_of(
    "engine.config",
    ("pretrained_config.architecture", "pretrained_config.dtype", "pretrained_config.mapping.tp_size",
     "pretrained_config.mapping.pp_size", "pretrained_config.max_draft_len", "pretrained_config.num_eagle_layers",
     "pretrained_config.max_non_leaves_per_layer", "pretrained_config.quantization.quant_algo",
     "pretrained_config.quantization.kv_cache_quant_algo", "build_config.max_draft_len",
     "build_config.speculative_decoding_mode", "build_config.max_batch_size", "build_config.max_input_len",
     "build_config.max_seq_len", "build_config.max_num_tokens"),
    BUILDER, type="read by builders/engine/crosscheck.py", required=True,
    note="written by trtllm-build; max_seq_len is recorded as requested + max_draft_len + num_eagle_layers",
)

# The TRT-LLM checkpoint and engine are read by TensorRT-LLM only in the engine flow; on later versions the checkpoint
# is the reference engine's own input. The EAGLE-3 head and the tokenizer are read by the LLM API of every version.
ROWS: list[Row] = (
    only(_CONFIG + _QUANT_KEYS + _TENSORS + _ENGINE_CONFIG, ENGINE_FLOW) + _EAGLE3 + _TOKENIZER + _HF_MODEL
)
