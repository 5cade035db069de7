"""`engine.backend: reference`: record what the reference engine needs as `<build>/engine/reference.json`.

Everything is relative to the build directory (core/spec.py), so Triton's reference model and the tools load
the engine from the build directory alone, wherever it is mounted.
"""

from __future__ import annotations

import json
from pathlib import Path

from builders import layout
from builders.config import BuildConfig
from core.spec import ReferenceSpec
from measure.draft_vocab import read_draft_vocab


class ReferenceSpecError(ValueError):
    """The checkpoint lacks what reference.json must record; the message names the file and key."""


def random_head_flag(checkpoint_dir: Path) -> bool:
    """`eagle_deploy.random_head` from the converted checkpoint's config.json (written by builders/convert)."""
    f = checkpoint_dir / "config.json"
    try:
        data = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise ReferenceSpecError(f"cannot read {f}: {e}; rerun the checkpoint stage") from e
    section = data.get("eagle_deploy") if isinstance(data, dict) else None
    if not isinstance(section, dict) or not isinstance(section.get("random_head"), bool):
        raise ReferenceSpecError(
            f"{f} has no boolean `eagle_deploy.random_head`; it was not written by this project's converter "
            "(rerun `python builders/build.py CONFIG --only checkpoint --force`)"
        )
    return section["random_head"]


def reference_spec(cfg: BuildConfig, random_head: bool, hf_target_dir: Path | None = None) -> ReferenceSpec:
    """The spec rendered from the config (pure but for reading draft.draft_vocab's ids); paths relative to the
    build dir; `hf_target_dir` is what the convert stage resolved target.model to."""
    return ReferenceSpec(
        checkpoint_dir=layout.CHECKPOINT,
        tokenizer_dir=f"{layout.CHECKPOINT}/{layout.TOKENIZER}",
        draft_type=cfg.draft.type,
        eagle3_head_dir=f"{layout.CHECKPOINT}/{layout.EAGLE3_HEAD}" if cfg.draft.kind.eagle3 else None,
        random_head=random_head,
        tree=cfg.draft_tree,
        dtype=cfg.target.dtype,
        device=cfg.engine.device,
        tp=cfg.parallel.tp,
        max_batch_size=cfg.request_limits().max_batch_size,
        max_input_len=cfg.request_limits().max_input_len,
        max_seq_len=cfg.request_limits().max_seq_len,
        hf_target_dir=None if hf_target_dir is None else str(hf_target_dir),
        draft_vocab=read_draft_vocab(Path(cfg.draft.draft_vocab)) if cfg.draft.draft_vocab else None,
        draft_len_schedule=cfg.draft_len_schedule(),
        max_concurrency=cfg.tree.max_concurrency,
        acceptance_rate_window_size=cfg.tree.acceptance_rate_window_size or 0,
        acceptance_rate_threshold=cfg.tree.acceptance_rate_threshold,
        acceptance_switch_per_sequence=cfg.tree.acceptance_switch_per_sequence,
    )
