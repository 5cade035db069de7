"""`python measure/tune_tree.py --build OUT_DIR --prompts FILE --budget N [--objective tau|speed] [--out snippet.yaml]`

Measures per-(depth, rank) acceptance with the reference engine on the build's checkpoint and writes a tree as a
config snippet:
- `--objective tau` (default): the tree with the largest expected accepted length within N nodes; prints expected
  vs measured tau for it and for the presets.
- `--objective schedule`: load-aware speculation (`tree.draft_len_schedule: auto`): times a step of B sequences
  drafting each depth 0..D of a tree (the build's, or --tree FILE) and target-only decoding, for each --batch-sizes B,
  and writes the draft length per batch size with the largest expected speedup (tau of the cut tree from the
  acceptance table, over the measured step cost), the expected speedup table and --plot; --json holds the schedule
  `tree.schedule_file` reads (measure/schedule_policy.py).
- `--objective speed`: also times one decoding step with the optimal tree of every size 1..N and with target-only
  decoding on this device, and writes the tree with the largest predicted speedup over target-only decoding; then
  measures that tree's real speedup on the prompts (each prompt decoded both ways, back to back).
Method, optimality argument and the speed model: measure/tree_tuning.py.

The build must be a finished build with engine.backend=reference (engine/reference.json is read: its checkpoint,
dtype, device and draft vocabulary). The prompts file is JSONL with `prompt` or MT-bench `turns` per line
(sources/data.py read_prompts). `--table` reuses the acceptance table of an earlier `--json` (same build and
prompts) instead of measuring it again, e.g. to tune for speed after tuning for tau.

Inputs:  --build (a finished reference build) and --prompts (JSONL, `prompt` or `turns` per line)
Outputs: a `tree:` config snippet (--out, else stdout); the comparison printed; --json the full results
Guide:   docs/tune-tree.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Run as a file (`python measure/tune_tree.py`), Python would put builders/ first on sys.path, where a
# module can shadow an installed package (builders/triton: `triton`): run as the module, as its command does.
if __name__ == "__main__" and not __package__:
    os.execv(sys.executable, [sys.executable, "-m", "measure.tune_tree", *sys.argv[1:]])

from measure.tree_tuning import (
    AcceptanceTable,
    SizeCost,
    chain,
    fastest,
    nested_trees,
    optimal_tree,
    snippet_yaml,
)
from core import trees
from core.trees import DraftTree

DEFAULT_PRESETS = ("trtllm-default", "eagle-default", "chain-4")


@dataclass
class Measured:
    tau: float
    acceptance_by_depth: list[int]
    steps: int


class Runner:
    """Loads the build's engine once and decodes the prompts greedily (speculative) with any tree."""

    def __init__(self, build_dir: Path, prompts: list[str], max_new_tokens: int, device: str | None) -> None:
        from engines.api import ReferenceEngine
        from sources.data import chat_ids

        self.engine = ReferenceEngine.from_build(build_dir, device)
        tok = self.engine.tokenizer
        self.eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
        self.ids = [chat_ids(tok, p) for p in prompts]
        self.max_new_tokens = max_new_tokens

    @property
    def random_head(self) -> bool:
        return self.engine.random_head

    def requests(self) -> list[Any]:
        from engines.api import GenerationRequest, SamplingParams

        return [GenerationRequest(prompt_ids=i, max_new_tokens=self.max_new_tokens, sampling=SamplingParams(),
                                  stop_token_ids=self.eos) for i in self.ids]

    def run(self, tree: DraftTree) -> Measured:
        from engines.api import ReferenceEngine

        engine, reqs = self.engine.with_tree(tree), self.requests()
        batch = engine.limits.max_batch_size  # greedy tokens do not depend on the batch (engines.session)
        results = [r for i in range(0, len(reqs), batch) for r in engine.generate(reqs[i:i + batch], speculative=True)]
        agg = ReferenceEngine.aggregate(results)
        return Measured(agg.tau, list(agg.acceptance_by_depth), agg.target_forwards)


def measure_table(runner: Runner, top_k: int, depth: int) -> AcceptanceTable:
    from tqdm import tqdm

    reach = []
    for r in tqdm(range(top_k), desc="rank chains", unit="chain"):
        m = runner.run(chain(r, depth))
        by_depth = (m.acceptance_by_depth + [0] * depth)[:depth]
        reach.append([m.steps] + by_depth)
    return AcceptanceTable(reach)


def read_table(path: Path) -> AcceptanceTable:
    """The acceptance table of an earlier `--json` (its `table.reach`), checked for shape."""
    try:
        reach = json.loads(path.read_text())["table"]["reach"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--table {path}: not a tune_tree.py --json file with table.reach ({e})") from e
    ok = (isinstance(reach, list) and reach and all(isinstance(r, list) and len(r) == len(reach[0]) >= 2 for r in reach)
          and all(isinstance(v, int) and v >= 0 for r in reach for v in r))
    if not ok:
        raise ValueError(f"--table {path}: table.reach must be equal-length lists (>= 2) of counts >= 0, one per rank")
    return AcceptanceTable(reach)


def tune_for_speed(runner: Runner, table: AcceptanceTable, budget: int, cost_prompts: int,
                   rounds: int) -> tuple[list[SizeCost], float]:
    """The step cost of the optimal tree of each size 1..budget and of target-only decoding (builders/tree_costs)."""
    from measure.tree_costs import step_ms

    candidates = nested_trees(table, budget)
    engines: dict[int, tuple[Any, bool]] = {0: (runner.engine, False)}
    engines.update({t.size: (runner.engine.with_tree(t), True) for t in candidates})
    ms = step_ms(engines, runner.ids[:cost_prompts], runner.max_new_tokens, runner.eos, rounds)
    costs = [SizeCost(t, table.expected_tau(t), ms[t.size]) for t in candidates]
    return costs, ms[0]


def print_speed(costs: list[SizeCost], target_ms: float, best: SizeCost) -> None:
    print(f"\ntarget-only decoding: {target_ms:.1f} ms per token")
    print(f"{'nodes':>6}{'depth':>6}{'expected tau':>14}{'step ms':>10}{'predicted speedup':>19}")
    for c in costs:
        mark = "  <- fastest" if c is best else ""
        print(f"{c.nodes:>6}{c.depth:>6}{c.expected_tau:>14.3f}{c.step_ms:>10.1f}{c.speedup(target_ms):>18.2f}x{mark}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="eagle-tune-tree", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--build", required=True, type=Path, help="finished build dir (with engine/reference.json)")
    ap.add_argument("--prompts", required=True, type=Path, help="JSONL prompts (`prompt` or `turns` per line)")
    ap.add_argument(
        "--budget",
        required=True,
        type=int,
        help="tree size N (draft tokens = max_draft_len), <= 256; with --objective speed the largest size tried",
    )
    ap.add_argument("--objective", choices=("tau", "speed", "schedule"), default="tau",
                    help="tau: most expected tokens per step (default); speed: fastest on this device; schedule: "
                         "draft length per batch size (draft_len_schedule) from measured step costs")
    ap.add_argument("--batch-sizes", default=None,
                    help="schedule: batch sizes to time, e.g. 1,2,4 (default: powers of two up to the build's "
                         "engine.max_batch_size)")
    ap.add_argument("--tree", type=Path, default=None,
                    help="schedule: a tree snippet (`tree: choices: ...`, e.g. configs/trees/*.yaml) to schedule "
                         "(default: the build's static tree)")
    ap.add_argument("--steps", type=int, default=8, help="schedule: decoding steps timed per configuration (default 8)")
    ap.add_argument("--plot", type=Path, default=None, help="schedule: write the expected-speedup plot (PNG) here")
    ap.add_argument("--cost-model", default=None,
                    help="schedule: take step costs from the roofline MODEL of a named GPU instead of timing this "
                         "device (measure/gpu_cost_model.py: H100-SXM, H200-SXM, A100-SXM-80GB, L40S); the acceptance "
                         "table is still measured here. Default batch sizes then 1..256")
    ap.add_argument(
        "--context",
        type=int,
        default=1024,
        help="schedule with --cost-model: context length (tokens) whose KV cache a step reads (default 1024)",
    )
    ap.add_argument("--out", type=Path, help="write the config snippet here (default: print it)")
    ap.add_argument("--max-depth", type=int, default=5, help="deepest level measured (default 5)")
    ap.add_argument("--top-k", type=int, default=10, help="ranks measured per level (default 10)")
    ap.add_argument("--table", type=Path, help="reuse the acceptance table of an earlier --json instead of measuring "
                    "one (--top-k and --max-depth then do not apply)")
    ap.add_argument("--num-prompts", type=int, default=None, help="use the first N prompts (default all)")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="tokens generated per prompt (default 64)")
    ap.add_argument("--cost-prompts", type=int, default=2, help="speed: prompts each step cost is timed on (default 2)")
    ap.add_argument("--cost-rounds", type=int, default=3, help="speed: round-robin passes over the sizes (default 3)")
    ap.add_argument("--presets", default=",".join(DEFAULT_PRESETS),
                    help="comma-separated presets to compare (--objective tau; speed compares tree sizes instead)")
    ap.add_argument("--device", default=None, help="override the build's device (cpu / cuda)")
    ap.add_argument("--json", type=Path, help="also write table + results as JSON")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from sources.data import DataSourceError, read_prompts

    if not 1 <= args.budget <= trees.MAX_DRAFT_LEN_LIMIT:
        print(f"error: --budget {args.budget} must be in 1..{trees.MAX_DRAFT_LEN_LIMIT}", file=sys.stderr)
        return 2
    if args.cost_prompts < 1 or args.cost_rounds < 1:
        print("error: --cost-prompts and --cost-rounds must be >= 1", file=sys.stderr)
        return 2
    # every argument checked before any prompt, model or table is loaded
    counts = {"--steps": args.steps, "--max-depth": args.max_depth, "--top-k": args.top_k,
              "--max-new-tokens": args.max_new_tokens, "--num-prompts": args.num_prompts}
    bad = [f"{k} {v}" for k, v in counts.items() if v is not None and v < 1]
    if bad:
        print(f"error: {', '.join(bad)}: must be >= 1", file=sys.stderr)
        return 2
    try:
        args.batch_sizes = parse_batch_sizes(args.batch_sizes)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        prompts = read_prompts(args.prompts, args.num_prompts)
        presets = {name: DraftTree.from_choices(trees.preset(name)) for name in args.presets.split(",") if name}
        given = read_table(args.table) if args.table else None
        runner = Runner(args.build, prompts, args.max_new_tokens, args.device)
        table = given or measure_table(runner, args.top_k, args.max_depth)
        if args.objective == "speed":
            return tune_speed(args, runner, table, len(prompts))
        if args.objective == "schedule":
            return tune_schedule(args, runner, table)
        tuned = optimal_tree(table, args.budget)
        results = compare(runner, table, [("tuned", tuned)] + list(presets.items()))
    except (DataSourceError, trees.TreeError, FileNotFoundError, ValueError) as e:
        # ValueError: engines.checkpoint.CheckpointError and friends (a broken or incomplete build), a bad --table
        print(f"error: {e}", file=sys.stderr)
        return 2
    deeper = [n for n, t in presets.items() if t.depth > table.depth or t.max_top_k > table.top_k]
    if deeper:
        print(f"note: {', '.join(deeper)} reach beyond the measured depth/ranks; their expected tau counts those "
              "nodes as 0")
    comment = (f"tree tuned by measure/tune_tree.py on {args.prompts} ({len(prompts)} prompts, "
               f"{args.max_new_tokens} new tokens each), budget {args.budget}\n"
               f"expected tau {results[0]['expected_tau']:.3f}, measured tau {results[0]['measured_tau']:.3f}")
    finish(args, runner, table, tuned, comment, {"objective": "tau", "results": results})
    return 0


def compare(runner: Runner, table: AcceptanceTable, rows: list[tuple[str, DraftTree]]) -> list[dict[str, Any]]:
    results = []
    print(f"\n{'tree':<18}{'nodes':>6}{'depth':>6}{'expected tau':>14}{'measured tau':>14}")
    for name, tree in rows:
        m = runner.run(tree)
        exp = table.expected_tau(tree)
        results.append({"tree": name, "nodes": tree.size, "depth": tree.depth, "expected_tau": exp,
                        "measured_tau": m.tau})
        print(f"{name:<18}{tree.size:>6}{tree.depth:>6}{exp:>14.3f}{m.tau:>14.3f}")
    return results


def tune_speed(args: argparse.Namespace, runner: Runner, table: AcceptanceTable, num_prompts: int) -> int:
    import torch

    from measure.costs import eagle_speedup

    costs, target_ms = tune_for_speed(runner, table, args.budget, args.cost_prompts, args.cost_rounds)
    best = fastest(costs, target_ms)
    print_speed(costs, target_ms, best)
    tuned = best.tree
    got = eagle_speedup(runner.engine.with_tree(tuned), runner.ids, args.max_new_tokens, runner.eos)
    print(f"\nfastest tree ({best.nodes} nodes) on all {num_prompts} prompts, each decoded both ways back to back: "
          f"tau {got.tau:.3f} (expected {best.expected_tau:.3f}), {got.eagle_tps:.2f} tok/s against target-only "
          f"{got.target_tps:.2f} tok/s = {got.ratio:.2f}x; {got.identical}/{got.prompts} outputs identical")
    if got.identical < got.prompts and runner.engine.dtype != torch.float32:
        print("note: in 16-bit a tree verification rounds differently from a one-token step, so greedy outputs may "
              "part at near-ties; float32 is exact (docs/benchmarks.md, the engine benchmark's agreement section)")
    if best.speedup(target_ms) < 1.0:
        print(f"note: no tree of at most {args.budget} nodes is predicted to beat target-only decoding on this "
              f"device (best {best.speedup(target_ms):.2f}x): with this head, decode without EAGLE here, or train a "
              "head that accepts more (docs/train-a-head.md)")
    comment = (f"fastest tree found by measure/tune_tree.py --objective speed on {args.prompts} ({num_prompts} "
               f"prompts, {args.max_new_tokens} new tokens each), sizes 1..{args.budget}, on {runner.engine.device} "
               f"in {str(runner.engine.dtype).removeprefix('torch.')}\n"
               f"expected tau {best.expected_tau:.3f}, measured tau {got.tau:.3f}; predicted speedup over "
               f"target-only {best.speedup(target_ms):.2f}x, measured {got.ratio:.2f}x")
    sizes = [{"nodes": c.nodes, "depth": c.depth, "expected_tau": c.expected_tau, "step_ms": c.step_ms,
              "predicted_speedup": c.speedup(target_ms)} for c in costs]
    finish(args, runner, table, tuned, comment, {
        "objective": "speed", "target_step_ms": target_ms, "sizes": sizes,
        "results": [{"tree": "fastest", "nodes": tuned.size, "depth": tuned.depth, "expected_tau": best.expected_tau,
                     "measured_tau": got.tau, "predicted_speedup": best.speedup(target_ms),
                     "measured_speedup": got.ratio, "eagle_tps": got.eagle_tps, "target_tps": got.target_tps,
                     "identical": got.identical, "prompts": got.prompts}],
    })
    return 0


def schedule_tree(args: argparse.Namespace, runner: Runner) -> DraftTree:
    import yaml

    if args.tree is not None:
        choices = yaml.safe_load(args.tree.read_text())["tree"]["choices"]
        return DraftTree.from_choices(trees.preset(choices) if isinstance(choices, str) else choices)
    tree = runner.engine.tree
    if not isinstance(tree, DraftTree):
        raise ValueError("--objective schedule needs a static tree: the build has a dynamic one; give --tree FILE")
    return tree


MAX_BATCH_SIZES = 512  # --batch-sizes with --cost-model (no build limit applies)


def parse_batch_sizes(text: str | None) -> list[int] | None:
    """--batch-sizes `1,2,8` as sorted distinct integers in 1..MAX_BATCH_SIZES including 1; None when not given.
    Checked before anything is loaded; the build's own max_batch_size is checked once the build is read."""
    if text is None:
        return None
    try:
        sizes = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"--batch-sizes {text}: give comma-separated integers, e.g. 1,2,4,8") from None
    if not sizes or sizes[0] != 1 or sizes[-1] > MAX_BATCH_SIZES:
        raise ValueError(f"--batch-sizes {text}: give sizes from 1 to at most {MAX_BATCH_SIZES} (and to the build's "
                         "engine.max_batch_size), including 1 (draft_len_schedule must hold batch size 1)")
    return sizes


def batch_sizes(args: argparse.Namespace, runner: Runner) -> list[int]:
    top = MAX_BATCH_SIZES if args.cost_model else runner.engine.limits.max_batch_size
    if args.batch_sizes is None:
        return [b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256) if b <= top]
    sizes: list[int] = args.batch_sizes  # parse_batch_sizes, in main
    if sizes[-1] > top:
        raise ValueError(f"--batch-sizes {','.join(map(str, sizes))}: give sizes from 1 up to the build's "
                         f"engine.max_batch_size {top}, including 1 (draft_len_schedule must hold batch size 1)")
    return sizes


def tune_schedule(args: argparse.Namespace, runner: Runner, table: AcceptanceTable) -> int:
    from measure.schedule_policy import measure, plot, print_result
    from core.speculation import truncate

    tree = schedule_tree(args, runner)
    taus = [1.0] + [table.expected_tau(truncate(tree, d)) for d in range(1, tree.depth + 1)]
    sizes = batch_sizes(args, runner)
    device, dtype = runner.engine.device, str(runner.engine.dtype).removeprefix("torch.")
    if args.cost_model:
        from measure import gpu_cost_model as gm
        from measure.schedule_policy import ScheduleResult

        if args.cost_model not in gm.GPUS:
            raise ValueError(f"--cost-model {args.cost_model}: use one of {', '.join(gm.GPUS)}")
        shape = gm.ModelShape.from_checkpoint(args.build / "checkpoint" / "config.json")
        step, target = gm.modelled_costs(gm.GPUS[args.cost_model], shape, tree, sizes, args.context)
        r = ScheduleResult(sizes, taus, step, target, tree)
        device, dtype = f"{args.cost_model} (roofline MODEL, not measured)", "16-bit"
        print(f"step costs: the roofline model of {args.cost_model} at context {args.context}, not a measurement")
    else:
        r = measure(runner.engine, tree, taus, runner.ids, sizes, args.steps, args.cost_rounds)
    print_result(r)
    if args.plot:
        plot(r, args.plot, f"expected EAGLE speedup by batch size: {tree.size}-node tree, {device}, {dtype}")
        print(f"wrote {args.plot}")
    sched = r.schedule()
    cut = truncate(tree, sched[1]) if sched else tree
    how = "step costs modelled" if args.cost_model else f"{args.steps} steps x {args.cost_rounds} rounds"
    comment = (f"load-aware schedule by measure/tune_tree.py --objective schedule on {args.prompts}, batch sizes "
               f"{','.join(map(str, sizes))}, {how}, on {device} in {dtype}\n"
               f"draft_len_schedule {sched or 'none: EAGLE does not beat target-only decoding here'}")
    finish(args, runner, table, cut, comment, {"objective": "schedule", "device": device, "dtype": dtype,
                                                "schedule": r.to_json()})
    return 0


def finish(args: argparse.Namespace, runner: Runner, table: AcceptanceTable, tuned: DraftTree, comment: str,
           extra: dict[str, Any]) -> None:
    """Print the acceptance table, write the snippet and the JSON."""
    if runner.random_head:
        print("note: this build's head is RANDOM: acceptance ~0, the tuned tree is meaningless")
    print("p[depth][rank] (rows = depth 1..):")
    for d in range(1, table.depth + 1):
        print(f"  d={d}: " + " ".join(f"{table.p(d, r):.3f}" for r in range(table.top_k)))
    if args.table:
        comment += f"\nacceptance table read from {args.table}"
    text = snippet_yaml(tuned, comment)
    sched = extra.get("schedule", {}).get("draft_len_schedule")
    if sched:  # --objective schedule: the measured schedule goes with its tree
        text += "  draft_len_schedule: {" + ", ".join(f"{b}: {n}" for b, n in sched.items()) + "}\n"
    if args.out:
        args.out.write_text(text)
        print(f"wrote {args.out}")
    else:
        print(text)
    if args.json:
        args.json.write_text(
            json.dumps({"table": table.to_json(), **extra, "tuned": tuned.as_lists()}, indent=2) + "\n"
        )


if __name__ == "__main__":
    sys.exit(main())
