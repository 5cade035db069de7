"""Where the time of a decoding step goes: the hook the reference engine's session calls.

`Laps` splits the wall time of one decoding step into consecutive named parts: `start()` opens the step and every
`lap(name)` charges the time since the previous mark to `name`, so the parts of a step add up to the step by
construction (the loop marks each boundary: draft levels, verification, walk, KV compaction, drafter update, host
bookkeeping). `sync` runs before every mark (on CUDA: a device synchronize, so a part holds the device work it
queued); this costs a host sync per mark and is why laps are off unless a profiler asks for them (`NO_LAPS`).
The profiler that fills them is measure/profile.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Laps:
    """Accumulated parts (seconds) over the steps profiled so far."""

    sync: Callable[[], None] = lambda: None
    clock: Callable[[], float] = time.perf_counter
    parts: dict[str, float] = field(default_factory=dict)
    steps: int = 0
    _mark: float | None = None

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
