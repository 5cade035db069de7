"""`draft_len_schedule: auto`: the draft length per batch size from measurement (measure/tune_tree.py
--objective schedule).

The policy. A step of B sequences drafting d levels of the tree (engines/schedule.py truncate) yields tau_d tokens per
sequence, where tau_d is the expected accepted length of the tree's first d levels from the acceptance table the tuner
measures on the user's prompts (acceptance per depth and rank), and costs c(B, d) ms, measured on the reference engine
(a session of B sequences; d = 0 is the step the engine takes when the schedule turns speculation off). Target-only
decoding costs c0(B) per token. The expected speedup over target-only decoding at batch size B is

    S(B, d) = tau_d * c0(B) / c(B, d)

and the schedule takes, per measured batch size, the d with the largest S, and 0 where no d beats target-only
(S <= 1). Written in upstream's form: thresholds = the measured batch sizes (a batch of B uses the length of the
smallest threshold >= B, so sizes between two measured ones take the larger one's length), consecutive equal lengths
merged, a trailing 0 dropped (above the largest threshold speculation is off anyway), and the length at batch size 1
becomes the tree's depth (upstream requires schedule[1] = max_draft_len, so the recommended tree is the tuned tree cut
to that depth). Batch sizes above the largest one measured are not measured: upstream turns speculation off there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from core.speculation import SpeculationPolicy, truncate
from core.trees import DraftTree
from engines.api import GenerationRequest, ReferenceEngine, SamplingParams


@dataclass(frozen=True)
class ScheduleResult:
    batch_sizes: list[int]
    taus: list[float]  # expected tau of the tree's first d levels, d = 0..depth (tau_0 = 1)
    step_ms: dict[int, list[float]]  # batch size -> [c(B, d) for d = 0..depth]
    target_ms: dict[int, float]  # batch size -> c0(B), target-only decoding
    tree: DraftTree

    def speedup(self, b: int, d: int) -> float:
        return self.taus[d] * self.target_ms[b] / self.step_ms[b][d]

    def best(self, b: int) -> int:
        """The draft length with the largest expected speedup at batch size b (0 when none beats target-only)."""
        d = max(range(len(self.taus)), key=lambda n: self.speedup(b, n))
        return d if d > 0 and self.speedup(b, d) > 1.0 else 0

    def schedule(self) -> dict[int, int]:
        """Upstream's draft_len_schedule (see the module docstring); {} when EAGLE beats nothing even at batch 1."""
        chosen = {b: self.best(b) for b in self.batch_sizes}
        top = chosen[self.batch_sizes[0]]
        if top == 0:
            return {}
        out: dict[int, int] = {}
        sizes = self.batch_sizes
        for i, b in enumerate(sizes):
            length = min(chosen[b], top)
            nxt = min(chosen[sizes[i + 1]], top) if i + 1 < len(sizes) else None
            if nxt != length:  # the next threshold would repeat this length: it covers these sizes too
                out[b] = length
        while len(out) > 1 and out[max(out)] == 0:  # above the largest threshold speculation is off anyway
            del out[max(out)]
        out[1] = top
        return dict(sorted(out.items()))

    def to_json(self) -> dict[str, Any]:
        sched = self.schedule()
        depth = sched.get(1, 0)
        return {
            "draft_len_schedule": {str(b): n for b, n in sched.items()},
            "tree": truncate(self.tree, depth).as_lists() if depth else None,
            "batch_sizes": self.batch_sizes, "taus": self.taus,
            "step_ms": {str(b): v for b, v in self.step_ms.items()},
            "target_ms": {str(b): v for b, v in self.target_ms.items()},
            "expected_speedup": {str(b): [self.speedup(b, d) for d in range(len(self.taus))] for b in self.batch_sizes},
            "chosen": {str(b): self.best(b) for b in self.batch_sizes},
        }


def _requests(ids: list[list[int]], batch: int, tokens: int) -> list[GenerationRequest]:
    # no stop token: every sequence decodes for the whole timed window
    return [GenerationRequest(ids[i % len(ids)], tokens, SamplingParams(), []) for i in range(batch)]


def time_steps(engine: ReferenceEngine, speculative: bool, ids: list[list[int]], batch: int, steps: int,
               depth: int) -> float:
    """Wall ms per decoding step of `batch` sequences (prefills excluded), over `steps` steps."""
    tokens = (steps + 1) * (depth + 1) + 1
    session = engine.session(capacity=batch, max_len=max(len(i) for i in ids) + tokens, speculative=speculative)
    for r in _requests(ids, batch, tokens):
        session.add(r)
    while session.pending:
        session.step()
    t0 = time.perf_counter()
    for _ in range(steps):
        session.step()
    return 1e3 * (time.perf_counter() - t0) / steps


def measure(engine: ReferenceEngine, tree: DraftTree, taus: list[float], ids: list[list[int]], batch_sizes: list[int],
            steps: int, rounds: int) -> ScheduleResult:
    """c(B, d) for every batch size and draft length 0..depth, and c0(B); round-robin `rounds` times so that a change
    of load on a shared machine reaches every configuration alike; the median-free mean of the rounds."""
    base = engine.with_tree(tree)
    configs: list[tuple[int, int | None]] = [(b, d) for b in batch_sizes for d in [None, *range(tree.depth + 1)]]
    total: dict[tuple[int, int | None], float] = dict.fromkeys(configs, 0.0)
    with tqdm(total=rounds * len(configs), desc="step costs per batch size", unit="run") as bar:
        for _ in range(rounds):
            for b, d in configs:
                if d is None:  # target-only decoding
                    ms = time_steps(base, False, ids, b, steps, 0)
                else:
                    eng = base.with_policy(SpeculationPolicy(draft_len_schedule={b: d}))
                    ms = time_steps(eng, True, ids, b, steps, d)
                total[(b, d)] += ms / rounds
                bar.update()
    return ScheduleResult(
        batch_sizes, taus, {b: [total[(b, d)] for d in range(tree.depth + 1)] for b in batch_sizes},
        {b: total[(b, None)] for b in batch_sizes}, tree,
    )


def print_result(r: ScheduleResult) -> None:
    depth = len(r.taus) - 1
    print("\nexpected tau by draft length: " + ", ".join(f"d={d}: {t:.3f}" for d, t in enumerate(r.taus)))
    head = "".join(f"{f'd={d} ms':>10}" for d in range(depth + 1))
    print(f"{'batch':>6}{'target ms':>11}{head}   expected speedup by d (0..{depth})   chosen")
    for b in r.batch_sizes:
        cells = "".join(f"{ms:>10.1f}" for ms in r.step_ms[b])
        sp = " ".join(f"{r.speedup(b, d):.2f}x" for d in range(depth + 1))
        print(f"{b:>6}{r.target_ms[b]:>11.1f}{cells}   {sp}   d={r.best(b)}")
    print(f"draft_len_schedule: {r.schedule() or 'none (EAGLE does not beat target-only decoding at batch size 1)'}")


def plot(r: ScheduleResult, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for d in range(1, len(r.taus)):
        ax.plot(r.batch_sizes, [r.speedup(b, d) for b in r.batch_sizes], marker="o", label=f"draft length {d}")
    ax.axhline(1.0, color="grey", lw=1, ls="--", label="target-only")
    ax.set_xscale("log", base=2)
    ax.set_xticks(r.batch_sizes, [str(b) for b in r.batch_sizes])
    ax.set_xlabel("batch size (sequences decoding together)")
    ax.set_ylabel("expected speedup over target-only")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
