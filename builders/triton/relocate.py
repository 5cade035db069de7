"""A copy of a rendered Triton repository that serves from another directory: its path parameters point where the
original's did.

A rendered repository writes its paths relative to itself (builders/triton/render.py `REPOSITORY_RELATIVE`,
render_llmapi.py `yaml_paths_relative`, and client.json's `tokenizer`), so a whole build can move. A copy of the
repository alone, put elsewhere (scripts/spec_sweep.py's speculation-off copy), would resolve them against its new
directory and find nothing there; `relocate` rewrites them against the copy's directory so they name the original
build's engine, checkpoint and tokenizer. Absolute paths are kept. Both layouts: the ensemble (TensorRT-LLM 1.1/1.2
line) and the llmapi model (current line)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from builders.triton.render import CLIENT_FILE, REPOSITORY_RELATIVE
from builders.triton.render_llmapi import yaml_paths_relative

MODEL_YAML = "model.yaml"  # the llmapi model's options (builders/triton/render_llmapi.py, L.MODEL_YAML)


def _moved(value: str, src: Path, dest: Path) -> str:
    """`value`, relative to `src`, rewritten relative to `dest` (absolute values unchanged)."""
    if os.path.isabs(value):
        return value
    return os.path.relpath(os.path.normpath(src.resolve() / value), dest.resolve())


def _yaml_moved(doc: dict[str, Any], src: Path, dest: Path) -> dict[str, Any]:
    """model.yaml's `./` / `../` directories resolved against `src`, then written relative to `dest` (the renderer's
    own rule, so the copy reads exactly as a repository rendered at `dest` would)."""
    def absolute(value: object) -> object:
        if isinstance(value, str) and value.startswith(("./", "../")):
            return str(Path(os.path.normpath(src.resolve() / value)))
        return value

    doc = dict(doc, model=absolute(doc.get("model")))
    spec = doc.get("speculative_config")
    if isinstance(spec, dict):
        doc["speculative_config"] = {k: absolute(v) if k in ("speculative_model_dir", "speculative_model") else v
                                     for k, v in spec.items()}
    return yaml_paths_relative(doc, dest)


def relocate(src: Path, dest: Path) -> list[Path]:
    """Rewrite the repository `dest`, a copy of `src`, so that every relative path it holds resolves from `dest` to
    what it named from `src`. Returns the files rewritten."""
    if not src.is_dir() or not dest.is_dir():
        raise ValueError(f"relocate: {src} and {dest} must both be repositories (directories)")
    changed: list[Path] = []
    for pbtxt in sorted(dest.glob("*/config.pbtxt")):
        cfg = text_format.Parse(pbtxt.read_text(), mc.ModelConfig())
        keys = [k for k in REPOSITORY_RELATIVE if k in cfg.parameters]
        for key in keys:
            value = cfg.parameters[key].string_value
            cfg.parameters[key].string_value = _moved(value, src, dest)
        if keys:
            pbtxt.write_text(text_format.MessageToString(cfg))
            changed.append(pbtxt)
    for f in sorted(dest.glob(f"*/*/{MODEL_YAML}")):
        doc = yaml.safe_load(f.read_text())
        if isinstance(doc, dict) and "model" in doc:
            f.write_text(yaml.safe_dump(_yaml_moved(doc, src, dest), sort_keys=False, default_flow_style=None,
                                        width=120))
            changed.append(f)
    client = dest / CLIENT_FILE
    if client.is_file():
        desc = json.loads(client.read_text())
        if desc.get("tokenizer"):
            desc["tokenizer"] = _moved(str(desc["tokenizer"]), src, dest)
            client.write_text(json.dumps(desc, indent=2) + "\n")
            changed.append(client)
    return changed
