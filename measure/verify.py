"""`python -m measure.verify --build OUT_DIR --prompts FILE.jsonl --max-new-tokens N [--temperature T] [--json PATH]
[--limit K] [--device D] [--reuse-hf REPORT.json]`

Decodes every prompt twice: with Hugging Face `generate()` on the ORIGINAL HF target (the independent oracle) and
with the reference engine using EAGLE over the build's converted checkpoint. Prints per prompt whether the outputs
are identical (else the first differing position), tau and both speeds. Exit status 1 if any greedy output differs
(sampled outputs are not expected to be identical: only tau and speed are reported), 2 on bad arguments.

`--reuse-hf REPORT.json` (greedy only) takes the HF outputs and HF speeds from an earlier report of the same target,
prompts and max_new_tokens instead of running HF again: comparing several trees or heads then costs one HF pass.

Inputs:  --build (a finished build), --prompts (JSONL, `prompt` or MT-bench `turns` per line)
Outputs: a line per prompt (identical or first divergence, tau, speeds) and a summary; --json the
         report; exit 1 if any greedy output differs
Guide:   docs/check-before-deploy.md
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

from core.spec import ENGINE_DIR, SPEC_FILE, read_spec

# torch, the engine and transformers load inside the functions that use them: `--help` answers at once.


def hf_target_dir(build: Path) -> Path:
    """The HF directory of the build's target, as the convert stage resolved it (recorded in reference.json)."""
    spec = read_spec(build)
    if spec.hf_target_dir is None:
        raise FileNotFoundError(
            f"{build}/{ENGINE_DIR}/{SPEC_FILE} records no hf_target_dir (written by an older build); rebuild with "
            "`python builders/build.py CONFIG --force`"
        )
    return Path(spec.hf_target_dir)


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
    hf_output_ids: list[int]


def eos_ids(model: Any, tokenizer: Any) -> list[int]:
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("neither the target's generation_config nor its tokenizer defines an eos token")
    return [int(e) for e in (eos if isinstance(eos, list) else [eos])]


def hf_generate(
    model: Any, ids: list[int], n: int, temperature: float, eos: list[int], pad: int
) -> tuple[list[int], float]:
    kwargs: dict[str, Any] = {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    if temperature > 0:
        kwargs = {"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0}
    import torch

    t0 = time.perf_counter()
    out = model.generate(
        torch.tensor([ids], device=model.device), max_new_tokens=n, eos_token_id=eos, pad_token_id=pad, **kwargs
    )
    return out[0, len(ids) :].tolist(), time.perf_counter() - t0


class ReuseError(ValueError):
    """An earlier report that cannot stand in for this run's HF pass; the message says what differs."""


def load_hf_outputs(
    report: Path, target: Path, prompts: list[list[int]], max_new_tokens: int
) -> tuple[list[tuple[list[int], float]], list[int]]:
    """(HF output ids, HF tokens/s) per prompt and the eos ids HF stopped at, from an earlier greedy report, after
    checking it ran the same target, the same prompts (token counts) and the same max_new_tokens."""
    doc = json.loads(report.read_text())
    problems = []
    if doc.get("temperature") != 0:
        problems.append(f"its temperature is {doc.get('temperature')!r} (only greedy HF outputs can be reused)")
    if doc.get("hf_target_dir") != str(target):
        problems.append(f"its target is {doc.get('hf_target_dir')!r}, this build's is {str(target)!r}")
    if doc.get("max_new_tokens") != max_new_tokens:
        problems.append(f"its max_new_tokens is {doc.get('max_new_tokens')!r}, this run's {max_new_tokens}")
    rows = doc.get("prompts", [])
    if [r.get("prompt_tokens") for r in rows] != [len(p) for p in prompts]:
        problems.append(f"its {len(rows)} prompts are not this run's {len(prompts)} (prompt token counts differ)")
    if any("hf_output_ids" not in r for r in rows) or "eos_token_ids" not in doc:
        problems.append("it has no hf_output_ids / eos_token_ids (written by an older measure.verify)")
    if problems:
        raise ReuseError(f"--reuse-hf {report}: " + "; ".join(problems) + "; rerun without --reuse-hf")
    return [(r["hf_output_ids"], float(r["hf_tokens_per_s"])) for r in rows], [int(e) for e in doc["eos_token_ids"]]


def run(args: argparse.Namespace) -> int:
    import torch

    from engines.api import GenerationRequest, ReferenceEngine, SamplingParams, aggregate_stats, stats_dict
    from measure.lossless import first_divergence
    from sources.data import chat_ids, read_prompts

    from transformers import AutoModelForCausalLM

    build = Path(args.build)
    engine = ReferenceEngine.from_build(build, device=args.device)
    if not engine.has_draft:
        print("error: the build has no EAGLE head to verify", file=sys.stderr)
        return 2
    tok = engine.tokenizer
    target = hf_target_dir(build)
    prompts = [chat_ids(tok, text) for text in read_prompts(Path(args.prompts), args.limit)]
    reused: list[tuple[list[int], float]] | None = None
    if args.reuse_hf:
        if args.temperature != 0:
            print("error: --reuse-hf needs greedy decoding (--temperature 0)", file=sys.stderr)
            return 2
        try:
            reused, eos = load_hf_outputs(Path(args.reuse_hf), target, prompts, args.max_new_tokens)
        except ReuseError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    else:
        hf = AutoModelForCausalLM.from_pretrained(str(target), dtype=engine.dtype).to(engine.device).eval()
        eos = eos_ids(hf, tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos[0]
    label = " [RANDOM HEAD: tau ~1 expected]" if engine.random_head else ""
    source = f", HF outputs from {args.reuse_hf}" if reused else ""
    print(
        f"verify {build}: {engine.describe_tree()}{label}, temperature {args.temperature}, "
        f"device {engine.device}{source}"
    )
    for line in engine.kernels:
        print(f"  kernels: {line}")
    reports, results = [], []
    for i, ids in enumerate(prompts):
        if reused is not None:
            hf_ids, hf_tps = reused[i]
        else:
            with torch.inference_mode():
                hf_ids, hf_s = hf_generate(hf, ids, args.max_new_tokens, args.temperature, eos, pad)
            hf_tps = len(hf_ids) / hf_s
        req = GenerationRequest(ids, args.max_new_tokens, SamplingParams(temperature=args.temperature, seed=i), eos)
        t0 = time.perf_counter()
        [res] = engine.generate([req])
        our_s = time.perf_counter() - t0
        results.append(res)
        div = first_divergence(hf_ids, res.output_ids)
        r = PromptReport(
            i, len(ids), div is None, div, len(hf_ids), len(res.output_ids), round(res.stats.tau, 3),
            round(hf_tps, 2), round(len(res.output_ids) / our_s, 2), hf_ids,
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
    hint = rounding_hint(str(engine.dtype), bool(differ) and args.temperature == 0)
    if hint:
        print(hint)
    hf_tps, our_tps = (sum(n) / sum(a / b for a, b in zip(n, tps)) for n, tps in (
        ([r.hf_tokens for r in reports], [r.hf_tokens_per_s for r in reports]),
        ([r.engine_tokens for r in reports], [r.engine_tokens_per_s for r in reports])))
    print(f"engine {our_tps:.1f} tok/s vs HF generate {hf_tps:.1f} tok/s ({our_tps / hf_tps:.2f}x, all prompts' "
          f"tokens over their time{'; HF speeds reused' if reused else ''})")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "build": str(build),
                    "hf_target_dir": str(target),
                    "max_new_tokens": args.max_new_tokens,
                    "eos_token_ids": eos,
                    "temperature": args.temperature,
                    "random_head": engine.random_head,
                    "kernels": list(engine.kernels),
                    "hf_reused_from": args.reuse_hf,
                    "prompts": [asdict(r) for r in reports],
                    "aggregate": stats_dict(agg),
                    "all_identical": not differ,
                },
                indent=2,
            )
            + "\n"
        )
    return 1 if differ and args.temperature == 0 else 0


def rounding_hint(dtype: str, differ: bool) -> str | None:
    """Why greedy outputs of a 16-bit build can differ from HF's without a bug, and how to check it."""
    if not differ or not dtype.endswith(("bfloat16", "float16")):
        return None
    name = dtype.removeprefix("torch.")
    return (f"note: this build runs in {name}. Verifying a draft tree multiplies several tokens in one pass, and "
            f"{name} rounds those products differently from HF's one-token steps, so a near-tie between two tokens "
            "can flip and the outputs part from there (each is still a greedy decode of the target in its rounding). "
            "To tell rounding from a bug, build the same config in float32 (`eagle-build CONFIG --set "
            "target.dtype=float32 --set output_dir=BUILD-fp32`) and rerun eagle-verify on it: float32 outputs must be "
            "identical (docs/check-before-deploy.md).")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="eagle-verify", description=__doc__.split("\n\n")[1],
                                epilog=__doc__.split("\n\n")[-1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", required=True, help="build directory (with engine/reference.json)")
    p.add_argument("--prompts", required=True, help="JSONL: `prompt` or MT-bench `turns` per line")
    p.add_argument("--max-new-tokens", type=int, required=True)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (outputs must be identical)")
    p.add_argument("--json", help="write the per-prompt report here")
    p.add_argument("--limit", type=int, help="only the first K prompts")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], help="override the build's engine.device")
    p.add_argument("--reuse-hf", metavar="REPORT.json", help="take HF outputs and speeds from this earlier greedy "
                   "report (same target, prompts, max_new_tokens) instead of running HF again")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.max_new_tokens < 1:
        print("error: --max-new-tokens must be >= 1", file=sys.stderr)
        return 2
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
