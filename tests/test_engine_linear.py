"""Reference engine, weight layouts (engines/linear.py): which layout each device and dtype gets, that the products
equal ATen's, and the fused MLP branches."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engines import skinny
from engines.api import ReferenceEngine
from engines.linear import Linear, fuse_rows, layout_for, native_16bit, prepare_linears
from engines.layers import MLP
from engines.parallel import TPGroup


pytestmark = pytest.mark.usefixtures("one_thread")


def _target_linears(engine: ReferenceEngine) -> list[Linear]:
    t = engine._rt.target
    out = [t.lm_head.linear]
    for layer in t.layers:
        assert layer.mlp.fc_gate is not None and layer.mlp.fc is None and layer.mlp.gate is None  # fused at load
        out += [layer.attn.qkv, layer.attn.dense, layer.mlp.fc_gate, layer.mlp.proj]
    return out


def test_layout_rules() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert layout_for(cpu, torch.float32) == "float32 kernels"
    for dt in (torch.bfloat16, torch.float16):
        assert layout_for(cuda, dt) == "as stored"  # cuBLAS multiplies 16-bit natively
    assert layout_for(cpu, torch.float16) == ("as stored" if native_16bit(torch.float16) else "float32 kernels")
    kernel = skinny.unavailable() is None
    native = {True: "bf16 measured", False: "as stored"}  # both: chosen per shape (tests/test_kernel_choice.py)
    without = "bf16 panels" if kernel else "float32 kernels"
    assert layout_for(cpu, torch.bfloat16) == (native[kernel] if native_16bit(torch.bfloat16) else without)
    assert layout_for(cuda, torch.float32) == "as stored"
    assert layout_for(cpu, torch.float8_e4m3fn) == "as stored"


def test_cpu_float32_weights_get_both_layouts_and_the_same_products(target_ckpt: Path) -> None:
    """W^T for one-row inputs (`weight` a view of it: stored once) and, for multi-row ones, the AVX2 kernel's
    float32 panels (or without it a oneDNN-packed weight); products equal ATen's to float32 rounding, with and
    without bias."""
    kernel = skinny.unavailable() is None
    if not kernel and not torch.backends.mkldnn.is_available():
        pytest.skip("neither the AVX2 kernel nor oneDNN here (the engine then uses ATen for every product)")
    engine = ReferenceEngine.from_checkpoint(target_ckpt, tree=None, dtype="float32", device="cpu")
    linears = _target_linears(engine)
    assert all(lin.weight_t is not None for lin in linears)
    if kernel:
        assert all(
            lin.panels is not None and lin.panels.dtype == torch.float32 and lin.packed is None for lin in linears
        )
    else:
        assert all(lin.packed is not None and lin.panels is None for lin in linears)
    assert all(lin.weight.data_ptr() == lin.weight_t.data_ptr() for lin in linears)

    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(96, 64, generator=g), torch.randn(96, generator=g)
    lin, nobias = Linear(w.clone(), b), Linear(w.clone())
    assert prepare_linears(lin, [lin, [lin, nobias]]) == 2  # lin reached three times, prepared once
    assert prepare_linears(lin) == 0 and (lin.packed is not None or lin.panels is not None)  # already prepared
    for shape in [(64,), (1, 64), (1, 1, 64), (5, 64), (2, 7, 64)]:
        x = torch.randn(*shape, generator=g)
        torch.testing.assert_close(lin(x), F.linear(x, w, b), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(nobias(x), F.linear(x, w), rtol=1e-5, atol=1e-5)
        assert lin(x).shape == x.shape[:-1] + (96,)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_cpu_16bit_products_are_16bit_gemms_with_float32_accumulation(dtype: torch.dtype) -> None:
    """Without native 16-bit matmul the weight is upcast once (exact) and multiplied in float32: the output is the
    float32 product of the 16-bit values rounded once to the 16-bit dtype, in the 16-bit dtype. (bf16 on AVX2 CPUs
    goes through the kernel instead: tests/test_engine_skinny.py.)"""
    if layout_for(torch.device("cpu"), dtype) == "bf16 panels":
        pytest.skip("bf16 runs through the AVX2 kernel here (tests/test_engine_skinny.py)")
    g = torch.Generator().manual_seed(1)
    w16, b16 = torch.randn(200, 64, generator=g).to(dtype), torch.randn(200, generator=g).to(dtype)
    lin = Linear(w16.clone(), b16.clone())
    prepare_linears(lin)
    if native_16bit(dtype):
        assert lin.weight_t is None and lin.weight.dtype == dtype
    else:
        assert lin.weight_t is not None and lin.weight_t.dtype == torch.float32 and lin.bias.dtype == torch.float32
        assert torch.equal(lin.weight, w16.float())  # the upcast is exact
    for rows in (1, 3, 9):
        x = torch.randn(rows, 64, generator=g).to(dtype)
        y = lin(x)
        exact = F.linear(x.double(), w16.double(), b16.double())  # no rounding before the output
        assert y.dtype == dtype and y.shape == (rows, 200)
        # One rounding to 16 bits (relative 2^-8 for bf16, 2^-11 for fp16) plus float32 accumulation error.
        ulp = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-11
        assert ((y.double() - exact).abs() <= exact.abs() * ulp + 1e-4).all()


def test_fused_mlp_branches_equal_the_separate_products() -> None:
    g = torch.Generator().manual_seed(2)
    one = TPGroup(0, 1)
    w_fc, w_gate, w_proj = (
        torch.randn(48, 32, generator=g),
        torch.randn(48, 32, generator=g),
        torch.randn(32, 48, generator=g),
    )
    separate = MLP(Linear(w_fc.clone()), Linear(w_gate.clone()), Linear(w_proj), one)
    fused = MLP(Linear(w_fc.clone()), Linear(w_gate.clone()), Linear(w_proj), one)
    assert fused.fuse() and fused.fc is None and fused.gate is None
    assert fused.fc_gate is not None and fused.fc_gate.out_features == 96
    x = torch.randn(3, 32, generator=g)
    torch.testing.assert_close(fused(x), separate(x), rtol=1e-6, atol=1e-6)
    # Parts that cannot share one product: bias on one branch only, FP8 activation scales.
    assert fuse_rows([Linear(w_fc, torch.zeros(48)), Linear(w_gate)]) is None
    fp8 = MLP(Linear(w_fc, act_scale=torch.tensor(1.0)), Linear(w_gate), Linear(w_proj), one)
    assert not fp8.fuse() and fp8.fc is not None and fp8.fc_gate is None
