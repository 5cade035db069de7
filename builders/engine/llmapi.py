"""`engine.backend: pytorch`: the TensorRT-LLM LLM API options YAML and the `trtllm-serve` command.

What may be written depends on the config's `trtllm_version` (core/trtllm_versions.py); every key is a row of the
contract ledger (ledger/llmapi.py, cited to tensorrt_llm/llmapi/llm_args.py of each version):
- `speculative_config.decoding_type` selects the EAGLE-3 worker on the PyTorch backend: `Eagle` on 1.1/1.2
  (EagleDecodingConfig.spec_dec_mode -> EAGLE3 / EAGLE3_ONE_MODEL), `Eagle3` on the current line
  (Eagle3DecodingConfig); `speculative_model_dir` (1.1/1.2) or `speculative_model` (current line) names the head;
  `eagle3_one_model` only where false still selects the two-model path, 1.1 / 1.2 (true for chains, false for a
  static tree); the current line accepts the key but runs one-model only (PRs #17366, #18721), so it is left out;
- `max_draft_len` = number of drafting steps (tree depth). A chain is the default linear tree: nothing else is
  written, which every supported version accepts;
- a static tree (versions with `pytorch_static_tree`): `eagle_choices` and, where the field exists,
  `max_total_draft_tokens` (= the number of tree nodes), with `eagle3_one_model: false`: only the two-model path
  builds a tree (1.2's one-model worker drafts chains);
- a dynamic tree (versions with `pytorch_dynamic_tree`, i.e. the current line): `use_dynamic_tree`,
  `dynamic_tree_max_topK`, `max_total_draft_tokens`, with max_draft_len <= max_total_draft_tokens <=
  dynamic_tree_max_topK * max_draft_len; top_k 1 is written as a chain (upstream routes it to the linear path,
  PR #15842); targets served with chains only are refused a dynamic tree (builders/trtllm/rules.py);
- `serving:` (builders/serving_config.py): enable_attention_dp, moe_expert_parallel_size, moe_config,
  cuda_graph_config, and the checked pass-through `serving.extra_llm_api_options`, merged last;
- `eagle3_layers_to_capture`: target layers whose OUTPUT is captured (upstream default {1, L//2 - 1, L - 4}); our
  config and EAGLE's code index the layer whose INPUT is fused (2, L//2, L-3), so the value is ours minus one. Written
  where the field exists; elsewhere only the default is possible and it is left out (rules.capture_problems);
- load-aware speculation (versions with `load_aware_speculation`): `draft_len_schedule` ({batch threshold: draft
  length}, `auto` = the measured one), `max_concurrency`, `acceptance_rate_window_size` / `acceptance_rate_threshold`
  (builders/speculation.py; the reference engine's semantics in engines/schedule.py);
- `enable_penalty` (tree.enable_penalty; the current line, chains): presence / frequency penalties on the one-model
  path, which refuses them without it;
- `kv_cache_config.dtype: fp8` for an FP8 KV cache; `free_gpu_memory_fraction`.
`trtllm-serve MODEL --backend pytorch ... --extra_llm_api_options FILE` (tensorrt_llm/commands/serve.py): the YAML
overrides trtllm-serve's own values, so the limits live in the YAML only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from builders.config import BuildConfig
from builders.serving_config import merged
from builders.trtllm import architectures
from builders.trtllm.rules import capture_problems, default_capture
from core.hfconfig import ModelConfigError, aux_layer_ids
from core.trees import DraftTree, DynamicTree

TRTLLM_SERVE = "trtllm-serve"
OPTIONS_FILE = "llm_api_options.yaml"


class LlmApiError(ValueError):
    """The config cannot be expressed for the LLM API; the message says what to change."""


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
    try:
        ids = aux_layer_ids(head_config, Path("eagle3/config.json"))
    except ModelConfigError as e:
        raise LlmApiError(str(e)) from None
    if ids is None:
        raise LlmApiError(
            "the EAGLE-3 head's config.json has no `eagle_aux_hidden_state_layer_ids`; "
            "set draft.eagle3.layers_to_capture"
        )
    return ids


def speculative_config(cfg: BuildConfig, draft_dir: Path, capture: list[int], num_target_layers: int,
                       target_arch: str = "LlamaForCausalLM") -> dict[str, Any]:
    """`speculative_config` for the config's TensorRT-LLM version (pure); `target_arch` picks one- or two-model
    EAGLE-3 from the architecture table (builders/trtllm/architectures.py)."""
    v = cfg.version
    row = architectures.get(target_arch)
    mode = None if row is None else row.pytorch_mode(v.key)
    if mode is None:  # the convert stage's preflight refuses it; a BuildConfig made by hand may still hold one
        raise LlmApiError("; ".join(architectures.problems(target_arch, version=v.key, backend="pytorch",
                                                           draft_type="eagle3", where="(the converted target)")))
    lim = cfg.limits()
    spec: dict[str, Any] = {
        "decoding_type": v.decoding_type,
        "max_draft_len": lim.num_eagle_layers,
        v.speculative_model_key: str(draft_dir),
    }
    tree = cfg.draft_tree
    static_tree = isinstance(tree, DraftTree) and not tree.is_chain()
    if v.eagle3_one_model_field:
        # A static tree runs on the two-model path only: the one-model worker drafts a chain whatever eagle_choices
        # says (tensorrt_llm/_torch/speculative/eagle3.py: Eagle3OneModelSpecMetadata sets is_spec_dec_tree = False;
        # Eagle3SpecMetadata, the two-model one, builds the tree from eagle_choices). A target class that is not a
        # SpecDecOneEngineForCausalLM runs two-model only (builders/trtllm/architectures.py).
        spec["eagle3_one_model"] = mode == architectures.ONE and not static_tree
    if v.eagle3_layers_to_capture:
        spec["eagle3_layers_to_capture"] = capture
    elif sorted(capture) != default_capture(num_target_layers):
        raise LlmApiError("; ".join(capture_problems(v.key, capture, num_target_layers)))
    if static_tree and isinstance(tree, DraftTree):
        if not v.static_trees:  # the config validation refuses it; a BuildConfig made by hand may still hold one
            raise LlmApiError(f"{v.name} has no static trees (eagle_choices); use tree.dynamic or a chain")
        if v.max_total_draft_tokens:
            spec["max_total_draft_tokens"] = lim.max_draft_len
        spec["eagle_choices"] = tree.as_lists()  # the LLM API YAML value: plain lists
    elif isinstance(tree, DynamicTree) and tree.top_k > 1:  # top_k 1 is a chain (upstream: the linear path)
        spec["max_total_draft_tokens"] = lim.max_draft_len
        spec["use_dynamic_tree"] = True
        spec["dynamic_tree_max_topK"] = tree.top_k
    spec.update(load_aware_fields(cfg))
    if cfg.tree.enable_penalty:  # builders/trtllm/rules.py allows it on the versions that have it, chains only
        spec["enable_penalty"] = True
    return spec


def load_aware_fields(cfg: BuildConfig) -> dict[str, Any]:
    """draft_len_schedule (`auto`: the measured one), max_concurrency, acceptance_rate_window_size/_threshold, where
    set; only versions with `load_aware_speculation` get here (builders/trtllm/rules.py refuses the others)."""
    t, out = cfg.tree, dict[str, Any]()
    schedule = cfg.draft_len_schedule()
    if schedule is not None or t.max_concurrency is not None or t.acceptance_rate_window_size:
        v = cfg.version
        if not v.load_aware_speculation:
            raise LlmApiError(f"{v.name} has no draft_len_schedule / max_concurrency / acceptance_rate_* fields; "
                              "set trtllm_version: '1.4' or remove them")
    if schedule is not None:
        out["draft_len_schedule"] = schedule
    if t.max_concurrency is not None:
        out["max_concurrency"] = t.max_concurrency
    if t.acceptance_rate_window_size:
        out["acceptance_rate_window_size"] = t.acceptance_rate_window_size
        out["acceptance_rate_threshold"] = t.acceptance_rate_threshold
    return out


def llm_api_options(cfg: BuildConfig, draft_dir: Path, capture: list[int], num_target_layers: int,
                    target_arch: str = "LlamaForCausalLM") -> dict[str, Any]:
    """The whole options mapping (pure). The config was validated against its TensorRT-LLM version when loaded
    (builders/trtllm/rules.py); a capture set that version cannot express raises LlmApiError."""
    llmapi_layout = cfg.version.triton_layout == "llmapi"
    if not cfg.engine.kind.llmapi_model and not (cfg.engine.kind.reference_engine and llmapi_layout):
        raise LlmApiError(f"engine.backend={cfg.engine.backend}: the LLM API YAML is for engine.backend=pytorch (and "
                          "the reference engine's mirror of the Triton llmapi model)")
    lim, e = cfg.limits(), cfg.engine
    base = {
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
        "speculative_config": speculative_config(cfg, draft_dir, capture, num_target_layers, target_arch),
        **cfg.serving.options(),
    }
    return merged(base, cfg.serving.extra_llm_api_options)


def plain(value: Any) -> Any:
    """Plain YAML data: tuples -> lists, paths -> strings; integer mapping keys stay integers (draft_len_schedule is
    dict[int, int] upstream), which a JSON round trip would turn into strings."""
    if isinstance(value, dict):
        return {k if isinstance(k, int) else str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return str(value) if isinstance(value, Path) else value


def dump_options(options: dict[str, Any]) -> str:
    """YAML text; eagle_choices stay one flow-style list per path so the file diffs well."""
    return yaml.safe_dump(plain(options), sort_keys=False, default_flow_style=None, width=120)


def trtllm_serve_argv(target_dir: Path, options_file: Path, host: str = "0.0.0.0", port: int = 8000, *,
                      backend_flag: bool = True) -> list[str]:
    """`trtllm-serve` for the HF target directory with our options file (pure). `backend_flag` False: leave out
    `--backend` (the current line: pytorch is the only backend and the default)."""
    return [
        TRTLLM_SERVE, str(target_dir),
        *(("--backend", "pytorch") if backend_flag else ()),
        "--tokenizer", str(target_dir),
        "--host", host,
        "--port", str(port),
        "--extra_llm_api_options", str(options_file),
    ]
