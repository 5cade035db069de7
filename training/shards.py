"""Where the trainer caches its shards (data, features, checkpoints) and how a file is saved: whole or not at all."""

from __future__ import annotations

import os
import re
from core.files import pid_alive
from pathlib import Path

import torch


def shard_path(work_dir: Path, kind: str, index: int) -> Path:
    return work_dir / kind / f"shard-{index:05d}.pt"


TEMP = re.compile(r"\.tmp-(?P<pid>\d+)$")  # atomic_save's temporary files: <name>.tmp-<pid>


def remove_stale_temps(directory: Path) -> list[Path]:
    """Delete the temporary files atomic_save left in `directory` when its process was killed mid-save (those of a
    process still running are kept: another rank or run may be writing them). Returns what was removed."""
    removed = []
    if directory.is_dir():
        for p in sorted(directory.iterdir()):
            m = TEMP.search(p.name)
            if m and p.is_file() and not p.is_symlink() and not pid_alive(int(m.group("pid"))):
                p.unlink(missing_ok=True)  # another rank may have removed it first
                removed.append(p)
    return removed


def atomic_save(obj: object, path: Path) -> None:
    """torch.save to a temporary file, then an atomic rename: a killed run never leaves a truncated shard."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    torch.save(obj, tmp)
    tmp.replace(path)
