"""Where a served decoding step's time goes, per step, when $EAGLE_DEPLOY_STEP_PROFILE names a directory.

Off by default (nothing is timed, nothing written). Set, every python model of the repository that takes part in a
request appends one JSON line per unit of its work to `<dir>/<model>-<pid>.jsonl`:

- the LLM model (reference engine, either layout), one line per batcher iteration that stepped the session:
  `batch` (sequences in the step), `prefill` (the step prefilled new requests), `join_ms` (the batcher's work before
  the step: expired / new / cancelled jobs; it includes waiting for a request when none was running), `step_ms`
  (Session.step: the decoding math plus the responses sent from it), `send_ms` (of step_ms: the `on_tokens`
  callbacks, i.e. building and sending each sequence's streamed response, detokenization included in the llmapi
  layout), `finish_ms` (final responses of the sequences that ended), and `parts_ms` (of step_ms: the engine's own
  split of a decoding step, core/laps.py: draft levels, verify, walk, kv compaction, output, drafter update,
  drafter catch-up, target step);
- preprocessing and postprocessing (ensemble layout), one line per execute(): `requests`, `ms`.

bench/bench_served.py reads these files and sets the same step against the engine in process.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from core.laps import Laps

ENV = "EAGLE_DEPLOY_STEP_PROFILE"


def directory() -> Path | None:
    """The profile directory named by $EAGLE_DEPLOY_STEP_PROFILE (created), or None when unset."""
    value = os.environ.get(ENV)
    if not value:
        return None
    d = Path(value)
    d.mkdir(parents=True, exist_ok=True)
    return d


class Lines:
    """One JSON line per record, to `<dir>/<model>-<pid>.jsonl` (each process its own file: no interleaving)."""

    def __init__(self, d: Path, model: str) -> None:
        self.path = d / f"{model}-{os.getpid()}.jsonl"
        self._f = self.path.open("a", buffering=1)

    def write(self, record: dict[str, Any]) -> None:
        self._f.write(json.dumps(record) + "\n")


def timed_execute(profile: Lines | None, execute: Any, requests: list[Any]) -> Any:
    """`execute(requests)`, with one `{requests, ms}` line written when the profile is on."""
    if profile is None:
        return execute(requests)
    t0 = time.perf_counter()
    out = execute(requests)
    profile.write({"requests": len(requests), "ms": 1e3 * (time.perf_counter() - t0)})
    return out


class StepProfile:
    """The LLM model's per-step record; the batcher calls `step`, the model's `on_tokens` is wrapped by `sending`."""

    def __init__(self, d: Path, model: str, laps: Laps) -> None:
        self.lines, self.laps = Lines(d, model), laps
        self.send_s = 0.0
        self._parts: dict[str, float] = {}

    def timed_send(self, fn: Any) -> Any:
        """`fn` (an on_tokens callback) with its time added to `send_s`."""
        def wrapped(slot: int, ids: list[int]) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(slot, ids)
            finally:
                self.send_s += time.perf_counter() - t0
        return wrapped

    def step(self, batch: int, prefill: bool, join_s: float, step_s: float, finish_s: float) -> None:
        parts = {k: v - self._parts.get(k, 0.0) for k, v in self.laps.parts.items()}
        self._parts = dict(self.laps.parts)
        self.lines.write({"batch": batch, "prefill": prefill, "join_ms": 1e3 * join_s, "step_ms": 1e3 * step_s,
                          "send_ms": 1e3 * self.send_s, "finish_ms": 1e3 * finish_s,
                          "parts_ms": {k: 1e3 * v for k, v in parts.items() if v}})
        self.send_s = 0.0


def for_llm_model(model: str) -> StepProfile | None:
    d = directory()
    return None if d is None else StepProfile(d, model, Laps())


def for_model(model: str) -> Lines | None:
    d = directory()
    return None if d is None else Lines(d, model)
