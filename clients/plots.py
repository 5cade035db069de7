"""PNG plots of a load test (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from clients.stats import LevelReport, Summary

PLOT_FILES = ("throughput.png", "latency_percentiles.png", "ttft_distribution.png")


def _level_label(rep: LevelReport) -> str:
    return f"c={rep.level:g}" if rep.mode == "concurrency" else f"{rep.level:g} req/s"


def _xaxis(ax: plt.Axes, levels: Sequence[LevelReport]) -> None:
    """Label the load axis; levels spanning >= 8x (e.g. concurrency 1,4,16,64) go on a log2 scale."""
    xs = [rep.level for rep in levels]
    ax.set_xlabel("concurrency" if levels and levels[0].mode == "concurrency" else "offered request rate (req/s)")
    if len(xs) > 1 and min(xs) > 0 and max(xs) / min(xs) >= 8:
        ax.set_xscale("log", base=2)


def plot_throughput(levels: Sequence[LevelReport], path: Path) -> Path:
    """Request throughput (left axis) and output tokens/s (right axis) against the load level."""
    xs = [rep.level for rep in levels]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(xs, [rep.request_throughput for rep in levels], "o-", color="tab:blue", label="requests/s")
    _xaxis(ax, levels)
    ax.set_ylabel("requests/s", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(xs, [rep.output_tokens_per_s for rep in levels], "s--", color="tab:orange", label="output tokens/s")
    ax2.set_ylabel("output tokens/s", color="tab:orange")
    ax.set_title("Throughput")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_latency_percentiles(levels: Sequence[LevelReport], path: Path) -> Path:
    """p50/p90/p99 of TTFT, inter-token and end-to-end latency (ms) per level, one panel per metric."""
    metrics = (("ttft_s", "TTFT"), ("itl_s", "inter-token"), ("e2e_s", "end-to-end"))
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    xs = [rep.level for rep in levels]
    for ax, (attr, title) in zip(axes, metrics, strict=True):
        for q, style in (("p50", "o-"), ("p90", "s--"), ("p99", "^:")):
            ys = [getattr(s, q) * 1e3 if (s := _summary(rep, attr)) else float("nan") for rep in levels]
            ax.plot(xs, ys, style, label=q)
        ax.set_title(f"{title} latency")
        _xaxis(ax, levels)
        ax.set_ylabel("ms")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _summary(rep: LevelReport, attr: str) -> Summary | None:
    s: Summary | None = getattr(rep, attr)
    return s


def plot_ttft_distribution(levels: Sequence[LevelReport], ttfts: Sequence[Sequence[float]], path: Path) -> Path:
    """Histogram of TTFT (ms) per level, overlaid (one colour per level)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    drawn = 0
    for rep, values in zip(levels, ttfts, strict=True):
        if values:
            ax.hist([v * 1e3 for v in values], bins=min(40, max(5, len(values) // 4)), alpha=0.5,
                    label=_level_label(rep))
            drawn += 1
    if drawn == 0:
        ax.text(0.5, 0.5, "no successful requests", ha="center", va="center", transform=ax.transAxes)
    else:
        ax.legend()
    ax.set_xlabel("time to first token (ms)")
    ax.set_ylabel("requests")
    ax.set_title("TTFT distribution")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_plots(levels: Sequence[LevelReport], ttfts: Sequence[Sequence[float]], out: Path) -> list[Path]:
    """All three plots into `out`; returns their paths (names in PLOT_FILES)."""
    out.mkdir(parents=True, exist_ok=True)
    return [
        plot_throughput(levels, out / PLOT_FILES[0]),
        plot_latency_percentiles(levels, out / PLOT_FILES[1]),
        plot_ttft_distribution(levels, ttfts, out / PLOT_FILES[2]),
    ]


COMPARISON_FILE = "speculation_on_off.png"


def plot_speculation_comparison(on: Sequence[LevelReport], off: Sequence[LevelReport], path: Path) -> Path:
    """Output tokens/s with speculation and without it at each load level (left), and their ratio (right): where the
    ratio crosses 1, speculation stops paying."""
    xs = [rep.level for rep in on]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    ax.plot(xs, [r.output_tokens_per_s for r in on], "o-", color="tab:green", label="EAGLE (speculation on)")
    ax.plot(xs, [r.output_tokens_per_s for r in off], "s--", color="tab:gray", label="speculation off")
    ax.set_ylabel("output tokens/s")
    ax.set_title("Throughput with and without speculation")
    ax.legend(fontsize=8)
    ratio = [a.output_tokens_per_s / b.output_tokens_per_s if b.output_tokens_per_s else float("nan")
             for a, b in zip(on, off, strict=True)]
    ax2.plot(xs, ratio, "o-", color="tab:purple")
    ax2.axhline(1.0, color="grey", lw=1, ls="--")
    ax2.set_ylabel("on / off (output tokens/s)")
    ax2.set_title("Speedup of speculation")
    for a in (ax, ax2):
        _xaxis(a, on)
        a.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
