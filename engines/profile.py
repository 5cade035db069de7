"""Where the time of a speculative cycle goes.

`Laps` splits the wall time of one decoding step into consecutive named parts: `start()` opens the step and every
`lap(name)` charges the time since the previous mark to `name`, so the parts of a step add up to the step by
construction (the loop marks each boundary: draft levels, verification, walk, KV compaction, drafter update, host
bookkeeping). On CUDA every mark synchronizes first, so a part holds the device work it queued; this costs a host
sync per mark and is why laps are off unless a profiler asks for them (`NO_LAPS`).

`python_share` measures the other axis: the share of a call's wall time spent inside torch operators (the
top-level operator events of `torch.profiler`), the rest being Python and dispatch between operators.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass
class Laps:
    """Accumulated parts (seconds) over the steps profiled so far."""

    sync: Callable[[], None] = lambda: None
    clock: Callable[[], float] = time.perf_counter
    parts: dict[str, float] = field(default_factory=dict)
    steps: int = 0
    _mark: float | None = None

    @classmethod
    def for_device(cls, device: torch.device) -> Laps:
        return cls(sync=torch.cuda.synchronize if device.type == "cuda" else (lambda: None))

    def start(self) -> None:
        self.sync()
        self._mark = self.clock()
        self.steps += 1

    def lap(self, name: str) -> None:
        """Charge the time since the previous mark to `name`."""
        if self._mark is None:
            raise RuntimeError(f"Laps.lap({name!r}) before start(): the step's first mark is start()")
        self.sync()
        now = self.clock()
        self.parts[name] = self.parts.get(name, 0.0) + now - self._mark
        self._mark = now

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    def per_step_ms(self) -> dict[str, float]:
        return {k: 1e3 * v / max(self.steps, 1) for k, v in self.parts.items()}


class _NoLaps(Laps):
    def start(self) -> None:
        pass

    def lap(self, name: str) -> None:
        pass


NO_LAPS: Laps = _NoLaps()


def python_share(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds of fn(), seconds inside top-level torch operators: aten::, mkldnn::, ...) under torch.profiler.

    The profiler adds a few microseconds per operator to both; the difference is Python and dispatch between
    operators (the overhead a compiled or graph-captured step removes)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        fn()
        wall = time.perf_counter() - t0
    # Operator events are named namespace::op (aten::, mkldnn::, ...); nested ones are inside their parent's time.
    top = [e for e in prof.events() if e.cpu_parent is None and "::" in e.name]
    return wall, sum(e.cpu_time_total for e in top) * 1e-6
