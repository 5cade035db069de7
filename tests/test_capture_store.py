"""The capture store's edges without a server (triton_repo/models/capture.py): directories it refuses (links, shared,
another user's) without changing them, segment names it refuses (never read, never beyond the size bound), writers
sharing a store across PID namespaces (flock liveness, unique writer ids) and the strict `eagle_capture` opt-out."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from triton_repo.models import capture as C
from triton_repo.models import ownership

ROOT = Path(__file__).resolve().parent.parent


def settings(**kw: Any) -> C.Settings:
    base = dict(dir="store", max_bytes=1 << 20, sample_rate=1.0, segment_records=4, segment_seconds=60.0,
                queue_size=64)
    return C.Settings(**{**base, **kw})


class Req:
    def __init__(self, params: dict[str, Any] | None, rid: str = "") -> None:
        self.p, self.rid = params, rid

    def parameters(self) -> str:
        return json.dumps(self.p) if self.p is not None else ""

    def request_id(self) -> str:
        return self.rid


# ---- the opt-out -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "out"), [(False, True), ("false", True), (True, False), ("true", False)])
def test_the_accepted_opt_out_values(value: Any, out: bool) -> None:
    raw = json.dumps({C.OPT_OUT: value})
    assert C.opt_out_problem(raw) is None and ownership.problem(Req({C.OPT_OUT: value})) is None
    assert C.opted_out(raw) is out


@pytest.mark.parametrize("value", ["off", "n", "no", "0", "0.0", "", " false", "False", "FALSE", "yes", 0, 1, 0.0,
                                   None, [], {}, "f"])
def test_an_opt_out_value_not_understood_is_refused_never_recorded(value: Any) -> None:
    raw = json.dumps({C.OPT_OUT: value})
    problem = ownership.problem(Req({C.OPT_OUT: value}, rid="r1"))
    assert problem == C.opt_out_problem(raw) and problem is not None
    assert problem.startswith(f"parameter {C.OPT_OUT}={json.dumps(value)} is not understood; send {C.OPT_OUT}: false")
    assert C.opted_out(raw)  # even were it let through: not recorded


@pytest.mark.parametrize("raw", [None, "", "{}", '{"other": "off"}', "not json", "[1]"])
def test_no_opt_out_parameter_is_no_problem_and_recorded(raw: str | None) -> None:
    assert C.opt_out_problem(raw) is None and not C.opted_out(raw)


# ---- directories -----------------------------------------------------------------------------------------------------

def _shared(p: Path, mode: int) -> Path:
    p.mkdir()
    os.chmod(p, mode)
    return p


@pytest.mark.parametrize("case", ["link to shared 1777", "link to own 0700", "shared 1777", "world-writable 0777",
                                  "group-writable 0770", "a file", "another user's"])
def test_an_unsafe_capture_dir_is_refused_and_left_unchanged(tmp_path: Path, case: str) -> None:
    d = tmp_path / "store"
    target: Path | None = None
    if case.startswith("link"):
        target = _shared(tmp_path / "target", 0o1777 if "1777" in case else 0o700)
        d.symlink_to(target)
    elif case == "a file":
        d.write_text("x")
    elif case == "another user's":
        if os.geteuid() != 0:
            pytest.skip("needs root to give a directory to another user")
        _shared(d, 0o700)
        os.chown(d, 65534, 65534)
    else:
        _shared(d, int(case.split()[-1], 8))
    before = os.lstat(target if target is not None else d)
    with pytest.raises(C.UnsafeStore) as e:
        C.Writer(d, settings())
    words = {"link": "is a symbolic link", "file": "is not a directory", "user": "belongs to uid 65534"}
    assert next((w for k, w in words.items() if k in case), "is shared (mode") in str(e.value)
    after = os.lstat(target if target is not None else d)
    assert (stat.S_IMODE(after.st_mode), after.st_uid) == (stat.S_IMODE(before.st_mode), before.st_uid)
    assert C.dir_problem(d) == str(e.value)


@pytest.mark.parametrize("mode", [0o755, 0o700, 0o711, None])
def test_an_own_dir_is_made_private_and_a_new_one_created_private(tmp_path: Path, mode: int | None) -> None:
    d = tmp_path / "a" / "store"
    if mode is not None:
        d.mkdir(parents=True)
        os.chmod(d, mode)
    C.Writer(d, settings()).close()
    assert stat.S_IMODE(d.stat().st_mode) == 0o700


# ---- segment names ---------------------------------------------------------------------------------------------------

FUTURE = f"{C.SEALED_PREFIX}{(time.time_ns() + 10 * 365 * 86400 * 10**9):020d}-x-1{C.SUFFIX}"
BAD_NAMES = [FUTURE, f"{C.SEALED_PREFIX}99999999999999999999-host.1-1{C.SUFFIX}", f"{C.SEALED_PREFIX}abc{C.SUFFIX}",
             f"{C.SEALED_PREFIX}1-2-3{C.SUFFIX}", f"{C.SEALED_PREFIX}00000000000000000001-a_b-1{C.SUFFIX}",
             f"{C.SEALED_PREFIX}00000000000000000001-a-1-{C.SUFFIX}"]


@pytest.mark.parametrize("name", BAD_NAMES, ids=lambda n: "ten-years-ahead" if n == FUTURE else n)  # ids stable
def test_a_planted_segment_is_never_read_and_cannot_evade_the_bound(tmp_path: Path, name: str) -> None:
    d = tmp_path / "store"
    C.private_dir(d)
    planted = d / name
    planted.write_text(json.dumps({"id": "planted"}) + "\n" * 4000)
    assert "planted" not in [r["id"] for r in C.read_records(d)] and planted not in C.sealed_segments(d)
    w = C.Writer(d, settings(max_bytes=4096, segment_records=2))
    for i in range(40):
        w.offer({"id": f"r{i}", "pad": "x" * 64})
    w.close()
    assert not planted.exists() and C.store_bytes(d) <= 4096
    assert sum(p.stat().st_size for p in d.iterdir()) <= 4096  # nothing else outside the bound
    assert [r["id"] for r in C.read_records(d)][-1] == "r39"


def test_a_segment_that_is_a_link_or_a_directory_is_never_followed(tmp_path: Path) -> None:
    d = C.private_dir(tmp_path / "store")
    outside = tmp_path / "secret.jsonl"
    outside.write_text(json.dumps({"id": "outside"}) + "\n")
    link = d / f"{C.SEALED_PREFIX}{time.time_ns():020d}-l-1{C.SUFFIX}"
    link.symlink_to(outside)
    sub = d / f"{C.SEALED_PREFIX}{time.time_ns():020d}-d-1{C.SUFFIX}"
    sub.mkdir()
    assert list(C.read_records(d)) == [] and set(C.refused_segments(d)) == {link, sub}
    C.enforce_bound(d, 1 << 20)
    assert not link.exists() and outside.exists()


# ---- writers sharing a store ---------------------------------------------------------------------------------------

def test_a_live_writers_open_segment_survives_another_writers_start(tmp_path: Path, monkeypatch: Any) -> None:
    """A writer whose pid means nothing here (another PID namespace) keeps its open segment: liveness is its lock."""
    d = tmp_path / "store"
    monkeypatch.setattr(C, "OPEN_GRACE_S", 0.0)
    a = C.Writer(d, settings(segment_records=100))
    for i in range(3):
        a.offer({"id": f"a{i}"})
    deadline = time.monotonic() + 10
    while not [p for p in d.iterdir() if p.name.startswith(C.OPEN_PREFIX)] and time.monotonic() < deadline:
        time.sleep(0.01)
    opened = [p for p in d.iterdir() if p.name.startswith(C.OPEN_PREFIX)]
    time.sleep(0.05)
    renamed = opened[0].with_name(f"{C.OPEN_PREFIX}999999-1{C.SUFFIX}")  # named like a dead process's segment
    for w in (C.Writer(d, settings()), C.Writer(d, settings())):
        w.close()
    assert opened[0].exists() and not renamed.exists()
    a.close()
    assert sorted(r["id"] for r in C.read_records(d)) == ["a0", "a1", "a2"]


def test_same_pid_writers_never_collide(tmp_path: Path, monkeypatch: Any) -> None:
    """Writers that all see pid 1 (each in its own PID namespace) write every record."""
    monkeypatch.setattr(C.os, "getpid", lambda: 1)
    d = tmp_path / "store"
    writers = [C.Writer(d, settings(segment_records=3)) for _ in range(3)]
    assert len({w.id for w in writers}) == 3 and all(".1." in w.id for w in writers)
    for i in range(10):
        for k, w in enumerate(writers):
            w.offer({"id": f"{k}-{i}"})
    for w in writers:
        w.close()
    assert sorted(r["id"] for r in C.read_records(d)) == sorted(f"{k}-{i}" for k in range(3) for i in range(10))


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare -p")
def test_writers_in_other_pid_namespaces_lose_nothing() -> None:
    """Separate processes in fresh PID namespaces (bench/bench_capture_writers.py): a writer starting in another
    namespace beside a live one, and two writers that are both pid 1."""
    out = subprocess.run([sys.executable, "bench/bench_capture_writers.py", "--records", "6"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["live open segment: 12 records written, 12 in the store, 0 lost",
                                       "same pid: 12 records written, 12 in the store, 0 lost"]


def test_a_dead_writers_open_segment_is_removed_once_unlocked_and_old(tmp_path: Path, monkeypatch: Any) -> None:
    d = C.private_dir(tmp_path / "store")
    left = d / f"{C.OPEN_PREFIX}gone.boot.7.00-1{C.SUFFIX}"
    left.write_text('{"id": "lost"}\n')
    C.Writer(d, settings()).close()
    assert left.exists()  # younger than OPEN_GRACE_S: maybe a writer about to lock it
    monkeypatch.setattr(C, "OPEN_GRACE_S", 0.0)
    C.Writer(d, settings()).close()
    assert not left.exists()
