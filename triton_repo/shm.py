"""The python backend's shared-memory regions of servers this launcher started: `/dev/shm/eagle<launcher pid>_
<grpc port>_rank<r>_<uuid>` (the prefix is ours: launch.py passes `shm-region-prefix-name`; the python backend adds
the uuid, python_backend src/shm_manager.cc). A server that is killed (or stopped before it was ready) leaves its
regions behind, 1 MiB or more each, until the machine reboots. The launcher removes its own server's regions on
every exit path it controls, and at each start the regions of earlier launchers that are gone and that no process
still maps or holds open (so a server still running after its launcher was killed keeps its regions).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from core.files import pid_alive

SHM_DIR = Path("/dev/shm")
REGION = re.compile(r"eagle(?P<pid>\d+)_(?P<port>\d+)_rank\d+_.+")


def prefix(tag: str, rank: int) -> str:
    return f"eagle{tag}_rank{rank}_"


def own_regions(tag: str, shm_dir: Path = SHM_DIR) -> list[Path]:
    """The regions of the server launched with `tag` (all its ranks)."""
    return sorted(p for p in shm_dir.glob(f"eagle{tag}_rank*_*") if REGION.fullmatch(p.name))


def _in_use(shm_dir: Path) -> set[str]:
    """Names under `shm_dir` that some process maps or holds open (/proc/<pid>/maps and fd links)."""
    used: set[str] = set()
    root = str(shm_dir) + "/"
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for line in (proc / "maps").read_text().splitlines():
                path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
                if path.startswith(root):
                    used.add(path[len(root):].removesuffix(" (deleted)"))
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith(root):
                    used.add(target[len(root):])
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return used


def stale_regions(shm_dir: Path = SHM_DIR) -> list[Path]:
    """Regions of launchers that are gone, which no process maps or holds open."""
    mine = [p for p in shm_dir.iterdir() if (m := REGION.fullmatch(p.name)) and not pid_alive(int(m.group("pid")))] \
        if shm_dir.is_dir() else []
    if not mine:
        return []
    used = _in_use(shm_dir)
    return sorted(p for p in mine if p.name not in used)


def remove(paths: list[Path]) -> int:
    """Unlink these regions (a region already gone is fine); returns how many were removed."""
    n = 0
    for p in paths:
        try:
            p.unlink()
            n += 1
        except FileNotFoundError:
            continue
    return n
