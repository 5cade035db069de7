"""Where the time of a speculative cycle goes.

`laps_for(device)` makes the `Laps` (core/laps.py) that split one decoding step into consecutive named parts; on
CUDA every mark synchronizes first, so a part holds the device work it queued.

`python_share` measures the other axis: the share of a call's wall time spent inside torch operators (the
top-level operator events of `torch.profiler`), the rest being Python and dispatch between operators.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from core.laps import Laps


def laps_for(device: torch.device) -> Laps:
    """Laps that synchronize `device` before every mark (CUDA), so each part holds the device work it queued."""
    return Laps(sync=torch.cuda.synchronize if device.type == "cuda" else (lambda: None))


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
