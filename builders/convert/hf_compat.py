"""Hugging Face directories handed to TensorRT-LLM, readable by the transformers major its version pins (registry
`transformers_major`): the one home of the transformers-4 spellings of a model config.

transformers 5 (this toolkit's, and the one that extracts GGUF / `pip:` targets) writes the RoPE base only inside
`rope_parameters`, the dtype as `dtype`, and the tokenizer class `TokenizersBackend`. transformers 4 (TensorRT-LLM
1.1 / 1.2) reads `rope_theta` and `rope_scaling` at the top level only (a missing rope_theta silently becomes 10000),
the dtype as `torch_dtype`, and has no TokenizersBackend. Both readers load what `transformers4_config` and
builders/convert/tokenizer.py `transformers4_tokenizer_config` write the same way: transformers 5 keeps
`rope_parameters` first and fills its rope_theta from the top-level key only when missing
(modeling_rope_utils.RotaryEmbeddingConfigMixin), and the two are written equal.

The checkpoint's tokenizer/ and the normalized EAGLE-3 head use these functions; so does the copy of the target's own
HF directory (`write_transformers4_copy`) that trtllm-serve and the Triton LLM-API model get on transformers-4
versions: config.json and tokenizer_config.json rewritten, other top-level files copied, weight files linked.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from builders.convert.tokenizer import TRANSFORMERS5_ONLY_CLASSES, write_tokenizer_files
from core.hfconfig import llama_spec, read_config

if TYPE_CHECKING:
    from builders.config import BuildConfig

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")  # linked, never copied
CONFIG = "config.json"


def needs_transformers4_copy(cfg: BuildConfig) -> bool:
    """TensorRT-LLM loads the target's HF directory itself only on the PyTorch backend (trtllm-serve, the LLM API);
    a version pinning transformers 4 then gets the copy."""
    return cfg.engine.kind.loads_hf_target and cfg.version.transformers_major == 4


def transformers4_config(cfg: dict[str, Any], *, rope_theta: float, rope_scaling: dict[str, Any] | None,
                         dtype: str | None) -> dict[str, Any]:
    """`cfg` with the top-level spellings transformers 4 reads, equal to what transformers 5 reads (pure).
    `rope_theta` / `rope_scaling` as core.hfconfig resolves them from either layout (scaling None = plain RoPE)."""
    out = dict(cfg)
    out["rope_theta"] = rope_theta
    if rope_scaling is not None:
        out["rope_scaling"] = rope_scaling
    if dtype is not None:
        out["torch_dtype"] = dtype
        out["dtype"] = dtype
    return out


def write_transformers4_copy(hf_dir: Path, out: Path) -> list[str]:
    """`hf_dir` as transformers 4 reads it, in `out`: config.json and the tokenizer rewritten, every other top-level
    file copied, weights symbolic links to the originals (absolute). Returns the config keys changed or added."""
    hf_dir, out = Path(hf_dir).resolve(), Path(out)
    spec = llama_spec(hf_dir)
    raw = read_config(hf_dir)
    cfg = transformers4_config(raw, rope_theta=spec.rope_theta, rope_scaling=spec.rope_scaling,
                               dtype=raw.get("torch_dtype") or raw.get("dtype"))
    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG).write_text(json.dumps(cfg, indent=2) + "\n")
    written = set(write_tokenizer_files(hf_dir, out)) | {CONFIG}
    for f in sorted(hf_dir.iterdir()):
        if not f.is_file() or f.name in written:
            continue
        if f.name.endswith(WEIGHT_SUFFIXES) or f.name.endswith(".index.json"):
            os.symlink(f, out / f.name)
        else:
            shutil.copyfile(f, out / f.name)
    return sorted(k for k in cfg if k not in raw or raw[k] != cfg[k])


def transformers4_problems(model_dir: Path) -> list[str]:
    """What transformers 4 would misread in `model_dir` (its config.json and tokenizer_config.json, when present)."""
    d = Path(model_dir)
    p: list[str] = []
    if (d / CONFIG).is_file():
        cfg = json.loads((d / CONFIG).read_text())
        params = cfg.get("rope_parameters")
        params = params if isinstance(params, dict) else {}
        if "rope_theta" in params and cfg.get("rope_theta") != params["rope_theta"]:
            p.append(f"{d / CONFIG}: rope_parameters.rope_theta={params['rope_theta']} but rope_theta="
                     f"{cfg.get('rope_theta')}: transformers 4 reads the top-level key only (default 10000)")
        kind = params.get("rope_type", params.get("type"))
        if kind not in (None, "default") and not isinstance(cfg.get("rope_scaling"), dict):
            p.append(f"{d / CONFIG}: rope_parameters.rope_type={kind!r} without rope_scaling: transformers 4 would "
                     "run plain RoPE")
        if "dtype" in cfg and "torch_dtype" not in cfg:
            p.append(f"{d / CONFIG}: dtype without torch_dtype: transformers 4 reads torch_dtype")
    tok = d / "tokenizer_config.json"
    if tok.is_file():
        t = json.loads(tok.read_text())
        if t.get("tokenizer_class") in TRANSFORMERS5_ONLY_CLASSES:
            p.append(f"{tok}: tokenizer_class {t['tokenizer_class']!r} does not exist in transformers 4")
        if isinstance(t.get("extra_special_tokens"), list):
            p.append(f"{tok}: a list extra_special_tokens (transformers 4 expects a mapping)")
    return p
