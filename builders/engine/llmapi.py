"""`engine.backend: pytorch`: the TensorRT-LLM LLM API options YAML and the `trtllm-serve` command.

Pinned API version: tensorrt_llm/llmapi/llm_args.py of the TensorRT-LLM 1.2 series (after PR #8366, Oct 2025,
which added `max_total_draft_tokens`; before main renamed the draft field to `speculative_model` and removed
`eagle_choices`, PR #18210, Aug 2026). What we write, and why:
- `speculative_config.decoding_type: Eagle`: in 1.x `Eagle` selects the EAGLE-3 worker on the PyTorch backend
  (EagleDecodingConfig.spec_dec_mode -> EAGLE3 / EAGLE3_ONE_MODEL); main keeps `Eagle` as an alias of `Eagle3`.
  The PyTorch backend runs EAGLE-3 heads only (EAGLE-1/2 checkpoints are incompatible, speculative-decoding docs),
  so `draft.type: eagle` is refused for this backend.
- `speculative_model_dir`: the 1.x field name; main accepts it as a validation alias of `speculative_model`.
- `max_draft_len` = number of drafting steps (tree depth); `max_total_draft_tokens` = number of tree nodes
  ("max_total_draft_tokens >= max_draft_len" for trees). A chain is the default linear tree: for it we write
  neither `eagle_choices` nor `max_total_draft_tokens`, so the YAML also loads on 1.0/1.1.
- static tree: `eagle_choices`; dynamic tree: `use_dynamic_tree: true`, `dynamic_tree_max_topK`,
  `max_total_draft_tokens` (required there), with max_draft_len <= max_total_draft_tokens <=
  dynamic_tree_max_topK * max_draft_len (main's validator).
- `eagle3_layers_to_capture`: indices of target layers whose OUTPUT is captured (upstream default
  {1, L//2 - 1, L - 4}); our config and EAGLE's code index the layer whose INPUT is fused (2, L//2, L-3), so the
  rendered value is ours minus one (output of layer i-1 = input of layer i).
- `kv_cache_config.dtype: fp8` for an FP8 KV cache; `free_gpu_memory_fraction`.
`trtllm-serve MODEL --backend pytorch ... --extra_llm_api_options FILE` (tensorrt_llm/commands/serve.py; main
also spells it `--config`): values in the YAML apply unless a flag is given explicitly, so limits live in the YAML
only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from builders.config import BuildConfig

TRTLLM_SERVE = "trtllm-serve"
OPTIONS_FILE = "llm_api_options.yaml"
LLMAPI_VERSION_NOTE = "tensorrt_llm/llmapi/llm_args.py, TensorRT-LLM 1.2 series (decoding_type Eagle, speculative_model_dir)"


class LlmApiError(ValueError):
    """The config cannot be expressed for the LLM API; the message says what to change."""


def llmapi_problems(cfg: BuildConfig) -> list[str]:
    p: list[str] = []
    if cfg.engine.backend != "pytorch":
        return [f"engine.backend={cfg.engine.backend}: the LLM API YAML is only for engine.backend=pytorch"]
    if cfg.draft.type != "eagle3":
        p.append(
            "draft.type=eagle with engine.backend=pytorch: TensorRT-LLM's PyTorch backend runs EAGLE-3 heads only "
            "(EAGLE-1/2 checkpoints are incompatible); use draft.type=eagle3, or engine.backend tensorrt/reference"
        )
    if cfg.quantization.weights == "fp8":
        p.append(
            "quantization.weights=fp8 with engine.backend=pytorch: this builder exports FP8 only as a TRT-LLM "
            "checkpoint (engine flow / reference engine); give an FP8 Hugging Face target instead, or use "
            "engine.backend tensorrt/reference"
        )
    dyn = cfg.tree.dynamic
    if dyn is not None and dyn.total_draft_tokens > dyn.top_k * dyn.depth:
        p.append(
            f"tree.dynamic.total_draft_tokens={dyn.total_draft_tokens} > top_k * depth = {dyn.top_k * dyn.depth}: "
            "TensorRT-LLM's dynamic tree keeps at most dynamic_tree_max_topK * max_draft_len tokens; lower it"
        )
    if dyn is not None and dyn.total_draft_tokens < dyn.depth:
        p.append(f"tree.dynamic.total_draft_tokens={dyn.total_draft_tokens} < depth={dyn.depth}; raise it")
    return p


def layers_to_capture(input_layer_ids: list[int], num_target_layers: int) -> list[int]:
    """Our input-indexed EAGLE-3 layer ids -> TRT-LLM's output-indexed `eagle3_layers_to_capture` (sorted)."""
    if len(set(input_layer_ids)) != len(input_layer_ids):
        raise LlmApiError(
            f"EAGLE-3 layer ids {input_layer_ids} repeat a layer: TensorRT-LLM takes `eagle3_layers_to_capture` as a "
            "set, so the head's fc input width would not match; this head cannot run on the PyTorch backend"
        )
    out = []
    for i in input_layer_ids:
        if not 1 <= i < num_target_layers:
            raise LlmApiError(
                f"EAGLE-3 layer id {i}: TensorRT-LLM captures layer OUTPUTS, so the input of layer {i} must be the "
                f"output of layer {i - 1}; ids must lie in 1..{num_target_layers - 1} "
                "(set draft.eagle3.layers_to_capture)"
            )
        out.append(i - 1)
    return sorted(out)


def resolve_input_layer_ids(cfg: BuildConfig, head_config: dict[str, Any]) -> list[int]:
    """draft.eagle3.layers_to_capture, else the head's `eagle_aux_hidden_state_layer_ids` (an error if neither)."""
    if cfg.draft.eagle3.layers_to_capture is not None:
        return list(cfg.draft.eagle3.layers_to_capture)
    if "eagle_aux_hidden_state_layer_ids" not in head_config:
        raise LlmApiError(
            "the EAGLE-3 head's config.json has no `eagle_aux_hidden_state_layer_ids`; "
            "set draft.eagle3.layers_to_capture"
        )
    return [int(x) for x in head_config["eagle_aux_hidden_state_layer_ids"]]


def is_chain(paths: list[list[int]]) -> bool:
    """A linear tree: one node per depth, always the top-1 child."""
    return all(all(r == 0 for r in p) for p in paths) and len({len(p) for p in paths}) == len(paths)


def speculative_config(cfg: BuildConfig, draft_dir: Path, capture: list[int]) -> dict[str, Any]:
    lim = cfg.limits()
    spec: dict[str, Any] = {
        "decoding_type": "Eagle",
        "max_draft_len": lim.num_eagle_layers,
        "speculative_model_dir": str(draft_dir),
        "eagle3_one_model": True,
        "eagle3_layers_to_capture": capture,
    }
    tree, dyn = cfg.static_tree(), cfg.dynamic_tree()
    if tree is not None:
        if not is_chain(tree.as_lists()):
            spec["max_total_draft_tokens"] = lim.max_draft_len
            spec["eagle_choices"] = tree.to_yaml_obj()
    else:
        assert dyn is not None  # BuildConfig guarantees exactly one of the two
        spec["max_total_draft_tokens"] = lim.max_draft_len
        spec["use_dynamic_tree"] = True
        spec["dynamic_tree_max_topK"] = dyn.top_k
    return spec


def llm_api_options(cfg: BuildConfig, draft_dir: Path, capture: list[int]) -> dict[str, Any]:
    """The whole options mapping (pure). Raises LlmApiError listing every problem."""
    problems = llmapi_problems(cfg)
    if problems:
        raise LlmApiError("; ".join(problems))
    lim, e = cfg.limits(), cfg.engine
    return {
        "tensor_parallel_size": cfg.parallel.tp,
        "pipeline_parallel_size": cfg.parallel.pp,
        "max_batch_size": e.max_batch_size,
        "max_num_tokens": lim.max_num_tokens,
        "max_seq_len": e.max_seq_len,
        "max_input_len": e.max_input_len,
        "dtype": cfg.target.dtype,
        "kv_cache_config": {
            "dtype": "fp8" if cfg.quantization.kv_cache == "fp8" else "auto",
            "free_gpu_memory_fraction": cfg.triton.kv_cache_free_gpu_mem_fraction,
            # Tree verification writes KV for rejected draft tokens; upstream's EAGLE-3 recipes turn block reuse
            # off so no request reuses blocks holding them.
            "enable_block_reuse": False,
        },
        "speculative_config": speculative_config(cfg, draft_dir, capture),
    }


def dump_options(options: dict[str, Any]) -> str:
    """YAML text; eagle_choices stay one flow-style list per path so the file diffs well."""
    return yaml.safe_dump(json.loads(json.dumps(options)), sort_keys=False, default_flow_style=None, width=120)


def trtllm_serve_argv(target_dir: Path, options_file: Path, host: str = "0.0.0.0", port: int = 8000) -> list[str]:
    """`trtllm-serve` for the HF target directory with our options file (pure)."""
    return [
        TRTLLM_SERVE, str(target_dir),
        "--backend", "pytorch",
        "--tokenizer", str(target_dir),
        "--host", host,
        "--port", str(port),
        "--extra_llm_api_options", str(options_file),
    ]  # fmt: skip
