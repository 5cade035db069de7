"""Measure what quantizing the EAGLE-1 drafter to FP8 costs in acceptance (tau), with the reference engine.

    python bench/bench_fp8_drafter.py --config configs/demo.yaml --out build/drafter-fp8 \
        --prompts 20 --max-new-tokens 64 [--set key=value ...]

Builds the config's checkpoint three times (16-bit; FP8 target + FP8 KV cache with a 16-bit drafter, this project's
default; the same with the drafter's linears in FP8, upstream's EAGLE FP8 recipe: builders/convert/fp8_drafter.py), runs
greedy speculative decoding on the first N MT-bench questions (calibration uses ShareGPT, so the two sets differ)
and prints tau for each, plus whether each FP8 variant's output equals its own target-only greedy output (lossless).
Results go to OUT/results.json.

Inputs:  --config (default configs/demo.yaml)
Outputs: OUT/results.json; tau per variant on stdout
Guide:   docs/fp8.md
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

from builders.build import main as build_main
from builders.config import BuildConfig, load_config


def build(config: Path, out: Path, sets: list[str]) -> Path:
    args = [str(config), "--only", "checkpoint", "--set", f"output_dir={out}"]
    for s in sets:
        args += ["--set", s]
    if build_main(args) != 0:
        raise SystemExit(f"build of {out} failed")
    return out / "checkpoint"


def measure(ckpt: Path, cfg: BuildConfig, prompts: list[list[int]], max_new: int) -> dict:
    from engines.api import GenerationRequest, ReferenceEngine, SamplingParams

    eng = ReferenceEngine.from_checkpoint(ckpt, tree=cfg.static_tree(), dtype=cfg.target.dtype, device="cpu")
    eos = [eng.tokenizer.eos_token_id]
    reqs = [GenerationRequest(prompt_ids=p, max_new_tokens=max_new, sampling=SamplingParams(), stop_token_ids=eos)
            for p in prompts]
    t0 = time.time()
    spec = eng.generate(reqs, speculative=True)
    t1 = time.time()
    plain = eng.generate(reqs, speculative=False)
    stats = ReferenceEngine.aggregate(spec)
    same = sum(a.output_ids == b.output_ids for a, b in zip(spec, plain))
    return {"tau": stats.tau, "acceptance_rate": stats.acceptance_rate, "identical_to_target_only": same,
            "prompts": len(prompts), "speculative_seconds": round(t1 - t0, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=REPO / "configs" / "demo.yaml")
    ap.add_argument("--out", type=Path, default=REPO / "build" / "drafter-fp8")
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    args = ap.parse_args()
    from builders.convert.fp8 import encode_prompts
    from builders.convert.fp8_drafter import calibrate_drafter, write_fp8_drafter
    from sources import data

    base = ["target.dtype=bfloat16", "quantization.calibration.dataset=sharegpt", *args.sets]
    fp8 = ["quantization.weights=fp8", "quantization.kv_cache=fp8"]
    out = args.out.resolve()
    ck16 = build(args.config, out / "b16", base)
    ck8 = build(args.config, out / "fp8_drafter16", base + fp8)
    cfg = load_config(args.config, base + fp8 + [f"output_dir={out / 'fp8_drafter16'}"])
    lim, cal = cfg.limits(), cfg.quantization.calibration
    cal_prompts = data.sharegpt_prompts(cal.num_samples)
    stats = calibrate_drafter(
        ck16,
        cfg.static_tree(),
        cfg.target.dtype,
        "cpu",
        lambda tok: [t[0].tolist() for t in encode_prompts(tok, cal_prompts[:16], cal.max_length)],
        32,
    )
    ck8d = out / "fp8_drafter8" / "checkpoint"
    shutil.rmtree(ck8d.parent, ignore_errors=True)
    shutil.copytree(ck8, ck8d)
    write_fp8_drafter(ck8d, stats, lim.num_eagle_layers)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ck16 / "tokenizer")
    qs = [q.turns[0] for q in data.mtbench_questions(limit=args.prompts)]
    prompts = [t[0].tolist() for t in encode_prompts(tok, qs, 512)]
    results = {}
    for name, ck in (("16-bit", ck16), ("FP8 target, 16-bit drafter", ck8), ("FP8 target, FP8 drafter", ck8d)):
        results[name] = measure(ck, cfg, prompts, args.max_new_tokens)
        print(f"{name:30s} tau {results[name]['tau']:.3f}  acceptance {results[name]['acceptance_rate']:.3f}  "
              f"identical to its target-only output {results[name]['identical_to_target_only']}/{len(prompts)}",
              flush=True)
    import os

    results["setup"] = {"config": str(args.config), "sets": base, "tree": cfg.tree.choices, "prompts": "MT-bench "
                        f"first {args.prompts} questions (first turns)", "max_new_tokens": args.max_new_tokens,
                        "load_average": os.getloadavg()}
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
