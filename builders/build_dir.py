"""What the build may touch inside `output_dir`: the rules that keep it from deleting or overwriting what it did not
write.

The build owns exactly: the stage directories that carry its manifest (`<stage>/manifest.json` naming that stage),
`logs/<stage>.log` (in a logs/ directory it created: LOGS_MARKER), `config.resolved.yaml`, its own temporary
`.<stage>.tmp-<pid>` / `.<stage>.old-<pid>` directories and `.config.resolved.yaml.tmp-<pid>` files. Anything else
with one of those names is someone else's: the build refuses to start and names it (`--force` reruns stages, it does
not take ownership). `output_dir` must be a directory (or not exist yet), must not be the project's sources, inside
them or a parent of them, and must be a path the Triton python backend can start its stub in (triton_repo/launch.py
`SHELL_UNSAFE`).
"""

from __future__ import annotations

import json
import os
import re
import stat
from core.files import pid_alive
from pathlib import Path
from typing import Any

from core.atomic import TEMP_MARKER, atomic_write_text, is_marked, sha256_file
from builders.layout import LOGS, MANIFEST
from builders.layout import RESOLVED_CONFIG as RESOLVED
from triton_repo.exposure import unsafe_path_problem

LOGS_MARKER = ".eagle-deploy-logs"
RESOLVED_MARKER = "# eagle-deploy: the validated config of this build (builders/build.py rewrites it on each run)"
PROJECT_ROOT = Path(__file__).resolve().parent.parent
# The project's own sources: an output_dir equal to, inside or above any of these is refused (a stage rerun swaps
# whole directories). Other folders of a clone (build/, a user's scratch dir) are fine.
SOURCE_DIRS = (".git", ".ci", "adaptive", "bench", "builders", "clients", "configs", "core", "devtools", "docker",
               "docs", "doctor", "engines", "heads", "ledger", "measure", "scripts", "sources", "stubs", "testkit",
               "tests", "training", "triton_repo", "dynamo_serve")
_TEMP = re.compile(r"^\.(?P<stage>[A-Za-z0-9_]+)\.(tmp|old)-(?P<pid>\d+)$")
_RESOLVED_TEMP = re.compile(rf"^\.{re.escape(RESOLVED)}\.tmp-(?P<pid>\d+)$")


def _is_within(p: Path, parent: Path) -> bool:
    return p == parent or parent in p.parents


def output_dir_problems(output_dir: Path) -> list[str]:
    """Why the build must not write to `output_dir` (empty when it may)."""
    out = output_dir.expanduser().resolve()
    problems: list[str] = []
    if out.exists() and not out.is_dir():
        problems.append(f"output_dir {out} exists and is not a directory; point output_dir at a directory")
    if _is_within(PROJECT_ROOT, out):
        problems.append(f"output_dir {out} is the project directory {PROJECT_ROOT} or a parent of it; a build there "
                        "could replace the project's sources: use a new directory such as build/<name>")
    for name in SOURCE_DIRS:
        src = PROJECT_ROOT / name
        if _is_within(out, src):
            problems.append(f"output_dir {out} is inside the project's sources ({src}); use a directory outside them "
                            "such as build/<name>")
    unsafe = unsafe_path_problem(out, "output_dir")
    if unsafe:
        problems.append(unsafe)
    return problems


def read_manifest(stage_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((stage_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_ours(stage_dir: Path, stage: str) -> bool:
    """A stage directory the build wrote: its manifest names this stage and records a config hash."""
    man = read_manifest(stage_dir)
    return man is not None and man.get("stage") == stage and "config_hash" in man


def foreign_problem(build_dir: Path, stage: str) -> str | None:
    """Why `<build_dir>/<stage>` must not be replaced (None when it is absent or ours)."""
    d = build_dir / stage
    if not d.exists() and not d.is_symlink():
        return None
    if d.is_symlink() or not d.is_dir():
        return f"{d} exists and is not a stage directory written by this build; move it away or pick another output_dir"
    if not is_ours(d, stage):
        return (f"{d} exists without this build's {MANIFEST} (stage {stage!r}): it was not written by this build, so "
                "it is never deleted or overwritten (--force does not change that); move it away or pick another "
                "output_dir")
    return None


def ownership_problems(build_dir: Path, stages: list[str]) -> list[str]:
    """Everything in `build_dir` the build would replace but did not write: stage dirs, logs/, config.resolved.yaml.
    `stages` = every stage name of the pipeline (logs of stages not selected by --only are ours too)."""
    problems = [p for s in stages if (p := foreign_problem(build_dir, s)) is not None]
    logs = build_dir / LOGS
    if logs.is_symlink() or (logs.exists() and not logs.is_dir()):
        problems.append(f"{logs} exists and is not the build's log directory; move it away")
    elif logs.is_dir():
        problems += [p for s in stages if (p := _foreign_log(build_dir, s)) is not None]
    resolved = build_dir / RESOLVED
    if resolved.is_symlink() or (resolved.exists() and not resolved.is_file()):
        problems.append(f"{resolved} exists and is not a file; move it away")
    elif resolved.exists() and not _looks_resolved(resolved) and not _legacy_resolved(build_dir, stages):
        problems.append(f"{resolved} exists and was not written by this build; move it away")
    return problems


def _foreign_log(build_dir: Path, stage: str) -> str | None:
    """Why `logs/<stage>.log` must not be overwritten: a link or not a file, or a file in a logs/ directory the
    build did not create (no LOGS_MARKER) next to no stage directory of ours. Other files in logs/ are never
    touched, so they are no reason to refuse."""
    log = build_dir / LOGS / f"{stage}.log"
    if not log.exists() and not log.is_symlink():
        return None
    if not single_file(log):
        return f"{log} exists and is not a log file this build wrote (a link, a hard link or not a file); move it away"
    if (build_dir / LOGS / LOGS_MARKER).is_file() or is_ours(build_dir / stage, stage):
        return None
    return f"{log} was not written by this build (no {LOGS}/{LOGS_MARKER}); move it away or pick another output_dir"


def mark_logs(build_dir: Path) -> Path:
    """Create `logs/` with the marker that says the build owns its `<stage>.log` files."""
    logs = build_dir / LOGS
    logs.mkdir(parents=True, exist_ok=True)
    marker = logs / LOGS_MARKER
    if not marker.is_file():
        marker.write_text("logs/<stage>.log here are written by eagle-deploy builds (builders/build.py)\n")
    return logs


def fresh_log(build_dir: Path, stage: str) -> Path:
    """An empty `logs/<stage>.log`: a new file (the old one unlinked, never truncated through a link or a hard
    link to a file elsewhere)."""
    log = mark_logs(build_dir) / f"{stage}.log"
    log.unlink(missing_ok=True)
    os.close(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))
    return log


def single_file(path: Path) -> bool:
    """A regular file, not a link, with no other hard link (writing it can change nothing elsewhere)."""
    try:
        st = path.lstat()
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1


def _looks_resolved(path: Path) -> bool:
    """A config.resolved.yaml the build wrote starts with RESOLVED_MARKER (write_resolved)."""
    if not single_file(path):
        return False
    try:
        with path.open("rb") as f:
            return f.read(len(RESOLVED_MARKER) + 1) == RESOLVED_MARKER.encode() + b"\n"
    except OSError:
        return False


def _legacy_resolved(build_dir: Path, stages: list[str]) -> bool:
    """A config.resolved.yaml of a build from before the marker line: its `derived:` section, next to a stage
    directory carrying our manifest (a lone file with such a line is a user's)."""
    path = build_dir / RESOLVED
    if not single_file(path) or not any(is_ours(build_dir / s, s) for s in stages):
        return False
    try:
        return "\nderived:\n" in f"\n{path.read_text()}"
    except (OSError, UnicodeDecodeError):
        return False


def write_resolved(build_dir: Path, text: str) -> None:
    """Write config.resolved.yaml beside itself and rename it into place (core/atomic.py `atomic_write_text`: a
    link or a hard link there is replaced, never written through; a failed write leaves no temporary file)."""
    atomic_write_text(build_dir / RESOLVED, f"{RESOLVED_MARKER}\n{text}")


def dead_resolved_temps(build_dir: Path) -> list[Path]:
    """`.config.resolved.yaml.tmp-<pid>` files of builds that are no longer running (a build killed while writing
    leaves one; a live pid may be a concurrent build, so its file stays). Only what write_resolved writes: a regular
    file with no other hard link whose bytes are empty or begin as RESOLVED_MARKER does (a prefix of it when the
    write stopped early); any other file of that name is never removed."""
    if not build_dir.is_dir():
        return []
    mark = RESOLVED_MARKER.encode() + b"\n"
    out = []
    for p in sorted(build_dir.iterdir()):
        m = _RESOLVED_TEMP.match(p.name)
        if not m or pid_alive(int(m.group("pid"))) or not single_file(p):
            continue
        try:
            with p.open("rb") as f:
                head = f.read(len(mark))
        except OSError:
            continue
        if mark.startswith(head):
            out.append(p)
    return out


def dead_temp_dirs(build_dir: Path, stages: list[str]) -> list[Path]:
    """`.<stage>.tmp-<pid>` / `.<stage>.old-<pid>` directories left by builds that are no longer running (killed
    builds leave them; a live pid may be a concurrent build, so its directories stay). Only for our `stages`, and
    only those carrying our marker (core/atomic.py TEMP_MARKER) or, for `.old-`, our manifest of that stage:
    a directory of the same shape that we did not write is never removed."""
    if not build_dir.is_dir():
        return []
    out = []
    for p in sorted(build_dir.iterdir()):
        m = _TEMP.match(p.name)
        if not m or m.group("stage") not in stages or pid_alive(int(m.group("pid"))):
            continue
        if is_marked(p) or (p.name.startswith(f".{m.group('stage')}.old-") and is_ours(p, m.group("stage"))):
            out.append(p)
    return out


def output_records(root: Path) -> list[dict[str, Any]]:
    """Every file of a finished stage output with its size and sha256, for the manifest. A symbolic link (a stage that
    links an input's weights, e.g. checkpoint/hf_model/) is recorded by its target: that file is an input, fingerprinted
    as one, and hashing it again would cost as much as the weights are large."""
    out: list[dict[str, Any]] = []
    for p in sorted(root.rglob("*")):
        if p.name == MANIFEST or p.relative_to(root) == Path(TEMP_MARKER):
            continue
        if p.is_symlink():
            out.append({"path": str(p.relative_to(root)), "link": os.readlink(p)})
        elif p.is_file():
            out.append({"path": str(p.relative_to(root)), "size": p.stat().st_size, "sha256": sha256_file(p)})
    return out


def output_damage(stage_dir: Path, manifest: dict[str, Any], verify: bool) -> list[str]:
    """How the stage's files differ from its manifest: missing or resized files (always), changed contents (with
    `verify`: a full hash of every output)."""
    records = manifest.get("outputs")
    if not isinstance(records, list):
        return [f"{stage_dir / MANIFEST} lists no outputs"]
    damage = []
    for rec in records:
        p = stage_dir / str(rec.get("path"))
        if "link" in rec:
            if not p.is_symlink() or os.readlink(p) != rec["link"] or not p.is_file():
                damage.append(f"{p} is not the link to {rec['link']} the build wrote (or its target is gone)")
            continue
        if not p.is_file():
            damage.append(f"{p} is missing")
        elif p.stat().st_size != rec.get("size"):
            damage.append(f"{p} has {p.stat().st_size} bytes, the build wrote {rec.get('size')}")
        elif verify and rec.get("sha256") is None:
            damage.append(f"{p}: the manifest records no hash (built by an older version)")
        elif verify and sha256_file(p) != rec["sha256"]:
            damage.append(f"{p}: contents changed since the build (sha256 differs)")
    return damage
