"""The build on storage that refuses writes (here the file size limit, `ulimit -f`, which fails writes with EFBIG as a
full disk fails them with ENOSPC): it ends with `error: [stage] ...` naming the error and what to do, exit status
1 (a stage failed), no traceback, and the stage's previous output untouched with no temporary directory left."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from builders.build import EXIT_STAGE
from tests.test_config_cli import write_cfg

ROOT = Path(__file__).resolve().parent.parent


def _build(cfg: Path, limit: int | None, *extra: str) -> subprocess.CompletedProcess[str]:
    def cap() -> None:
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, str(ROOT / "builders" / "build.py"), str(cfg), "--only", "checkpoint",
                           *extra], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600, preexec_fn=cap)


def _snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("limit", [4096, 64 << 10, 1 << 20])
def test_a_stage_that_cannot_write_ends_with_its_error_and_keeps_the_previous_output(limit: int, tiny_target: Path,
                                                                                     tmp_path: Path) -> None:
    out = tmp_path / "out"
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, "random", out)
    first = _build(cfg, None)
    assert first.returncode == 0, first.stderr
    before = _snapshot(out / "checkpoint")
    p = _build(cfg, limit, "--force")
    assert p.returncode == EXIT_STAGE, p.stderr
    assert "Traceback" not in p.stderr
    assert "error: [checkpoint] File too large" in p.stderr, p.stderr
    assert "(errno EFBIG): free space or raise the limit (df -h, ulimit -f, quota), then rerun" in p.stderr
    assert "the stage's previous output (if any) is kept" in p.stderr
    assert _snapshot(out / "checkpoint") == before
    assert not [d.name for d in out.iterdir() if ".tmp-" in d.name or ".old-" in d.name]


def test_a_first_build_that_cannot_write_anything_ends_with_a_setup_error(tiny_target: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, "random", out)
    p = _build(cfg, 0)
    assert p.returncode == EXIT_STAGE and "Traceback" not in p.stderr
    assert "error: [setup] File too large" in p.stderr, p.stderr
