"""The build on storage that refuses writes (here the file size limit, `ulimit -f`, which fails writes with EFBIG as a
full disk fails them with ENOSPC): it ends with `error: [stage] ...` naming the error and what to do, exit status
1 (a stage failed), no traceback, and the stage's previous output untouched with no temporary directory left."""

from __future__ import annotations

import errno
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


@pytest.mark.parametrize("limit", [0, 1, 40])
def test_a_first_build_that_cannot_write_anything_ends_with_a_setup_error(limit: int, tiny_target: Path,
                                                                          tmp_path: Path) -> None:
    out = tmp_path / "out"
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, "random", out)
    p = _build(cfg, limit)
    assert p.returncode == EXIT_STAGE and "Traceback" not in p.stderr
    assert "error: [setup] File too large" in p.stderr, p.stderr
    assert sorted(x.name for x in out.iterdir()) == []  # no .config.resolved.yaml.tmp-<pid> left behind


def _dead_pid() -> int:
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(child.stdout)


def test_a_build_removes_the_resolved_config_temp_files_of_dead_builds_and_no_other(tiny_target: Path,
                                                                                   tmp_path: Path) -> None:
    from builders.build_dir import RESOLVED_MARKER

    out = tmp_path / "out"
    out.mkdir()
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, "random", out)
    dead = [_dead_pid() for _ in range(3)]
    ours = {f".config.resolved.yaml.tmp-{dead[0]}": b"",  # stopped before its first byte
            f".config.resolved.yaml.tmp-{dead[1]}": RESOLVED_MARKER.encode()[:17],  # stopped inside the marker
            f".config.resolved.yaml.tmp-{dead[2]}": RESOLVED_MARKER.encode() + b"\nname: x\n"}
    others = {f".config.resolved.yaml.tmp-{os.getpid()}": b"",  # a live build's (this process)
              f".config.resolved.yaml.tmp-{dead[0] + 1000000}": b"a user's notes\n",  # not what the build writes
              ".config.resolved.yaml.tmp-x": b""}
    for name, data in {**ours, **others}.items():
        (out / name).write_bytes(data)
    linked = out / f".config.resolved.yaml.tmp-{dead[1] + 1000000}"
    (tmp_path / "elsewhere").write_bytes(b"")
    os.link(tmp_path / "elsewhere", linked)  # a hard link: removing it is not ours to decide
    p = _build(cfg, None)
    assert p.returncode == 0, p.stderr
    for name in ours:
        assert not (out / name).exists() and f"[setup] removing {out / name}: left by a build" in p.stdout, name
    assert all((out / name).read_bytes() == data for name, data in others.items())
    assert linked.exists()


@pytest.mark.parametrize("error", [OSError(errno.EFBIG, "File too large"), OSError(errno.ENOSPC, "No space left"),
                                   KeyboardInterrupt()])
def test_an_atomic_write_that_fails_removes_its_temp_file_and_keeps_the_old_file(
        error: BaseException, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from core import atomic

    final = tmp_path / "f.yaml"
    final.write_text("old\n")
    fdopen = os.fdopen

    class Failing:
        def __init__(self, fd: int, *_: object) -> None:
            self.f = fdopen(fd, "w")

        def __enter__(self) -> Failing:
            return self

        def __exit__(self, *_: object) -> None:
            self.f.close()

        def write(self, text: str) -> None:
            self.f.write(text[:3])
            self.f.flush()
            raise error

    monkeypatch.setattr(atomic.os, "fdopen", Failing)
    with pytest.raises(type(error)):
        atomic.atomic_write_text(final, "new text\n")
    assert final.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.yaml"]
