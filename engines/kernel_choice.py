"""Which kernel multiplies a bf16 weight of each shape, chosen by a short measurement on the machine that loads it.

On a CPU whose oneDNN multiplies bf16 natively (AVX512-BF16 / AMX) and where the AVX2 kernel builds
(engines/skinny.py), both can multiply a bf16 weight: oneDNN's bf16 GEMM through `F.linear`, and the kernel on the
weight packed in 16-column panels. Which is faster depends on the CPU and on the product's shape (the weight's
(out, in) and the rows multiplied: a decoding step's few rows are bound by streaming the weight, larger products by
arithmetic). So at load, for each weight shape, both are timed at ROWS rows and the kernel is used for every row
count up to the largest one below which it won at every measured point (`Choice.kernel_rows`), oneDNN above.

A choice is cached per shape and machine (in memory, and in `choices-<machine>.json` beside the built kernel:
`skinny.cache_dir()`), so a machine's later loads take the same kernels without measuring, and their outputs are
the same from load to load. `engines.linear.describe_layouts` says what was chosen; the engine prints it at load.

`choose` takes the timer as an argument (`Timer`): tests give it fixed timings.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from engines import skinny

ROWS = (1, 2, 4, 8, 16, 32)  # row counts timed per shape (decoding steps: 1..batch x tree nodes)
ALWAYS = 1 << 30  # kernel_rows when the kernel won at every measured row count
KERNEL, NATIVE = "AVX2 kernel", "oneDNN bf16"
Timer = Callable[[str, int, int, int], float]  # (KERNEL or NATIVE, out, in, rows) -> seconds per product


@dataclass(frozen=True)
class Choice:
    out_features: int
    in_features: int
    kernel_rows: int  # products of up to this many rows use the kernel, larger ones oneDNN; 0: never the kernel
    ms: dict[str, list[float]]  # the measurement: KERNEL / NATIVE -> ms per product at each of ROWS
    cached: bool = False  # read from the machine's cache file instead of measured in this process

    def describe(self) -> str:
        shape = f"{self.out_features}x{self.in_features}"
        if self.kernel_rows == 0:
            use = f"{NATIVE} at every row count"
        elif self.kernel_rows >= ALWAYS:
            use = f"{KERNEL} at every row count"
        else:
            use = f"{KERNEL} up to {self.kernel_rows} rows, {NATIVE} above"
        one = {name: ms[0] for name, ms in self.ms.items()}
        return (f"{shape}: {use} (1 row: {KERNEL} {one[KERNEL]:.3f} ms, {NATIVE} {one[NATIVE]:.3f} ms"
                f"{', cached' if self.cached else ''})")


def kernel_rows(kernel_ms: list[float], native_ms: list[float], rows: tuple[int, ...] = ROWS) -> int:
    """The largest measured row count up to which the kernel was at least as fast at every measured point."""
    best = 0
    for r, k, n in zip(rows, kernel_ms, native_ms):
        if k > n:
            return best
        best = r
    return ALWAYS


def measure(name: str, n: int, k: int, rows: int) -> float:
    """Seconds per product of `rows` rows with a random (n, k) bf16 weight, median of 5 passes over enough
    copies of the weight to stream them from memory (as a forward does), not from cache."""
    copies = max(1, min(8, (32 << 20) // (2 * n * k)))
    g = torch.Generator().manual_seed(n * 31 + k)
    ws = [torch.randn(n, k, generator=g).bfloat16() for _ in range(copies)]
    x = torch.randn(rows, k, generator=g).bfloat16()
    if name == KERNEL:
        panels, xf = [skinny.pack(w) for w in ws], x.float()

        def run() -> None:
            for p in panels:
                skinny.matmul(xf, p, n, None).bfloat16()
    else:
        def run() -> None:
            for w in ws:
                F.linear(x, w)
    times = []
    for i in range(6):  # the first pass warms up
        t0 = time.perf_counter()
        run()
        if i:
            times.append((time.perf_counter() - t0) / copies)
    return statistics.median(times)


def machine() -> dict[str, str]:
    """What a choice depends on besides the shape: CPU, torch, the kernel's build, the thread count."""
    model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith(("model name", "flags")):
                model += line.split(":", 1)[1].strip() + ";"
    return {"cpu": f"{platform.machine()} {model}", "torch": torch.__version__,
            "capability": str(torch.backends.cpu.get_cpu_capability()), "threads": str(torch.get_num_threads()),
            "kernel": skinny.library_path(os.environ.get("CC", "cc")).name}


def cache_file() -> Path:
    key = hashlib.sha256(json.dumps(machine(), sort_keys=True).encode()).hexdigest()[:16]
    return skinny.cache_dir() / f"choices-{key}.json"


_CHOSEN: dict[tuple[int, int], Choice] = {}  # this process's choices


def _read(path: Path) -> dict[str, dict]:
    try:
        return dict(json.loads(path.read_text())["shapes"])
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _write(path: Path, shapes: dict[str, dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".json.tmp")
    with os.fdopen(fd, "w") as f:
        json.dump({"machine": machine(), "shapes": shapes}, f, indent=1)
    os.replace(tmp, path)  # atomic: a concurrent loader reads the old file or this one


def choose(n: int, k: int, timer: Timer = measure) -> Choice:
    """The kernel for a bf16 (n, k) weight on this machine: cached, else measured with `timer` and cached."""
    key = f"bfloat16 {n}x{k}"
    if (hit := _CHOSEN.get((n, k))) is not None:
        return hit
    path = cache_file()
    shapes = _read(path)
    if key in shapes:
        choice = Choice(**{**shapes[key], "cached": True})
    else:
        ms = {name: [1e3 * timer(name, n, k, r) for r in ROWS] for name in (KERNEL, NATIVE)}
        choice = Choice(n, k, kernel_rows(ms[KERNEL], ms[NATIVE]), ms)
        shapes = {**_read(path), key: {f: v for f, v in asdict(choice).items() if f != "cached"}}
        _write(path, shapes)
    _CHOSEN[(n, k)] = choice
    return choice


def forget() -> None:
    """Drop this process's choices (the cache file stays): the next `choose` reads the file again."""
    _CHOSEN.clear()
