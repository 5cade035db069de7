"""Throughput of each step of head training on this machine, measured in one run (SmolLM2-135M-Instruct, real
ShareGPT conversations), next to the peers it is set against.

    python bench/bench_train.py [--conversations 32] [--threads 0] [--precisions float32,bfloat16]

Prints, each in tokens/s (threads = --threads, 0 = all cores):
  machine     fp32 / bf16 matmul GFLOPS (1024^3) and a target forward at that rate: GFLOPS / (2 x body params)
  HF peer     transformers `model(input_ids)` on batches of 8 x 384 tokens (the reference figure the trainer's
              features are set against)
  features    our length-bucketed hidden-state pass (features.py) over the conversations' real lengths, once per
              --batch-tokens budget (features.batch_tokens: on a CPU small batches that stay in cache can win)
  answers     self-distillation: HF `generate` in batches, then a separate feature pass (the previous trainer),
              vs our batched greedy decoding that keeps the features on the way (generate.py); tokens = prompt +
              answer tokens of the finished sequences per second of the whole step
  train       EAGLE-1 head optimizer steps (batch 8, the demo recipe's loss), float32 and bf16 autocast
and the load average before and after (the machine is shared: compare figures within one run).

Inputs:  the demo target and ShareGPT conversations (installed packages)
Outputs: the figures on stdout
Guide:   docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch


T = TypeVar("T")


def gflops(dtype: torch.dtype, n: int = 1024, reps: int = 3) -> float:
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - t) / 1e9


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def load(dtype: torch.dtype) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sources.targets import smollm2_dir

    d = smollm2_dir()
    return AutoModelForCausalLM.from_pretrained(d, dtype=dtype).eval(), AutoTokenizer.from_pretrained(d)


def conversations(tok: Any, n: int) -> tuple[list[torch.Tensor], list[list[int]]]:
    """(ShareGPT first turns with their answers, <= 256 tokens; the prompts alone), the demo recipe's filters."""
    from training.data import dataset_example, prompt_ids, sharegpt_conversations
    from sources.data import sharegpt_path

    seqs: list[torch.Tensor] = []
    prompts: list[list[int]] = []
    for c in itertools.islice(sharegpt_conversations(sharegpt_path(), "first"), 4 * n):
        p = prompt_ids(tok, c.messages[:1])
        if len(p) <= 128 and len(seqs) < n:
            seqs.append(dataset_example(tok, c, 256)[0])
            prompts.append(p)
    return seqs, prompts


def hf_peer(model: Any, seqs: list[torch.Tensor], batches: int, width: int) -> float:
    """transformers forward on [8, width] batches of real tokens (conversations concatenated)."""
    flat = torch.cat(seqs).long()
    need = batches * 8 * width
    flat = flat.repeat(need // len(flat) + 1)[:need].view(batches, 8, width)
    with torch.inference_mode():
        model(input_ids=flat[0][:, :16])
        _, s = timed(lambda: [model(input_ids=b) for b in flat])
    return need / s


def features_rate(model: Any, seqs: list[torch.Tensor], batch_tokens: int) -> float:
    from training.features import FeatureSpec, sequence_features

    spec = FeatureSpec(None, torch.bfloat16)
    _, s = timed(lambda: sequence_features(model, seqs, spec, batch_tokens))
    return sum(len(x) for x in seqs) / s


def answers_hf_then_features(model: Any, tok: Any, prompts: list[list[int]], new: int) -> float:
    """The previous trainer's self-distillation: HF generate (batched, left-padded), then a separate feature pass."""
    from training.features import FeatureSpec, sequence_features

    eos, pad = tok.eos_token_id, tok.pad_token_id

    def run() -> int:
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        att = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.inference_mode():
            gen = model.generate(input_ids=ids, attention_mask=att, max_new_tokens=new, do_sample=False,
                                 pad_token_id=pad, eos_token_id=eos)[:, width:].tolist()
        seqs = []
        for p, g in zip(prompts, gen):
            cut = g.index(eos) + 1 if eos in g else len(g)
            seqs.append(torch.tensor(p + g[:cut]))
        sequence_features(model, seqs, FeatureSpec(None, torch.bfloat16), 8192)
        return sum(len(x) for x in seqs)

    tokens, s = timed(run)
    return tokens / s


def answers_ours(model: Any, tok: Any, prompts: list[list[int]], new: int) -> float:
    from training.features import FeatureSpec
    from training.generate import regenerate_with_features

    got, s = timed(lambda: regenerate_with_features(model, prompts, new, {tok.eos_token_id}, tok.pad_token_id,
                                                    len(prompts), FeatureSpec(None, torch.bfloat16)))
    return sum(len(p) + len(a) for p, (a, _) in zip(prompts, got)) / s


def train_rate(model: Any, seqs: list[torch.Tensor], bf16: bool, steps: int) -> float:
    """Optimizer steps of the demo recipe's EAGLE-1 loss on cached features (batch 8), tokens/s."""
    import json

    from sources.targets import smollm2_dir
    from training.compute import Compute
    from training.config import load_train_config
    from training.features import FeatureSpec, sequence_features
    from training.loop import Example, add_noise, collate, eagle_loss
    from training.model import head_from_target
    from training.plan import plan_positions

    tc = load_train_config(REPO / "configs/train/smollm2-eagle.yaml").train
    feats = sequence_features(model, seqs[:8], FeatureSpec(None, torch.bfloat16), 8192)
    ex = [Example(f["hidden"], s, torch.arange(len(s)) >= len(s) // 3) for s, f in zip(seqs[:8], feats)]
    c = Compute(torch.device("cpu"), bf16=bf16, threads=torch.get_num_threads(), device_map=False)
    head = head_from_target(json.loads((smollm2_dir() / "config.json").read_text()),
                            model.get_input_embeddings().weight.detach().float(), 0)
    lm = model.get_output_embeddings().weight.detach().float()
    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=1e-4)

    def step(i: int) -> None:
        g = torch.Generator().manual_seed(i)
        b = collate(ex)
        pos = plan_positions([e.loss_mask for e in ex], tc.p_loss_positions * len(ex), g)
        with c.autocast():
            loss, _ = eagle_loss(head, lm, b, add_noise(b, tc.noise_std, [g] * len(ex)), tc, pos, pos.n_loss, pos.n_ce)
        opt.zero_grad()
        loss.backward()
        opt.step()

    step(0)
    def run_steps() -> None:
        for i in range(1, steps + 1):
            step(i)

    _, s = timed(run_steps)
    return steps * sum(len(e.input_ids) for e in ex) / s


def budgets_arg(text: str) -> list[int]:
    """`--batch-tokens 1024,8192` -> [1024, 8192]; each at least 16 (features.batch_tokens' lower bound)."""
    try:
        out = [int(b) for b in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated integers, e.g. 1024,8192") from None
    if not out or min(out) < 16:
        raise argparse.ArgumentTypeError(f"{text!r}: every budget must be >= 16 tokens, e.g. 1024,8192")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="bench_train.py", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--conversations", type=int, default=32, help="ShareGPT conversations for features/answers")
    ap.add_argument("--new-tokens", type=int, default=128, help="answer length for the self-distillation step")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = all cores)")
    ap.add_argument("--precisions", default="float32,bfloat16", help="target/head precisions to measure")
    ap.add_argument("--hf-batches", type=int, default=2, help="8 x 384 batches for the HF peer")
    ap.add_argument("--train-steps", type=int, default=3)
    ap.add_argument("--batch-tokens", type=budgets_arg, default="1024,8192",
                    help="comma-separated features.batch_tokens budgets to time the features step with")
    ap.add_argument(
        "--answer-prompts",
        type=int,
        default=16,
        help="prompts decoded as one batch in the answers step (the recipes' data.generate_batch_size is 64)",
    )
    ap.add_argument("--small-bf16", action="store_true", help="on a CPU without native bf16 (emulated bf16 matmuls, "
                    "tens of times slower): measure bf16 on 8 x 64 tokens, 4 conversations and 1 training step")
    args = ap.parse_args(argv)
    if not 1 <= args.answer_prompts <= args.conversations:
        ap.error(f"--answer-prompts {args.answer_prompts}: give 1..--conversations ({args.conversations}); raise "
                 "--conversations for larger answer batches")
    budgets = args.batch_tokens
    from training.compute import cpu_has_native_bf16, usable_cores

    torch.set_num_threads(args.threads or usable_cores())
    load0 = os.getloadavg()
    print(f"threads {torch.get_num_threads()}, CPU capability {torch.backends.cpu.get_cpu_capability()}, native bf16: "
          f"{cpu_has_native_bf16()}, load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}", flush=True)
    rows: list[tuple[str, str, float]] = []
    for name in args.precisions.split(","):
        dtype = getattr(torch, name)
        model, tok = load(dtype)
        body = sum(p.numel() for n, p in model.model.named_parameters() if "embed_tokens" not in n)
        first = len(rows)
        g = gflops(dtype)
        rows.append((name, "matmul GFLOPS (1024^3)", g))
        rows.append((name, "target forward at the matmul rate, tok/s", g * 1e9 / (2 * body)))
        small = args.small_bf16 and name == "bfloat16"
        seqs, prompts = conversations(tok, 4 if small else args.conversations)
        width = 64 if small else 384
        rows.append((name, f"HF model(input_ids) 8 x {width}, tok/s",
                     hf_peer(model, seqs, 1 if small else args.hf_batches, width)))
        for bt in budgets:
            rows.append((name, f"features (length-bucketed, batch_tokens {bt}), tok/s", features_rate(model, seqs, bt)))
        if name == "float32":  # bf16 decoding on a CPU without native bf16 would take hours here
            few = prompts[: args.answer_prompts]
            rows.append((name, "answers: HF generate + feature pass, tok/s",
                         answers_hf_then_features(model, tok, few, args.new_tokens)))
            rows.append((name, "answers: batched decode keeping features, tok/s",
                         answers_ours(model, tok, few, args.new_tokens)))
        rows.append((name, "train EAGLE-1 head (batch 8), tok/s", train_rate(model, seqs, name == "bfloat16",
                                                                             1 if small else args.train_steps)))
        for r in rows[first:]:
            print(f"  {r[0]:>9}  {r[1]:<48} {r[2]:9.1f}", flush=True)
    load1 = os.getloadavg()
    print(f"\nload average after: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    print("\n| precision | step | figure |\n|---|---|---|")
    for p, what, v in rows:
        print(f"| {p} | {what} | {v:.1f} |")
    by = {(p, w): v for p, w, v in rows}
    hf = by.get(("float32", "HF model(input_ids) 8 x 384, tok/s"))
    for bt in budgets:
        ours = by.get(("float32", f"features (length-bucketed, batch_tokens {bt}), tok/s"))
        if hf and ours:
            print(f"features with batch_tokens {bt} / HF forward (float32, same run): {ours / hf:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
