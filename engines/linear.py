"""Linear layers, and the weight layouts their products use on each device and dtype.

`prepare_linears` gives every `Linear` of a loaded model the layout its products run fastest in, once at load:

- CUDA, and CPUs whose oneDNN multiplies 16-bit types natively (`torch.ops.mkldnn._is_mkldnn_bf16_supported()`:
  AVX512-BF16 / AMX; `_is_mkldnn_fp16_supported()`: AVX512-FP16 / AMX-FP16), for 16-bit dtypes: the weight as
  stored, through `F.linear` (cuBLAS / oneDNN; 16-bit products accumulate in float32), except:
- CPU bfloat16 with native bf16 where the AVX2 kernel also builds: per weight shape, whichever of oneDNN's bf16 GEMM
  and the AVX2 kernel (bf16 panels, below) a short measurement at load found faster, per row count
  (engines/kernel_choice.py: cached per shape and machine, so the same machine always multiplies alike).
- CPU float32: W^T contiguous for one-row inputs (x @ W^T streams W row by row; ATen's GEMV on the (N, K) layout is
  slower on this project's CPUs), and for multi-row inputs the weight packed in panels for the AVX2 kernel
  (engines/skinny.py: each loaded weight serves every row), or, without AVX2 or a C compiler, reordered once for
  oneDNN (MKL's sgemm repacks W on every call, which for the skinny products of verification costs about as much
  as the product).
- CPU bfloat16 without native 16-bit support, on AVX2: the weight packed once in 16-column panels for the AVX2
  kernel (engines/skinny.py), which reads bf16 weights, widens them exactly in registers and reuses each for every
  row of the product: half the bytes of a float32 copy, and 2-8 rows for little more than the price of one.
- CPU float16 without native support, and bfloat16 where the AVX2 kernel cannot be built (a warning says why):
  ATen's 16-bit kernels there convert element by element and are slower than float32 at every row count, so the
  weight is upcast to float32 once (exact: every bf16 and fp16 value is a float32) and multiplied with the float32
  layouts above.
  In both 16-bit layouts the input is upcast (exact) and the output rounded to the 16-bit dtype: the numbers of a
  16-bit GEMM with float32 accumulation, up to summation order. Activations, residual stream and KV cache stay 16-bit.

`bench/bench_engine.py` prints each layout's cost per row count on the machine it runs on.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from engines import kernel_choice, skinny

FP8_MAX = 448.0  # largest finite float8_e4m3fn

Layout = Literal["as stored", "float32 kernels", "bf16 panels", "bf16 measured"]


def fake_quant_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Round-trip through FP8 e4m3 with a per-tensor scale: fp8(x / s) * s (what an FP8 GEMM or FP8 KV cache sees)."""
    q = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return (q.float() * scale).to(x.dtype)


@dataclass
class Linear:
    """y = x W^T + b. `act_scale` set = FP8 activations (fake-quantized with the calibrated per-tensor scale).

    With the float32-kernel layout (`weight_t` set by `prepare_linears`), `weight` is a float32 view of `weight_t`
    (W is stored once, transposed), `packed` the oneDNN-reordered copy for multi-row inputs, and `bias` float32."""

    weight: torch.Tensor  # (out_features, in_features), already dequantized to the compute dtype
    bias: torch.Tensor | None = None
    act_scale: torch.Tensor | None = None
    packed: torch.Tensor | None = None
    weight_t: torch.Tensor | None = None
    panels: torch.Tensor | None = None
    choice: kernel_choice.Choice | None = None  # "bf16 measured": panels up to choice.kernel_rows rows, oneDNN above

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.act_scale is not None:
            x = fake_quant_fp8(x, self.act_scale)
        if self.weight_t is None and self.panels is None:
            return F.linear(x, self.weight, self.bias)
        dtype, k = x.dtype, x.shape[-1]
        if self.choice is not None and x.numel() // k > self.choice.kernel_rows:
            return F.linear(x, self.weight, None if self.bias is None else self.bias.to(dtype))  # exact: bf16 bias
        xf = x.float().reshape(-1, k)  # no-op for float32; exact upcast for 16-bit inputs
        if self.weight_t is not None and xf.shape[0] == 1:  # one row: MKL streams W^T
            y = torch.mm(xf, self.weight_t)
            y = y if self.bias is None else y + self.bias
        elif self.panels is not None:
            y = skinny.matmul(xf, self.panels, self.out_features, self.bias)
        elif self.packed is not None:
            y = torch.ops.mkldnn._linear_pointwise(xf, self.packed, self.bias, "none", [], "")
        else:
            y = F.linear(xf, self.weight, self.bias)
        return y.view(*x.shape[:-1], y.shape[-1]).to(dtype)


def fuse_rows(parts: list[Linear]) -> Linear | None:
    """One Linear computing [parts[0](x), parts[1](x), ...] (weights stacked by rows), or None when the parts
    cannot share a product (FP8 activation scales, bias on some only, already prepared)."""
    if any(p.act_scale is not None or p.weight_t is not None or p.panels is not None or p.choice is not None
           for p in parts):
        return None
    if len({p.bias is None for p in parts}) != 1 or len({(p.weight.dtype, p.weight.device) for p in parts}) != 1:
        return None
    bias = None if parts[0].bias is None else torch.cat([p.bias for p in parts if p.bias is not None])  # all or none
    return Linear(torch.cat([p.weight for p in parts]), bias)


def native_16bit(dtype: torch.dtype) -> bool:
    """True when this CPU's oneDNN multiplies `dtype` natively (no upcast needed for speed)."""
    if not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if dtype == torch.float16:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    return False


def layout_for(device: torch.device, dtype: torch.dtype) -> Layout:
    if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return "as stored"
    if dtype == torch.bfloat16 and native_16bit(dtype) and skinny.unavailable() is None:
        return "bf16 measured"
    if dtype != torch.float32 and native_16bit(dtype):
        return "as stored"
    if dtype == torch.bfloat16 and skinny.unavailable() is None:
        return "bf16 panels"
    return "float32 kernels"


def to_float32_kernels(lin: Linear) -> None:
    """W^T (float32, contiguous) for one-row products, `weight` a view of it, and for multi-row ones the AVX2
    kernel's float32 panels, or without the kernel the oneDNN-reordered weight
    (`torch.ops.mkldnn._reorder_linear_weight`, what torch.compile's CPU weight packing uses:
    torch/_inductor/fx_passes/mkldnn_fusion.py)."""
    w = lin.weight.float()
    lin.weight_t = w.t().contiguous()
    lin.weight = lin.weight_t.t()
    lin.bias = None if lin.bias is None else lin.bias.float().contiguous()
    if skinny.unavailable() is None:
        lin.panels = skinny.pack(w)
    elif torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        lin.packed = torch.ops.mkldnn._reorder_linear_weight(w, None)


def to_bf16_panels(lin: Linear) -> None:
    """The weight packed for the AVX2 kernel (`skinny.pack`); the stored weight is kept for `restricted` copies."""
    lin.panels = skinny.pack(lin.weight)
    lin.bias = None if lin.bias is None else lin.bias.float().contiguous()


def linears(*roots: object) -> list[Linear]:
    """Every `Linear` reachable from `roots` (dataclass fields and lists), once each."""
    seen: set[int] = set()
    found: list[Linear] = []
    stack = list(roots)
    while stack:
        obj = stack.pop()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, Linear):
            found.append(obj)
        elif isinstance(obj, list):
            stack.extend(obj)
        elif hasattr(obj, "__dataclass_fields__"):
            stack.extend(getattr(obj, f) for f in obj.__dataclass_fields__)
    return found


def prepare_linears(*roots: object, timer: kernel_choice.Timer = kernel_choice.measure) -> int:
    """Give every `Linear` reachable from `roots` the layout `layout_for` picks for its weight's device and dtype
    (`timer` times the candidates of "bf16 measured": engines/kernel_choice.py). Returns how many linears got a CPU
    kernel layout (float32 kernels, bf16 panels or a measured choice)."""
    prepared = 0
    for lin in linears(*roots):
        w = lin.weight
        layout = layout_for(w.device, w.dtype)
        if lin.weight_t is not None or lin.panels is not None or lin.choice is not None or layout == "as stored":
            continue
        if layout == "bf16 measured":
            lin.choice = kernel_choice.choose(w.shape[0], w.shape[1], timer=timer)
            if lin.choice.kernel_rows > 0:
                to_bf16_panels(lin)
        elif layout == "bf16 panels":
            to_bf16_panels(lin)
        else:
            warn_no_kernel()
            to_float32_kernels(lin)
        prepared += 1
    return prepared


def describe_layouts(*roots: object) -> list[str]:
    """What multiplies the weights of `roots`, one line per layout (and per shape for measured choices)."""
    lines: dict[str, None] = {}
    for lin in linears(*roots):
        if lin.choice is not None:
            lines[f"bf16, chosen at load by measurement ({kernel_choice.cache_file()}): {lin.choice.describe()}"] = None
        elif lin.panels is not None and lin.panels.dtype == torch.bfloat16:
            lines["bf16: the AVX2 kernel on bf16 panels (no native bf16 on this CPU)"] = None
        elif lin.weight_t is not None:
            multi = "the AVX2 kernel on float32 panels" if lin.panels is not None else (
                "oneDNN on its packed weight" if lin.packed is not None else "ATen")
            lines[f"{str(lin.weight_t.dtype).removeprefix('torch.')} kernels: MKL on W^T for one row, {multi} for "
                  "more"] = None
        else:
            lines[f"{str(lin.weight.dtype).removeprefix('torch.')} on {lin.weight.device.type}: the weight as stored "
                  "(F.linear)"] = None
    return sorted(lines)


@functools.lru_cache(maxsize=1)
def _warn_once(why: str) -> None:
    warnings.warn(f"the AVX2 kernel is unavailable ({why}): bfloat16 runs through float32 kernels (twice the bytes "
                  "per step) and multi-row float32 products through oneDNN", stacklevel=3)


def warn_no_kernel() -> None:
    """Say, once per process, why a CPU layout on this AVX2 CPU runs without the kernel (engines/skinny.py)."""
    why = skinny.unavailable()
    if why is not None and skinny.cpu_has_avx2():
        _warn_once(why)
