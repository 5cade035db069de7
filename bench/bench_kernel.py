#!/usr/bin/env python3
"""The products of one target forward, by number of rows, in each CPU weight layout (engines/linear.py).

For the demo target's shapes (SmolLM2-135M: 30 layers of qkv 960x576, dense 576x576, fused gate/up 3072x576, down
576x1536), with cold weights (a whole model's worth, so every product streams its weights from memory as in a real
forward), the median time of all 120 products for M rows, all layouts interleaved:

- MKL `mm` on W^T float32 (the engine's one-row float32 path);
- oneDNN on its packed float32 weight (the multi-row path without the AVX2 kernel);
- the AVX2 kernel on float32 panels and on bf16 panels (engines/skinny.py).

Prints ms and GB/s of weights streamed (bytes of the layout / time) per row count.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_kernel.py --rows 1,2,3,4,8,16
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch

from engines import skinny

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # (out, in) of one SmolLM2-135M layer's products


def layouts(g: torch.Generator, layers: int) -> dict[str, list[tuple[int, torch.Tensor]]]:
    """(out features, prepared weight) of every product, per layout."""
    out: dict[str, list[tuple[int, torch.Tensor]]] = {"MKL W^T fp32": [], "oneDNN packed fp32": [],
                                                      "kernel fp32 panels": [], "kernel bf16 panels": []}
    for _ in range(layers):
        for n, k in SHAPES:
            w = torch.randn(n, k, generator=g).bfloat16().float()
            out["MKL W^T fp32"].append((n, w.t().contiguous()))
            out["oneDNN packed fp32"].append((n, torch.ops.mkldnn._reorder_linear_weight(w, None)))
            out["kernel fp32 panels"].append((n, skinny.pack(w)))
            out["kernel bf16 panels"].append((n, skinny.pack(w.bfloat16())))
    return out


def product(name: str, x: torch.Tensor, n: int, w: torch.Tensor) -> None:
    if name == "MKL W^T fp32":
        torch.mm(x, w)
    elif name == "oneDNN packed fp32":
        torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
    else:
        skinny.matmul(x, w, n, None)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Inputs:  none (random weights of the demo target's layer shapes)\n"
               "Outputs: the table on stdout\n"
               "Guide:   docs/benchmarks.md (The AVX2 kernel)")
    ap.add_argument("--rows", default="1,2,3,4,8,16", help="comma-separated row counts M")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--layers", type=int, default=30, help="layers of products (30: the whole SmolLM2-135M body)")
    args = ap.parse_args()
    if (why := skinny.unavailable()) is not None:
        print(f"the AVX2 kernel cannot run here: {why}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    g = torch.Generator().manual_seed(0)
    lay = layouts(g, args.layers)
    xs = {(m, k): torch.randn(m, k, generator=g) for m in rows for k in {k for _, k in SHAPES}}
    ks = [k for _ in range(args.layers) for _, k in SHAPES]

    def run(name: str, m: int) -> Callable[[], None]:
        def forward() -> None:
            for k, (n, w) in zip(ks, lay[name]):
                product(name, xs[(m, k)], n, w)

        return forward

    fns = {(name, m): run(name, m) for m in rows for name in lay}
    times: dict[tuple[str, int], list[float]] = {k: [] for k in fns}
    for r in range(args.repeats + 1):  # round 0 warms up
        for key, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            if r:
                times[key].append(time.perf_counter() - t0)
    params = args.layers * sum(n * k for n, k in SHAPES)
    nbytes = {name: params * (2 if "bf16" in name else 4) for name in lay}
    print(
        f"{args.layers} layers x {len(SHAPES)} products (SmolLM2-135M layer shapes), cold weights, "
        f"{args.threads} thread(s), "
        f"median of {args.repeats}: ms (GB/s of weights streamed)"
    )
    print(f"{'rows':>5}" + "".join(f"{name:>24}" for name in lay))
    for m in rows:
        cells = []
        for name in lay:
            s = statistics.median(times[(name, m)])
            cells.append(f"{1e3 * s:>13.1f} ({nbytes[name] / s / 1e9:>5.1f} GB/s)")
        print(f"{m:>5}" + "".join(f"{c:>24}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
