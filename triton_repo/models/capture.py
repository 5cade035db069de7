"""The capture store: the served LLM model records each finished request (prompt and output token ids, sampling
parameters, per-request acceptance, model version) for adaptive/refresh.py (docs/adaptive.md). Opt-in: the build
writes `capture.json` at the repository root only when `capture.enabled` (builders/adaptive_config.py); without it
the hook does nothing.

Layout of the store directory (mode 0700, every file 0600, so only the server's user reads what clients sent):

    seg-<unix ns>-<writer>-<n>.jsonl  a sealed segment: one JSON record per line, complete, never rewritten
    .open-<writer>-<n>.jsonl          the segment being written (readers skip it), flock()ed by its writer

`<writer>` is unique to one writer, whichever host, boot and PID namespace it runs in (a store may be a volume that
replicas share): `<host>.<boot id>.<pid>.<16 random hex>`. A segment is written to its `.open-` name, under an
exclusive flock() its writer holds until it is sealed, and renamed into place (still locked) when it holds
`segment_records` records or is `segment_seconds` old, so a sealed segment is whole and a crash loses at most the open
one. A later writer removes an open segment only when it can take that lock (its writer is gone: the kernel drops a
dead process's locks) and the file is older than OPEN_GRACE_S; no process id is ever compared. After each seal the
oldest sealed segments are deleted until the store is within `max_bytes`. A file named like a segment whose name does
not parse, whose time lies more than MAX_FUTURE_S ahead, or that is not a regular file is never read and is deleted
first by that bound, so no name can keep a segment out of the bound's reach.

The directory is refused (UnsafeStore) when it is a symbolic link, not a directory, another user's, or writable by
other users (a shared 1777 directory): the store holds client prompts, so it must be a directory of its own; a new
one is created 0700 and an existing one of ours is tightened to 0700, never a link's target or a shared directory.

Serving never waits on the disk: the model hands a record to a bounded queue (`queue_size`) that one
writer thread drains; a record that finds it full, or that the disk refuses, is dropped and counted
(eagle_llm_capture_dropped_total). A request opts out with the request parameter `eagle_capture: false` (Triton
forwards an ensemble request's parameters to its steps: triton-inference-server/core pull 261); the parameter is
read strictly (OPT_OUT_VALUES): any other value is refused with INVALID_ARGUMENT before any work, never recorded.

Nothing here imports pb_utils at module level: the arithmetic and the files run in tests without a server.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import queue
import random
import re
import secrets
import socket
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SETTINGS_FILE = "capture.json"  # at the repository root (written by the triton stage when capture.enabled)
OPT_OUT = "eagle_capture"  # request parameter; false = never recorded
SEALED_PREFIX, OPEN_PREFIX, SUFFIX = "seg-", ".open-", ".jsonl"
DIR_MODE, FILE_MODE = 0o700, 0o600
MAX_FUTURE_S = 3600.0  # a sealed segment dated further ahead than this (clock skew between replicas) is refused
OPEN_GRACE_S = 10.0  # an unlocked open segment younger than this may be one whose writer is about to lock it
# seg-<20-digit ns>-<writer>-<n>.jsonl (a writer id of letters, digits and dots; older stores: the pid)
SEALED_NAME = re.compile(r"seg-(\d{20})-([A-Za-z0-9.]{1,96})-(\d{1,12})\.jsonl")
OPT_OUT_VALUES = {True: True, False: False, "true": True, "false": False}  # the only values of eagle_capture
OPT_OUT_HELP = (f'send {OPT_OUT}: false (a boolean, or the string "false") to keep this request out of the capture '
                'store, true (or "true", or no parameter) to allow it')


@dataclass(frozen=True)
class Settings:
    dir: str  # absolute, or relative to the repository root
    max_bytes: int
    sample_rate: float
    segment_records: int
    segment_seconds: float
    queue_size: int

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    def store_dir(self, repo_root: Path) -> Path:
        return Path(os.path.normpath(os.path.abspath(Path(repo_root) / self.dir)))  # a link is seen, not followed


def read_settings(repo_root: Path) -> Settings | None:
    """The repository's capture settings, or None when the build did not enable capture."""
    f = Path(repo_root) / SETTINGS_FILE
    return Settings(**json.loads(f.read_text())) if f.is_file() else None


# ---- the store on disk -------------------------------------------------------------------------------------------


class UnsafeStore(OSError):
    """The capture directory cannot be trusted with client prompts (a link, a shared or another user's directory)."""


def dir_problem(d: Path) -> str | None:
    """Why `d` cannot be the store (None when it is absent or a directory of this user's that others cannot write)."""
    try:
        st = os.lstat(d)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return (f"capture dir {d} is a symbolic link: a link is never followed (its target could be a shared "
                "directory); set capture.dir to the real directory, one of this server's user's own")
    if not stat.S_ISDIR(st.st_mode):
        return f"capture dir {d} exists and is not a directory; set capture.dir to a directory of its own"
    if st.st_uid != os.geteuid():
        return (f"capture dir {d} belongs to uid {st.st_uid}, not to this server's user (uid {os.geteuid()}); give "
                "a directory of the server's own (a new path is created with mode 0700)")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH | stat.S_ISVTX):
        return (f"capture dir {d} is shared (mode {stat.S_IMODE(st.st_mode):04o}: writable by other users); it is "
                "not changed: give a directory only this server's user can write (a new path is created 0700)")
    return None


def private_dir(d: Path) -> Path:
    """Create `d` (and parents) 0700 whatever the umask, or tighten our own existing `d` to 0700; raise
    UnsafeStore for a link, a non-directory, another user's or a shared directory (dir_problem), never changing it."""
    d = Path(os.path.abspath(d))  # not resolve(): a link must be seen, not followed
    if problem := dir_problem(d):
        raise UnsafeStore(problem)
    d.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(d, DIR_MODE)
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)  # the directory checked, not one swapped in
    try:
        if problem := dir_problem(d):
            raise UnsafeStore(problem)
        os.fchmod(fd, DIR_MODE)
    finally:
        os.close(fd)
    return d


def _sealed_time(p: Path, now_ns: int) -> int | None:
    """The seal time of a well-named sealed segment no further than MAX_FUTURE_S ahead, else None."""
    m = SEALED_NAME.fullmatch(p.name)
    if m is None or int(m.group(1)) > now_ns + int(MAX_FUTURE_S * 1e9):
        return None
    return int(m.group(1))


def _segment_like(p: Path) -> bool:
    return p.name.startswith(SEALED_PREFIX) and p.name.endswith(SUFFIX)


def _valid(p: Path, now_ns: int) -> int | None:
    """The seal time of `p` when it is a sealed segment to read (a regular file, not a link, with a valid name)."""
    t = _sealed_time(p, now_ns)
    try:
        return t if t is not None and stat.S_ISREG(os.lstat(p).st_mode) else None
    except OSError:  # gone meanwhile
        return None


def sealed_segments(d: Path) -> list[Path]:
    """Sealed segments, oldest first (their names start with the seal time): regular files with valid names only."""
    if not d.is_dir():
        return []
    now, found = time.time_ns(), []
    for p in d.iterdir():
        if _segment_like(p) and (t := _valid(p, now)) is not None:
            found.append((t, p.name, p))
    return [p for _, _, p in sorted(found)]


def refused_segments(d: Path) -> list[Path]:
    """Files named like sealed segments that are not ones (a name that does not parse, a time far ahead, a link or
    anything but a regular file): never read, deleted by enforce_bound."""
    if not d.is_dir():
        return []
    now = time.time_ns()
    return sorted(p for p in d.iterdir() if _segment_like(p) and _valid(p, now) is None and os.path.lexists(p))


def read_records(d: Path) -> Iterator[dict[str, Any]]:
    """Every record of the sealed segments, oldest first. A line that is not a JSON object (a store written by
    something else) is skipped; the open segments and refused names are never read, nor a link's target."""
    for seg in sealed_segments(d):
        try:
            fd = os.open(seg, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:  # bounded or purged meanwhile, or swapped for a link
            continue
        with os.fdopen(fd) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict):
                    yield rec


def store_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in sealed_segments(d))


def enforce_bound(d: Path, max_bytes: int) -> int:
    """Delete the refused segment names, then the oldest sealed segments until the store holds at most
    `max_bytes`; returns how many went."""
    gone = 0
    for p in refused_segments(d):
        with contextlib.suppress(OSError):
            if p.is_dir() and not p.is_symlink():
                p.rmdir()  # an empty one; a full directory stays, never read
            else:
                p.unlink(missing_ok=True)
            gone += 1
    segs = sealed_segments(d)
    sizes = [p.stat().st_size for p in segs]
    total = sum(sizes)
    for p, n in zip(segs, sizes):
        if total <= max_bytes:
            break
        p.unlink(missing_ok=True)
        total, gone = total - n, gone + 1
    return gone


def purge(d: Path) -> int:
    """Delete every segment, sealed and open; returns how many files went. The directory stays."""
    if not d.is_dir():
        return 0
    n = 0
    for p in d.iterdir():
        if p.suffix == SUFFIX and p.name.startswith((SEALED_PREFIX, OPEN_PREFIX)):
            p.unlink(missing_ok=True)
            n += 1
    return n


def writer_id() -> str:
    """`<host>.<boot id>.<pid>.<16 random hex>`: unique across hosts, boots and PID namespaces (the random part
    alone is; the rest says where a segment came from)."""
    host = re.sub(r"[^A-Za-z0-9]", "", socket.gethostname())[:32] or "host"
    try:
        boot = re.sub(r"[^0-9a-f]", "", Path("/proc/sys/kernel/random/boot_id").read_text())[:8] or "boot"
    except OSError:
        boot = "boot"
    return f"{host}.{boot}.{os.getpid()}.{secrets.token_hex(8)}"


def remove_dead_open(d: Path) -> int:
    """Remove open segments whose writer is gone (a crash): what they held is lost, as promised. Gone = its flock
    can be taken (the kernel releases a dead writer's lock, in any PID namespace) and it is older than
    OPEN_GRACE_S. A live writer's segment is never touched, whatever its name says."""
    n = 0
    for p in d.iterdir():
        if not p.name.startswith(OPEN_PREFIX):
            continue
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # its writer holds it: alive
            os.close(fd)
            continue
        try:
            if time.time() - os.fstat(fd).st_mtime >= OPEN_GRACE_S:
                p.unlink(missing_ok=True)
                n += 1
        finally:
            os.close(fd)
    return n


class Writer:
    """One writer thread draining a bounded queue into segments. `offer()` never blocks. `on_written(n)` /
    `on_dropped(n)` count records (the metrics)."""

    def __init__(self, d: Path, s: Settings, on_written: Callable[[int], None] = lambda n: None,
                 on_dropped: Callable[[int], None] = lambda n: None) -> None:
        self.dir, self.s = private_dir(Path(d)), s
        self.on_written, self.on_dropped = on_written, on_dropped
        remove_dead_open(self.dir)
        self._q: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=s.queue_size)
        self.id = writer_id()
        self._n = 0  # segments opened by this writer
        self._file: Any = None
        self._open: Path | None = None
        self._records, self._opened_at = 0, 0.0
        self._thread = threading.Thread(target=self._loop, name="capture-writer", daemon=True)
        self._thread.start()

    def offer(self, record: dict[str, Any]) -> bool:
        try:
            self._q.put_nowait(record)
            return True
        except queue.Full:
            self.on_dropped(1)
            return False

    def close(self, timeout_s: float = 10.0) -> None:
        """Write what is queued, seal the open segment, stop the thread."""
        while True:
            try:
                self._q.put(None, timeout=timeout_s)
                break
            except queue.Full:  # the writer is stuck (a hung disk): give up on the queued records
                return
        self._thread.join(timeout=timeout_s)

    # ---- writer thread ----------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            wait = max(0.05, self._opened_at + self.s.segment_seconds - time.monotonic()) if self._file else None
            try:
                rec = self._q.get(timeout=wait)
            except queue.Empty:
                self._seal()  # the open segment is old enough
                continue
            if rec is None:
                self._seal()
                return
            self._write(rec)

    def _write(self, rec: dict[str, Any]) -> None:
        try:
            if self._file is None:
                self._start()
            self._file.write(json.dumps(rec, separators=(",", ":")) + "\n")
            self._file.flush()
            self._records += 1
        except (OSError, ValueError):  # disk full, store removed, unserializable: dropped, serving goes on
            self.on_dropped(1)
            self._abandon()
            return
        if self._records >= self.s.segment_records or time.monotonic() - self._opened_at >= self.s.segment_seconds:
            self._seal()

    def _start(self) -> None:
        self._n += 1
        self._open = self.dir / f"{OPEN_PREFIX}{self.id}-{self._n}{SUFFIX}"
        fd = os.open(self._open, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
        fcntl.flock(fd, fcntl.LOCK_EX)  # held until sealed: how other writers know this one is alive
        os.fchmod(fd, FILE_MODE)
        self._file = os.fdopen(fd, "w")
        self._records, self._opened_at = 0, time.monotonic()

    def _seal(self) -> None:
        if self._file is None or self._open is None:
            return
        n = self._records
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            final = self.dir / f"{SEALED_PREFIX}{time.time_ns():020d}-{self.id}-{self._n}{SUFFIX}"
            os.replace(self._open, final)  # the segment appears whole or not at all, still locked
            self._file.close()
            self.on_written(n)
            enforce_bound(self.dir, self.s.max_bytes)
        except OSError:  # purged under us, or the disk failed: its records are lost
            self.on_dropped(n)
        self._file, self._open = None, None

    def _abandon(self) -> None:
        n, f = self._records, self._file
        self._file, self._records = None, 0
        if f is not None:
            with contextlib.suppress(OSError):
                f.close()
            if self._open is not None:
                self._open.unlink(missing_ok=True)
            self.on_dropped(n)


# ---- the hook the served models call -----------------------------------------------------------------------------


def _opt_out_value(parameters_json: str | None) -> tuple[bool, Any]:
    """(present, value) of the request's eagle_capture parameter."""
    if not parameters_json:
        return False, None
    try:
        params = json.loads(parameters_json)
    except ValueError:
        return False, None
    if not isinstance(params, dict) or OPT_OUT not in params:
        return False, None
    return True, params[OPT_OUT]


def opt_out_problem(parameters_json: str | None) -> str | None:
    """Why the request's eagle_capture value is refused (not true/false: OPT_OUT_VALUES), or None."""
    present, v = _opt_out_value(parameters_json)
    if not present or (type(v) in (bool, str) and v in OPT_OUT_VALUES):
        return None
    shown = json.dumps(v)[:40]
    return f"parameter {OPT_OUT}={shown} is not understood; {OPT_OUT_HELP}"


def opted_out(parameters_json: str | None) -> bool:
    """True when the request says `eagle_capture: false` (or "false"), and for any value not understood (the models
    refuse those first: opt_out_problem; never recorded either way)."""
    present, v = _opt_out_value(parameters_json)
    if not present:
        return False
    return not (type(v) in (bool, str) and OPT_OUT_VALUES.get(v, False))


def forwarded(request: Any) -> dict[str, Any]:
    """The opt-out to pass on to the LLM model in a request built for it (the BLS model's)."""
    params = request.parameters() if hasattr(request, "parameters") else None
    return {OPT_OUT: False} if opted_out(params) else {}


def record(prompt_ids: list[int], output_ids: list[int], sampling: Any, max_new_tokens: int, finish_reason: str,
           stats: Any, version: str) -> dict[str, Any]:
    """One request as the store keeps it (`stats`: core.types.RequestStats or anything with its counters)."""
    return {
        "id": uuid.uuid4().hex, "time": round(time.time(), 3), "model_version": version,
        "prompt_ids": [int(t) for t in prompt_ids], "output_ids": [int(t) for t in output_ids],
        "sampling": {"temperature": float(sampling.temperature), "top_k": int(sampling.top_k or 0),
                     "top_p": float(sampling.top_p), "seed": None if sampling.seed is None else int(sampling.seed)},
        "max_new_tokens": int(max_new_tokens), "finish_reason": str(finish_reason),
        "acceptance": {"target_forwards": int(stats.target_forwards),
                       "accepted_draft_tokens": int(stats.accepted_draft_tokens),
                       "draft_tokens": int(stats.draft_tokens),
                       "acceptance_by_depth": [int(x) for x in getattr(stats, "acceptance_by_depth", [])]},
    }


class Hook:
    """What a served LLM model calls: `wanted(request)` when it admits one (opt-out, sample rate), `finished(...)`
    when one ended normally. Disabled (no capture.json): both are no-ops that allocate nothing."""

    def __init__(self, pb_utils: Any, settings: Settings | None, repo_root: Path, labels: dict[str, str]) -> None:
        self.settings, self.version = settings, labels.get("version", "")
        self.writer: Writer | None = None
        self._rng = random.Random()
        if settings is None:
            return
        fam = pb_utils.MetricFamily
        self._families = [
            fam("eagle_llm_capture_records_total", "Finished requests written to the capture store", fam.COUNTER),
            fam("eagle_llm_capture_dropped_total", "Finished requests the capture store dropped: its queue was full "
                "or the disk refused them (serving never waits for it)", fam.COUNTER),
        ]
        written, dropped = (f.Metric(labels) for f in self._families)
        self.writer = Writer(settings.store_dir(repo_root), settings, written.increment, dropped.increment)

    @classmethod
    def of(cls, pb_utils: Any, args: dict[str, Any], backend: str) -> Hook:
        """The hook of a python model (`args` of initialize(): model_repository is the model's directory)."""
        root = Path(args["model_repository"]).resolve().parent
        labels = {"model": args["model_name"], "backend": backend, "version": str(args.get("model_version", ""))}
        return cls(pb_utils, read_settings(root), root, labels)

    def wanted(self, request: Any) -> bool:
        if self.writer is None or self.settings is None:
            return False
        try:
            if opted_out(request.parameters() if hasattr(request, "parameters") else None):
                return False
        except Exception:  # parameters the backend cannot read: not recorded (never a reason to refuse it)
            return False
        return self.settings.sample_rate >= 1.0 or self._rng.random() < self.settings.sample_rate

    def finished(self, wanted: bool, request: Any, result: Any) -> None:
        """A request that ended normally: engines.api GenerationRequest and GenerationResult."""
        if not wanted or self.writer is None:
            return
        try:
            rec = record(request.prompt_ids, result.output_ids, request.sampling, request.max_new_tokens,
                         result.finish_reason, result.stats, self.version)
        except Exception:  # the store must never break serving: a record it cannot make is a dropped one
            self.writer.on_dropped(1)
            return
        self.writer.offer(rec)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
