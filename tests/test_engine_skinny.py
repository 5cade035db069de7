"""The AVX2 kernel for decoding's few-row products (engines/skinny.py, engines/kernels/skinny.c): packing, products
against a float64 reference at every row count and thread count, the build cache, and what happens without it."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engines import linear, skinny
from engines.linear import Linear, layout_for, native_16bit, prepare_linears

pytestmark = pytest.mark.usefixtures("one_thread")

needs_kernel = pytest.mark.skipif(
    skinny.unavailable() is not None, reason=f"kernel unavailable: {skinny.unavailable()}"
)


@pytest.fixture
def fresh_kernel(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """An empty kernel cache and no loaded library; both restored afterwards."""
    monkeypatch.setenv("EAGLE_DEPLOY_KERNELS", str(tmp_path / "kernels"))
    skinny._load.cache_clear()
    linear._warn_once.cache_clear()
    yield tmp_path / "kernels"
    monkeypatch.undo()
    skinny._load.cache_clear()
    linear._warn_once.cache_clear()


def test_pack_lays_out_16_column_panels_and_zero_pads() -> None:
    w = torch.arange(20 * 3, dtype=torch.float32).view(20, 3)
    p = skinny.pack(w)
    assert p.shape == (2, 3, 16) and p.is_contiguous()
    assert torch.equal(p[0, :, 5], w[5]) and torch.equal(p[1, :, 3], w[19])  # panel p, column j = row 16p + j of W
    assert torch.equal(p[1, :, 4:], torch.zeros(3, 12))
    assert skinny.pack(w.to(torch.bfloat16)).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="2-D bf16 or float32 weights, not torch.float16"):
        skinny.pack(w.half())
    with pytest.raises(ValueError, match=r"not torch.float32 \(60,\)"):
        skinny.pack(w.flatten())


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("n,k", [(200, 64), (7, 3), (48, 577)])
def test_products_equal_float64_at_every_row_and_thread_count(dtype: torch.dtype, n: int, k: int) -> None:
    """Rows 1..4 each have their own code path and 5..13 mix them (blocks of 4); columns past a whole panel and an
    odd K take the tails. The error is float32 accumulation only: the weights are widened exactly."""
    g = torch.Generator().manual_seed(n + k)
    w, b = torch.randn(n, k, generator=g).to(dtype), torch.randn(n, generator=g)
    panels = skinny.pack(w)
    threads = torch.get_num_threads()
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            for m in (1, 2, 3, 4, 5, 8, 13):
                x = torch.randn(m, k, generator=g)
                exact = x.double() @ w.double().t() + b.double()
                for bias in (b, None):
                    y = skinny.matmul(x, panels, n, bias)
                    want = exact if bias is not None else exact - b.double()
                    assert y.dtype == torch.float32 and y.shape == (m, n)
                    assert ((y.double() - want).abs() <= 1e-5 * (1 + want.abs()) * k**0.5).all(), (t, m)
    finally:
        torch.set_num_threads(threads)


@needs_kernel
def test_matmul_rejects_inputs_that_do_not_fit() -> None:
    panels = skinny.pack(torch.randn(32, 8))
    with pytest.raises(ValueError, match=r"x torch.float32 \(2, 9\) does not fit panels \(2, 8, 16\) for 32 outputs"):
        skinny.matmul(torch.randn(2, 9), panels, 32, None)
    with pytest.raises(ValueError, match="for 33 outputs"):
        skinny.matmul(torch.randn(2, 8), panels, 33, None)
    with pytest.raises(ValueError, match="torch.bfloat16"):
        skinny.matmul(torch.randn(2, 8).bfloat16(), panels, 32, None)
    with pytest.raises(ValueError, match=r"bias must be a contiguous float32 vector of 32, not torch.bfloat16 \(32,\)"):
        skinny.matmul(torch.randn(2, 8), panels, 32, torch.zeros(32).bfloat16())
    with pytest.raises(ValueError, match=r"vector of 32, not torch.float32 \(31,\)"):
        skinny.matmul(torch.randn(2, 8), panels, 32, torch.zeros(31))
    with pytest.raises(ValueError, match="panels must be contiguous bf16 or float32"):
        skinny.matmul(torch.randn(2, 8), panels.transpose(1, 2).contiguous().transpose(1, 2), 32, None)


@needs_kernel
def test_bf16_linear_gets_panels_and_16bit_gemm_numbers() -> None:
    """A bf16 Linear on an AVX2 CPU multiplies through the kernel: weight kept as stored (bf16), panels bf16, bias
    float32; the output is the exact product rounded once to bf16 (plus float32 accumulation error)."""
    if native_16bit(torch.bfloat16):
        pytest.skip("this CPU multiplies bf16 natively: chosen per shape by measurement (tests/test_kernel_choice.py)")
    assert layout_for(torch.device("cpu"), torch.bfloat16) == "bf16 panels"
    g = torch.Generator().manual_seed(3)
    w16, b16 = torch.randn(200, 64, generator=g).bfloat16(), torch.randn(200, generator=g).bfloat16()
    lin = Linear(w16.clone(), b16.clone())
    assert prepare_linears(lin) == 1 and prepare_linears(lin) == 0  # prepared once
    assert lin.panels is not None and lin.panels.dtype == torch.bfloat16 and lin.weight_t is None
    assert torch.equal(lin.weight, w16) and lin.bias is not None and lin.bias.dtype == torch.float32
    for shape in [(64,), (1, 64), (3, 64), (2, 5, 64)]:
        x = torch.randn(*shape, generator=g).bfloat16()
        y = lin(x)
        exact = F.linear(x.double(), w16.double(), b16.double())
        assert y.dtype == torch.bfloat16 and y.shape == x.shape[:-1] + (200,)
        assert ((y.double() - exact).abs() <= exact.abs() * 2.0**-8 + 1e-4).all()


@needs_kernel
def test_build_is_cached_per_source_and_compiler(fresh_kernel: Path) -> None:
    assert skinny.library_path("gcc") != skinny.library_path("clang")  # the name keys the compiler (and the source)
    assert skinny.unavailable() is None
    built = list(fresh_kernel.glob("skinny-*.so"))
    assert len(built) == 1 and not list(fresh_kernel.glob("*.tmp"))  # written atomically
    mtime = built[0].stat().st_mtime_ns
    skinny._load.cache_clear()
    assert skinny.unavailable() is None and built[0].stat().st_mtime_ns == mtime  # reused, not rebuilt


def test_compile_argv_is_a_shared_avx2_openmp_build() -> None:
    argv = skinny.compile_argv("gcc", Path("/src/skinny.c"), Path("/out/k.so"))
    assert argv[0] == "gcc" and argv[-1] == "/src/skinny.c" and argv[argv.index("-o") + 1] == "/out/k.so"
    assert {"-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC"} <= set(argv)


def test_no_compiler_says_what_to_do_and_bf16_warns_and_upcasts(fresh_kernel: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    if not skinny.cpu_has_avx2():
        pytest.skip("no AVX2 here: the kernel is never tried")
    monkeypatch.setenv("CC", "no-such-compiler-xyz")
    why = skinny.unavailable()
    assert why is not None and "no C compiler (`no-such-compiler-xyz`)" in why and "install gcc or set $CC" in why
    with pytest.raises(RuntimeError, match="the AVX2 kernel is unavailable: no C compiler"):
        skinny.matmul(torch.randn(1, 8), skinny.pack(torch.randn(16, 8)), 16, None)
    if native_16bit(torch.bfloat16):
        return
    assert layout_for(torch.device("cpu"), torch.bfloat16) == "float32 kernels"
    lin = Linear(torch.randn(32, 16).bfloat16())
    with pytest.warns(UserWarning, match=r"the AVX2 kernel is unavailable \(no C compiler.*\): bfloat16 runs through "
                                         r"float32 kernels"):
        prepare_linears(lin)
    assert lin.panels is None and lin.weight_t is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fp32 = Linear(torch.randn(32, 16))
        prepare_linears(Linear(torch.randn(32, 16).bfloat16()), fp32)  # once per process
    assert fp32.panels is None and (fp32.packed is not None or not torch.backends.mkldnn.is_available())


def test_a_failing_build_is_reported_with_the_compiler_output(fresh_kernel: Path, monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    if not skinny.cpu_has_avx2():
        pytest.skip("no AVX2 here: the kernel is never tried")
    cc = tmp_path / "broken-cc"
    cc.write_text("#!/bin/sh\necho 'error: out of coffee' >&2\nexit 1\n")
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    why = skinny.unavailable()
    assert why is not None and "building skinny.c failed" in why and "error: out of coffee" in why
    assert not list(fresh_kernel.glob("*"))  # no partial library left behind


@needs_kernel
def test_bench_kernel_prints_every_layout_per_row_count() -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(root / "bench/bench_kernel.py"), "--rows", "1,3", "--repeats", "1",
                          "--layers", "1"], capture_output=True, text=True, timeout=300, check=True).stdout
    head, names, one, three = out.strip().splitlines()
    assert head.startswith("1 layers x 4 products (SmolLM2-135M layer shapes), cold weights, 1 thread(s), median of 1")
    for name in ("MKL W^T fp32", "oneDNN packed fp32", "kernel fp32 panels", "kernel bf16 panels"):
        assert name in names
    assert one.split()[0] == "1" and three.split()[0] == "3" and three.count("GB/s") == 4
