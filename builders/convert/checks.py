"""Preflight for the convert stage: every problem with the target, the head and their fit, found BEFORE anything is
written (build.py exits 2 with all of them). Reads configs and safetensors headers only (plus d2t/t2d, which are
small); no tensor data of the target is loaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from builders.config import BuildConfig
from builders.convert.eagle import check_head, head_bias
from builders.convert import families
from builders.convert.eagle3 import check_eagle3, resolve_layer_ids
from builders.convert.head_layout import flat_head, named_as_given
from builders.convert.llama import check_parallel
from builders.published import published_problems
from builders.convert.shapes import shape_problems, target_shapes
from builders.convert.weights import WeightFileError, WeightSource
from sources.targets import ModelSourceError, resolve_target
from builders.trtllm import architectures
from core.hfconfig import LlamaSpec, ModelConfigError, llama_spec, read_config
from core.draft_heads import mla_head_problem
from core.families import CHAIN_ONLY, NATIVE, family_of


def _tokenizer_fingerprint(d: Path) -> Any:
    """The vocabulary of a tokenizer.json (model vocab + added tokens), or None when the directory has none."""
    f = d / "tokenizer.json"
    if not f.is_file():
        return None
    data = json.loads(f.read_text())
    added = sorted((t["id"], t["content"]) for t in data.get("added_tokens", []))
    return data.get("model", {}).get("vocab"), added


def tokenizer_problems(target_dir: Path, head_dir: Path | None) -> list[str]:
    if not (target_dir / "tokenizer.json").is_file() and not (target_dir / "tokenizer.model").is_file():
        return [f"target.model {target_dir}: no tokenizer.json or tokenizer.model; the target directory must include "
                "its tokenizer (it is copied into the checkpoint)"]
    problems = _auto_map_problems(target_dir / "tokenizer_config.json")
    if head_dir is None:
        return problems
    head_tok = _tokenizer_fingerprint(head_dir)
    if head_tok is not None and head_tok != _tokenizer_fingerprint(target_dir):
        return [f"draft.model {head_dir}: its tokenizer.json differs from the target's ({target_dir}); the head was "
                "trained for another tokenizer"]
    return problems


def _auto_map_problems(path: Path) -> list[str]:
    """A tokenizer config whose auto_map names custom code (builders/convert/tokenizer.py `auto_map_problem`)."""
    from builders.convert.tokenizer import auto_map_problem

    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError):
        return []  # absent or unreadable: the tokenizer load reports it
    problem = auto_map_problem(cfg, path) if isinstance(cfg, dict) else None
    return [] if problem is None else [f"target.model: {problem}"]


def config_checks(cfg: BuildConfig) -> tuple[Path | None, LlamaSpec | None, list[str]]:
    """The target's checks that read its config.json only (no weights): its row of the architecture table for this
    version, backend and draft type, and what its family refuses. `build.py --dry-run` runs these too."""
    try:
        hf = resolve_target(cfg.target.model)
        arch = (read_config(hf).get("architectures") or [None])[0]
        refused = architectures.problems(arch, version=cfg.trtllm_version, backend=cfg.engine.backend,
                                         draft_type=cfg.draft.type, where=str(hf))
        if refused:
            return None, None, refused
        spec = llama_spec(hf, require_arch=False)
    except (ModelSourceError, ModelConfigError) as e:
        return None, None, [f"target.model: {e}"]
    p = families.problems(spec, reference_engine=cfg.engine.kind.reference_engine, max_seq_len=cfg.engine.max_seq_len,
                          tp=cfg.parallel.tp)
    p += published_problems(cfg, hf, spec.architecture)  # a target published quantized (builders/published.py)
    row = family_of(spec.architecture)
    if cfg.engine.kind.reference_engine and row is not None and row.attention in CHAIN_ONLY:
        tree = cfg.static_tree()
        if tree is None or not tree.is_chain():
            p.append(f"target.model {hf}: {spec.architecture}: {CHAIN_ONLY[row.attention]}, "
                     "so the reference engine verifies only chain drafts for it; set tree.choices: chain-N "
                     "(e.g. chain-3), or build for engine.backend pytorch")
    return hf, spec, p


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


def _weights_present(hf: Path) -> list[str]:
    """A target directory without its weights (a plan can be made from config.json alone; the build cannot)."""
    if any((hf / n).is_file() for n in WEIGHT_FILES):
        return []
    return [f"target.model {hf}: no weights ({', '.join(WEIGHT_FILES)}); download the checkpoint's weight files "
            "into it (--dry-run prints the plan from config.json alone)"]


def _target_checks(cfg: BuildConfig) -> tuple[Path | None, LlamaSpec | None, list[str]]:
    hf, spec, p = config_checks(cfg)
    if hf is None or spec is None:
        return hf, spec, p
    from builders.convert.hf_quant_stage import preflight_problems

    p += preflight_problems(cfg, spec.architecture)
    if spec.architecture not in NATIVE:  # the generic path converts no weights: transformers reads the directory
        return hf, spec, p + _weights_present(hf)
    p += check_parallel(spec, cfg.parallel.tp, cfg.parallel.pp)
    if cfg.parallel.pp > 1:
        p.append(f"parallel.pp={cfg.parallel.pp}: EAGLE checkpoints are written with pp=1 (TensorRT-LLM's "
                 "EagleForCausalLM has no pipeline parallelism); set parallel.pp=1")
    try:
        with WeightSource(hf) as src:
            p += shape_problems(src, target_shapes(spec), "target.model")
    except (WeightFileError, ModelConfigError) as e:
        p.append(f"target.model: {e}")
    return hf, spec, p


def _eagle_checks(cfg: BuildConfig, target: LlamaSpec, head_dir: Path) -> list[str]:
    try:
        head = llama_spec(head_dir, require_arch=False)
        with WeightSource(head_dir) as src:
            p = check_head(head, target, src) + check_parallel(head, cfg.parallel.tp, 1)
            head_bias(head_dir, src)
    except (WeightFileError, ModelConfigError) as e:
        return [f"draft.model: {e}"]
    return p


def _eagle3_checks(cfg: BuildConfig, target: LlamaSpec, head_dir: Path) -> list[str]:
    """Any layout the doctor reads (a speculators head through its flat view: builders/convert/head_layout.py)."""
    try:
        mla = mla_head_problem(read_config(head_dir), f"draft.model {head_dir}")
    except ModelConfigError as e:
        return [f"draft.model: {e}"]
    if mla is not None:
        return [mla]
    try:
        with flat_head(head_dir) as flat:
            try:
                ids = resolve_layer_ids(read_config(flat), cfg.draft.eagle3.layers_to_capture, flat)
                with WeightSource(flat) as src:
                    p = check_eagle3(flat, target, ids, src)
            except (WeightFileError, ModelConfigError) as e:
                p = [f"draft.model: {e}"]
            return [named_as_given(m, flat, head_dir) for m in p]
    except ModelConfigError as e:
        return [f"draft.model: {e}"]


def preflight(cfg: BuildConfig) -> list[str]:
    """All problems of the convert stage's inputs; empty = safe to write."""
    hf, target, p = _target_checks(cfg)
    if hf is None or target is None:
        return p
    head_dir = None if cfg.draft.model == "random" else Path(cfg.draft.model)
    if head_dir is not None and not head_dir.is_dir():
        return p + [f"draft.model {head_dir}: not a directory; give the head's directory or `random`"]
    p += tokenizer_problems(hf, head_dir)
    if head_dir is None:
        return p
    if not cfg.draft.kind.eagle3:
        return p + _eagle_checks(cfg, target, head_dir)
    return p + _eagle3_checks(cfg, target, head_dir)
