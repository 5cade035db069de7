"""Render the `llmapi` layout (the current TensorRT-LLM line): one model, as TensorRT-LLM's
triton_backend/all_models/llmapi/ lays it out:

    <repo>/tensorrt_llm/config.pbtxt     backend python, the inputs/outputs of triton_repo/llmapi_contract.py
    <repo>/tensorrt_llm/1/model.yaml     LLM API options (model, limits, kv_cache_config, speculative_config)
                                         + triton_config {decoupled, max_batch_size}
    <repo>/tensorrt_llm/1/model.py       engine.backend reference: the reference engine's mirror (ours);
                                         engine.backend pytorch: the metrics bridge (models/llmapi_bridge.py), a
                                         subclass of upstream's model.py, which it imports with helpers.py from
                                         the TensorRT-LLM image (never copied into the build: builds serve
                                         read-only), never written by us

The LLM API options come from builders/engine/llmapi.py, the one source for them (and through it the config's draft
tree): the engine stage's YAML for engine.backend pytorch, computed the same way for the reference mirror.
Upstream's launcher passes --disable-auto-complete-config, so model.yaml's `decoupled` does not reach Triton; the
config.pbtxt says it too (model_transaction_policy), or streaming requests would be refused.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from tritonclient.grpc import model_config_pb2 as mc

from builders import layout
from builders.config import BuildConfig
from builders.triton.pbtxt import _add_inputs, _add_outputs, _decoupled, _instances, _params
from triton_repo import llmapi_contract as L

UPSTREAM_MODEL_DIR = "/app/all_models/llmapi/tensorrt_llm/1"  # in the TensorRT-LLM Triton image
# upstream file -> its name in the repository: the bridge (models/llmapi_bridge.py) is model.py and imports upstream's
UPSTREAM_FILES = {"model.py": "upstream_model.py", "helpers.py": "helpers.py"}


def model_config(bc: BuildConfig, build_dir: Path) -> mc.ModelConfig:
    cfg = mc.ModelConfig(name=bc.triton.llm_model, backend="python")
    _add_inputs(cfg, L.INPUTS)
    _add_outputs(cfg, L.OUTPUTS)
    _instances(cfg, 1)
    if bc.triton.streaming:
        _decoupled(cfg, True)
    if bc.engine.kind.reference_engine:
        _add_inputs(cfg, L.LORA_INPUTS)  # declared to be refused by name (models/llmapi_refusals.py)
        _params(cfg, {"build_dir": str(build_dir.resolve()),
                      "max_queue_size": bc.triton.max_queue_size})
    return cfg


def llm_options(bc: BuildConfig, build_dir: Path, options_file: Path) -> dict[str, Any]:
    """The LLM API options: the engine stage's file (engine.backend pytorch), else computed the same way from the
    checkpoint (the reference mirror)."""
    if bc.engine.kind.llmapi_model:
        return dict(yaml.safe_load(options_file.read_text()))
    from builders.engine import llmapi
    from builders.engine.stage import eagle3_capture, target_architecture

    ckpt = build_dir / layout.CHECKPOINT
    capture, n_layers = eagle3_capture(bc, ckpt)
    return llmapi.llm_api_options(bc, (ckpt / layout.EAGLE3_HEAD).resolve(), capture, n_layers,
                                  target_architecture(ckpt))


def yaml_paths_relative(doc: dict[str, Any], out: Path) -> dict[str, Any]:
    """model.yaml's directories (`model` and the speculative model), relative to the repository, for a build that
    moves. Upstream's llmapi model passes them to `LLM(...)` as they are, so a relative path is relative to the
    server's working directory, which triton_repo/launch.py sets to the repository. Each starts with `./` or `../`,
    which no Hugging Face repo id can, so a path that does not resolve is an error, never a hub download."""
    def rel(value: str) -> str:
        r = os.path.relpath(value, out.resolve())
        return r if r.startswith("..") else f"./{r}"

    doc = dict(doc, model=rel(doc["model"]))
    spec = doc.get("speculative_config")
    if isinstance(spec, dict):
        key = next((k for k in ("speculative_model_dir", "speculative_model") if spec.get(k)), None)
        if key is not None:
            doc["speculative_config"] = dict(spec, **{key: rel(str(spec[key]))})
    return doc


def model_yaml(bc: BuildConfig, build_dir: Path, out: Path, options: dict[str, Any]) -> str:
    from builders.engine.llmapi import plain

    doc = {
        "model": str(layout.trtllm_model_dir(build_dir)),  # readable by its transformers (hf_compat)
        **options,
        # the metrics bridge reads LLM.get_stats(), which needs the iteration statistics (models/llmapi_bridge.py)
        **({"enable_iter_perf_stats": True} if bc.engine.kind.exports_speculative_metrics else {}),
        # max_batch_size 0: the model takes one prompt per request (upstream's template value); the LLM API
        # batches requests in flight itself, up to the top-level max_batch_size.
        "triton_config": {"max_batch_size": 0, "decoupled": bc.triton.streaming},
    }
    return yaml.safe_dump(yaml_paths_relative(plain(doc), out), sort_keys=False, default_flow_style=None, width=120)


def client_descriptor(bc: BuildConfig, tokenizer: Path) -> dict[str, Any]:
    def tensor(t: Any) -> dict[str, Any]:
        from triton_repo.contract import WIRE_DTYPE

        return {"name": t.name, "datatype": WIRE_DTYPE[t.dtype], "dims": list(t.dims), "optional": t.optional,
                "default": t.default, "description": t.description}

    return {
        "model": bc.triton.llm_model, "layout": "llmapi", "backend": bc.engine.backend,
        "streaming": bc.triton.streaming, "max_batch_size": 0, "max_input_len": bc.engine.max_input_len,
        "max_seq_len": bc.engine.max_seq_len, "tokenizer": str(tokenizer),
        "inputs": [tensor(x) for x in L.INPUTS], "outputs": [tensor(x) for x in L.OUTPUTS],
        "perf_outputs": list(L.SPEC_OUTPUTS), "config_name": bc.name, "config_hash": bc.config_hash(),
    }
