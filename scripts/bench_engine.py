"""Benchmark (issue 3): SmolLM2-135M-Instruct, MT-bench first turns, greedy, one run per method.

    python scripts/bench_engine.py [--questions 20] [--max-new-tokens 128] [--build DIR] [--device cpu]

Methods, in one process on the same prompts (prompts run one at a time, batch 1):
  (1) HF generate                          transformers generate(), the baseline
  (2) HF prompt lookup                     generate(prompt_lookup_num_tokens=10)
  (3) engine target-only                   ReferenceEngine.generate(speculative=False)
  (4) engine EAGLE                         ReferenceEngine.generate() with the build's head and tree
Prints tokens/s and the ratio to (1). Without --build, (4) uses a RANDOM head (with configs/demo.yaml's tree) converted on
the fly: its tau is ~1 and it can only be slower than (3); pass --build with a trained head to measure a real speed-up.
Numbers depend on the machine and its load: compare ratios within one run only.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from engines.api import GenerationRequest, ReferenceEngine, SamplingParams, aggregate_stats  # noqa: E402
from engines.data import chat_ids, mtbench_questions  # noqa: E402


DEMO_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "demo.yaml"


def random_head_engine(hf_dir: Path, work: Path, device: str) -> ReferenceEngine:
    """SmolLM2 + a random EAGLE-1 head, converted on the fly, with the demo config's tree."""
    from builders.config import load_config
    from builders.convert import Provenance, convert_eagle, write_random_head

    tree = load_config(DEMO_CONFIG).static_tree()
    assert tree is not None, f"{DEMO_CONFIG} must use a static tree (tree.choices)"
    write_random_head(hf_dir, work / "head", seed=0)
    convert_eagle(
        hf_dir, work / "head", work / "ckpt", dtype="float32", max_draft_len=tree.size, num_eagle_layers=tree.depth,
        max_non_leaves_per_layer=tree.max_non_leaves_per_layer,
        provenance=Provenance(random_head=True, target_source=str(hf_dir), head_source="random"),
    )
    return ReferenceEngine.from_checkpoint(work / "ckpt", tree=tree, dtype="float32", device=device)


def timed(name: str, prompts: list[list[int]], fn: Callable[[list[int]], list[int]]) -> tuple[float, list[list[int]]]:
    outs, tokens, t0 = [], 0, time.perf_counter()
    for ids in tqdm(prompts, desc=name, leave=False):
        out = fn(ids)
        outs.append(out)
        tokens += len(out)
    return tokens / (time.perf_counter() - t0), outs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--build", type=Path, action="append", default=[],
                    help="build dir with a trained head (engine/reference.json); repeat to compare several heads/trees "
                    "in the same run (each adds an EAGLE row)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads for every method (1 is the most stable "
                    "on a shared machine)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM

    from builders.demo_model import smollm2_dir

    hf_dir = smollm2_dir()
    with tempfile.TemporaryDirectory() as tmp:
        if args.build:
            eagles = [(f"build {b}" + (" (RANDOM head)" if e.random_head else ""), e)
                      for b in args.build for e in [ReferenceEngine.from_build(b, device=args.device)]]
        else:
            eagles = [("RANDOM head (tau ~1 expected; the trained head comes from another issue)",
                       random_head_engine(hf_dir, Path(tmp), args.device))]
        first = eagles[0][1]
        tok = first.tokenizer
        eos = [int(tok.eos_token_id)]
        prompts = [chat_ids(tok, q.turns[0]) for q in mtbench_questions(args.questions)]
        hf = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=first.dtype).to(args.device).eval()
        n = args.max_new_tokens

        def hf_gen(ids: list[int], **kw: object) -> list[int]:
            with torch.inference_mode():
                out = hf.generate(
                    torch.tensor([ids], device=args.device), max_new_tokens=n, do_sample=False, temperature=None,
                    top_p=None, top_k=None, eos_token_id=eos, pad_token_id=eos[0], **kw,
                )
            return out[0, len(ids) :].tolist()

        stats: dict[int, list] = {k: [] for k in range(len(eagles))}

        def ours(engine: ReferenceEngine, ids: list[int], speculative: bool, key: int | None = None) -> list[int]:
            [r] = engine.generate([GenerationRequest(ids, n, SamplingParams(), eos)], speculative=speculative)
            if key is not None:
                stats[key].append(r.stats)
            return r.output_ids

        hf_gen(prompts[0][:8])  # warm-up (lazy initialisation), not timed
        results = {
            "(1) HF generate": timed("hf", prompts, hf_gen),
            "(2) HF prompt lookup": timed("hf-pld", prompts, lambda ids: hf_gen(ids, prompt_lookup_num_tokens=10)),
            "(3) engine target-only": timed("ours", prompts, lambda ids: ours(first, ids, False)),
        }
        for k, (_, engine) in enumerate(eagles):
            name = "(4) engine EAGLE" + (f" [{k + 1}]" if len(eagles) > 1 else "")
            results[name] = timed(f"eagle{k}", prompts, lambda ids, e=engine, k=k: ours(e, ids, True, k))
    base, base_out = results["(1) HF generate"]
    print(f"SmolLM2-135M-Instruct, {len(prompts)} MT-bench questions, {n} new tokens, greedy, batch 1, {args.device}, "
          f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f} at the end")
    for name, (tps, outs) in results.items():
        same = sum(a == b for a, b in zip(outs, base_out))
        print(f"  {name:<30} {tps:8.1f} tok/s   {tps / base:5.2f}x   outputs identical to (1): {same}/{len(outs)}")
    for k, (head, engine) in enumerate(eagles):
        agg = aggregate_stats(stats[k])
        tag = f"[{k + 1}] " if len(eagles) > 1 else ""
        print(f"  {tag}EAGLE head: {head}; {engine.describe_tree()}")
        print(f"  {tag}EAGLE tau {agg.tau:.3f} (accepted {agg.accepted_draft_tokens} draft tokens over "
              f"{agg.target_forwards} target forwards; by depth {agg.acceptance_by_depth})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
