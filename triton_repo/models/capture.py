"""The capture store: the served LLM model records each finished request (prompt and output token ids, sampling
parameters, per-request acceptance, model version) for builders/refresh.py (docs/adaptive.md). Opt-in: the build
writes `capture.json` at the repository root only when `capture.enabled` (builders/adaptive_config.py); without it
the hook does nothing.

Layout of the store directory (mode 0700, every file 0600, so only the server's user reads what clients sent):

    seg-<unix ns>-<pid>-<n>.jsonl     a sealed segment: one JSON record per line, complete, never rewritten
    .open-<pid>-<n>.jsonl             the segment being written (readers skip it)

A segment is written to its `.open-` name and renamed into place when it holds `segment_records` records or is
`segment_seconds` old, so a sealed segment is whole and a crash loses at most the open one (a later writer removes
open segments whose process is gone). After each seal the oldest sealed segments are deleted until the store is within
`max_bytes`. Serving never waits on the disk: the model hands a record to a bounded queue (`queue_size`) that one
writer thread drains; a record that finds it full, or that the disk refuses, is dropped and counted
(eagle_llm_capture_dropped_total). A request opts out with the request parameter `eagle_capture: false` (Triton
forwards an ensemble request's parameters to its steps: triton-inference-server/core pull 261).

Nothing here imports pb_utils at module level: the arithmetic and the files run in tests without a server.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
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
        return (Path(repo_root) / self.dir).resolve()


def read_settings(repo_root: Path) -> Settings | None:
    """The repository's capture settings, or None when the build did not enable capture."""
    f = Path(repo_root) / SETTINGS_FILE
    return Settings(**json.loads(f.read_text())) if f.is_file() else None


# ---- the store on disk -------------------------------------------------------------------------------------------


def private_dir(d: Path) -> Path:
    """Create `d` (and parents) and make it 0700 whatever the umask; refuse a link (it could point anywhere)."""
    d.mkdir(parents=True, exist_ok=True)
    if d.is_symlink():
        raise OSError(f"capture dir {d} is a symbolic link; give the real directory")
    os.chmod(d, DIR_MODE)
    return d


def sealed_segments(d: Path) -> list[Path]:
    """Sealed segments, oldest first (their names start with the seal time)."""
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if p.name.startswith(SEALED_PREFIX) and p.name.endswith(SUFFIX))


def read_records(d: Path) -> Iterator[dict[str, Any]]:
    """Every record of the sealed segments, oldest first. A line that is not a JSON object (a store written by
    something else) is skipped; the open segments are never read."""
    for seg in sealed_segments(d):
        with seg.open() as f:
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
    """Delete the oldest sealed segments until the store holds at most `max_bytes`; returns how many went."""
    segs = sealed_segments(d)
    sizes = [p.stat().st_size for p in segs]
    total, gone = sum(sizes), 0
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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_dead_open(d: Path) -> int:
    """Remove open segments left by processes that are gone (a crash): what they held is lost, as promised."""
    n = 0
    for p in d.iterdir():
        if p.name.startswith(OPEN_PREFIX):
            pid = p.name[len(OPEN_PREFIX):].split("-", 1)[0]
            if pid.isdigit() and not _alive(int(pid)):
                p.unlink(missing_ok=True)
                n += 1
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
        self._n = 0  # segments opened by this process
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
        self._open = self.dir / f"{OPEN_PREFIX}{os.getpid()}-{self._n}{SUFFIX}"
        fd = os.open(self._open, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
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
            self._file.close()
            final = self.dir / f"{SEALED_PREFIX}{time.time_ns():020d}-{os.getpid()}-{self._n}{SUFFIX}"
            os.replace(self._open, final)  # the segment appears whole or not at all
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


def opted_out(parameters_json: str | None) -> bool:
    """True when the request's parameters say `eagle_capture: false` (bool, or the strings false/0/no)."""
    if not parameters_json:
        return False
    try:
        params = json.loads(parameters_json)
    except ValueError:
        return False
    v = params.get(OPT_OUT) if isinstance(params, dict) else None
    return v is False or (isinstance(v, str) and v.strip().lower() in ("false", "0", "no")) or v == 0


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
