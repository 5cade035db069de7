"""`python builders/tune_tree.py --build OUT_DIR --prompts FILE --budget N [--out snippet.yaml]`

Measures per-(depth, rank) acceptance with the reference engine on the build's checkpoint, writes the tree that
maximizes expected accepted length within N nodes as a config snippet, and prints expected vs measured tau for it
and for the presets. Method and optimality argument: builders/tree_tuning.py.

The build must be a finished build (any engine backend: its checkpoint/ and engine/reference.json are read; for
non-reference backends pass --checkpoint-build with a reference build of the same checkpoint). The prompts file is
JSONL with `prompt` or MT-bench `turns` per line (engines/data.py read_prompts).

Inputs:  --build (a finished build) and --prompts (JSONL, `prompt` or `turns` per line)
Outputs: a `tree:` config snippet (--out, else stdout); expected vs measured tau printed; --json the full results
Guide:   docs/tune-tree.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repository, not builders/, heads the path (builders/triton
    sys.path[0] = str(Path(__file__).resolve().parent.parent)  # would otherwise shadow the `triton` package)

from engines import trees  # noqa: E402
from builders.tree_tuning import AcceptanceTable, chain, optimal_tree, snippet_yaml  # noqa: E402
from engines.trees import DraftTree  # noqa: E402

DEFAULT_PRESETS = ("trtllm-default", "eagle-default", "chain-4")


@dataclass
class Measured:
    tau: float
    acceptance_by_depth: list[int]
    steps: int


class Runner:
    """Loads the build's checkpoint once per tree and decodes the prompts greedily (speculative)."""

    def __init__(self, build_dir: Path, prompts: list[str], max_new_tokens: int, device: str | None) -> None:
        from engines.spec import read_spec

        self.spec = read_spec(build_dir)
        self.build_dir = build_dir
        self.prompts = prompts
        self.max_new_tokens = max_new_tokens
        self.device = device or self.spec.device
        self.random_head = False

    def run(self, tree: DraftTree) -> Measured:
        from engines.api import GenerationRequest, ReferenceEngine, SamplingParams
        from engines.data import chat_ids

        s = self.spec
        eng = ReferenceEngine.from_checkpoint(
            s.path(self.build_dir, s.checkpoint_dir), tree=tree, dtype=s.dtype, device=self.device,
            eagle3_head_dir=s.path(self.build_dir, s.eagle3_head_dir) if s.eagle3_head_dir else None,
        )
        self.random_head = eng.random_head
        tok = eng.tokenizer
        eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
        reqs = [GenerationRequest(prompt_ids=chat_ids(tok, p), max_new_tokens=self.max_new_tokens,
                                  sampling=SamplingParams(), stop_token_ids=eos) for p in self.prompts]
        agg = ReferenceEngine.aggregate(eng.generate(reqs, speculative=True))
        return Measured(agg.tau, list(agg.acceptance_by_depth), agg.target_forwards)


def measure_table(runner: Runner, top_k: int, depth: int) -> AcceptanceTable:
    from tqdm import tqdm

    reach = []
    for r in tqdm(range(top_k), desc="rank chains", unit="chain"):
        m = runner.run(chain(r, depth))
        by_depth = (m.acceptance_by_depth + [0] * depth)[:depth]
        reach.append([m.steps] + by_depth)
    return AcceptanceTable(reach)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tune_tree.py", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--build", required=True, type=Path, help="finished build dir (with engine/reference.json)")
    ap.add_argument("--prompts", required=True, type=Path, help="JSONL prompts (`prompt` or `turns` per line)")
    ap.add_argument("--budget", required=True, type=int, help="tree size N (draft tokens = max_draft_len), <= 256")
    ap.add_argument("--out", type=Path, help="write the config snippet here (default: print it)")
    ap.add_argument("--max-depth", type=int, default=5, help="deepest level measured (default 5)")
    ap.add_argument("--top-k", type=int, default=10, help="ranks measured per level (default 10)")
    ap.add_argument("--num-prompts", type=int, default=None, help="use the first N prompts (default all)")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="tokens generated per prompt (default 64)")
    ap.add_argument("--presets", default=",".join(DEFAULT_PRESETS), help="comma-separated presets to compare")
    ap.add_argument("--device", default=None, help="override the build's device (cpu / cuda)")
    ap.add_argument("--json", type=Path, help="also write table + results as JSON")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from engines.data import DataSourceError, read_prompts

    if not 1 <= args.budget <= trees.MAX_DRAFT_LEN_LIMIT:
        print(f"error: --budget {args.budget} must be in 1..{trees.MAX_DRAFT_LEN_LIMIT}", file=sys.stderr)
        return 2
    try:
        prompts = read_prompts(args.prompts, args.num_prompts)
        presets = {name: DraftTree.from_choices(trees.preset(name)) for name in args.presets.split(",") if name}
        runner = Runner(args.build, prompts, args.max_new_tokens, args.device)
    except (DataSourceError, trees.TreeError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    try:
        table = measure_table(runner, args.top_k, args.max_depth)
        tuned = optimal_tree(table, args.budget)
        rows = [("tuned", tuned)] + list(presets.items())
        results = []
        print(f"\n{'tree':<18}{'nodes':>6}{'depth':>6}{'expected tau':>14}{'measured tau':>14}")
        for name, tree in rows:
            m = runner.run(tree)
            exp = table.expected_tau(tree)
            results.append({"tree": name, "nodes": tree.size, "depth": tree.depth, "expected_tau": exp,
                            "measured_tau": m.tau})
            print(f"{name:<18}{tree.size:>6}{tree.depth:>6}{exp:>14.3f}{m.tau:>14.3f}")
    except ValueError as e:  # engines.checkpoint.CheckpointError and friends: a broken or incomplete build
        print(f"error: {e}", file=sys.stderr)
        return 2
    deeper = [n for n, t in presets.items() if t.depth > args.max_depth or t.max_top_k > args.top_k]
    if deeper:
        print(f"note: {', '.join(deeper)} reach beyond the measured depth/ranks; their expected tau counts those "
              "nodes as 0")
    if runner.random_head:
        print("note: this build's head is RANDOM: acceptance ~0, the tuned tree is meaningless")
    print("p[depth][rank] (rows = depth 1..):")
    for d in range(1, table.depth + 1):
        print(f"  d={d}: " + " ".join(f"{table.p(d, r):.3f}" for r in range(table.top_k)))
    comment = (f"tree tuned by builders/tune_tree.py on {args.prompts} ({len(prompts)} prompts, "
               f"{args.max_new_tokens} new tokens each), budget {args.budget}\n"
               f"expected tau {results[0]['expected_tau']:.3f}, measured tau {results[0]['measured_tau']:.3f}")
    text = snippet_yaml(tuned, comment)
    if args.out:
        args.out.write_text(text)
        print(f"wrote {args.out}")
    else:
        print(text)
    if args.json:
        args.json.write_text(json.dumps({"table": table.to_json(), "results": results,
                                         "tuned": tuned.as_lists()}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
