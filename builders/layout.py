"""The layout of a build directory: every stage's directory name and the files the stages share.

    <build>/config.resolved.yaml      the validated config with its filled-in defaults (builders/build.py)
    <build>/checkpoint/               convert stage: TensorRT-LLM checkpoint, tokenizer/, eagle3/ (EAGLE-3 head),
                                      hf_model/ (the target for a transformers-4 TensorRT-LLM, engine.backend pytorch),
                                      hf_quantized/ (an FP8 / NVFP4 target on the current line, engine.backend pytorch)
    <build>/engine/                   engine stage: engines / LLM API options / reference.json (core/spec.py)
    <build>/triton_repo/              Triton model repository
    <build>/dynamo/                   NVIDIA Dynamo deployment (the current line; dynamo_serve/layout.py)
    <build>/logs/<stage>.log          each stage's log
    <build>/<stage>/manifest.json     what each stage read, ran and wrote (builders/pipeline.py)

The engine directory and its reference.json are named in core/spec.py, because the reference engine reads
them without importing the build side; they are re-exported here so the build side has one place to look.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.records import resolve_recorded
from core.spec import ENGINE_DIR, SPEC_FILE
from dynamo_serve.layout import DYNAMO_DIR

CHECKPOINT = "checkpoint"
ENGINE = ENGINE_DIR
TRITON_REPO = "triton_repo"
LOGS = "logs"
MANIFEST = "manifest.json"
RESOLVED_CONFIG = "config.resolved.yaml"
TOKENIZER = "tokenizer"  # inside the checkpoint
EAGLE3_HEAD = "eagle3"  # inside the checkpoint: the normalized EAGLE-3 head
REFERENCE_SPEC = SPEC_FILE  # inside the engine directory
STAGE_DIRS = (CHECKPOINT, ENGINE, TRITON_REPO, DYNAMO_DIR)  # the only names whose temporary directories a build removes
HF_TARGET_NOTE = "hf_target_dir"  # the convert stage's manifest note naming the resolved HF target directory
HF_MODEL = "hf_model"  # inside the checkpoint: the target's HF directory as a transformers-4 TensorRT-LLM reads it
HF_QUANTIZED = "hf_quantized"  # inside the checkpoint: the target quantized by ModelOpt (HF export), current line
FP8_REFERENCE = "fp8_reference"  # inside the checkpoint: a generic row's FP8 export as the reference engine runs it
TRTLLM_MODEL_NOTE = "trtllm_model_dir"  # the convert stage's note: the HF directory handed to TensorRT-LLM


class LayoutError(RuntimeError):
    """A build directory lacks what a later stage or tool needs; the message says which command writes it."""


def manifest(build_dir: Path, stage: str) -> dict[str, Any]:
    """A finished stage's manifest.json."""
    f = Path(build_dir) / stage / MANIFEST
    try:
        return json.loads(f.read_text())
    except FileNotFoundError:
        raise LayoutError(f"{f} not found: run `python builders/build.py CONFIG` to write the {stage} stage") from None
    except ValueError as e:
        raise LayoutError(f"{f} is not valid JSON ({e}); rerun the build with --force") from None


def _convert_note(build_dir: Path, key: str) -> Path:
    """A path the convert stage recorded once in its manifest's notes (relative to the build directory)."""
    notes = manifest(build_dir, CHECKPOINT).get("notes", {})
    if key not in notes:
        raise LayoutError(
            f"{Path(build_dir) / CHECKPOINT / MANIFEST} has no notes.{key}; rerun the convert stage "
            "(`python builders/build.py CONFIG --force`)"
        )
    return resolve_recorded(str(notes[key]), Path(build_dir).resolve())


def hf_target_dir(build_dir: Path) -> Path:
    """The HF directory the convert stage resolved `target.model` to."""
    return _convert_note(build_dir, HF_TARGET_NOTE)


def trtllm_model_dir(build_dir: Path) -> Path:
    """The HF directory TensorRT-LLM loads the target and its tokenizer from (trtllm-serve, model.yaml `model`): the
    convert stage's transformers-4 copy where the version needs one, else the resolved target."""
    return _convert_note(build_dir, TRTLLM_MODEL_NOTE)
