"""Acceptance (tau) of an EAGLE-3 head against a 16-bit target and against the same target quantized for the current
line (ModelOpt's FP8 / NVFP4 Hugging Face export as TensorRT-LLM's PyTorch backend loads it), on held-out prompts.

    python bench/bench_quant_tau.py CONFIG --out DIR [--variants fp8,nvfp4] [--kv-cache fp8] [--prompts 40]
        [--max-new-tokens 64] [--set KEY=VALUE ...]

CONFIG is a current-line config (trtllm_version 1.4; e.g. configs/smollm2-eagle3-current.yaml). For the 16-bit
target and each variant the checkpoint and engine stages are built with engine.backend reference (DIR/<variant>/;
the quantized builds calibrate on quantization.calibration's prompts and hold the weights as the PyTorch backend
loads them: builders/convert/hf_quant.py), then every build decodes the same held-out prompts greedily with
speculation, prompt by prompt, every build on a prompt before the next prompt: MT-bench first turns that follow the
calibration ones (calibration dataset mtbench, the first num_samples questions). tau per build and its relative
change against 16-bit are printed; identical greedy outputs are counted too (a quantized target decodes other tokens).

Inputs:  CONFIG, its target and EAGLE-3 head
Outputs: DIR/<variant>/ builds; a table on stdout; DIR/tau.json (the figures)
Guide:   docs/fp8.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def build(config: str, out: Path, variant: str, kv: str, overrides: list[str]) -> Path:
    from builders.build import main as build_main

    q = [] if variant == "16-bit" else [f"quantization.weights={variant}", f"quantization.kv_cache={kv}"]
    sets = [f"output_dir={out / variant}", "engine.backend=reference", "quantization.calibration.dataset=mtbench",
            *q, *overrides]
    argv = [config, "--only", "checkpoint", "--only", "engine", *[a for o in sets for a in ("--set", o)]]
    if build_main(argv) != 0:
        raise SystemExit(f"the {variant} build failed")
    return out / variant


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--variants", default="fp8", help="comma-separated: fp8, nvfp4")
    ap.add_argument("--kv-cache", default="fp8", choices=["none", "fp8"])
    ap.add_argument("--prompts", type=int, default=40)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    args.out = args.out.resolve()  # output_dir relative to the config file would land in configs/

    from builders.config import load_config
    from builders.convert.fp8 import encode_prompts
    from engines.api import GenerationRequest, ReferenceEngine, SamplingParams
    from sources import data

    cfg = load_config(args.config, args.overrides + ["quantization.calibration.dataset=mtbench"])
    skip = cfg.quantization.calibration.num_samples
    prompts = [q.turns[0] for q in data.mtbench_questions()][skip:skip + args.prompts]
    if not prompts:
        raise SystemExit(f"no MT-bench question after the {skip} calibration ones; lower num_samples")
    variants = ["16-bit", *[v for v in args.variants.split(",") if v]]
    engines = {v: ReferenceEngine.from_build(build(args.config, args.out, v, args.kv_cache, args.overrides))
               for v in variants}
    tok = engines["16-bit"].tokenizer
    ids = [t[0].tolist() for t in encode_prompts(tok, prompts, cfg.quantization.calibration.max_length)]
    eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
    results: dict[str, list] = {v: [] for v in variants}
    for i in ids:  # every build on a prompt before the next prompt
        req = GenerationRequest(prompt_ids=i, max_new_tokens=args.max_new_tokens, sampling=SamplingParams(),
                                stop_token_ids=eos)
        for v in variants:
            results[v] += engines[v].generate([req], speculative=True)
    taus = {v: ReferenceEngine.aggregate(r).tau for v, r in results.items()}
    same = {v: sum(a.output_ids == b.output_ids for a, b in zip(results[v], results["16-bit"])) for v in variants}
    print(f"{len(prompts)} held-out MT-bench prompts (questions {skip + 1}..{skip + len(prompts)}), "
          f"{args.max_new_tokens} new tokens, KV cache {args.kv_cache} in the quantized builds")
    print("| target | tau | vs 16-bit | outputs equal to 16-bit |\n|---|---|---|---|")
    for v in variants:
        rel = (taus[v] - taus["16-bit"]) / taus["16-bit"]
        print(f"| {v} | {taus[v]:.3f} | {rel:+.1%} | {same[v]}/{len(prompts)} |")
    (args.out / "tau.json").write_text(json.dumps({"prompts": len(prompts), "tau": taus, "same": same}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
