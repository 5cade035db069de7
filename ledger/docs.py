"""Render the contract ledger into docs/contracts.md: `python -m ledger.docs` (writes it) or
`--check` (exit 1 when the committed file is stale; tests/test_ledger.py runs the check).

`SOURCES` records what was read to establish the rows: the upstream file, the version read (by commit, in
NVIDIA/TensorRT-LLM or in a named fork of it: no copy at the tag commits was available, so the versions read are
dated by their content or by the fork's version.py at the same commit), the day it was read, and what
it showed; "not found at commit X" marks a statement the version opened at X does not bear out (what X shows
instead follows). `UNVERIFIED` lists what could not be established.
`python -m ledger.check --upstream-report` lists every row's citation with its last reading, oldest first.

Inputs:  the ledger in ledger/*.py, the architecture table (builders/trtllm/architectures.py)
Outputs: docs/contracts.md and the table by architecture in docs/bring-your-own-model.md (--check: exit 1 when stale)
Guide:   docs/contracts.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from builders.trtllm import architectures
from core import trtllm_versions

from ledger import table as ledger, llmapi as ledger_llmapi, rows as ledger_rows

DOC = Path(__file__).resolve().parents[1] / "docs" / "contracts.md"
GUIDE = DOC.parent / "bring-your-own-model.md"  # its table by architecture (between the markers) is rendered too

SOURCES: tuple[tuple[str, str, str, str], ...] = (
    # (repository:path, version read, read on (UTC date), what it established)
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/models/eagle/config.py",
     "commit 0382a8ac", "2026-12-01",
     "EagleConfig keys; from_hugging_face copies the quantization block into eagle_net_config and excludes "
     "eagle_nets.{i}.lm_head"),
    ("NVIDIA/TensorRT-LLM:examples/eagle/convert_checkpoint.py",
     "commit 65b31db1b401d3752b8ebe7c29093cbfb6af04b7", "2026-12-01",
     "eagle_net_config['quantization'].update(...) with exclude_modules += eagle_nets.{i}.lm_head"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/models/llama/config.py",
     "commit 04100fd0", "2026-12-01",
     "LLaMAConfig keys; from_hugging_face reads rope_theta with default 10000 (transformers-4 attribute)"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/models/modeling_utils.py",
     "commit b35ac1b64368513d215c57d2ed01d62d910df8da", "2026-12-03",
     "PretrainedConfig.__init__ (keyword-only required keys, unknown keys set as attributes), QuantConfig fields "
     "and fnmatch exclude_modules, PretrainedModel.load strict on missing tensors, kv_cache_rcp_scaling_factor "
     "derived"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/quantization/quantize.py",
     "commit 89fd9b74ab7ae753b4c6b3db25a400dca7ea54a0", "2026-12-03",
     "kv_cache_quantize gives every Attention of model.named_modules() a kv_cache_scaling_factor"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/models/eagle/model.py",
     "commit 89fd9b74ab7ae753b4c6b3db25a400dca7ea54a0", "2026-12-01",
     "EagleNet = LLaMAModel drafter + lm_head; forward asserts the paged KV cache; accept plugin inputs"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/builder.py",
     "fork 2ez4bz/TensorRT-LLM commit 6e9246abe52a01da01f8a37343b219ae03b8de20 (a 2025 main: BuildConfig with "
     "auto_parallel_config, NVFP4; docker/Makefile at the same commit builds on CUDA 12.9.1); NVIDIA/TensorRT-LLM's "
     "own stored version, commit 14e801da3632eb71367b847e335c4f2b09098651, is an early file without max_seq_len",
     "2026-12-03",
     "BuildConfig defaults (2048 / 1024 / None / 8192), _init_max_seq_len, build(): max_seq_len += max_draft_len "
     "(+ num_eagle_layers for EAGLE), EAGLE asserts max_batch_size <= 512 and max_draft_len <= 256"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/commands/build.py",
     "commit 008b2b8d", "2026-12-01",
     "trtllm-build flags and defaults"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/plugin/plugin.py",
     "commit c20322ffd3dc0740ca530c9fad989b22e64f6e06", "2026-12-01",
     "plugin flag names and values"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/commands/serve.py",
     "commit 00209af1", "2026-12-01",
     "trtllm-serve options; the YAML overwrites trtllm-serve's values"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/llmapi/llm_args.py",
     "commits fcd3f31682808ae56118ae43c1d7864a3a945e6f (early 2025) and "
     "0004396720054fd8e205cbf616f21f0b57c6b412 (2026); no 1.1- or 1.2-line version was opened by commit, and the "
     "BaseLlmArgs / KvCacheConfig fields were not re-read at these two",
     "2026-12-03",
     "EagleDecodingConfig: eagle3_layers_to_capture and max_total_draft_tokens absent in the early-2025 version, "
     "present in the 2026 one; the early DecodingBaseConfig.from_dict dispatches on data.get('decoding_type')"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/_torch/attention_backend/trtllm.py",
     "fork Ataraksia/TensorRT-LLM commit a451bf93888ef588251268516ac6cd4be0a124c5, an unresolved merge of "
     "NVIDIA/TensorRT-LLM main whose upstream side the statement is read from (tensorrt_llm/version.py at the same "
     "commit reads 1.1.0rc6 on that side)", "2026-12-03",
     "TrtllmAttentionMetadata.generate_spec_decoding_position_offsets / generate_spec_decoding_packed_mask assert "
     "'only chained/linear tree is supported now' and update_spec_dec_param 'currently dynamic tree is not "
     "supported' (PyTorch backend trees, 1.1 line)"),
    ("NVIDIA/TensorRT-LLM:docs/source/release-notes.md",
     "commit 001eaece", "2026-12-01",
     "transformers 4.56.0 in 1.1, 4.57.3 in 1.2; Triton backend base images"),
    ("NVIDIA/TensorRT-LLM:triton_backend/inflight_batcher_llm/src/model_instance_state.cc",
     "commits 0c8de69a, c8c6df08bd0ead54cd47f7973e1e425c28a174cd", "2026-12-01",
     "parameters read and which are unconditional; fillTritonResponse writes 10 perf outputs"),
    ("NVIDIA/TensorRT-LLM:triton_backend/inflight_batcher_llm/src/model_state.cc",
     "commit 5cdd6921", "2026-12-01",
     "GetParameter throws 'Cannot find parameter with name'; boolean spellings"),
    ("NVIDIA/TensorRT-LLM:triton_backend/inflight_batcher_llm/src/utils.h",
     "commit 14c3afec", "2026-12-01",
     "input / output tensor names; getResponseBuffer throws when Triton refuses an output"),
    ("NVIDIA/TensorRT-LLM:triton_backend/inflight_batcher_llm/src/utils.cc",
     "commit c8c6df08bd0ead54cd47f7973e1e425c28a174cd", "2026-12-01",
     "splitBatchInputsTensors: input_lengths 1-D, per-row slicing"),
    ("NVIDIA/TensorRT-LLM:triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt",
     "commit 0c8de69a", "2026-12-01",
     "reshape / allow_ragged_batch per input; the guided-decoding parameters present"),
    ("NVIDIA/TensorRT-LLM:cpp/include/tensorrt_llm/batch_manager/llmRequest.h + llmRequest.cpp + "
     "cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp + cpp/tensorrt_llm/runtime/gptJsonConfig.cpp + "
     "cpp/include/tensorrt_llm/runtime/eagleModule.h",
     "llmRequest.cpp at commit 89fd9b74ab7ae753b4c6b3db25a400dca7ea54a0; trtGptModelInflightBatching.cpp at commit "
     "b35ac1b64368513d215c57d2ed01d62d910df8da (updateRequests calls updateNumTokensPerIteration with the tokens added "
     "in the step); "
     "llmRequest.h: fork Ataraksia/TensorRT-LLM commit a451bf93888ef588251268516ac6cd4be0a124c5 (the upstream side "
     "of its merge of NVIDIA/TensorRT-LLM main, 1.1.0rc6 by its tensorrt_llm/version.py); NVIDIA/TensorRT-LLM's own "
     "stored header, commit d879430b040ea30c65220c9171a8a70607398748, is an early one without "
     "updateNumTokensPerIteration; gptJsonConfig.cpp at fork pantherrui/TensorRT-LLM commit "
     "a21b58d07f289752bed91b0e61641b0beabd596a (2025); eagleModule.h at commit "
     "2931b93fa41bf8b6d23a6e266ffc17810a5966ef",
     "2026-12-03",
     "engine-flow EAGLE fills acceptance_rate / total_*_draft_tokens (see docs/deploy.md): with a speculative "
     "decoding module, perf metrics requested and draft tokens on the request, "
     "LlmRequest::updateNumTokensPerIteration adds tokens-per-iteration - 1 to totalAcceptedDraftTokens and "
     "min(getNumDraftTokens(), getMaxDraftPathLen()) to totalDraftTokens; parseJson builds the EAGLE module as "
     "EagleModule(num_eagle_layers, max_draft_len, ...), whose first argument is maxDraftPathLen, so the drafted "
     "count per step is min(draft tokens, num_eagle_layers) (builders/triton/render.py draft_tokens_per_step)"),
    ("triton-inference-server/tensorrtllm_backend:docs/model_config.md",
     "b9cc224 (v1.1.0 release #830; its tensorrt_llm submodule is NVIDIA/TensorRT-LLM 48b7b5d8)", "2026-12-01",
     "parameter documentation of the pinned release"),
    ("triton-inference-server/common:protobuf/model_config.proto",
     "r25.12 (c09e98a)", "2026-12-01",
     "ModelConfig fields"),
    ("triton-inference-server/core:src/infer_response.cc, src/model.cc",
     "r25.12 (8dbcc96)", "2026-12-01",
     "an output missing from the config is refused ('unexpected inference output')"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/llmapi/llm_args.py (current line)",
     "commit 0004396720054fd8e205cbf616f21f0b57c6b412 (2026, before PR #18210) and the published docs pages "
     "llm-api/reference/Eagle3DecodingConfig.html of 1.3.0rc27, 1.4.0rc1, 1.4.0rc4", "2026-12-01",
     "Eagle3DecodingConfig fields and validators (dynamic tree bounds; speculative_model alias "
     "speculative_model_dir); eagle_choices listed in 1.3.0rc27, gone in 1.4.0rc1; eagle3_one_model not in the "
     "rendered signature from 1.3.0rc27 on, yet still accepted (see PR #18721 below); the SpeculativeConfig union "
     "discriminated by decoding_type; BaseLlmArgs extra='forbid'"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/llmapi/llm_args.py DecodingBaseConfig (load-aware speculation)",
     "the published Eagle3DecodingConfig pages of 1.3.0rc27, 1.4.0rc1, 1.4.0rc4; commit "
     "0004396720054fd8e205cbf616f21f0b57c6b412 "
     "(2026 main: the fields, the validator, the exclusivity and the max_concurrency translation as stated); the "
     "1.2 copy (acceptance_window / acceptance_length_threshold; draft_len_schedule must hold key 1 = "
     "max_draft_len; DecodingBaseConfig does not translate max_concurrency): fork mikeiovine/TensorRT-LLM commit "
     "1b1598c0c25ff230a26e1fde71ad5494b68be14a, dated by content and tied to no tag (see the llm_args.py 1.2-line "
     "row); the later rename: not found at commits "
     "0004396720054fd8e205cbf616f21f0b57c6b412 or fcd3f31682808ae56118ae43c1d7864a3a945e6f (early 2025: "
     "DecodingBaseConfig has only max_draft_len and speculative_model)", "2026-12-03",
     "max_concurrency (int > 0), draft_len_schedule "
     "(dict[int, int]), acceptance_rate_window_size (int >= 0) / acceptance_rate_threshold ([0, 1]) on "
     "1.3.0rc27..1.4.0rc4; the validator: thresholds >= 1, lengths >= 0 and <= max_draft_len, smallest threshold = "
     "max_draft_len (the 1.2 copy: key 1 required); max_concurrency and draft_len_schedule exclusive, "
     "max_concurrency -> {N: max_draft_len}; above the largest threshold no speculation. The 1.2 copy names the "
     "switch acceptance_window / acceptance_length_threshold and was not read at v1.2.0, so 1.2 is refused; later "
     "main renamed it again"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/_torch/speculative/interface.py",
     "commit 00b6d5a25c30b4382d24fbdf52956d601b3ffd24 (a 2026 main: SpeculativeDecodingMode has DFLASH and DSPARK); "
     "the earlier versions at commits b35ac1b64368513d215c57d2ed01d62d910df8da, "
     "f933a608045a46426792263617475b359d568043 and be5be52fb2a6119508aa72eb6041a1320659a789 have no "
     "support_dynamic_draft_len; llm_args.py at commit 0004396720054fd8e205cbf616f21f0b57c6b412 calls it to translate "
     "max_concurrency",
     "2026-12-03", "SpeculativeDecodingMode.support_dynamic_draft_len is true for EAGLE-3 one-model (and MTP / "
     "MTP-Eagle one-model, PARD, DFlash, draft-target one-model, SA), false for two-model EAGLE-3"),
    ("NVIDIA/TensorRT-LLM:triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt",
     "commits c8c6df08, 0a710573", "2026-12-01",
     "the llmapi model's inputs/outputs (names, types, dims, optional); no max_batch_size, no "
     "model_transaction_policy, no parameters"),
    ("NVIDIA/TensorRT-LLM:triton_backend/all_models/llmapi/tensorrt_llm/1/model.py",
     "commit 044a90d2", "2026-12-01",
     "model.yaml minus triton_config -> LLM(**args); triton_config.decoupled / max_batch_size read without "
     "default; 'stop' input; streamed responses carry outputs[i].text; perf outputs built with the text_output dtype"),
    ("NVIDIA/TensorRT-LLM:triton_backend/all_models/llmapi/tensorrt_llm/1/helpers.py",
     "commit 0df60f9a", "2026-12-01",
     "sampling_param_* inputs -> SamplingParams keyword arguments; streaming; return_* output flags"),
    ("NVIDIA/TensorRT-LLM pull requests #15907, #11723, #18210, #10124, #12062/#13081",
     "2026 threads", "2026-12-01",
     "engine-based Triton backend and templates removed (llmapi kept); trtllm-build deprecated then removed after "
     "1.3.0rc20; eagle_choices removed; Eagle3 decoding type; one-model dynamic trees"),
    ("triton-inference-server/server:docs/introduction/compatibility.md",
     "main 4b54459 / r26.08 6fa22ae", "2026-12-01",
     "newest NGC trtllm image rows: 26.07 -> TensorRT-LLM 1.2.1; no image carries 1.3/1.4"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/_torch/models/modeling_{llama,qwen3,qwen,mistral,qwen3_moe,gpt_oss}.py",
     "the commits named in 'Target architectures'", "2026-12-03",
     "which target classes are SpecDecOneEngineForCausalLM (one-model EAGLE-3) and which are "
     "DecoderModelForCausalLM whose layers capture hidden states (two-model only)"),
    ("NVIDIA/TensorRT-LLM pull request #17366 and issue #6158", "2026-08 / 2025-09 threads", "2026-12-03",
     "two-model speculative decoding forced onto the one-model path; Mistral EAGLE-3 ran two-model only"),
    # ---- round 3 --------------------------------------------------------------------------------------------------
    ("NVIDIA/TensorRT-LLM pull requests #18721, #17366, #5879", "2026-09 / 2026-08 / 2025-07 threads", "2026-12-04",
     "#18721 'BREAKING: Remove the two-model speculative decoding path and dead C++ spec-dec code' (merged, label "
     "api-breaking; its test_eagle3.py keeps passing eagle3_one_model, now only True): the key is still accepted on "
     "the current line, false no longer selects a two-model path (#17366 had first overridden false to one-model "
     "with a warning). That false now raises was not read in a source line. #5879 'support qwen3 dense model in "
     "eagle_one_model=False' (merged 2025-07): Qwen3 EAGLE-3 arrived as two-model"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/_torch/speculative/spec_sampler_base.py + "
     "tensorrt_llm/_torch/speculative/utils.py + tensorrt_llm/_torch/pyexecutor/sampler/penalties.py",
     "spec_sampler_base.py at commit 006567a7b85d72e256e4863bf65ae843ba8d3a7b (2026 main, eagle_choices still "
     "deprecated-not-removed: before 1.4.0rc1); utils.py get_spec_decoder and penalties.py has_occurrence_penalty in "
     "stored 2026 versions whose commit the index did not show; PRs #17701 (2026-08-14), #17955 (2026-08-19), "
     "#18401 (2026-08-29), #19161 (2026-09) as threads", "2026-12-04",
     "SpecSampler.validate_request (one-model speculative sampler): refuses return_context_logits / "
     "return_generation_logits / logprobs, min_p > 0, min_length, bad_words, no_repeat_ngram_size, embedding_bias, "
     "top_p_decay; a repetition != 1 / presence != 0 / frequency != 0 penalty needs enable_penalty, and is refused "
     "when penalty_supported is False, which get_spec_decoder sets for eagle_choices and dynamic trees. Which of "
     "these checks v1.4.0rc4 itself holds was not read at the tag"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/llmapi/llm_args.py DecodingBaseConfig.enable_penalty",
     "the published Eagle3DecodingConfig pages of 1.3.0rc27, 1.4.0rc1 and 1.4.0rc4 (enable_penalty: bool = False in "
     "each signature); PR #17701 (merged 2026-08-14, after 1.2.1 of NGC 26.07)", "2026-12-04",
     "enable_penalty exists on the current line, default false; not on 1.1 / 1.2 (added after them; not read at "
     "v1.1.0 / v1.2.0)"),
    ("NVIDIA/TensorRT-LLM:triton_backend/all_models/llmapi/tensorrt_llm/1/helpers.py + model.py",
     "helpers.py at commit 0df60f9ad779c4dc4f55da07e08b969fc4684e56, model.py at commit 044a90d2", "2026-12-04",
     "get_sampling_params_from_request passes sampling_param_frequency_penalty / presence_penalty to SamplingParams "
     "(no min_p, no repetition_penalty, no logprobs input); return_cumulative_logprob only reads "
     "outputs[i].cumulative_logprob in _create_response (sent as str, 'None' when no log probabilities were "
     "computed)"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/executor/iteration_stats.py", "commit b11790149e0e12e52ea82ed7a4d51b51ea98dce6",
     "2026-12-04",
     "_materialize_frame: with rank payloads (attention data parallelism) one row per rank, row = dict(base) (so "
     "specDecodingStats and numActiveRequests are copies), attentionDpRank = the rank, queue / completed counts "
     "zeroed outside rank 0; without them one row with attentionDpRank = frame.attention_dp_rank or 0"),
    ("huggingface/transformers 4.56.0 (PyPI wheel, run)",
     "AutoTokenizer.from_pretrained, AutoConfig.from_pretrained", "2026-12-01",
     "'TokenizersBackend does not exist'; the rewritten tokenizer_config.json loads with identical ids; the "
     "normalized EAGLE-3 head config of a transformers-5 head (rope_parameters, eagle_config) loads as "
     "LlamaConfig with its rope_theta, layer ids and torch_dtype"),
    # ---- round 2 --------------------------------------------------------------------------------------------------
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/_torch/speculative/eagle3.py",
     "commit f933a608045a46426792263617475b359d568043 (a 2025 version: eagle_choices in Eagle3SpecMetadata, no "
     "SpecWorkerBase); no 1.2-line or 2026 version was opened by commit", "2026-12-03",
     "Eagle3OneModelSpecMetadata.__post_init__ sets is_spec_dec_tree = False ('currently Eagle3 only supports linear "
     "tree'), and the one-model worker drafts max_draft_len tokens one per step; the two-model "
     "Eagle3SpecMetadata sets is_spec_dec_tree from eagle_choices and builds the tree (spec_tree_manager)"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/llmapi/llm_args.py (1.2 line)",
     "fork mikeiovine/TensorRT-LLM commit 1b1598c0c25ff230a26e1fde71ad5494b68be14a, dated by content (no tag: "
     "eagle_choices still a supported static tree, eagle3_model_arch llama3 / mistral_large3, Eagle3DecodingConfig a "
     "plain subclass); the later NVIDIA/TensorRT-LLM commit 0004396720054fd8e205cbf616f21f0b57c6b412 (2026 main) "
     "instead warns that the static tree is deprecated and will be removed in release 1.4",
     "2026-12-03",
     "EagleDecodingConfig: eagle3_one_model default True, spec_dec_mode EAGLE3_ONE_MODEL / EAGLE3; "
     "validate_eagle_choices warns 'The Draft token tree is still under development'; eagle_choices sets "
     "max_total_draft_tokens (to the number of choices)"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/models/modeling_utils.py", "commit b35ac1b64368513d215c57d2ed01d62d910df8da",
     "2026-12-03",
     "PretrainedModel.load: 'Exemption for embedding sharing': a parameter named *lm_head.weight is not required "
     "while any provided tensor ends in vocab_embedding.weight (likewise lm_head.per_channel_scale)"),
    ("NVIDIA/TensorRT-LLM:triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt", "commit 0a710573",
     "2026-12-03",
     "optional inputs image_url ('Only read when triton_config.multimodal is set') and lora_id / lora_name / "
     "lora_path / lora_ckpt_source (the first three together), besides the inputs read in round 1"),
    ("NVIDIA/TensorRT-LLM:triton_backend/all_models/llmapi/tensorrt_llm/1/model.py",
     "commit b35ac1b64368513d215c57d2ed01d62d910df8da",
     "2026-12-03", "_convert_request reads text_input, sampling, output config and streaming: no lora_*, no image_url"),
    ("NVIDIA/TensorRT-LLM:triton_backend/all_models/llmapi/tensorrt_llm/1/helpers.py",
     "commit 0df60f9ad779c4dc4f55da07e08b969fc4684e56 (the 2026 version read in round 1; it also has "
     "load_logits_post_processors); the earlier commit fab2f90bc62bcf0ca72d7dffbf31c3ddee6f948e has no LoRA helper",
     "2026-12-03",
     "get_lora_request_from_request: a LoRARequest from lora_id / lora_name / lora_path (all three or none), "
     "lora_ckpt_source 'hf' (or 'nemo'); a lora_path missing on the server's filesystem is refused"),
    ("triton-inference-server/tutorials:Popular_Models_Guide/Qwen2.5-VL/qwen2_5_vl_trtllm_guide.md", "commit 9511717",
     "2026-12-03",
     "image_url and triton_config.multimodal come from NVIDIA/TensorRT-LLM PR #18381, 'not merged and not present "
     "in any released TensorRT-LLM'; without multimodal the images are silently ignored"),
    ("NVIDIA/TensorRT-LLM:docs/source/installation/installation-guide.md",
     "commit 0360df4cd204813c7e007f389d95915b8aa89bfa (CUDA Toolkit 13.2, nightly wheel index): torch==2.12.0; the "
     "earlier commit 141006be24098c8b00b916d422bd24b5dbbd4909 (its example installs 1.3.0rc16) has the same recipe "
     "with torch==2.10.0",
     "2026-12-03",
     "pip recipe: PyTorch CUDA 13.0 build first (torch==2.12.0, pip's default is CUDA 12.8), apt-get install "
     "libopenmpi-dev, `pip3 uninstall nvidia-cutlass-dsl nvidia-cutlass-dsl-libs-base nvidia-cutlass-dsl-libs-core "
     "nvidia-cutlass-dsl-libs-cu12 nvidia-cutlass-dsl-libs-cu13` ('uninstall any previous CUTLASS DSL "
     "installation'), `pip3 install --ignore-installed pip \"setuptools<80\" wheel`, then tensorrt_llm; a torch "
     "constraints file keeps pip from replacing torch (builders/versions.py PIP_BOOTSTRAP, CUTLASS_DSL_PACKAGES)"),
    ("NVIDIA/TensorRT-LLM:requirements.txt", "commit 000867d9 (1.2 line)", "2026-12-03",
     "transformers==4.57.1, torch>=2.9.0a0,<=2.9.0 from the CUDA 13.0 index, mpi4py (the 1.4 pin was not read)"),
    ("triton-inference-server/tensorrtllm_backend:dockerfile/Dockerfile.triton.trt_llm_backend",
     "0b9d7d5 (main, 2026-07-14)", "2026-12-03",
     "CUDA torch copied from the NGC PyTorch image, mpi4py by TensorRT-LLM's docker/common/install_mpi4py.sh, then "
     "tensorrt_llm==${TENSORRTLLM_VER}; all_models / scripts copied to /app"),
    ("NVIDIA/TensorRT-LLM pull requests #12829, #16516", "2026-04 / 2026-07 threads", "2026-12-03",
     "#12829 (merged 2026-04): transformers 4.x -> 5.3.0, rope_parameters handling; #16516 (open 2026-07): 5.10.1"),
    ("NVIDIA/TensorRT-LLM issues #5260, #10458", "2025-06 / 2026-01 threads", "2026-12-03",
     "PyTorch backend with a float32 model: rmsnorm / FlashInfer append_paged_kv_cache 'failed to dispatch data type "
     "Float'; maintainers: most TensorRT-LLM custom kernels do not support float32"),
    ("huggingface/transformers:src/transformers/modeling_rope_utils.py + src/transformers/configuration_utils.py + "
     "src/transformers/models/llama/configuration_llama.py + src/transformers/models/auto/tokenization_auto.py",
     "4.57.3 and 5.24.0 wheels (run)", "2026-12-03",
     "4.57.3 reads a 5.x config (rope_parameters only) with rope_theta 10000 and no scaling and cannot load "
     "TokenizersBackend; checkpoint/hf_model loads with rope_theta, rope_scaling and the same token ids; 5.24.0 "
     "reads both alike (RotaryEmbeddingConfigMixin: rope_parameters first; PretrainedConfig takes torch_dtype)"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/_torch/model_config.py",
     "commit 008e0af8980fc560003631ba4ac37828836a91c8 (a 2026 main after v1.4.0rc4)", "2026-12-06",
     "from_pretrained reads hf_quant_config.json first and treats it as authoritative (_build_modelopt_quant_config: "
     "quant_algo, kv_cache_quant_algo, group_size, exclude_modules); config.json's quantization_config is compared "
     "with it (warn_if_inline_diverges) and read only when the file is absent"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/_torch/model_config.py ModelConfig.load_hf_quant_config",
     "commit 008e0af8980fc560003631ba4ac37828836a91c8 (a 2026 main after v1.4.0rc4)", "2026-12-07",
     "config.json quantization_config: quant_method fp8 with weight_block_size (asserted (128, 128)) or "
     "activation_scheme static -> FP8_BLOCK_SCALES, group_size 128, exclude *kv_b_proj*, *k_b_proj*, *eh_proj plus "
     "modules_to_not_convert; mxfp4 (group 32), mxfp8 ([1, 32] asserted), nvfp4 (group_size 16 asserted), "
     "compressed-tensors; ignored_layers / ignore excluded for every format; other methods set no quant_algo. "
     "QuantAlgo(value) takes the upper-case names of tensorrt_llm/quantization/mode.py"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/_torch/attention_backend/trtllm.py TrtllmAttention.__init__",
     "commit 9144c0e6a535f6f3108d870bc1eef158853cb2ea (the comment quoted here is in a later stored main version)",
     "2026-12-08",
     "kv_cache_scaling_factor = ones(1); kv_scale_quant_orig / kv_scale_orig_quant derived from it; the comment: "
     "they stay at 1.0 for the PyTorch backend, which never overrides them; modules/attention.py assigns "
     "forward_args.kv_scale_* only for an FP4 KV cache. modules/linear.py FP8QDQLinearMethod.create_weights: "
     "kv_scales / inv_kv_scales are 'K, V scales for NVFP4 KV cache'"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/_torch/modules/fused_moe/quantization.py",
     "commit 002366a4074cacd4f7be481727bea2e1eb9136a5", "2026-12-08",
     "FP8QDQFusedMoEMethod: per expert {e}.w1/w3/w2 weight, weight_scale, input_scale (VANILLA); "
     "requantize_expert_w3_w1_weight_fp8_qdq requantizes an expert's w1 and w3 to their larger weight_scale; "
     "load_activation_scales_fp8_qdq + process_weights_after_loading: one fc31 input scale (the largest w1/w3 "
     "input_scale of all experts) and one fc2 input scale (the largest w2 input_scale) per MoE layer"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/_torch/models/checkpoints/hf/qwen2_moe_weight_mapper.py",
     "commit 7a1198904a380af40fc09862bb5fd6b1131c3f7e", "2026-12-08",
     "Qwen2MoeHfWeightMapper.handle_special_instance_module: an MoE module's weights renamed gate_proj -> w1, "
     "up_proj -> w3, down_proj -> w2 and handed to MoE.load_weights (Qwen3MoeHfWeightMapper derives from it)"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/_torch/models/modeling_deepseekv3.py DeepseekV3ForCausalLM.load_weights",
     "commit 000561df0bd751d793257102bbe59cb4a64b2fd5", "2026-12-08",
     "kv_b_proj: load_kv_b_proj_and_k_b_proj_trans splits it into k_b_proj_trans / v_b_proj, its scale read as "
     "weight_scale_inv per 128 (or dequantized with weight_scale_inv when excluded); kv_a_proj_with_mqa: q_a_proj "
     "and kv_a_proj_with_mqa concatenated into fused_a, their weight_scale_inv concatenated: no per-tensor "
     "weight_scale / input_scale is read for them"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/_torch/models/modeling_glm.py Glm4MoeForCausalLM.load_weights",
     "commit 0406f8aa75104e96d80105563defd26ea0d9009a", "2026-12-08",
     "_load_weights_impl with params_map renaming the routed experts' (not shared_experts') gate_proj / up_proj / "
     "down_proj to w1 / w3 / w2 for the fused MoE; shared_experts a GatedMLP (fused gate_up); GLM4Attention with "
     "q/k/v biases (attention_bias) and no o_proj bias; DeepseekV3Gate loads weight and e_score_correction_bias"),
    ("nvidia-modelopt 0.47.0 (PyPI): modelopt/torch/export/unified_export_hf.py export_hf_checkpoint",
     "the installed package", "2026-12-08",
     "run on every tiny family row (FP8_DEFAULT_CFG + FP8_KV_CFG): dense and per-expert linears FP8 with scalar "
     "weight_scale / input_scale, routers and embeddings excluded; gpt-oss experts written fused (3-D); Nemotron-H's "
     "exclude_modules carry a sentinel suffix; DeepSeek-V4's wo_a left 16-bit unlisted; Llama 4 fails in "
     "model_utils.is_multimodal_model"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/_torch/modules/linear.py",
     "commit 00bbf71e796406ea8593a77cbfb828356182db16", "2026-12-06",
     "FP8QDQLinearMethod: float8_e4m3fn weight, scalar weight_scale and input_scale; fused q/k/v and gate/up "
     "requantized to the group's largest weight_scale (fp8 -> model dtype x own scale / max -> fp8), input_scale the "
     "group's largest; k_scale / v_scale loaded as kv_scales. NVFP4LinearMethod: packed e2m1 weight, e4m3 "
     "weight_scale per 16, weight_scale_2 and input_scale shared across a fused group (asserted)"),
)

UNVERIFIED: tuple[str, ...] = (
    "ModelOpt quantization per family row (core/capabilities.py, docs: 'Target architectures'): the routed experts' "
    "FP8 loading (FP8QDQFusedMoEMethod, fused_moe/quantization.py) was read at 002366a4, Qwen2MoeHfWeightMapper "
    "(the w1/w3/w2 renaming Qwen3-MoE inherits) at 7a119890, DeepSeek-V3's MLA weight loading at 000561df: main "
    "commits, not the v1.4.0rc4 tag. What ModelOpt's export writes per row was measured with nvidia-modelopt 0.47.0 "
    "and transformers 5.25 on the tiny random models of testkit/tiny_families.py, not on published checkpoints; no "
    "quantized MoE target was served on a GPU by this project.",
    "Capabilities per family row and the serving fields (docs: 'Target architectures', capability table; "
    "llmapi.option rows enable_attention_dp, moe_expert_parallel_size, moe_config, cuda_graph_config and the "
    "pass-through names): read at main commits, not at the v1.4.0rc4 tag: each row's EAGLE-3 capture at the commit "
    "its cell names, KVCacheManager.get_cache_size_per_token at d2a5560a, DSACacheManager's at eaf50262, the support "
    "matrix at 11d64858 (PR #9893), the dynamic-tree note at 04c8822c (PR #13081), _is_effective_dynamic_tree at "
    "edf63e81 (PR #15842: whether v1.4.0rc4 has it was not established; a top_k 1 tree is written as a chain either "
    "way), llm_args.py at fcd3f316 (enable_attention_dp, enable_lm_head_tp_in_adp, moe_expert_parallel_size, "
    "num_postprocess_workers, MoeConfig.use_low_precision_moe_combine, CudaGraphConfig). MoeConfig.backend's values, "
    "print_iter_log, stream_interval, trust_remote_code, enable_chunked_prefill, disable_overlap_scheduler, "
    "moe_tensor_parallel_size and kv_cache_config.max_tokens are as upstream's DeepSeek recipes and deployment guide "
    "set them (examples/models/core/deepseek_v3/README.md at 010892fd; the DeepSeek-R1 deployment guide), not read in "
    "llm_args.py. Per-rank weights with attention data parallelism count every non-expert weight whole on each rank "
    "(the dense MLP and shared experts are, modeling_glm.py / modeling_deepseekv3.py _compute_mlp_tp_size / "
    "_compute_shared_expert_tp_size at 0406f8aa; the LM head with enable_lm_head_tp_in_adp may be split: an upper "
    "bound). NVIDIA's published EAGLE-3 recipe for DeepSeek-V3 was not found; the serving fields follow its MTP ones.",
    "Quantized targets on the current line (hf_quant.* rows): the loader was read at 2026 main commits after "
    "v1.4.0rc4 (008e0af8, 00bbf71e), not at the tag; the FP8 KV cache scale kept at 1.0 was read in "
    "tensorrt_llm/_torch/attention_backend/trtllm.py TrtllmAttention.__init__ and the NVFP4-only use of k_scale / "
    "v_scale in modules/linear.py FP8QDQLinearMethod.create_weights in stored 2026 main versions whose commits the "
    "index did not name. "
    "No quantized checkpoint was served on a GPU by this project. The hf_quant.tensor names are the Hugging Face "
    "model's own as ModelOpt exports them; the upstream mapper that fuses q/k/v and gate/up at load was not read.",
    "The stored file versions could not be pinned to the exact tag commits (NVIDIA/TensorRT-LLM is too large to "
    "fetch; no copy at 48b7b5d8 = v1.1.0 or 36e34eef = release/1.2). Engine-flow files changed "
    "little across 1.x; the LLM API differences are bracketed by versions dated before and after the 1.1 branch.",
    "eagle3_layers_to_capture at v1.1.0: not proven, so 1.1 output never contains it (only the default layers).",
    "tensorrt_llm/_torch/models/modeling_speculative.py (EAGLE-3 head keys and tensor names): the stored version is "
    "a 2026 rewrite; the rows repeat the earlier reading recorded in builders/convert/eagle3.py.",
    "Current line (1.4): no file could be read at the v1.4.0rc4 tag; its rows rest on the 1.4.0rc docs signatures and "
    "on the stored 2026 versions of llm_args.py and of the llmapi model files (commit dates unknown). Not established: "
    "SamplingParams' default max_tokens (the CPU mirror uses 32), whether exclude_input_from_output changes "
    "text_output, the exact transformers pin of the 1.4 wheels (5.x since PR #12829; v5.3.0 is cited) and the torch "
    "version 1.4.0rc4 requires (docker/Dockerfile.current's TORCH_VERSION follows the install guide at commit "
    "0360df4c; the image build fails when the wheel's requirements disagree), nor whether its llmapi model.py reads "
    "lora_* / image_url.",
    "float32 on the PyTorch backend is refused on the strength of issues #5260 and #10458, not of a 1.4 source line "
    "that rejects it.",
    "1.2's two-model static tree (eagle3_one_model false) is read from eagle3.py, not run on a GPU.",
    "Target architectures: the modeling_*.py registrations were read in stored versions dated by content (2025-2026), "
    "not at the tags; a version's column repeats what those versions show for the whole 1.x line (the classes' base "
    "did not change between the versions read). Qwen2 / Mistral on the current line rest on PRs #17366 (two-model "
    "false overridden to one-model) and #18721 (two-model path removed) and on their classes not being "
    "SpecDecOneEngineForCausalLM in the newest versions read. Qwen3 one-model on 1.1 is not established by a file "
    "read at v1.1.0: PR #5879 (2025-07) added Qwen3 EAGLE-3 as two-model, and the one-model registration was read "
    "in a later version only.",
    "eagle3_one_model on the current line: that false raises since PR #18721 (rather than being overridden, as "
    "after #17366) was not read in a source line; what was read is that the two-model path was removed and the key "
    "is still accepted (true). We never write the key there.",
    "Sampling on the one-model path at v1.4.0rc4: the rules (penalties need enable_penalty, none with trees; "
    "logprobs / logits / min_p refused) were read at a 2026 main commit before 1.4.0rc1, not at the tag; the "
    "enable_penalty field itself is in the 1.4.0rc4 API reference. 1.1 / 1.2: not read; their ensemble contract "
    "declares no penalty, min_p or logprob input, so Triton refuses them there.",
    "Nothing here ran on TensorRT-LLM or a GPU: every row is read from source, not executed.",
)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _consumer(row: ledger_rows.Row) -> str:
    s = row.source
    refs = sorted({ledger_rows.ref_of(s.repo, v) for v in row.versions})
    return f"{s.repo}@{', '.join(refs)} `{s.path}` {s.symbol}"


def render() -> str:
    out = ["# Contract ledger: every name we write for TensorRT-LLM and Triton", "",
           "Generated by `python -m ledger.docs` from ledger/*.py; do not edit. "
           "`required`: the consumer fails without the name (under the listed conditions). Check a finished build "
           "with `python -m ledger.check CONFIG.yaml`.", "", "## Versions", "",
           "| trtllm_version | release | engine flow | EAGLE-1/2 heads | PyTorch EAGLE-3 | PyTorch static tree | "
           "PyTorch dynamic tree | eagle3_layers_to_capture | Triton layout | image |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    yes = {True: "yes", False: "no"}
    for v in trtllm_versions.VERSIONS.values():
        out.append(f"| {v.key} | {v.release} ({v.tag}) | {yes[v.engine_flow]} | {yes[v.eagle12_heads]} | "
                   f"{yes[v.pytorch_eagle3]} | {yes[v.pytorch_static_tree]} | {yes[v.pytorch_dynamic_tree]} | "
                   f"{yes[v.eagle3_layers_to_capture]} | {v.triton_layout} | {v.triton_image or '-'} |")
    out += ["", "## Target architectures", "", "Which target architectures (config.json `architectures[0]`) each path "
            "serves (builders/trtllm/architectures.py, the one table the preflight, these docs and the tests read).",
            ""] + architectures.markdown()
    surfaces: dict[str, list[ledger_rows.Row]] = {}
    for r in ledger.all_rows():
        surfaces.setdefault(r.surface, []).append(r)
    for surface, rows in surfaces.items():
        out += ["", f"## {surface}", "", "| name | versions | required | type | consumer | note |",
                "|---|---|---|---|---|---|"]
        for r in rows:
            req = ("yes" + (f" ({', '.join(r.when)})" if r.when else "")) if r.required else "no"
            if r.required and r.exempt_if_emitted_suffix:
                req += f", unless a name ending in `{r.exempt_if_emitted_suffix}` is written"
            out.append(f"| `{_cell(r.name)}` | {', '.join(r.versions)} | {req} | {_cell(r.type)} | "
                       f"{_cell(_consumer(r))} | {_cell(r.note)} |")
    out += ["", "## Upstream inputs we do not declare (llmapi model)", "",
            "| input | upstream | why |", "|---|---|---|"]
    out += [f"| `{_cell(n)}` | {_cell(f'{s.repo} `{s.path}` {s.symbol}')} | {_cell(why)} |"
            for n, s, why in ledger_llmapi.NOT_DECLARED]
    out += ["", "## Sources", "", "| file | version read | read on | established |", "|---|---|---|---|"]
    out += [f"| {_cell(f)} | {_cell(v)} | {on} | {_cell(what)} |" for f, v, on, what in SOURCES]
    out += ["", "## Not verified", ""] + [f"- {u}" for u in UNVERIFIED] + [""]
    return "\n".join(out)


def render_guide(text: str) -> str:
    """`text` (docs/bring-your-own-model.md) with the table between the architecture markers re-rendered."""
    a, b = architectures.GUIDE_BEGIN, architectures.GUIDE_END
    if a not in text or b not in text:
        raise ValueError(f"{GUIDE}: the markers {a} and {b} are missing")
    head, rest = text.split(a, 1)
    return head + a + "\n" + "\n".join(architectures.guide_table()) + "\n" + b + rest.split(b, 1)[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ledger.docs", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/contracts.md is not a fresh render")
    args = ap.parse_args(argv)
    text, guide = render(), GUIDE.read_text()
    if args.check:
        fresh = DOC.is_file() and DOC.read_text() == text and render_guide(guide) == guide
        print(f"{DOC}, {GUIDE.name}: {'fresh' if fresh else 'stale: run python -m ledger.docs'}")
        return 0 if fresh else 1
    DOC.write_text(text)
    GUIDE.write_text(render_guide(guide))
    print(f"wrote {DOC} ({len(ledger.all_rows())} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
