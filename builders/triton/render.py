"""Render a complete Triton model repository from the config and the build outputs.

One ensemble contract (triton_repo/contract.py) for all backends; only the `tensorrt_llm` step differs:
  - tensorrt : the C++ `tensorrtllm` backend on `<build>/engine` (inflight fused batching, decoding_mode eagle,
               eagle_choices in the backend's brace syntax);
  - pytorch  : a python model running the TensorRT-LLM LLM API from `model.yaml` (EAGLE-3), token ids in/out;
  - reference: a python model running this project's reference engine on the build directory.
preprocessing, postprocessing, ensemble and tensorrt_llm_bls are the same python models for all three.

Configs are built as `ModelConfig` protobuf messages (tritonclient.grpc.model_config_pb2) and written with
text_format, so every file is valid by construction and no `${placeholder}` can survive; a value we cannot fill is
a RenderError naming the field and the fix. A `client.json` descriptor of the ensemble goes to the repository root
(tritonserver ignores plain files there).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import yaml
from tritonclient.grpc import model_config_pb2 as mc

from builders import layout as build_layout
from core.atomic import TEMP_MARKER
from builders.config import BuildConfig
from builders.engine.llmapi import OPTIONS_FILE as LLMAPI_OPTIONS_FILE
from builders.triton import render_llmapi as RL
from builders.triton.pbtxt import (
    RenderError,
    _add_inputs,
    _add_outputs,
    _base,
    _batching,
    _decoupled,
    _instances,
    _params,
    to_text,
)
from core.trees import DraftTree
from triton_repo import contract as C
from triton_repo.models import guard as G
from triton_repo.models.bootstrap import BOOTSTRAP_MODULE

SERVE_PACKAGE = Path(C.__file__).resolve().parent  # triton_repo/: what the rendered models run
MODELS_SRC = SERVE_PACKAGE / "models"
CLIENT_FILE = "client.json"


# ---- models shared by all backends --------------------------------------------------------------------------------



def triton_eagle_choices(tree: DraftTree) -> str:
    """The tree in the tensorrtllm backend's `eagle_choices` syntax: `{0}, {0,0}, ...` (the backend parses braces,
    not brackets; tensorrtllm_backend inflight_batcher_llm/src/model_instance_state.cc)."""
    return ", ".join("{" + ",".join(map(str, p)) + "}" for p in tree.paths)

def _python_common(build_dir: Path) -> dict[str, str]:
    return {"tokenizer_dir": str(tokenizer_dir(build_dir))}


# preprocessing emits it, the ensemble carries it to the python LLM model, which checks it (models/guard.py)
TOKEN_OUT = C.Tensor(G.TOKEN, "TYPE_STRING", (1,))
TOKEN_IN = C.Tensor(G.TOKEN, "TYPE_STRING", (1,), True)


def handle_wired(bc: BuildConfig) -> bool:
    """Whether the python LLM model's per-request handle goes to postprocessing (contract.HANDLE_OUTPUT): a python
    LLM model (the C++ backend writes no such output) that streams (only then can a later response be cancelled)."""
    return bc.triton.streaming and not bc.engine.kind.cpp_triton_model


def internal_guard(bc: BuildConfig) -> bool:
    """Whether the python models guard the internal ones (models/guard.py). Never with engine.backend tensorrt:
    the C++ tensorrtllm backend cannot check a secret, so there the gateway must expose only the entry models."""
    return not bc.triton.expose_internal_models and not bc.engine.kind.cpp_triton_model


# Path parameters, written relative to the repository's directory so a build whose repository sits inside it can be
# moved. The python models resolve them against the repository at start-up (triton_repo/models/common.py
# Params.path). The C++ tensorrtllm backend opens gpt_model_path as given (NVIDIA/TensorRT-LLM@c8c6df08
# triton_backend/inflight_batcher_llm/src/model_instance_state.cc ModelInstanceState::ModelInstanceState:
# std::filesystem::exists, then the Executor), so a relative path is relative to the server's working directory:
# triton_repo/launch.py starts tritonserver in the repository directory. Its tokenizer_dir is read but unused there
# (getGuidedDecodingConfigFromParams: 'does not use tokenizer_dir').
REPOSITORY_RELATIVE = ("tokenizer_dir", "build_dir", "gpt_model_path")


def _repository_relative(cfg: mc.ModelConfig, out: Path) -> mc.ModelConfig:
    for key in REPOSITORY_RELATIVE:
        if key in cfg.parameters:
            value = cfg.parameters[key].string_value
            cfg.parameters[key].string_value = os.path.relpath(value, out.resolve())
    return cfg


def tokenizer_dir(build_dir: Path) -> Path:
    tok = (build_dir / build_layout.CHECKPOINT / build_layout.TOKENIZER).resolve()
    if not (tok / "tokenizer_config.json").is_file():
        raise RenderError(
            f"tokenizer not found at {tok} (no tokenizer_config.json); run the checkpoint stage first: "
            "`python builders/build.py CONFIG --only checkpoint`"
        )
    return tok


def perf_bridged(bc: BuildConfig, perf_bridge: bool | None) -> bool:
    """Whether the ensemble bridges the LLM model's perf outputs to the speculative metrics (models/perf_bridge.py):
    always for the C++ backend (it exports none itself); on request for the reference backend, which then writes its
    perf outputs as the C++ backend does (a CPU twin of the engine flow's wiring)."""
    if bc.engine.kind.cpp_triton_model:
        return True
    if perf_bridge and not bc.engine.kind.reference_engine:
        raise RenderError(f"perf_bridge: engine.backend={bc.engine.backend!r} exports its own metrics; the bridge "
                          "serves engine.backend tensorrt (and the reference twin of its wiring)")
    return bool(perf_bridge)


def draft_tokens_per_step(bc: BuildConfig) -> int:
    """What one generation step adds to the perf output total_draft_tokens, so forwards = drafted / it. The C++
    runtime adds min(draft tokens, getMaxDraftPathLen()) (NVIDIA/TensorRT-LLM cpp/include/tensorrt_llm/batch_manager/
    llmRequest.h `LlmRequest::updateNumTokensPerIteration`); the reference engine adds the tree's nodes."""
    tree = bc.static_tree()
    if tree is None:
        raise RenderError("the perf bridge needs tree.choices (a static tree): forwards are derived from the drafted "
                          "tokens per step")
    # the engine's max draft path length is num_eagle_layers (the tree's depth unless the config overrides it)
    return min(tree.size, bc.limits().num_eagle_layers) if bc.engine.kind.cpp_triton_model else tree.size


def preprocessing_config(bc: BuildConfig, build_dir: Path, bridged: bool = False) -> mc.ModelConfig:
    t = bc.triton
    cfg = _base(t.preprocessing_model, bc.request_limits().max_batch_size, backend="python")
    required = tuple(k for k, v in C.PREPROCESSING_INPUT_MAP.items() if v in C.REQUIRED_HELP)
    _add_inputs(cfg, C.PREPROCESSING_INPUTS + ((C.PREPROCESSING_PERF_INPUT,) if bridged else ()),
                checked_by_model=required)
    _add_outputs(cfg, C.PREPROCESSING_OUTPUTS + ((C.PREPROCESSING_PERF_OUTPUT,) if bridged else ())
                 + ((TOKEN_OUT,) if internal_guard(bc) else ()))
    _params(cfg, {
        **_python_common(build_dir),
        "internal_guard": internal_guard(bc),
        "add_special_tokens": C.ADD_SPECIAL_TOKENS,
        "max_input_len": bc.request_limits().max_input_len,
        "max_seq_len": bc.request_limits().max_seq_len,
        # engine-flow EAGLE accepts drafts greedily (token equality): refuse sampling requests there
        "greedy_only": bc.engine.kind.greedy_only,
        "perf_bridge": bridged,
    })
    _instances(cfg, t.preprocessing_instances)
    return cfg


def postprocessing_config(bc: BuildConfig, build_dir: Path, bridged: bool = False) -> mc.ModelConfig:
    t = bc.triton
    cfg = _base(t.postprocessing_model, bc.request_limits().max_batch_size, backend="python")
    _add_inputs(cfg, C.POSTPROCESSING_INPUTS + (C.POSTPROCESSING_PERF_INPUTS if bridged else ())
                + ((C.HANDLE_INPUT,) if handle_wired(bc) else ()))
    _add_outputs(cfg, C.POSTPROCESSING_OUTPUTS)
    _params(cfg, {
        **_python_common(build_dir),
        "skip_special_tokens": C.SKIP_SPECIAL_TOKENS,
        # 0: no perf bridge (the python LLM models count their own metrics)
        "draft_tokens_per_step": draft_tokens_per_step(bc) if bridged else 0,
        # where a cancelled step's stop request goes (models/stop_relay.py); also the perf bridge's `model` label
        "llm_model": t.llm_model,
        "decoupled": t.streaming,  # the LLM model takes stop requests (models/stop_relay.py)
    })
    # No dynamic_batching: its queue refuses the cancelled requests of an abandoned ensemble stream unseen (core
    # scheduler_utils.cc PriorityQueue::PolicyQueue::ApplyPolicy), so the model could not relay their stop, and on
    # Triton 2.51 a refused step left the ensemble request in flight for good (docs/triton.md, "Cancellation").
    _instances(cfg, t.postprocessing_instances)
    return cfg


def ensemble_config(bc: BuildConfig, bridged: bool = False) -> mc.ModelConfig:
    t = bc.triton
    cfg = _base(t.ensemble_model, bc.request_limits().max_batch_size, platform="ensemble")
    # text_input and max_tokens are required but declared optional (upstream's template declares them required):
    # Triton 2.51 (core r24.10 InferenceRequest::Normalize) checks only the NUMBER of inputs, so a request that
    # omits max_tokens but sends another optional input passes, the ensemble never schedules the preprocessing step
    # that needs it and ends the request with an empty success. Declared optional, the request reaches
    # preprocessing, which refuses it with INVALID_ARGUMENT naming the input (models/preprocessing.py `_required`).
    _add_inputs(cfg, C.ENSEMBLE_INPUTS, checked_by_model=tuple(C.REQUIRED_HELP))
    _add_outputs(cfg, C.ENSEMBLE_OUTPUTS)
    llm_out, post_in = C.LLM_OUTPUT_MAP, C.POSTPROCESSING_INPUT_MAP
    token = {G.TOKEN: G.TOKEN_TENSOR} if internal_guard(bc) else {}  # never an ensemble output: clients never see it
    pre_in, pre_out, llm_in = (
        C.PREPROCESSING_INPUT_MAP,
        {**C.PREPROCESSING_OUTPUT_MAP, **token},
        {**C.LLM_INPUT_MAP, **token},
    )
    if bridged:  # every request asks for the perf outputs; postprocessing counts them (models/perf_bridge.py)
        pre_in = {**pre_in, **C.PREPROCESSING_PERF_INPUT_MAP}
        pre_out = {**pre_out, **C.PREPROCESSING_PERF_OUTPUT_MAP}
        llm_in = {**llm_in, **C.LLM_PERF_INPUT_MAP}
        llm_out = {**llm_out, **C.LLM_PERF_OUTPUT_MAP}
        post_in = {**post_in, **C.POSTPROCESSING_PERF_INPUT_MAP}
    if handle_wired(bc):  # postprocessing stops the request of a client that went away (models/stop_relay.py)
        llm_out = {**llm_out, **C.LLM_HANDLE_OUTPUT_MAP}
        post_in = {**post_in, **C.POSTPROCESSING_HANDLE_INPUT_MAP}
    for model, imap, omap in (
        (t.preprocessing_model, pre_in, pre_out),
        (t.llm_model, llm_in, llm_out),
        (t.postprocessing_model, post_in, C.POSTPROCESSING_OUTPUT_MAP),
    ):
        step = cfg.ensemble_scheduling.step.add()
        step.model_name = model
        step.model_version = -1
        step.input_map.update(imap)
        step.output_map.update(omap)
    return cfg


def bls_config(bc: BuildConfig, build_dir: Path, bridged: bool = False) -> mc.ModelConfig:
    t = bc.triton
    cfg = _base(t.bls_model, bc.request_limits().max_batch_size, backend="python")
    _add_inputs(cfg, C.ENSEMBLE_INPUTS)
    _add_outputs(cfg, C.ENSEMBLE_OUTPUTS)
    _params(cfg, {
        **_python_common(build_dir),
        "preprocessing_model": t.preprocessing_model,
        "llm_model": t.llm_model,
        "decoupled": t.streaming,
        "internal_guard": internal_guard(bc),
        "draft_tokens_per_step": draft_tokens_per_step(bc) if bridged else 0,  # 0: no perf bridge
    })
    _decoupled(cfg, t.streaming)
    _instances(cfg, t.bls_instances)
    return cfg


# ---- the LLM model, per backend -----------------------------------------------------------------------------------


def tensorrt_llm_config(bc: BuildConfig, build_dir: Path) -> mc.ModelConfig:
    """C++ tensorrtllm backend. Every parameter, input attribute and output is a ledger row
    (ledger/triton.py), cited to triton_backend/inflight_batcher_llm/src of the version."""
    tree = bc.static_tree()
    if tree is None:
        raise RenderError(
            "engine.backend=tensorrt needs tree.choices: the tensorrtllm backend takes eagle_choices only"
        )
    t = bc.triton
    cfg = _base(t.llm_model, bc.request_limits().max_batch_size, backend="tensorrtllm")
    _add_inputs(cfg, C.LLM_INPUTS, cpp=True)
    _add_outputs(cfg, C.LLM_OUTPUTS + C.CPP_EXTRA_PERF_OUTPUTS)
    _decoupled(cfg, t.streaming)
    _batching(cfg, bc, queue=True)
    cfg.dynamic_batching.preferred_batch_size.append(bc.request_limits().max_batch_size)
    _instances(cfg, 1)  # the backend schedules in-flight batching itself; one instance owns the engine
    _params(cfg, {
        "gpt_model_type": "inflight_fused_batching",
        "gpt_model_path": str((build_dir / build_layout.ENGINE).resolve()),
        "max_beam_width": 1,
        "batch_scheduler_policy": "guaranteed_no_evict",
        "kv_cache_free_gpu_mem_fraction": t.kv_cache_free_gpu_mem_fraction,
        # Tree verification writes KV for rejected draft tokens; keep block reuse off (as builders/engine/llmapi.py).
        "enable_kv_cache_reuse": False,
        "enable_chunked_context": False,
        "decoding_mode": "eagle",
        "eagle_choices": triton_eagle_choices(tree),
        # Read unconditionally at model load (getGuidedDecodingConfigFromParams; a missing one throws "Cannot find
        # parameter with name"); empty values = no guided decoding, as upstream's template leaves them.
        "tokenizer_dir": str(tokenizer_dir(build_dir)),
        "guided_decoding_backend": "",
        "xgrammar_tokenizer_info_path": "",
    }, empty_ok=("guided_decoding_backend", "xgrammar_tokenizer_info_path"))
    return cfg


def python_llm_config(bc: BuildConfig, build_dir: Path, bridged: bool = False) -> mc.ModelConfig:
    """The reference / LLM-API python model with the tensorrt_llm model's I/O."""
    t = bc.triton
    cfg = _base(t.llm_model, bc.request_limits().max_batch_size, backend="python")
    _add_inputs(cfg, C.LLM_INPUTS + ((TOKEN_IN,) if internal_guard(bc) else ()))
    _add_outputs(cfg, C.LLM_OUTPUTS + ((C.ARRIVAL_TIME_OUTPUT,) if bridged else ())
                 + ((C.HANDLE_OUTPUT,) if handle_wired(bc) else ()))
    _decoupled(cfg, t.streaming)
    _batching(cfg, bc, queue=True)
    _instances(cfg, t.llm_instances)
    params: dict[str, str | int | float | bool | None] = {
        **_python_common(build_dir),
        "llm_kind": bc.engine.backend,
        "build_dir": str(build_dir.resolve()),
        "max_queue_size": t.max_queue_size,
        "decoupled": t.streaming,
        "internal_guard": internal_guard(bc),
        "entry_models": f"{t.ensemble_model} or {t.bls_model}",
    }
    if bc.engine.kind.reference_engine:  # its batcher ends requests past it (triton_repo/models/batcher.py)
        params["request_deadline_s"] = bc.request_deadline_s()
        # false serves the same build without speculation (the baseline of clients/loadtest.py --baseline-url)
        params["speculative"] = True
        # true: perf outputs on every response with arrival_time_ns, as the C++ backend (the perf bridge's twin)
        params["perf_every_response"] = bridged
    else:  # the reference model reads its limits from the engine's reference.json instead
        lim = bc.request_limits()
        params.update(max_batch_size=lim.max_batch_size, max_input_len=lim.max_input_len, max_seq_len=lim.max_seq_len)
    _params(cfg, params)
    return cfg


def llmapi_model_yaml(bc: BuildConfig, build_dir: Path, out: Path) -> str:
    """upstream all_models/llmapi/tensorrt_llm/1/model.yaml: LLM(**args) + triton_config; the LLM args are the
    engine stage's options file (builders/engine/llmapi.py), the one source for them."""
    options_file = build_dir / build_layout.ENGINE / LLMAPI_OPTIONS_FILE
    if not options_file.is_file():
        raise RenderError(f"{options_file} not found: run the engine stage (engine.backend=pytorch) first")
    options = yaml.safe_load(options_file.read_text())
    doc = {
        "model": str(build_layout.trtllm_model_dir(build_dir)),  # readable by its transformers (hf_compat)
        "backend": "pytorch",
        **options,
        "triton_config": {"max_batch_size": bc.request_limits().max_batch_size, "decoupled": bc.triton.streaming},
    }
    return yaml.safe_dump(RL.yaml_paths_relative(doc, out), sort_keys=False, default_flow_style=None, width=120)


# ---- the repository -----------------------------------------------------------------------------------------------


def client_descriptor(bc: BuildConfig) -> dict[str, Any]:
    """What clients need to call the ensemble (read by clients/): names, wire dtypes, dims, optional, defaults."""

    def tensor(t: C.Tensor) -> dict[str, Any]:
        return {
            "name": t.name, "datatype": C.WIRE_DTYPE[t.dtype], "dims": list(t.dims), "optional": t.optional,
            "default": t.default, "description": t.description,
        }

    t = bc.triton
    return {
        "model": t.ensemble_model,
        "bls_model": t.bls_model,
        "llm_model": t.llm_model,
        "backend": bc.engine.backend,
        "streaming": t.streaming,
        "max_batch_size": bc.request_limits().max_batch_size,
        "max_input_len": bc.request_limits().max_input_len,
        "max_seq_len": bc.request_limits().max_seq_len,
        "inputs": [tensor(x) for x in C.ENSEMBLE_INPUTS],
        "outputs": [tensor(x) for x in C.ENSEMBLE_OUTPUTS],
        "perf_outputs": [x.name for x in C.PERF_OUTPUTS],
        "perf_semantics": C.PERF_SEMANTICS[bc.engine.backend],
        "config_name": bc.name,
        "config_hash": bc.config_hash(),
    }


def model_configs(bc: BuildConfig, build_dir: Path, perf_bridge: bool | None = None) -> list[mc.ModelConfig]:
    br = perf_bridged(bc, perf_bridge)
    cpp = bc.engine.kind.cpp_triton_model
    llm = tensorrt_llm_config(bc, build_dir) if cpp else python_llm_config(bc, build_dir, br)
    return [
        preprocessing_config(bc, build_dir, br), llm, postprocessing_config(bc, build_dir, br),
        ensemble_config(bc, br), bls_config(bc, build_dir, br),
    ]


MODEL_SOURCE = {"preprocessing": "preprocessing.py", "postprocessing": "postprocessing.py", "bls": "bls.py"}


def config_problems(bc: BuildConfig) -> list[str]:
    """Checks before anything is written (build preflight)."""
    t = bc.triton
    names = {
        "triton.ensemble_model": t.ensemble_model, "triton.preprocessing_model": t.preprocessing_model,
        "triton.postprocessing_model": t.postprocessing_model, "triton.llm_model": t.llm_model,
        "triton.bls_model": t.bls_model,
    }
    p = []
    seen: dict[str, str] = {}
    for field, name in names.items():
        if name in seen:
            p.append(f"{field}={name!r} is also {seen[name]}; every Triton model needs its own name")
        seen[name] = field
        if not name or "/" in name or name.startswith("."):
            p.append(f"{field}={name!r} is not a valid model directory name")
    return p + [f"contract: {x}" for x in C.check_wiring()]


def layout(bc: BuildConfig) -> str:
    """'ensemble' (TensorRT-LLM 1.1/1.2) or 'llmapi' (the current line), from the version table."""

    return bc.version.triton_layout


def render_llmapi(bc: BuildConfig, build_dir: Path, out: Path) -> list[Path]:
    """The llmapi layout (builders/triton/render_llmapi.py)."""
    from builders.engine.llmapi import LlmApiError

    try:
        options = RL.llm_options(bc, build_dir, build_dir / build_layout.ENGINE / LLMAPI_OPTIONS_FILE)
    except (OSError, LlmApiError) as e:
        raise RenderError(f"LLM API options for the llmapi model: {e}") from e
    d = out / bc.triton.llm_model
    (d / "1").mkdir(parents=True)
    tokenizer = Path(os.path.relpath(tokenizer_dir(build_dir), out.resolve()))  # clients resolve it (clients/schema.py)
    files = {d / "config.pbtxt": to_text(_repository_relative(RL.model_config(bc, build_dir), out)),
             d / "1" / RL.L.MODEL_YAML: RL.model_yaml(bc, build_dir, out, options),
             out / CLIENT_FILE: json.dumps(RL.client_descriptor(bc, tokenizer), indent=2) + "\n"}
    for f, text in files.items():
        f.write_text(text)
    source = bc.engine.kind.llmapi_layout_model
    if source is None:
        raise RenderError(f"engine.backend {bc.engine.backend} has no model for the llmapi layout")
    shutil.copyfile(MODELS_SRC / source, d / "1" / "model.py")
    shutil.copyfile(MODELS_SRC / "bootstrap.py", d / "1" / f"{BOOTSTRAP_MODULE}.py")
    files[d / "1" / "model.py"] = ""
    files[d / "1" / f"{BOOTSTRAP_MODULE}.py"] = ""
    return list(files)


def render(bc: BuildConfig, build_dir: Path, out: Path, perf_bridge: bool | None = None) -> list[Path]:
    """Write the repository into `out` (must be empty or absent). Returns the files written. `perf_bridge`: wire a
    reference repository like the engine flow's perf bridge (`perf_bridged`)."""
    problems = config_problems(bc)
    if problems:
        raise RenderError("; ".join(problems))
    out.mkdir(parents=True, exist_ok=True)
    if any(p.name != TEMP_MARKER for p in out.iterdir()):  # the stage's temp-dir marker is removed before use
        raise RenderError(f"{out} is not empty; render into a fresh directory")
    if layout(bc) == "llmapi":
        return render_llmapi(bc, build_dir, out)
    t = bc.triton
    sources = {
        t.preprocessing_model: MODEL_SOURCE["preprocessing"],
        t.postprocessing_model: MODEL_SOURCE["postprocessing"],
        t.bls_model: MODEL_SOURCE["bls"],
    }
    if bc.engine.kind.python_llm_model is not None:  # the C++ tensorrtllm backend needs no model file
        sources[t.llm_model] = bc.engine.kind.python_llm_model
    written: list[Path] = []
    for cfg in model_configs(bc, build_dir, perf_bridge):
        d = out / cfg.name
        (d / "1").mkdir(parents=True)
        (d / "config.pbtxt").write_text(to_text(_repository_relative(cfg, out)))
        written.append(d / "config.pbtxt")
        if cfg.name in sources:
            shutil.copyfile(MODELS_SRC / sources[cfg.name], d / "1" / "model.py")
            shutil.copyfile(MODELS_SRC / "bootstrap.py", d / "1" / f"{BOOTSTRAP_MODULE}.py")
            written += [d / "1" / "model.py", d / "1" / f"{BOOTSTRAP_MODULE}.py"]
    if bc.engine.kind.llmapi_model:
        f = out / t.llm_model / "1" / "model.yaml"
        f.write_text(llmapi_model_yaml(bc, build_dir, out))
        written.append(f)
    f = out / CLIENT_FILE
    f.write_text(json.dumps(client_descriptor(bc), indent=2) + "\n")
    written.append(f)
    return written
