"""Render the contract ledger into docs/contracts.md: `python -m builders.trtllm.ledger_docs` (writes it) or
`--check` (exit 1 when the committed file is stale; tests/test_ledger.py runs the check).

`SOURCES` records what was read to establish the rows: the upstream file, the stored version read (the search index
keeps file versions by commit, not by tag: read_file at the tag commits reported none, so the versions read are
dated by their content), and what it showed. `UNVERIFIED` lists what could not be established.

Inputs:  the ledger in builders/trtllm/ledger_*.py
Outputs: docs/contracts.md (--check: exit 1 when stale)
Guide:   docs/contracts.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from builders.trtllm import ledger, ledger_rows, registry

DOC = Path(__file__).resolve().parents[2] / "docs" / "contracts.md"

SOURCES: tuple[tuple[str, str, str], ...] = (
    # (repository:path, version read, what it established)
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/models/eagle/config.py", "commit 0382a8ac",
     "EagleConfig keys; from_hugging_face copies the quantization block into eagle_net_config and excludes "
     "eagle_nets.{i}.lm_head"),
    ("NVIDIA/TensorRT-LLM:examples/eagle/convert_checkpoint.py", "index id 817366946",
     "eagle_net_config['quantization'].update(...) with exclude_modules += eagle_nets.{i}.lm_head"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/models/llama/config.py", "commit 04100fd0",
     "LLaMAConfig keys; from_hugging_face reads rope_theta with default 10000 (transformers-4 attribute)"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/models/modeling_utils.py", "index id 1189552800",
     "PretrainedConfig.__init__ (keyword-only required keys, unknown keys set as attributes), QuantConfig fields and "
     "fnmatch exclude_modules, PretrainedModel.load strict on missing tensors, kv_cache_rcp_scaling_factor derived"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/quantization/quantize.py", "index ids 235018984, 2456403896",
     "kv_cache_quantize gives every Attention of model.named_modules() a kv_cache_scaling_factor"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/models/eagle/model.py", "index id 714135431",
     "EagleNet = LLaMAModel drafter + lm_head; forward asserts the paged KV cache; accept plugin inputs"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/builder.py", "index id 205252225",
     "BuildConfig defaults (2048 / 1024 / None / 8192), _init_max_seq_len, build(): max_seq_len += max_draft_len "
     "(+ num_eagle_layers for EAGLE), EAGLE asserts max_batch_size <= 512 and max_draft_len <= 256"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/commands/build.py", "commit 008b2b8d", "trtllm-build flags and defaults"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/plugin/plugin.py", "index id 196834873", "plugin flag names and values"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/commands/serve.py", "commit 00209af1", "trtllm-serve options; the YAML "
     "overwrites trtllm-serve's values"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/llmapi/llm_args.py", "index ids 1520735490 (mid-2025, before the 1.1 branch), "
     "1090804222 (after it), 7019226376 (1.2 line)",
     "BaseLlmArgs / KvCacheConfig fields in all three; EagleDecodingConfig: eagle3_layers_to_capture and "
     "max_total_draft_tokens absent in the first, present in the others; from_dict pops decoding_type"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/_torch/attention_backend/trtllm.py", "index id 2450153673",
     "'only chained/linear tree is supported now' (PyTorch backend trees, 1.1 line)"),
    ("NVIDIA/TensorRT-LLM:docs/source/release-notes.md", "commit 001eaece",
     "transformers 4.56.0 in 1.1, 4.57.3 in 1.2; Triton backend base images"),
    ("NVIDIA/TensorRT-LLM:triton_backend/inflight_batcher_llm/src/model_instance_state.cc",
     "commit 0c8de69a (index id 4322035863) and index id 650404864",
     "parameters read and which are unconditional; fillTritonResponse writes 10 perf outputs"),
    ("NVIDIA/TensorRT-LLM:triton_backend/inflight_batcher_llm/src/model_state.cc", "commit 5cdd6921",
     "GetParameter throws 'Cannot find parameter with name'; boolean spellings"),
    ("NVIDIA/TensorRT-LLM:triton_backend/inflight_batcher_llm/src/utils.h", "commit 14c3afec",
     "input / output tensor names; getResponseBuffer throws when Triton refuses an output"),
    ("NVIDIA/TensorRT-LLM:triton_backend/inflight_batcher_llm/src/utils.cc", "index id 696271938",
     "splitBatchInputsTensors: input_lengths 1-D, per-row slicing"),
    ("NVIDIA/TensorRT-LLM:triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt", "commit 0c8de69a",
     "reshape / allow_ragged_batch per input; the guided-decoding parameters present"),
    ("NVIDIA/TensorRT-LLM:cpp/include/tensorrt_llm/batch_manager/llmRequest.h + llmRequest.cpp + "
     "cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp", "index ids 786144818, 572863852, 4152691838",
     "engine-flow EAGLE fills acceptance_rate / total_*_draft_tokens (see docs/deploy.md)"),
    ("triton-inference-server/tensorrtllm_backend:docs/model_config.md", "b9cc224 (v1.1.0 release #830; its "
     "tensorrt_llm submodule is NVIDIA/TensorRT-LLM 48b7b5d8)", "parameter documentation of the pinned release"),
    ("triton-inference-server/common:protobuf/model_config.proto", "r25.12 (c09e98a)", "ModelConfig fields"),
    ("triton-inference-server/core:src/infer_response.cc, src/model.cc", "r25.12 (8dbcc96)",
     "an output missing from the config is refused ('unexpected inference output')"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/llmapi/llm_args.py (current line)", "index commit 0004396 (2026, before PR "
     "#18210) and the published docs pages llm-api/reference/Eagle3DecodingConfig.html of 1.3.0rc27, 1.4.0rc1, "
     "1.4.0rc4", "Eagle3DecodingConfig fields and validators (dynamic tree bounds; speculative_model alias "
     "speculative_model_dir); eagle_choices listed in 1.3.0rc27, gone in 1.4.0rc1; eagle3_one_model absent from "
     "1.3.0rc27 on; the SpeculativeConfig union discriminated by decoding_type; BaseLlmArgs extra='forbid'"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/llmapi/llm_args.py DecodingBaseConfig (load-aware speculation)",
     "the published Eagle3DecodingConfig pages of 1.3.0rc27, 1.4.0rc1, 1.4.0rc4; index copies 55143598664 (main, "
     "after 1.4.0rc4) and 7019226376 (1.2 line)", "max_concurrency (int > 0), draft_len_schedule (dict[int, int]), "
     "acceptance_rate_window_size (int >= 0) / acceptance_rate_threshold ([0, 1]) on 1.3.0rc27..1.4.0rc4; the "
     "validator: thresholds >= 1, lengths >= 0 and <= max_draft_len, smallest threshold = max_draft_len (the 1.2 "
     "copy: key 1 required); max_concurrency and draft_len_schedule exclusive, max_concurrency -> {N: "
     "max_draft_len}; above the largest threshold no speculation. The 1.2 copy names the switch acceptance_window / "
     "acceptance_length_threshold and was not read at v1.2.0, so 1.2 is refused; later main renamed it again"),
    ("NVIDIA/TensorRT-LLM:tensorrt_llm/_torch/speculative/interface.py", "index copies 56267098755, 55097849426",
     "SpeculativeDecodingMode.support_dynamic_draft_len includes EAGLE-3 one-model"),
    ("NVIDIA/TensorRT-LLM:triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt", "index commits c8c6df08, "
     "0a710573", "the llmapi model's inputs/outputs (names, types, dims, optional); no max_batch_size, no "
     "model_transaction_policy, no parameters"),
    ("NVIDIA/TensorRT-LLM:triton_backend/all_models/llmapi/tensorrt_llm/1/model.py", "index commit 044a90d2",
     "model.yaml minus triton_config -> LLM(**args); triton_config.decoupled / max_batch_size read without default; "
     "'stop' input; streamed responses carry outputs[i].text; perf outputs built with the text_output dtype"),
    ("NVIDIA/TensorRT-LLM:triton_backend/all_models/llmapi/tensorrt_llm/1/helpers.py", "index commit 0df60f9a",
     "sampling_param_* inputs -> SamplingParams keyword arguments; streaming; return_* output flags"),
    ("NVIDIA/TensorRT-LLM pull requests #15907, #11723, #18210, #10124, #12062/#13081 (issues corpus)", "2026 threads",
     "engine-based Triton backend and templates removed (llmapi kept); trtllm-build deprecated then removed after "
     "1.3.0rc20; eagle_choices removed; Eagle3 decoding type; one-model dynamic trees"),
    ("triton-inference-server/server:docs/introduction/compatibility.md", "main 4b54459 / r26.08 6fa22ae",
     "newest NGC trtllm image rows: 26.07 -> TensorRT-LLM 1.2.1; no image carries 1.3/1.4"),
    ("huggingface/transformers 4.56.0 (PyPI wheel, run)", "AutoTokenizer.from_pretrained, AutoConfig.from_pretrained",
     "'TokenizersBackend does not exist'; the rewritten tokenizer_config.json loads with identical ids; the "
     "normalized EAGLE-3 head config of a transformers-5 head (rope_parameters, eagle_config) loads as LlamaConfig "
     "with its rope_theta, layer ids and torch_dtype"),
)

UNVERIFIED: tuple[str, ...] = (
    "The stored file versions could not be pinned to the exact tag commits (NVIDIA/TensorRT-LLM is too large to "
    "fetch; the index has no version at 48b7b5d8 = v1.1.0 or 36e34eef = release/1.2). Engine-flow files changed "
    "little across 1.x; the LLM API differences are bracketed by versions dated before and after the 1.1 branch.",
    "eagle3_layers_to_capture at v1.1.0: not proven, so 1.1 output never contains it (only the default layers).",
    "tensorrt_llm/_torch/models/modeling_speculative.py (EAGLE-3 head keys and tensor names): the stored version is "
    "a 2026 rewrite; the rows repeat the earlier reading recorded in builders/convert/eagle3.py.",
    "Current line (1.4): no file could be read at the v1.4.0rc4 tag; its rows rest on the 1.4.0rc docs signatures and "
    "on the stored 2026 versions of llm_args.py and of the llmapi model files (commit dates unknown). Not established: "
    "SamplingParams' default max_tokens (the CPU mirror uses 32), whether exclude_input_from_output changes "
    "text_output, and the transformers version of the 1.4 wheels.",
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
           "Generated by `python -m builders.trtllm.ledger_docs` from builders/trtllm/ledger_*.py; do not edit. "
           "`required`: the consumer fails without the name (under the listed conditions). Check a finished build "
           "with `python -m builders.ledger_check CONFIG.yaml`.", "", "## Versions", "",
           "| trtllm_version | release | engine flow | EAGLE-1/2 heads | PyTorch EAGLE-3 | PyTorch static tree | "
           "PyTorch dynamic tree | eagle3_layers_to_capture | Triton layout | image |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    yes = {True: "yes", False: "no"}
    for v in registry.VERSIONS.values():
        out.append(f"| {v.key} | {v.release} ({v.tag}) | {yes[v.engine_flow]} | {yes[v.eagle12_heads]} | "
                   f"{yes[v.pytorch_eagle3]} | {yes[v.pytorch_static_tree]} | {yes[v.pytorch_dynamic_tree]} | "
                   f"{yes[v.eagle3_layers_to_capture]} | {v.triton_layout} | {v.triton_image or '-'} |")
    surfaces: dict[str, list[ledger_rows.Row]] = {}
    for r in ledger.all_rows():
        surfaces.setdefault(r.surface, []).append(r)
    for surface, rows in surfaces.items():
        out += ["", f"## {surface}", "", "| name | versions | required | type | consumer | note |",
                "|---|---|---|---|---|---|"]
        for r in rows:
            req = ("yes" + (f" ({', '.join(r.when)})" if r.when else "")) if r.required else "no"
            out.append(f"| `{_cell(r.name)}` | {', '.join(r.versions)} | {req} | {_cell(r.type)} | "
                       f"{_cell(_consumer(r))} | {_cell(r.note)} |")
    out += ["", "## Sources", "", "| file | version read | established |", "|---|---|---|"]
    out += [f"| {_cell(f)} | {_cell(v)} | {_cell(what)} |" for f, v, what in SOURCES]
    out += ["", "## Not verified", ""] + [f"- {u}" for u in UNVERIFIED] + [""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m builders.trtllm.ledger_docs", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/contracts.md is not a fresh render")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        fresh = DOC.is_file() and DOC.read_text() == text
        print(f"{DOC}: {'fresh' if fresh else 'stale: run python -m builders.trtllm.ledger_docs'}")
        return 0 if fresh else 1
    DOC.write_text(text)
    print(f"wrote {DOC} ({len(ledger.all_rows())} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
