"""Where the trainer caches its shards (data, features, checkpoints) and how a file is saved: whole or not at all."""

from __future__ import annotations

import os
from pathlib import Path

import torch


def shard_path(work_dir: Path, kind: str, index: int) -> Path:
    return work_dir / kind / f"shard-{index:05d}.pt"


def atomic_save(obj: object, path: Path) -> None:
    """torch.save to a temporary file, then an atomic rename: a killed run never leaves a truncated shard."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    torch.save(obj, tmp)
    tmp.replace(path)
