"""The checkpoint's `tokenizer/` directory, readable by the transformers 4.x inside the TensorRT-LLM images.

Triton's preprocessing / postprocessing models, `trtllm-serve --tokenizer` and TensorRT-LLM's own LLM API load this
directory with `AutoTokenizer.from_pretrained` of the image's transformers (4.56 in TensorRT-LLM 1.1, 4.57 in 1.2;
their release notes). transformers 5 saves `"tokenizer_class": "TokenizersBackend"`, a class transformers 4 does not
have ("Tokenizer class TokenizersBackend does not exist or is not currently imported"), and renamed
`additional_special_tokens` to a list-valued `extra_special_tokens` (a mapping in transformers 4). The copy keeps every
file byte for byte except `tokenizer_config.json`, whose transformers-5-only spellings are rewritten:
- tokenizer_class TokenizersBackend (or missing) with a tokenizer.json -> PreTrainedTokenizerFast, the class
  transformers 4 builds from a bare tokenizer.json;
- a list `extra_special_tokens` -> `additional_special_tokens`;
- `auto_map` (pointers to Python code shipped with the model, which `AutoTokenizer` would ask to run with
  trust_remote_code) is removed when `tokenizer_class` is a stock transformers class, and the conversion is refused
  when it is not: the checkpoint never carries custom code.
A real Hugging Face target saved by transformers 4 (e.g. "LlamaTokenizer", "PreTrainedTokenizerFast") is unchanged.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from builders.layout import TOKENIZER
from core.hfconfig import ModelConfigError

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
    "tokenizer.model",
)
TRANSFORMERS5_ONLY_CLASSES = ("TokenizersBackend",)
FAST_FROM_TOKENIZER_JSON = "PreTrainedTokenizerFast"


def auto_map_problem(cfg: dict[str, Any], path: Path) -> str | None:
    """Why a tokenizer config with `auto_map` cannot be converted: its class is custom code (None when stock)."""
    if "auto_map" not in cfg:
        return None
    import transformers

    cls = cfg.get("tokenizer_class")
    if isinstance(cls, str) and (hasattr(transformers, cls) or hasattr(transformers, cls.removesuffix("Fast"))
                                 or cls in TRANSFORMERS5_ONLY_CLASSES):
        return None
    return (f"{path}: auto_map points at custom tokenizer code and tokenizer_class {cls!r} is not a transformers "
            "class; the checkpoint must load without running code from the model directory (trust_remote_code): "
            "save the tokenizer as a stock class (e.g. PreTrainedTokenizerFast with tokenizer.json)")


def transformers4_tokenizer_config(cfg: dict[str, Any], has_tokenizer_json: bool) -> dict[str, Any]:
    """`tokenizer_config.json` content that transformers 4 and 5 both load as the same tokenizer, without
    `auto_map` (pure; `auto_map_problem` refuses custom classes first)."""
    out = {k: v for k, v in cfg.items() if k != "auto_map"}
    cls = out.get("tokenizer_class")
    if (cls is None or cls in TRANSFORMERS5_ONLY_CLASSES) and has_tokenizer_json:
        out["tokenizer_class"] = FAST_FROM_TOKENIZER_JSON
    elif cls in TRANSFORMERS5_ONLY_CLASSES:
        raise ModelConfigError(
            f"tokenizer_config.json names {cls!r} (a transformers 5 class) and there is no tokenizer.json to load it "
            "from in transformers 4; save the tokenizer with tokenizer.json"
        )
    extra = out.get("extra_special_tokens")
    if isinstance(extra, list):
        del out["extra_special_tokens"]
        out.setdefault("additional_special_tokens", extra)
    return out


def copy_tokenizer(hf_dir: Path, out_dir: Path) -> list[str]:
    """Copy the tokenizer files present in `hf_dir` to `out_dir/tokenizer/`; returns the names copied."""
    present = [n for n in TOKENIZER_FILES if (hf_dir / n).is_file()]
    if "tokenizer.json" not in present and "tokenizer.model" not in present:
        raise ModelConfigError(
            f"{hf_dir}: no tokenizer.json or tokenizer.model; the target directory must include its tokenizer"
        )
    dest = out_dir / TOKENIZER
    dest.mkdir(parents=True, exist_ok=True)
    for n in present:
        if n == "tokenizer_config.json":
            cfg = json.loads((hf_dir / n).read_text())
            problem = auto_map_problem(cfg, hf_dir / n)
            if problem is not None:
                raise ModelConfigError(problem)
            if "auto_map" in cfg:
                print(f"{hf_dir / n}: auto_map {sorted(cfg['auto_map'])} removed (tokenizer_class "
                      f"{cfg.get('tokenizer_class')!r} is a transformers class; no custom code is copied)", flush=True)
            fixed = transformers4_tokenizer_config(cfg, "tokenizer.json" in present)
            (dest / n).write_text(json.dumps(fixed, indent=2, ensure_ascii=False) + "\n")
        else:
            shutil.copyfile(hf_dir / n, dest / n)
    return present
