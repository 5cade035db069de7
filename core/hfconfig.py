"""The Llama-family fields a converter needs, read from an HF `config.json` (transformers 4 or 5 layout).

transformers 5 moved `rope_theta` / `rope_scaling` into `rope_parameters` ({"rope_type", "rope_theta", ...});
transformers 4 configs carry `rope_theta` and `rope_scaling` at the top level. Both are accepted here (and must
agree when both are present). EAGLE-3 heads name their captured layers at the top level or, as SpecForge and
ModelOpt export them, inside an `eagle_config` block (`aux_layer_ids`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.families import FAMILIES, text_config

LLAMA_ARCHITECTURES = tuple(f.name for f in FAMILIES if f.engine_flow)  # what EagleForCausalLM (a Llama) converts


class ModelConfigError(ValueError):
    """An HF config that cannot be converted; the message names the file, key and fix."""


@dataclass(frozen=True)
class LlamaSpec:
    path: Path  # the config.json read
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_act: str
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None  # None = plain RoPE
    tie_word_embeddings: bool
    attention_bias: bool
    mlp_bias: bool
    raw: dict[str, Any]

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim


def rope_theta_of(cfg: dict[str, Any], path: Path) -> float:
    """The RoPE base from `rope_theta` (transformers 4) or `rope_parameters.rope_theta` (transformers 5); both
    present must agree; neither = HF LlamaConfig's default 10000."""
    params = cfg.get("rope_parameters")
    nested = params.get("rope_theta") if isinstance(params, dict) else None
    top = cfg.get("rope_theta")
    if nested is not None and top is not None and float(nested) != float(top):
        raise ModelConfigError(
            f"{path}: rope_theta={top} disagrees with rope_parameters.rope_theta={nested}; fix the config (they are "
            "the same RoPE base for transformers 4 and 5 readers)"
        )
    value = nested if nested is not None else top
    return float(value) if value is not None else 10000.0


def _rope(cfg: dict[str, Any], path: Path) -> tuple[float, dict[str, Any] | None]:
    theta = rope_theta_of(cfg, path)
    params = cfg.get("rope_parameters")
    if isinstance(params, dict):  # transformers 5
        scaling: dict[str, Any] | None = {k: v for k, v in params.items() if k != "rope_theta"}
    else:  # transformers 4
        scaling = dict(cfg["rope_scaling"]) if isinstance(cfg.get("rope_scaling"), dict) else None
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind in (None, "default"):
            return theta, None
        # TRT-LLM reads the scaling type from "type" (older releases) or "rope_type" (newer): write both.
        scaling = dict(scaling, type=kind, rope_type=kind)
    return theta, scaling


def aux_layer_ids(cfg: dict[str, Any], path: Path) -> list[int] | None:
    """EAGLE-3 `eagle_aux_hidden_state_layer_ids`: top level (SafeAILab, this project) or inside an `eagle_config`
    block (SpecForge / ModelOpt exports); both present must agree. None = the head does not say."""
    block = cfg.get("eagle_config")
    nested = block.get("eagle_aux_hidden_state_layer_ids") if isinstance(block, dict) else None
    top = cfg.get("eagle_aux_hidden_state_layer_ids")
    if nested is not None and top is not None and [int(i) for i in nested] != [int(i) for i in top]:
        raise ModelConfigError(
            f"{path}: eagle_aux_hidden_state_layer_ids={list(top)} disagrees with "
            f"eagle_config.eagle_aux_hidden_state_layer_ids={list(nested)}; keep one"
        )
    ids = top if top is not None else nested
    return None if ids is None else [int(i) for i in ids]


# Where the default capture layers are read: `_get_eagle3_default_capture_layers` (1, L // 2 - 1, L - 4),
# output-indexed,
# which Eagle3SpecMetadata and Eagle3OneModelSpecMetadata use when layers_to_capture is None and refuse for 5 layers or
# fewer ("Not enough hidden layers for default EAGLE3 capture").
EAGLE3_DEFAULT_CAPTURE_SOURCE = ("NVIDIA/TensorRT-LLM tensorrt_llm/_torch/speculative/eagle3.py at commit "
                                 "f933a608045a46426792263617475b359d568043 _get_eagle3_default_capture_layers")


def eagle3_default_layer_ids(num_layers: int) -> list[int]:
    """The EAGLE-3 capture layers for a target of `num_layers` decoder layers, input-indexed as heads record them
    (`eagle_aux_hidden_state_layer_ids`, the trainer's `eagle3.layer_ids`: id j = the input of decoder layer j =
    the output of layer j - 1; 0 = the embeddings).

    From 7 layers: TensorRT-LLM's default (EAGLE3_DEFAULT_CAPTURE_SOURCE), output-indexed (1, L//2 - 1, L - 4), that
    is [2, L//2, L - 3] input-indexed, SafeAILab's and SpecForge's default too. Upstream has no default for 5 layers or
    fewer and repeats a layer at 6 ({1, 2, 2}); below 7 layers this gives distinct layers spread over the depth
    instead: [1, L//2, L - 1] from 4 layers, [0, 1, 2] at 3, every layer below (a build then writes them
    explicitly as `eagle3_layers_to_capture`)."""
    if num_layers < 1:
        raise ValueError(f"num_layers={num_layers}: a target has at least one decoder layer")
    if num_layers >= 7:
        return [2, num_layers // 2, num_layers - 3]
    if num_layers >= 4:
        return [1, num_layers // 2, num_layers - 1]
    return list(range(min(num_layers, 3)))


def read_config(model_dir: Path) -> dict[str, Any]:
    path = Path(model_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelConfigError(f"{path}: missing; a model directory needs its Hugging Face config.json") from None
    except ValueError as e:
        raise ModelConfigError(f"{path}: not valid JSON ({e})") from None
    except RecursionError:
        raise ModelConfigError(f"{path}: JSON nested too deeply to read; a model's config.json is a flat object") \
            from None
    if not isinstance(cfg, dict):
        raise ModelConfigError(f"{path}: top level must be a JSON object")
    return cfg


def llama_spec(model_dir: Path, *, require_arch: bool = True) -> LlamaSpec:
    """Parse a Llama config; `require_arch=False` for EAGLE heads (their architectures entry varies)."""
    path = Path(model_dir) / "config.json"
    cfg = text_config(read_config(model_dir))  # a multimodal target's text model (Llama 4)
    arch = (cfg.get("architectures") or [None])[0]
    if require_arch and arch not in LLAMA_ARCHITECTURES:
        raise ModelConfigError(
            f"{path}: architectures={cfg.get('architectures')!r}; only Llama-family targets "
            f"({', '.join(LLAMA_ARCHITECTURES)}) "
            "can be converted (TensorRT-LLM's EagleForCausalLM subclasses LLaMAForCausalLM)"
        )
    if cfg.get("model_type") == "deepseek_v4" and "intermediate_size" not in cfg:  # DeepseekV4Config.attribute_map:
        cfg = {**cfg, "intermediate_size": cfg.get("moe_intermediate_size")}  # intermediate_size is the experts' width
    if "rms_norm_eps" not in cfg and "layer_norm_epsilon" in cfg:  # Nemotron-H spells its RMSNorm epsilon so
        cfg = {**cfg, "rms_norm_eps": cfg["layer_norm_epsilon"]}
    need = [
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "rms_norm_eps",
    ]
    missing = [k for k in need if k not in cfg]
    if missing:
        raise ModelConfigError(f"{path}: missing key(s) {', '.join(missing)}")
    heads = int(cfg["num_attention_heads"])
    theta, scaling = _rope(cfg, path)
    return LlamaSpec(
        path=path,
        architecture=str(arch),
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=int(cfg["hidden_size"]),
        intermediate_size=int(cfg["intermediate_size"]),
        num_hidden_layers=int(cfg["num_hidden_layers"]),
        num_attention_heads=heads,
        # Absent keys take HF LlamaConfig's documented defaults (transformers/models/llama/configuration_llama.py):
        # num_key_value_heads = num_attention_heads, head_dim = hidden // heads, silu, 2048 positions, untied.
        num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
        hidden_act=str(cfg.get("hidden_act", "silu")),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        rms_norm_eps=float(cfg["rms_norm_eps"]),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get("attention_bias", False)),
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        raw=cfg,
    )
