"""Compare a built TensorRT-LLM engine's `config.json` against our config.

An engine directory holds `config.json` = {"version", "pretrained_config", "build_config"} (tensorrt_llm/builder.py,
EngineConfig.to_dict) next to `rank{r}.engine`. Triton and the runtime trust that file, so a stale or foreign engine
(another tree depth, another tp, fp16 instead of fp8...) must be caught here rather than as bad acceptance later.

`build_config.speculative_decoding_mode` is serialized from the IntFlag SpeculativeDecodingMode
(tensorrt_llm/models/modeling_utils.py: NONE=1, DRAFT_TOKENS_EXTERNAL=2, MEDUSA=4, LOOKAHEAD_DECODING=8,
EXPLICIT_DRAFT_TOKENS=16, EAGLE=32), so json holds the integer 32.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from builders.config import BuildConfig

EAGLE_MODE_INT = 32
_EAGLE_MODE_STRINGS = {"eagle", "SpeculativeDecodingMode.EAGLE", "EAGLE"}


class EngineConfigError(ValueError):
    """The engine's config.json is unreadable or lacks a key we must check."""


def _get(tree: dict[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise EngineConfigError(
                f"engine config.json has no `{dotted}`; it was not written by trtllm-build for an EAGLE engine "
                "(rebuild the engine)"
            )
        node = node[part]
    return node


def engine_max_seq_len(cfg: BuildConfig) -> int:
    """The max_seq_len trtllm-build records: tensorrt_llm/builder.py build() adds max_draft_len for any speculative
    mode and num_eagle_layers for EAGLE to the requested value ("to account for speculative decoding implementation
    specifics. Maximum number of generated tokens remains the same")."""
    lim = cfg.limits()
    assert cfg.engine.max_seq_len is not None
    return cfg.engine.max_seq_len + lim.max_draft_len + lim.num_eagle_layers


def expected_values(cfg: BuildConfig) -> dict[str, Any]:
    """What the engine's config.json must say, keyed by dotted path, rendered from the one config."""
    lim, q = cfg.limits(), cfg.quantization
    return {
        "pretrained_config.architecture": "EagleForCausalLM",
        "pretrained_config.dtype": cfg.target.dtype,
        "pretrained_config.mapping.tp_size": cfg.parallel.tp,
        "pretrained_config.mapping.pp_size": cfg.parallel.pp,
        "pretrained_config.max_draft_len": lim.max_draft_len,
        "pretrained_config.num_eagle_layers": lim.num_eagle_layers,
        "pretrained_config.max_non_leaves_per_layer": lim.max_non_leaves_per_layer,
        "pretrained_config.quantization.quant_algo": "FP8" if q.weights == "fp8" else None,
        "pretrained_config.quantization.kv_cache_quant_algo": "FP8" if q.kv_cache == "fp8" else None,
        "build_config.max_draft_len": lim.max_draft_len,
        "build_config.speculative_decoding_mode": EAGLE_MODE_INT,
        "build_config.max_batch_size": cfg.engine.max_batch_size,
        "build_config.max_input_len": cfg.engine.max_input_len,
        "build_config.max_seq_len": engine_max_seq_len(cfg),
        "build_config.max_num_tokens": lim.max_num_tokens,
    }


def _same(key: str, got: Any, want: Any) -> bool:
    if key == "build_config.speculative_decoding_mode":
        return got == EAGLE_MODE_INT or (isinstance(got, str) and got in _EAGLE_MODE_STRINGS)
    return got == want


def mismatches(engine_config: dict[str, Any], cfg: BuildConfig) -> list[str]:
    """One message per disagreeing value; raises EngineConfigError when a checked key is missing."""
    if not isinstance(engine_config, dict):
        raise EngineConfigError("engine config.json must be a JSON object")
    out = []
    for key, want in expected_values(cfg).items():
        got = _get(engine_config, key)
        if not _same(key, got, want):
            out.append(f"{key}: engine has {got!r}, config expects {want!r}")
    return out


def crosscheck_engine_dir(engine_dir: Path, cfg: BuildConfig) -> list[str]:
    """Read `<engine_dir>/config.json`, check it and that every rank engine file exists."""
    f = engine_dir / "config.json"
    try:
        data = json.loads(f.read_text())
    except OSError as e:
        raise EngineConfigError(f"cannot read {f}: {e}; did trtllm-build finish?") from e
    except ValueError as e:
        raise EngineConfigError(f"{f} is not valid JSON: {e}") from e
    out = mismatches(data, cfg)
    world = cfg.parallel.tp * cfg.parallel.pp
    missing = [f"rank{r}.engine" for r in range(world) if not (engine_dir / f"rank{r}.engine").is_file()]
    if missing:
        out.append(f"engine files missing in {engine_dir}: {', '.join(missing)} (expected {world} rank engines)")
    return out
