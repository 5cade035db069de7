"""Config builders shared by the engine-stage / LLM API tests and their golden files.

`UPDATE_GOLDEN=1 pytest tests/test_engine_stage.py tests/test_llmapi.py` rewrites tests/golden/ (review the diff:
the golden files are the contract with TensorRT-LLM's CLI and llm_args).
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

from builders.config import BuildConfig
from core.config_input import apply_overrides

GOLDEN = Path(__file__).resolve().parent / "golden"
BASE: dict[str, Any] = {
    "name": "golden",
    "trtllm_version": "1.1",  # the engine flow (EAGLE-1, static tree): the pinned image's line
    "output_dir": "/builds/golden",
    "target": {"model": "/models/target", "dtype": "float16"},
    "draft": {"type": "eagle", "model": "/models/head"},
    "tree": {"choices": "trtllm-default"},
    "engine": {"backend": "tensorrt", "max_batch_size": 4, "max_input_len": 1024, "max_seq_len": 2048,
               "max_num_tokens": 2048},
}


def write_build_yaml(path: Path, *, output_dir: Path, target: Path, head: Path, draft: str, backend: str, tree: str,
                     name: str, version: str = "1.1", engine: dict[str, Any] | None = None, **sections: Any) -> Path:
    """A build config file for a real (tiny) model: small engine limits unless `engine` says otherwise; further
    top-level sections (quantization, ...) as given."""
    import yaml

    data: dict[str, Any] = {
        "name": name, "output_dir": str(output_dir), "trtllm_version": version,
        "target": {"model": str(target), "dtype": "float16"}, "draft": {"type": draft, "model": str(head)},
        "tree": {"choices": tree},
        "engine": {"backend": backend, "max_batch_size": 8, "max_input_len": 256, "max_seq_len": 512, **(engine or {})},
        **sections,
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def make_cfg(*overrides: str) -> BuildConfig:
    data = copy.deepcopy(BASE)
    assert apply_overrides(data, list(overrides)) == []
    return BuildConfig.model_validate(data)


def check_golden(name: str, actual: Any) -> None:
    """Compare with tests/golden/<name> (JSON or text); rewrite it when UPDATE_GOLDEN=1."""
    f = GOLDEN / name
    text = actual if isinstance(actual, str) else json.dumps(actual, indent=2) + "\n"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    assert f.is_file(), f"golden file {f} missing; run with UPDATE_GOLDEN=1 and review it"
    assert text == f.read_text(), f"{name} differs from the golden file (UPDATE_GOLDEN=1 to accept after review)"
