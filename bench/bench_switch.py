r"""The acceptance switch on mixed traffic: for the whole batch (TensorRT-LLM's) or per sequence (ours).

    python bench/bench_switch.py --build build/demo-sweep --high HIGH.jsonl --low LOW.jsonl --concurrency 2 \
        --requests 16 --max-tokens 64 --window 8 --threshold 0.12 --rounds 2 [--json OUT.json]

Traffic: requests alternate between two prompt files, `--high` (prompts the head drafts well, e.g. MT-bench) and
`--low` (prompts it drafts badly, e.g. other languages), each inside the model's chat template, `--concurrency` in
flight in a closed loop through ONE engine session (as a server keeps one), speculating at every batch size. Four
policies decode the same traffic, one after the other and in a rotated order each round:
- `target-only`: no speculation;
- `always`: the whole tree at every step;
- `batch switch`: TensorRT-LLM's acceptance switch (`acceptance_rate_window_size` / `acceptance_rate_threshold`):
  once the batch's mean acceptance over the last `--window` speculating steps is below `--threshold`, speculation
  stays off for the session, every later request included;
- `per-sequence switch` (ours, `tree.acceptance_switch_per_sequence`): the same window and threshold, per sequence:
  a sequence whose own acceptance is low stops drafting, the others (and every later request) keep drafting.

Prints, per policy: output tokens/s (median of rounds) and its ratio to target-only, the draft tokens proposed, tau
per kind of prompt, and whether every output equals target-only decoding's (greedy: it must).

Inputs:  a finished reference build; two JSONL prompt files (`prompt` or MT-bench `turns`)
Outputs: the table on stdout; --json every figure
Guide:   docs/benchmarks.md ("The acceptance switch per sequence, on mixed traffic")
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from scripts.spec_sweep import positive_int  # the same argument rules as the sweep

POLICIES = ("target-only", "always", "batch switch", "per-sequence switch")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench_switch.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", required=True, type=Path, help="finished build with engine.backend reference")
    ap.add_argument("--high", required=True, type=Path, help="JSONL prompts the head drafts well")
    ap.add_argument("--low", required=True, type=Path, help="JSONL prompts the head drafts badly")
    ap.add_argument("--concurrency", type=positive_int("--concurrency"), default=2,
                    help="sequences in flight (closed loop)")
    ap.add_argument("--requests", type=positive_int("--requests"), default=16,
                    help="requests per policy and round (alternating kinds)")
    ap.add_argument("--max-tokens", type=positive_int("--max-tokens"), default=64)
    ap.add_argument("--window", type=positive_int("--window"), default=8, help="acceptance_rate_window_size")
    ap.add_argument("--threshold", type=float, default=0.12, help="acceptance_rate_threshold")
    ap.add_argument("--rounds", type=positive_int("--rounds"), default=2)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if not 0.0 <= args.threshold <= 1.0:
        ap.error(f"--threshold {args.threshold}: must be in [0, 1]")
    if not (args.build / "engine" / "reference.json").is_file():
        ap.error(f"--build {args.build}: no engine/reference.json (build it with engine.backend: reference)")
    for flag, path in (("--high", args.high), ("--low", args.low)):
        if not path.is_file():
            ap.error(f"{flag} {path}: no such file")
    return args


def traffic(engine: Any, args: argparse.Namespace) -> list[tuple[str, list[int]]]:
    """(kind, prompt ids), alternating high / low, each prompt inside the chat template."""
    from clients.prompts import chat_template, load_prompts

    wrap = chat_template(engine.tokenizer.name_or_path)  # the directory the engine loaded it from
    kinds = {"high": load_prompts(args.high), "low": load_prompts(args.low)}
    out = []
    for i in range(args.requests):
        kind = ("high", "low")[i % 2]
        prompts = kinds[kind]
        out.append((kind, engine.tokenizer.encode(wrap(prompts[(i // 2) % len(prompts)]), add_special_tokens=True)))
    return out


def run(engine: Any, reqs: list[tuple[str, list[int]]], args: argparse.Namespace, speculative: bool
        ) -> dict[str, Any]:
    """The requests through one session, `concurrency` in flight; outputs and per-request statistics."""
    import torch

    from engines.api import GenerationRequest, SamplingParams

    eos = [engine.tokenizer.eos_token_id]
    results: dict[int, Any] = {}
    with torch.inference_mode():
        session = engine.session(args.concurrency, engine.limits.max_seq_len, speculative=speculative)
        slot_of: dict[int, int] = {}
        nxt, t0 = 0, time.perf_counter()
        while nxt < len(reqs) or not session.done:
            while nxt < len(reqs) and session.free:
                slot_of[session.add(GenerationRequest(reqs[nxt][1], args.max_tokens, SamplingParams(), eos))] = nxt
                nxt += 1
            session.step()
            for slot in session.finished:
                results[slot_of.pop(slot)] = session.pop(slot)
        wall = time.perf_counter() - t0
    tokens = sum(len(r.output_ids) for r in results.values())
    per_kind: dict[str, dict[str, int]] = {}
    for i, r in results.items():
        k = per_kind.setdefault(reqs[i][0], {"tokens": 0, "accepted": 0, "drafted": 0})
        k["tokens"] += len(r.output_ids)
        k["accepted"] += r.stats.accepted_draft_tokens
        k["drafted"] += r.stats.draft_tokens
    return {"tokens_per_s": tokens / wall, "outputs": [results[i].output_ids for i in range(len(reqs))],
            "per_kind": per_kind}


def engines_for(args: argparse.Namespace) -> dict[str, tuple[Any, bool]]:
    from core.speculation import SpeculationPolicy
    from engines.api import ReferenceEngine

    base = ReferenceEngine.from_build(args.build, device="cpu").with_policy(None)
    window = {"acceptance_rate_window_size": args.window, "acceptance_rate_threshold": args.threshold}
    return {"target-only": (base, False), "always": (base, True),
            "batch switch": (base.with_policy(SpeculationPolicy(**window)), True),
            "per-sequence switch": (base.with_policy(SpeculationPolicy(**window, per_sequence_switch=True)), True)}


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    ref = runs["target-only"][0]["outputs"]
    base = statistics.median(r["tokens_per_s"] for r in runs["target-only"])
    out: dict[str, Any] = {}
    for name, rs in runs.items():
        rate = statistics.median(r["tokens_per_s"] for r in rs)
        kinds = rs[0]["per_kind"]
        out[name] = {
            "tokens_per_s": [r["tokens_per_s"] for r in rs], "median_tokens_per_s": rate, "vs_target_only": rate / base,
            "draft_tokens": sum(k["drafted"] for k in kinds.values()),
            "tau": {kind: k["tokens"] / max(1, k["tokens"] - k["accepted"]) for kind, k in sorted(kinds.items())},
            "identical_to_target_only": sum(o == w for r in rs for o, w in zip(r["outputs"], ref, strict=True)),
            "outputs": sum(len(r["outputs"]) for r in rs),
        }
    return out


def table(doc: dict[str, Any]) -> str:
    lines = ["| policy | tokens/s (rounds) | median vs target-only | draft tokens | tau high / low | identical to "
             "target-only |", "|---|---|---|---|---|---|"]
    for name in POLICIES:
        p = doc[name]
        tau = p["tau"]
        lines.append(f"| {name} | {', '.join(f'{x:.1f}' for x in p['tokens_per_s'])} | {p['vs_target_only']:.2f}x | "
                     f"{p['draft_tokens']} | {tau.get('high', 1.0):.2f} / {tau.get('low', 1.0):.2f} | "
                     f"{p['identical_to_target_only']}/{p['outputs']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    engines = engines_for(args)
    reqs = traffic(engines["target-only"][0], args)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in POLICIES}
    load0 = os.getloadavg()[0]
    for k in range(args.rounds):
        order = POLICIES[k % len(POLICIES):] + POLICIES[: k % len(POLICIES)]  # each policy leads a round in turn
        for name in order:
            engine, speculative = engines[name]
            runs[name].append(run(engine, reqs, args, speculative))
            print(f"round {k + 1}: {name}: {runs[name][-1]['tokens_per_s']:.1f} tokens/s", flush=True)
    doc = summarize(runs)
    doc["meta"] = {"build": str(args.build), "concurrency": args.concurrency, "requests": args.requests,
                   "max_tokens": args.max_tokens, "window": args.window, "threshold": args.threshold,
                   "rounds": args.rounds, "load_average": [load0, os.getloadavg()[0]]}
    print(table(doc))
    print(f"load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
