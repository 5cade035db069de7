"""Measure a trained EAGLE head with `measure.verify`: tau and wall-clock speedup over HF `generate`, per tree.

    python bench/bench_head.py --config configs/demo.yaml --head heads/smollm2-eagle \
        --mtbench-every 8 --max-new-tokens 128 --out build/bench-head \
        --trees topk-2-3,eagle-default --dynamic 4,4,20 --tune-budget 25

For each tree it builds the config's checkpoint + engine stages with the head (`builders/build.py --set ...
--only checkpoint engine`), runs `python -m measure.verify` (greedy; HF generate is the oracle and the baseline)
and prints one table row: tree, nodes, tau, HF tok/s, engine tok/s, speedup. HF runs once, with the first tree; the
other trees reuse its outputs and speeds (`measure.verify --reuse-hf`; `--hf-every-tree` reruns it).
`--tune-budget N` also runs `measure/tune_tree.py` on the first build and measures the tuned N-node tree.
`--target-only` also times the engine's own target-only decoding (same build, same prompts, one at a time, checked
identical to HF) and adds the speedup over it. Everything measured in this one run is written to OUT/results.json; the
markdown table is printed (the model card quotes it).

Inputs:  --config, --head (an EAGLE head directory), MT-bench questions
Outputs: OUT/results.json and a markdown table on stdout
Guide:   docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def tree_overrides(spec: str) -> list[str]:
    """`topk-2-3` (preset), `dynamic:K,D,N` or `file:SNIPPET.yaml` (tune_tree output) -> build.py --set items."""
    if spec.startswith("dynamic:"):
        k, d, n = (int(x) for x in spec[len("dynamic:"):].split(","))
        return ["tree.choices=null", f"tree.dynamic={{top_k: {k}, depth: {d}, total_draft_tokens: {n}}}"]
    if spec.startswith("file:"):
        import yaml

        choices = yaml.safe_load(Path(spec[len("file:"):]).read_text())["tree"]["choices"]
        return [f"tree.choices={json.dumps(choices)}"]
    return [f"tree.choices={spec}"]


def build_argv(config: Path, head: Path, out: Path, spec: str) -> list[str]:
    sets = [f"draft.model={head.resolve()}", f"output_dir={out.resolve()}", *tree_overrides(spec)]
    return [sys.executable, str(REPO / "builders/build.py"), str(config), *[a for s in sets for a in ("--set", s)],
            "--only", "checkpoint", "--only", "engine"]


def verify_argv(
    build: Path, prompts: Path, max_new_tokens: int, json_path: Path, reuse_hf: Path | None = None
) -> list[str]:
    argv = [sys.executable, "-m", "measure.verify", "--build", str(build), "--prompts", str(prompts),
            "--max-new-tokens", str(max_new_tokens), "--json", str(json_path)]
    return argv + (["--reuse-hf", str(reuse_hf)] if reuse_hf else [])


def tune_argv(
    build: Path, prompts: Path, budget: int, max_new_tokens: int, out: Path, num_prompts: int | None
) -> list[str]:
    argv = [sys.executable, str(REPO / "measure/tune_tree.py"), "--build", str(build), "--prompts", str(prompts),
            "--budget", str(budget), "--max-new-tokens", str(max_new_tokens), "--out", str(out), "--presets", ""]
    return argv + (["--num-prompts", str(num_prompts)] if num_prompts else [])


def run(argv: list[str]) -> None:
    print("$ " + " ".join(argv), flush=True)
    if subprocess.run(argv, cwd=REPO).returncode != 0:
        raise SystemExit(f"bench_head: command failed: {' '.join(argv)}")


def row(name: str, verify_json: Path) -> dict:
    doc = json.loads(verify_json.read_text())
    ps = doc["prompts"]
    hf_tokens = sum(p["hf_tokens"] for p in ps)
    eng_tokens = sum(p["engine_tokens"] for p in ps)
    hf_s = sum(p["hf_tokens"] / p["hf_tokens_per_s"] for p in ps)
    eng_s = sum(p["engine_tokens"] / p["engine_tokens_per_s"] for p in ps)
    return {
        "tree": name,
        "prompts": len(ps),
        "identical": doc["all_identical"],
        "tau": doc["aggregate"]["tau"],
        "hf_tok_s": hf_tokens / hf_s,
        "engine_tok_s": eng_tokens / eng_s,
        "speedup": (eng_tokens / eng_s) / (hf_tokens / hf_s),
    }


def measure(args: argparse.Namespace, name: str, spec: str, reuse_hf: Path | None) -> tuple[dict, Path, Path]:
    build = args.out / name.replace(":", "-").replace(",", "-").replace("/", "-")
    run(build_argv(args.config, args.head, build, spec))
    vj = args.out / f"verify-{build.name}.json"
    run(verify_argv(build, args.prompts, args.max_new_tokens, vj, reuse_hf))
    return row(name, vj), build, vj


def target_only(build: Path, prompts: Path, max_new_tokens: int, hf_report: Path) -> dict:
    """The engine's target-only decoding of every prompt (batch 1, greedy, the build's dtype/device): tokens/s over
    all prompts, and whether each output equals HF's (from the verify report of this run)."""
    import time

    from engines.api import GenerationRequest, ReferenceEngine, SamplingParams
    from sources.data import chat_ids, read_prompts

    eng = ReferenceEngine.from_build(build)
    hf = json.loads(hf_report.read_text())
    tokens, seconds, same = 0, 0.0, 0
    for text, ref in zip(read_prompts(prompts), hf["prompts"]):
        req = GenerationRequest(chat_ids(eng.tokenizer, text), max_new_tokens, SamplingParams(), hf["eos_token_ids"])
        t0 = time.perf_counter()
        [res] = eng.generate([req], speculative=False)
        seconds += time.perf_counter() - t0
        tokens += len(res.output_ids)
        same += res.output_ids == ref["hf_output_ids"]
    return {"prompts": len(hf["prompts"]), "identical_to_hf": same, "tok_s": tokens / seconds}


def write_mtbench(out: Path, every: int) -> Path:
    from sources.data import mtbench_questions

    qs = mtbench_questions()[::every]
    path = out / f"mtbench-every-{every}.jsonl"
    path.write_text("".join(json.dumps({"question_id": q.question_id, "category": q.category, "turns": q.turns[:1]})
                            + "\n" for q in qs))
    print(f"{len(qs)} MT-bench questions (ids {[q.question_id for q in qs]}) -> {path}")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="bench_head.py", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--config", type=Path, default=REPO / "configs/demo.yaml", help="build config (target, engine)")
    ap.add_argument("--head", type=Path, required=True, help="EAGLE head dir (SafeAILab layout)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompts", type=Path, help="JSONL (`prompt` or MT-bench `turns`)")
    src.add_argument("--mtbench-every", type=int, metavar="N",
                     help="every N-th of the 80 MT-bench questions (first turns; N=1: all 80, N=8: one in 8 across "
                          "all categories), written to OUT/mtbench-every-N.jsonl")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", type=Path, required=True, help="build dirs and results.json go here")
    ap.add_argument("--trees", default="topk-2-3,eagle-default", help="comma-separated static presets")
    ap.add_argument("--dynamic", default=None, help="EAGLE-2 dynamic tree top_k,depth,total_draft_tokens")
    ap.add_argument("--tune-budget", type=int, default=None, help="also tune a tree of this many nodes")
    ap.add_argument("--tune-prompts", type=int, default=None, help="tune_tree --num-prompts (default: all)")
    ap.add_argument("--tune-max-new-tokens", type=int, default=None, help="tune_tree --max-new-tokens (default: "
                    "--max-new-tokens)")
    ap.add_argument("--target-only", action="store_true", help="also time the engine's target-only decoding and "
                    "report the speedup over it")
    ap.add_argument("--hf-every-tree", action="store_true", help="run HF generate again for every tree (default: "
                    "once, with the first tree; the others reuse its outputs and speeds)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.mtbench_every:
        args.prompts = write_mtbench(args.out, args.mtbench_every)
    specs = [(t, t) for t in args.trees.split(",") if t]
    if args.dynamic:
        specs.append((f"dynamic:{args.dynamic}", f"dynamic:{args.dynamic}"))
    rows, first_build, hf_report = [], None, None
    for name, spec in specs:
        r, build, vj = measure(args, name, spec, None if args.hf_every_tree else hf_report)
        rows.append(r)
        first_build, hf_report = first_build or build, hf_report or vj
        print(json.dumps(r), flush=True)
    if first_build is None or hf_report is None:
        sys.exit("error: no tree was measured (pass at least one tree)")
    if args.tune_budget:
        snippet = args.out / f"tuned-{args.tune_budget}.yaml"
        tokens = args.tune_max_new_tokens or args.max_new_tokens
        run(tune_argv(first_build, args.prompts, args.tune_budget, tokens, snippet, args.tune_prompts))
        r, _, _ = measure(
            args, f"tuned-{args.tune_budget}", f"file:{snippet}", None if args.hf_every_tree else hf_report
        )
        rows.append(r)
    plain = target_only(first_build, args.prompts, args.max_new_tokens, hf_report) if args.target_only else None
    (args.out / "results.json").write_text(json.dumps({"trees": rows, "target_only": plain}, indent=2) + "\n")
    print_table(rows, plain)
    return 0


def print_table(rows: list[dict], plain: dict | None) -> None:
    extra = " engine target-only tok/s | speedup over target-only |" if plain else ""
    print(f"\n| tree | prompts | outputs identical | tau | HF tok/s | EAGLE tok/s | speedup over HF |{extra}")
    print("|---|---|---|---|---|---|---|" + ("---|---|" if plain else ""))
    for r in rows:
        tail = f" {plain['tok_s']:.1f} | {r['engine_tok_s'] / plain['tok_s']:.2f}x |" if plain else ""
        print(f"| {r['tree']} | {r['prompts']} | {r['identical']} | {r['tau']:.2f} | {r['hf_tok_s']:.1f} | "
              f"{r['engine_tok_s']:.1f} | {r['speedup']:.2f}x |{tail}")
    if plain:
        print(f"\nengine target-only: {plain['identical_to_hf']}/{plain['prompts']} outputs identical to HF greedy")


if __name__ == "__main__":
    sys.exit(main())
