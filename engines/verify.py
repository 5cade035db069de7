"""`python -m engines.verify --build OUT_DIR --prompts FILE.jsonl --max-new-tokens N [--temperature T] [--json PATH]
[--limit K] [--device D]`

Decodes every prompt twice: with Hugging Face `generate()` on the ORIGINAL HF target (the independent oracle) and
with the reference engine using EAGLE over the build's converted checkpoint. Prints per prompt whether the outputs
are identical (else the first differing position), tau and both speeds. Exit status 1 if any greedy output differs
(sampled outputs are not expected to be identical: only tau and speed are reported), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import yaml  # noqa: E402

from engines.api import GenerationRequest, ReferenceEngine, SamplingParams, aggregate_stats, stats_dict  # noqa: E402
from engines.data import chat_ids, read_prompts  # noqa: E402


def hf_target_dir(build: Path) -> Path:
    """The HF directory of the build's target: config.resolved.yaml's target.model (resolved like the build does),
    else the convert stage manifest's notes.hf_target_dir."""
    from builders.demo_model import resolve_target

    resolved = build / "config.resolved.yaml"
    if resolved.is_file():
        model = yaml.safe_load(resolved.read_text())["target"]["model"]
        return resolve_target(str(model))
    manifest = build / "checkpoint" / "manifest.json"
    if manifest.is_file():
        notes = json.loads(manifest.read_text())["notes"]
        if "hf_target_dir" in notes:
            return Path(notes["hf_target_dir"])
    raise FileNotFoundError(
        f"{build}: neither config.resolved.yaml nor checkpoint/manifest.json (notes.hf_target_dir) found; "
        "is this a build directory written by `python builders/build.py`?"
    )


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@dataclass
class PromptReport:
    index: int
    prompt_tokens: int
    identical: bool
    first_divergence: int | None
    hf_tokens: int
    engine_tokens: int
    tau: float
    hf_tokens_per_s: float
    engine_tokens_per_s: float


def eos_ids(model: Any, tokenizer: Any) -> list[int]:
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("neither the target's generation_config nor its tokenizer defines an eos token")
    return [int(e) for e in (eos if isinstance(eos, list) else [eos])]


def hf_generate(model: Any, ids: list[int], n: int, temperature: float, eos: list[int], pad: int) -> tuple[list[int], float]:
    kwargs: dict[str, Any] = {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    if temperature > 0:
        kwargs = {"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0}
    t0 = time.perf_counter()
    out = model.generate(
        torch.tensor([ids], device=model.device), max_new_tokens=n, eos_token_id=eos, pad_token_id=pad, **kwargs
    )
    return out[0, len(ids) :].tolist(), time.perf_counter() - t0


def run(args: argparse.Namespace) -> int:
    from transformers import AutoModelForCausalLM

    build = Path(args.build)
    engine = ReferenceEngine.from_build(build, device=args.device)
    if not engine.has_draft:
        print("error: the build has no EAGLE head to verify", file=sys.stderr)
        return 2
    tok = engine.tokenizer
    hf = AutoModelForCausalLM.from_pretrained(str(hf_target_dir(build)), dtype=engine.dtype).to(engine.device).eval()
    eos = eos_ids(hf, tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos[0]
    label = " [RANDOM HEAD: tau ~1 expected]" if engine.random_head else ""
    print(f"verify {build}: {engine.describe_tree()}{label}, temperature {args.temperature}, device {engine.device}")
    reports, results = [], []
    for i, text in enumerate(read_prompts(Path(args.prompts), args.limit)):
        ids = chat_ids(tok, text)
        with torch.inference_mode():
            hf_ids, hf_s = hf_generate(hf, ids, args.max_new_tokens, args.temperature, eos, pad)
        req = GenerationRequest(ids, args.max_new_tokens, SamplingParams(temperature=args.temperature, seed=i), eos)
        t0 = time.perf_counter()
        [res] = engine.generate([req])
        our_s = time.perf_counter() - t0
        results.append(res)
        div = first_divergence(hf_ids, res.output_ids)
        r = PromptReport(
            i, len(ids), div is None, div, len(hf_ids), len(res.output_ids), round(res.stats.tau, 3),
            round(len(hf_ids) / hf_s, 2), round(len(res.output_ids) / our_s, 2),
        )
        reports.append(r)
        where = "identical" if r.identical else f"DIFFERS at token {div}"
        print(
            f"  [{i}] {where:>20}  tau {r.tau:.2f}  HF {r.hf_tokens_per_s:7.1f} tok/s  engine "
            f"{r.engine_tokens_per_s:7.1f} tok/s  ({r.engine_tokens} tokens)"
        )
    agg = aggregate_stats([r.stats for r in results])
    differ = [r.index for r in reports if not r.identical]
    print(f"{len(reports) - len(differ)}/{len(reports)} identical; aggregate tau {agg.tau:.3f}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "build": str(build),
                    "temperature": args.temperature,
                    "random_head": engine.random_head,
                    "prompts": [asdict(r) for r in reports],
                    "aggregate": stats_dict(agg),
                    "all_identical": not differ,
                },
                indent=2,
            )
            + "\n"
        )
    return 1 if differ and args.temperature == 0 else 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engines.verify", description=__doc__.split("\n\n")[1])
    p.add_argument("--build", required=True, help="build directory (with engine/reference.json)")
    p.add_argument("--prompts", required=True, help="JSONL: `prompt` or MT-bench `turns` per line")
    p.add_argument("--max-new-tokens", type=int, required=True)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (outputs must be identical)")
    p.add_argument("--json", help="write the per-prompt report here")
    p.add_argument("--limit", type=int, help="only the first K prompts")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], help="override the build's engine.device")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.max_new_tokens < 1:
        print("error: --max-new-tokens must be >= 1", file=sys.stderr)
        return 2
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
