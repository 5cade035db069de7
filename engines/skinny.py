"""The AVX2 kernel for the few-row products of decoding (engines/kernels/skinny.c), built once per machine.

A decoding step multiplies a few rows (one token per sequence, or a draft tree's nodes) by every weight of the
model: up to about 4 rows the product is bound by streaming the weights, not by arithmetic. ATen's bf16 kernels on
CPUs without native 16-bit products (AVX2) convert element by element; upcasting the weights to float32 once
doubles the bytes every step reads; and the float32 GEMMs (MKL, oneDNN) do not reuse a loaded weight across 2-8
rows. The kernel reads weights packed in 16-column panels (bf16 widened exactly in registers) and reuses each loaded
weight for every row.

It is compiled with the system's C compiler (`$CC`, default `cc`) into a per-user cache the first time an engine
loads on an AVX2 CPU (bf16 weights use it for every product, float32 ones for multi-row products), and loaded with
ctypes. `unavailable()` says why it cannot be used (no AVX2, no compiler, a failed build); engines/linear.py then
keeps the float32-kernel layout with oneDNN for multi-row products, and warns with that reason for bf16.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

SOURCE = Path(__file__).parent / "kernels" / "skinny.c"
PANEL = 16  # output columns per panel (NB in skinny.c)
ROWS_PER_PASS = 4  # rows multiplied per pass over a panel (the m1..m4 blocks of skinny.c): they cost what one does
FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC")


def compile_argv(cc: str, source: Path, out: Path) -> list[str]:
    """The compiler command that builds the kernel library."""
    return [cc, *FLAGS, "-o", str(out), str(source)]


def cache_dir() -> Path:
    """Where built kernels live: $EAGLE_DEPLOY_KERNELS, else ~/.cache/eagle-deploy/kernels."""
    env = os.environ.get("EAGLE_DEPLOY_KERNELS")
    return Path(env) if env else Path.home() / ".cache" / "eagle-deploy" / "kernels"


def library_path(cc: str) -> Path:
    """The library's file name depends on the source, the flags and the compiler, so an edit rebuilds it."""
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join((cc, *FLAGS)).encode()).hexdigest()[:16]
    return cache_dir() / f"skinny-{key}.so"


def cpu_has_avx2() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64") and torch.backends.cpu.get_cpu_capability() in (
        "AVX2", "AVX512")


def build(cc: str) -> Path:
    """Compile the library if this source has not been built yet (atomically: concurrent loaders are safe)."""
    out = library_path(cc)
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".so.tmp")
    os.close(fd)
    try:
        done = subprocess.run(compile_argv(cc, SOURCE, Path(tmp)), capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"`{' '.join(compile_argv(cc, SOURCE, out))}` failed:\n{done.stderr.strip()}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


@functools.lru_cache(maxsize=1)
def _load() -> tuple[ctypes.CDLL | None, str | None]:
    """(library, None), or (None, why it cannot be used and what to do)."""
    if not cpu_has_avx2():
        return None, f"this CPU ({platform.machine()}, {torch.backends.cpu.get_cpu_capability()}) has no AVX2"
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        return None, f"no C compiler (`{os.environ.get('CC', 'cc')}`) to build {SOURCE.name}: install gcc or set $CC"
    try:
        lib = ctypes.CDLL(str(build(cc)))  # after torch: its libgomp.so.1 is the OpenMP runtime the kernel uses
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        return None, f"building {SOURCE.name} failed: {e}"
    args = (ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
            ctypes.c_void_p, ctypes.c_int)
    for f in (lib.skinny_bf16, lib.skinny_f32):
        f.argtypes, f.restype = args, None
    return lib, None


def unavailable() -> str | None:
    """None when the kernel can run here; otherwise why not."""
    return _load()[1]


def pack(weight: torch.Tensor) -> torch.Tensor:
    """(N, K) bf16 or float32 weight -> (ceil(N / 16), K, 16) panels, columns past N zero."""
    if weight.dtype not in (torch.bfloat16, torch.float32) or weight.dim() != 2:
        raise ValueError(f"the kernel packs 2-D bf16 or float32 weights, not {weight.dtype} {tuple(weight.shape)}")
    n, k = weight.shape
    panels = -(-n // PANEL)
    padded = weight.new_zeros(panels * PANEL, k)
    padded[:n] = weight
    return padded.view(panels, PANEL, k).transpose(1, 2).contiguous()


def matmul(x: torch.Tensor, panels: torch.Tensor, n: int, bias: torch.Tensor | None) -> torch.Tensor:
    """x (M, K) float32 @ W^T (+ bias) with W given as `pack(W)`, W (n, K): float32 (M, n)."""
    lib, why = _load()
    if lib is None:
        raise RuntimeError(f"the AVX2 kernel is unavailable: {why}")
    m, k = x.shape
    if x.dtype != torch.float32 or panels.shape[1] != k or panels.shape[0] * PANEL < n:
        raise ValueError(f"x {x.dtype} {tuple(x.shape)} does not fit panels {tuple(panels.shape)} for {n} outputs")
    if panels.dtype not in (torch.bfloat16, torch.float32) or not panels.is_contiguous():
        raise ValueError(f"panels must be contiguous bf16 or float32 (`pack`), not {panels.dtype}")
    if bias is not None and (bias.dtype != torch.float32 or bias.shape != (n,) or not bias.is_contiguous()):
        raise ValueError(f"bias must be a contiguous float32 vector of {n}, not {bias.dtype} {tuple(bias.shape)}")
    x = x.contiguous()
    y = torch.empty(m, n, dtype=torch.float32)
    fn = lib.skinny_bf16 if panels.dtype == torch.bfloat16 else lib.skinny_f32
    fn(x.data_ptr(), m, k, panels.data_ptr(), n, None if bias is None else bias.data_ptr(), y.data_ptr(),
       torch.get_num_threads())
    return y
