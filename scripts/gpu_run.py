"""The prepared GPU run, one command inside one device call: `python3 scripts/gpu_run.py --out $OUT --minutes 8.5`.

On a lent H200 (docs/gpu-run.md), after scripts/gpu_pack.py's calls have carried the payload:
  0. assemble  join the carried parts (.gpu/call-*/), check every SHA-256, install the wheels into /tmp/site,
               extract the demo target from its GGUF
  1. engine    scripts/bench_engine.py on CUDA with the committed heads: forward cost of T new tokens (T up to 64,
               CUDA-synchronized, with the device's roofs), HF generate, target-only and EAGLE tokens/s, tau,
               identical outputs, cycle breakdown; fp32 and bf16 (--engine-seconds of the budget)
  2. train     builders/train_head.py configs/train/smollm2-eagle-h200.yaml: self-distilled answers for every usable
               ShareGPT first turn, features, training; each step timed and its tokens/s computed; epochs chosen
               to fit what is left of the budget (measured on a 40-step probe)
Everything lands in --out (the device call's $OUT): summary.json (every figure and the exact commands),
engine.json, head.tar (the exported head with recipe.yaml and train_log.jsonl). A stage that fails or runs out
of time is recorded in summary.json and the next one still runs.
`--tiny` rehearses the same path on a CPU in minutes (tiny sizes, no wheel install): run it before a lease.

Inputs:  .gpu/call-*/ (scripts/gpu_pack.py), the working tree
Outputs: --out: summary.json, engine.json, head.tar
Guide:   docs/gpu-run.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from scripts.gpu_pack import sha256

RECIPE = REPO / "configs/train/smollm2-eagle-h200.yaml"
SITE = Path("/tmp/site")
TINY_TRAIN = ["data.num_conversations=20", "data.num_eval=4", "data.shard_size=8", "data.generate_batch_size=8",
              "data.max_new_tokens=12", "features.batch_tokens=2048", "train.epochs=1", "train.batch_size=4",
              "train.warmup_steps=1", "train.checkpoint_every=2", "train.eval_every=100", "compute.device=cpu",
              "compute.threads=1"]


class RunError(RuntimeError):
    """The payload is incomplete or damaged; the message names what to carry again."""


# ---- 0. assemble ----------------------------------------------------------------------------------------------------


def read_manifest(gpu: Path) -> dict:
    """The packer's manifest (every call folder carries the same one)."""
    manifests = sorted(gpu.glob("call-*/manifest.json"))
    if not manifests:
        raise RunError(f"no {gpu}/call-*/manifest.json: run scripts/gpu_pack.py here and carry its call folders")
    manifest = json.loads(manifests[0].read_text())
    if "packed_at_commit" not in manifest:
        raise RunError(f"{manifests[0]} was written by an older scripts/gpu_pack.py; rerun it and carry again")
    return manifest


def assemble(gpu: Path) -> dict[str, Path]:
    """Join each file's parts from the call folders into gpu/files or gpu/data; check its SHA-256."""
    manifest = read_manifest(gpu)
    missing = sorted({p.split("/")[0] for e in manifest["files"].values() for p in e["parts"]
                      if not (gpu / p).is_file()})
    if missing:
        raise RunError(f"parts of {', '.join(missing)} are not here: carry those folders in earlier calls of this "
                       "lease (a machine keeps them only while it stays warm)")
    out = {}
    for name, e in manifest["files"].items():
        dest = gpu / ("files" if e["kind"] == "wheel" else "data") / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not (dest.is_file() and sha256(dest) == e["sha256"]):
            with dest.open("wb") as f:
                for p in e["parts"]:
                    f.write((gpu / p).read_bytes())
            if sha256(dest) != e["sha256"]:
                raise RunError(f"{name}: SHA-256 differs from the manifest; rerun scripts/gpu_pack.py and carry again")
        out[name] = dest
    return out


def install_argv(wheels: list[Path], site: Path) -> list[str]:
    return [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
            "--upgrade", "--target", str(site), *map(str, wheels)]


# ---- running and timing ---------------------------------------------------------------------------------------------


def timed(argv: list[str], env: dict[str, str], timeout: float) -> tuple[int, float]:
    """Run with output streamed; (return code, seconds). 124 when the timeout ended it."""
    print("$ " + " ".join(argv), flush=True)
    t0 = time.perf_counter()
    try:
        rc = subprocess.run(argv, cwd=REPO, env=env, timeout=max(timeout, 1)).returncode
    except subprocess.TimeoutExpired:
        rc = 124
    return rc, time.perf_counter() - t0


def train_argv(sets: list[str], until: str | None = None, stop_at: int | None = None) -> list[str]:
    argv = [sys.executable, str(REPO / "builders/train_head.py"), str(RECIPE), *[a for s in sets for a in ("--set", s)]]
    argv += ["--until", until] if until else []
    return argv + (["--stop-at-step", str(stop_at)] if stop_at else [])


def shard_tokens(work: Path) -> tuple[int, int, int]:
    """(sequences, tokens, answer tokens) in the cached data shards."""
    import torch

    seqs = toks = ans = 0
    for p in sorted((work / "data").glob("shard-*.pt")):
        d = torch.load(p, weights_only=True)
        seqs += len(d["input_ids"])
        toks += sum(len(x) for x in d["input_ids"])
        ans += sum(int(m.sum()) for m in d["loss_mask"])
    return seqs, toks, ans


# ---- 1. engine ------------------------------------------------------------------------------------------------------


def engine_argv(args: argparse.Namespace, out: Path) -> list[str]:
    if args.tiny:
        size = ["--questions", "1", "--max-new-tokens", "8", "--trees", "chain-3", "--dtypes", "float32",
                "--forward-ts", "1,2", "--device", "cpu", "--threads", "1"]
    else:
        size = ["--questions", str(args.questions), "--max-new-tokens", "128", "--trees", "chain-3,demo",
                "--dtypes", "float32,bfloat16", "--forward-ts", "1,2,4,8,16,64", "--device", "cuda", "--threads", "8"]
    return [sys.executable, str(REPO / "scripts/bench_engine.py"), *size, "--draft-vocab", "0", "--json",
            str(out / "engine.json")]


# ---- 2. train -------------------------------------------------------------------------------------------------------


def choose_epochs(seconds_per_step: float, startup: float, left: float, n_train: int, batch: int, most: int) -> int:
    """Epochs that fit in `left` seconds (10% margin), at least 1, at most the recipe's."""
    per_epoch = -(-n_train // batch) * seconds_per_step
    return max(1, min(most, int((left - startup) / (1.1 * per_epoch))))


def stage_train(args: argparse.Namespace, env: dict[str, str], deadline: float, rec: dict) -> Path | None:
    from training.config import load_train_config

    work = (REPO / "build" / ("gpu-tiny" if args.tiny else "gpu") / "work").resolve()
    head = work.parent / "head"
    sets = [f"work_dir={work}", f"output_dir={head}"] + (TINY_TRAIN if args.tiny else [])
    cfg0 = load_train_config(RECIPE, sets)
    left = deadline - time.time()
    for step, share in (("data", 0.45), ("features", 0.65)):  # at least a third of the time is left to train
        before = len(list((work / "features").glob("shard-*.pt")))
        rc, s = timed(train_argv(sets, step), env, deadline - time.time() - (1 - share) * left)
        seqs, toks, ans = shard_tokens(work)
        # Self-distillation keeps the features while decoding: then the features step only loads and checks.
        computed = step == "data" or len(list((work / "features").glob("shard-*.pt"))) > before
        rec[step] = {"rc": rc, "seconds": s, "sequences": seqs, "tokens": toks, "answer_tokens": ans,
                     "computed": computed, "tokens_per_s": toks / s if s and computed else None}
        if step == "data" and rc == 124 and seqs > 2 * cfg0.data.num_eval:  # train on the answers finished so far
            sets.append(f"data.num_conversations={seqs}")
            rec[step]["cut_to"] = seqs
        elif rc != 0:
            return None
    cfg = load_train_config(RECIPE, sets)
    startup = rec["features"]["seconds"]  # loading the target + checking every cached shard, nothing computed
    probe_sets = sets + [f"work_dir={work.parent / 'probe'}", "train.checkpoint_every=1000"]
    _link_cache(work, work.parent / "probe")
    probe_steps = 2 if args.tiny else 40
    rc, s = timed(train_argv(probe_sets, stop_at=probe_steps), env, deadline - time.time())
    rec["probe"] = {"rc": rc, "seconds": s, "steps": probe_steps}
    if rc != 0:
        return None
    # Probe minus start-up; if start-up varied more than the steps took, the whole probe bounds a step from above.
    basis = "probe minus start-up" if s > startup else "whole probe (upper bound)"
    per_step = (s - startup if s > startup else s) / probe_steps
    n_train = rec["data"]["sequences"] - cfg.data.num_eval
    epochs = choose_epochs(per_step, startup, deadline - time.time(), n_train, cfg.train.batch_size, cfg.train.epochs)
    rec["probe"].update(seconds_per_step=per_step, basis=basis, epochs=epochs)
    rc, s = timed(train_argv(sets + [f"train.epochs={epochs}"]), env, deadline - time.time())
    rec["train"] = {"rc": rc, "seconds": s, "epochs": epochs}
    log_path = head / "train_log.jsonl"
    if rc != 0 or not log_path.is_file():
        return None
    log = [json.loads(x) for x in log_path.read_text().splitlines()]
    tokens = sum(r.get("tokens", 0) for r in log if "loss" in r)
    ev = [r for r in log if "eval_acc" in r]
    rec["train"].update(tokens=tokens, tokens_per_s=tokens / s, steps=max(r["step"] for r in log if "loss" in r),
                        eval_top1=ev[-1]["eval_acc"] if ev else None,
                        eval_chain_tau=ev[-1].get("eval_chain_tau") if ev else None)
    return head


def _link_cache(work: Path, probe: Path) -> None:
    probe.mkdir(parents=True, exist_ok=True)
    for sub in ("data", "features"):
        if not (probe / sub).is_symlink():
            (probe / sub).symlink_to(work / sub)


# ---- main -----------------------------------------------------------------------------------------------------------


def _git_commit() -> str | None:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def environment(site: Path | None) -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    paths = ([str(site)] if site else []) + [str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter,
                                 epilog="Inputs:  .gpu/call-*/ (scripts/gpu_pack.py)\n"
                                 "Outputs: --out: summary.json, engine.json, head.tar\nGuide:   docs/gpu-run.md")
    ap.add_argument("--out", type=Path, required=True, help="the device call's $OUT")
    ap.add_argument("--minutes", type=float, default=8.5, help="wall-clock budget of the whole run")
    ap.add_argument("--engine-seconds", type=float, default=240, help="budget of stage 1 (the rest trains)")
    ap.add_argument("--questions", type=int, default=5, help="MT-bench questions of stage 1")
    ap.add_argument("--stages", default="engine,train", help="comma-separated subset of engine,train")
    ap.add_argument("--tiny", action="store_true", help="CPU rehearsal: tiny sizes, wheels checked but not installed")
    args = ap.parse_args(argv)
    t0 = time.time()
    deadline = t0 + 60 * args.minutes
    args.out.mkdir(parents=True, exist_ok=True)
    summary: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t0)), "argv": sys.argv,
                     "commit": _git_commit()}  # None where the tree came without .git (a device call)

    def save() -> None:
        summary["seconds"] = time.time() - t0
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")

    try:
        files = assemble(REPO / ".gpu")
        summary["packed_at_commit"] = read_manifest(REPO / ".gpu")["packed_at_commit"]
    except RunError as e:
        summary["error"] = str(e)
        save()
        print(f"gpu_run: {e}", file=sys.stderr)
        return 2
    site = None if args.tiny else SITE
    if site:
        rc, s = timed(install_argv([p for p in files.values() if p.suffix == ".whl"], site), os.environ.copy(), 120)
        summary["install"] = {"rc": rc, "seconds": s}
        sys.path.insert(0, str(site))  # this process reads the recipe too (pydantic)
    env = environment(site)
    rc, s = timed([sys.executable, "-m", "measure.model_source"], env, 300)  # dequantize the GGUF once, here
    summary["target"] = {"rc": rc, "seconds": s}
    summary["device"] = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__, "
                                        "torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"],
                                       capture_output=True, text=True, env=env).stdout.strip()
    save()
    stages = args.stages.split(",")
    if "engine" in stages:
        rc, s = timed(engine_argv(args, args.out), env, min(args.engine_seconds, deadline - time.time()))
        summary["engine"] = {"rc": rc, "seconds": s, "argv": engine_argv(args, args.out)}
        save()
    if "train" in stages:
        summary["train"] = {}
        head = stage_train(args, env, deadline, summary["train"])
        if head is not None:
            with tarfile.open(args.out / "head.tar", "w") as tar:
                tar.add(head, arcname="head")
        save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
