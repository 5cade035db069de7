"""Where a speculative step's time goes, for several builds and trees side by side, in process, one sequence.

    python bench/bench_step.py --build cur=build/cur --build demo=build/demo3 \
        [--trees cur=config,chain-2,file:configs/trees/x.yaml,dyn:2:3:6] [--questions 8] [--max-new-tokens 64]
        [--rounds 2] [--verify-ts 1,2,3,4,7] [--json FILE]

For each build (`NAME=DIR`, a finished build with engine.backend reference): target-only decoding (the build's own
engine, speculation off) and speculative decoding with each tree of --trees for that build (`config` = the build's
own tree; a core/trees.py preset such as chain-2 or topk-2-3; `file:PATH` a `tree.choices` snippet; `[[0],[1]]`
paths inline; `dyn:K:D:N` an EAGLE-2 dynamic tree), on the first --questions MT-bench questions inside the chat
template, greedy. Every method decodes a prompt before the next prompt starts, in an order rotated each round, so a
change of load reaches every method alike. Printed per method: tokens/s, ratio to the same build's target-only
decoding, tau, outputs identical to target-only decoding, and the speculative step's parts in ms per step (drafting
per level, the dynamic tree's selection, drafter catch-up, verification, the walk over the reached rows, KV
compaction, output, drafter update: engines/drafting.py and step.py mark them). Then the cost of one
target forward at T rows (verification of a tree of T - 1 drafts) against T = 1, interleaved.

Inputs:  --build NAME=DIR (repeatable); MT-bench questions (sources/data.py)
Outputs: the tables on stdout; --json the figures
Guide:   docs/benchmarks.md ("The current line's step on a CPU")
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    os.execv(sys.executable, [sys.executable, "-m", "bench.bench_step", *sys.argv[1:]])

import torch

from core.laps import Laps
from core.trees import DraftTree, DynamicTree, Tree, preset
from engines.api import GenerationRequest, ReferenceEngine, SamplingParams
from measure.costs import forward_fns, interleaved_ms, profile_cycles
from sources.data import chat_ids, mtbench_questions


def parse_tree(text: str, engine: ReferenceEngine) -> tuple[str, Tree]:
    """A --trees item: `config`, a preset, `file:PATH`, inline paths or `dyn:K:D:N`."""
    import yaml

    if text == "config":
        if engine.tree is None:
            raise ValueError("the build has no tree")
        return "config", engine.tree
    if text.startswith("dyn:"):
        k, d, n = (int(x) for x in text[4:].split(":"))
        return text, DynamicTree(k, d, n)
    if text.startswith("file:"):
        choices = yaml.safe_load(Path(text[5:]).read_text())["tree"]["choices"]
        return Path(text[5:]).stem, DraftTree.from_choices(preset(choices) if isinstance(choices, str) else choices)
    if text.startswith("["):
        return text.replace(" ", ""), DraftTree.from_choices(json.loads(text))
    return text, DraftTree.from_choices(preset(text))


@dataclass
class Method:
    build: str
    name: str
    engine: ReferenceEngine
    speculative: bool
    seconds: float = 0.0
    tokens: int = 0
    steps: int = 0
    accepted: int = 0
    outputs: list[list[int]] = field(default_factory=list)
    laps: Laps = field(default_factory=Laps)

    @property
    def label(self) -> str:
        return f"{self.build} {self.name}"


def run_one(m: Method, ids: list[int], n: int, eos: list[int]) -> None:
    session = m.engine.session(capacity=1, max_len=len(ids) + n, speculative=m.speculative)
    prof = profile_cycles(session, [GenerationRequest(ids, n, SamplingParams(), eos)], m.laps)
    [r] = prof.results
    m.seconds += prof.decode_s
    m.tokens += prof.tokens
    m.steps += r.stats.target_forwards
    m.outputs.append(r.output_ids)


def split_trees(items: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for item in items:
        name, _, rest = item.partition("=")
        out.setdefault(name, []).extend(x for x in _split_top(rest) if x)
    return out


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets (inline paths hold commas)."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return [*parts, cur]


def methods_for(builds: dict[str, Path], trees: dict[str, list[str]]) -> list[Method]:
    out = []
    for name, d in builds.items():
        engine = ReferenceEngine.from_build(d)
        out.append(Method(name, "target-only", engine, False))
        for t in trees.get(name, ["config"]):
            label, tree = parse_tree(t, engine)
            out.append(Method(name, label, engine.with_tree(tree), True))
    return out


def report(methods: list[Method], prompts: int) -> list[dict[str, Any]]:
    base = {m.build: m for m in methods if not m.speculative}
    rows = []
    print(f"\n{'method':<34}{'tok/s':>8}{'vs off':>8}{'tau':>7}{'ms/step':>9}{'same':>6}  parts (ms per step)")
    for m in methods:
        off = base[m.build]
        tps, steps = m.tokens / m.seconds, max(m.steps, 1)
        tau = m.tokens / steps
        same = sum(a == b for a, b in zip(m.outputs, off.outputs))
        parts = {k: 1e3 * v / steps for k, v in m.laps.parts.items()}
        ratio = tps / (off.tokens / off.seconds)
        shown = ", ".join(f"{k} {v:.1f}" for k, v in parts.items())
        print(f"{m.label:<34}{tps:>8.1f}{ratio:>7.2f}x{tau:>7.2f}{1e3 * m.seconds / steps:>9.1f}"
              f"{same:>3}/{prompts:<2}  {shown}")
        rows.append({"method": m.label, "tokens_per_s": tps, "ratio_vs_off": ratio, "tau": tau,
                     "ms_per_step": 1e3 * m.seconds / steps, "identical": same, "prompts": prompts, "parts_ms": parts})
    return rows


def verify_costs(engine: ReferenceEngine, ts: list[int], repeats: int) -> dict[int, float]:
    from engines.model import Llama

    target = engine._rt.target  # the benchmark times the engine's own target forward
    if not isinstance(target, Llama):
        raise ValueError("--verify-ts times the native Llama path only; give --verify-ts '' for this build")
    fns = forward_fns(target, engine.dtype, torch.device(engine.device), ts)
    ms = interleaved_ms(fns, repeats)
    print("\none target forward after a 200-token context, T new rows (a tree of T - 1 drafts), median ms: "
          + ", ".join(f"T={t}: {v:.1f} ({v / ms[ts[0]]:.2f}x)" for t, v in ms.items()))
    return ms


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", action="append", required=True, help="NAME=DIR, a finished reference build")
    ap.add_argument("--trees", action="append", default=[], help="NAME=TREE,TREE,... for build NAME")
    ap.add_argument("--questions", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--verify-ts", default="1,2,3,4,5,7")
    ap.add_argument("--verify-repeats", type=int, default=20)
    ap.add_argument("--json", type=Path)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    builds = {b.partition("=")[0]: Path(b.partition("=")[2]) for b in args.build}
    methods = methods_for(builds, split_trees(args.trees))
    tok = methods[0].engine.tokenizer
    eos = [tok.eos_token_id]
    prompts = [chat_ids(tok, q.turns[0]) for q in mtbench_questions(args.questions)]
    for m in methods:  # warm-up: kernels chosen, caches allocated
        run_one(m, prompts[0], 8, eos)
        m.seconds, m.tokens, m.steps, m.outputs, m.laps = 0.0, 0, 0, [], Laps()
    t0 = time.time()
    for r in range(args.rounds):
        for i, ids in enumerate(prompts):
            order = methods[(r + i) % len(methods):] + methods[:(r + i) % len(methods)]
            for m in order:
                run_one(m, ids, args.max_new_tokens, eos)
        print(f"round {r + 1}/{args.rounds} done ({time.time() - t0:.0f} s, load {os.getloadavg()[0]:.1f})")
    for m in methods:  # outputs of the last round only, once per prompt
        m.outputs = m.outputs[-len(prompts):]
    rows = report(methods, len(prompts))
    ts = [int(x) for x in args.verify_ts.split(",") if x]
    ver = verify_costs(methods[0].engine, ts, args.verify_repeats) if ts else {}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows, "verify_ms": ver, "load": os.getloadavg()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
