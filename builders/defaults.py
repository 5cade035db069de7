"""Engine limits a config may leave out, filled the way TensorRT-LLM fills them (before validation, so every rule
sees the values), and recorded with the reason in `config.resolved.yaml`.

TensorRT-LLM's defaults (tensorrt_llm/builder.py, BuildConfig and _init_max_seq_len; the same values in
tensorrt_llm/llmapi/llm_args.py BaseLlmArgs / trtllm-serve for the PyTorch backend):
- max_batch_size 2048; EAGLE engines assert max_batch_size <= 512 in build(), so engine.backend tensorrt takes 512;
- max_input_len 1024 (build() clips it to max_seq_len; we keep it below max_seq_len so one token can be generated);
- max_seq_len = ceil(max_position_embeddings * RoPE factor), the factor ignored for su / longrope / llama3 scaling,
  2048 when the model config has no max_position_embeddings.
The reference engine allocates its KV cache for max_batch_size x max_seq_len up front, so its defaults are sized for
a CPU: max_batch_size 4, max_seq_len at most 2048.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from core.kinds import BACKENDS, Backend

TRTLLM_MAX_BATCH_SIZE = 2048
TRTLLM_MAX_INPUT_LEN = 1024
TRTLLM_FALLBACK_MAX_SEQ_LEN = 2048
RESCALING_FREE_ROPE = ("su", "longrope", "llama3")  # _init_max_seq_len: these types do not scale max_seq_len
REFERENCE_MAX_BATCH_SIZE = 4
REFERENCE_MAX_SEQ_LEN = 2048


class DefaultsError(ValueError):
    """A limit cannot be derived (the target cannot be read); the message names the field and the fix."""


def model_max_seq_len(model_dir: Path) -> tuple[int, str]:
    """trtllm-build's max_seq_len for a Hugging Face model directory, and how it was obtained."""
    from core.hfconfig import read_config

    cfg = read_config(model_dir)
    positions = cfg.get("max_position_embeddings")
    if positions is None:
        return TRTLLM_FALLBACK_MAX_SEQ_LEN, "no max_position_embeddings in the target config: trtllm-build's 2048"
    scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else None
    factor = float(scaling.get("factor", 1.0)) if isinstance(scaling, dict) and kind not in RESCALING_FREE_ROPE else 1.0
    if kind in (None, "default"):
        factor = 1.0
    value = math.ceil(int(positions) * factor)
    why = f"target max_position_embeddings {positions}" + (f" x RoPE factor {factor:g}" if factor != 1.0 else "")
    return value, why


def engine_defaults(backend: Backend, eagle_max_batch_size: int, model_dir: Path | None) -> dict[str, tuple[int, str]]:
    """{field: (value, reason)} for max_batch_size, max_seq_len and max_input_len. `model_dir` None (unreadable
    target) raises DefaultsError for max_seq_len."""
    if backend.reference_engine:
        batch = (REFERENCE_MAX_BATCH_SIZE, "reference engine default (KV cache allocated up front)")
    elif backend.engine_flow:
        batch = (
            min(TRTLLM_MAX_BATCH_SIZE, eagle_max_batch_size),
            f"trtllm-build default {TRTLLM_MAX_BATCH_SIZE}, capped at the EAGLE engine limit {eagle_max_batch_size}",
        )
    else:
        batch = (TRTLLM_MAX_BATCH_SIZE, "TensorRT-LLM LLM API default")
    if model_dir is None:
        raise DefaultsError("target.model cannot be read")
    seq, why = model_max_seq_len(model_dir)
    if backend.reference_engine and seq > REFERENCE_MAX_SEQ_LEN:
        seq, why = REFERENCE_MAX_SEQ_LEN, f"{why}, capped at the reference engine's {REFERENCE_MAX_SEQ_LEN}"
    return {"max_batch_size": batch, "max_seq_len": (seq, why),
            "max_input_len": (min(TRTLLM_MAX_INPUT_LEN, seq - 1),
                              f"TensorRT-LLM default {TRTLLM_MAX_INPUT_LEN}, below max_seq_len")}


def fill_engine_defaults(data: dict[str, Any], eagle_max_batch_size: int) -> tuple[list[str], dict[str, str]]:
    """Fill the unset engine limits of a raw config mapping in place. Returns (problems, {engine.field: reason})."""
    from sources.targets import ModelSourceError, resolve_target
    from core.hfconfig import ModelConfigError

    engine, target = data.get("engine"), data.get("target")
    name = engine.get("backend") if isinstance(engine, dict) else None
    backend = BACKENDS.get(name) if isinstance(name, str) else None
    if not isinstance(engine, dict) or backend is None:
        return [], {}  # the schema reports a missing or invalid engine section
    unset = [k for k in ("max_batch_size", "max_input_len", "max_seq_len") if engine.get(k) is None]
    if not unset:
        return [], {}
    model = target.get("model") if isinstance(target, dict) else None
    try:
        model_dir = resolve_target(model) if isinstance(model, str) else None
        values = engine_defaults(backend, eagle_max_batch_size, model_dir)
    except (ModelSourceError, ModelConfigError, DefaultsError, OSError) as e:
        return [f"engine.{k}: not set, and the default cannot be derived from target.model ({e}); set engine.{k}"
                for k in unset], {}
    if engine.get("max_seq_len") is not None and "max_input_len" in unset:
        values["max_input_len"] = (min(TRTLLM_MAX_INPUT_LEN, int(engine["max_seq_len"]) - 1),
                                   f"TensorRT-LLM default {TRTLLM_MAX_INPUT_LEN}, below max_seq_len")
    applied = {}
    for k in unset:
        engine[k], applied[f"engine.{k}"] = values[k][0], values[k][1]
    return [], applied


def fill_version_defaults(data: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """Unset engine limits -> TensorRT-LLM's defaults for the config's version (an unknown version is reported by
    the config's own field validator; the default version's limits stand in until then)."""
    from core import trtllm_versions

    key = data.get("trtllm_version", trtllm_versions.DEFAULT_VERSION)
    try:
        version = trtllm_versions.get(str(key))
    except trtllm_versions.UnknownVersion:
        version = trtllm_versions.get(trtllm_versions.DEFAULT_VERSION)  # the field validator reports the bad value
    return fill_engine_defaults(data, version.eagle_max_batch_size)
