"""`python training/train_head.py CONFIG.yaml [--set a.b=v ...] [--until data|features|train]`
`torchrun --nproc-per-node N training/train_head.py CONFIG.yaml`   (data-parallel: NCCL on GPUs, gloo on CPUs)

Trains an EAGLE-1/2 head (`head: eagle`) or an EAGLE-3 head with a reduced draft vocabulary (`head: eagle3`) for a
target (SafeAILab/EAGLE recipes, see training/):
  1. data      ShareGPT conversations, cached shards in work_dir/data; with `responses: regenerate` the answers are
               the target's own greedy continuations, decoded in batches, and the features of every token are
               kept on the way (written as the shard's feature shard: no second target pass)
  2. features  the target's hidden states (eagle: post-norm last hidden state; eagle3: + the inputs of the captured
               layers and the greedy token) in length-bucketed batches, bf16/fp16 shards in work_dir/features;
               `features.storage: online` computes them inside each training step instead
  3. train     the head; resumable checkpoints in work_dir/checkpoints (rerun the same command to resume, with any
               number of ranks)
  4. export    output_dir/{config.json, model.safetensors (fp16), recipe.yaml, train_log.jsonl}; eagle3: the
               HF-style LlamaForCausalLMEagle3 layout builders/convert/eagle3.py takes (midlayer.*, d2t, t2d)

The `compute:` section picks the device (CUDA when present), precision (bf16 where the hardware has it) and
threads. Under torchrun every rank computes its share of the data and feature shards (round robin), trains on
its share of every global batch (DistributedDataParallel), and rank 0 writes checkpoints and the export.
Every step is resumable: rerunning the same command skips finished shards and continues from the last checkpoint.

Inputs:  CONFIG.yaml, a training config (every field: docs/train-config.md; examples: configs/train/)
Outputs: work_dir/ (data and feature shards, checkpoints) and output_dir/ (the head: config.json, model.safetensors)
Guide:   docs/train-a-head.md
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

# Run as a file (`python training/train_head.py`), Python would put training/ first on sys.path, where a
# module can shadow an installed package (builders/triton: `triton`): run as the module, as its command does.
if __name__ == "__main__" and not __package__:
    os.execv(sys.executable, [sys.executable, "-m", "training.train_head", *sys.argv[1:]])

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from core.config_input import ConfigError
from training.config import TrainHeadConfig, load_train_config, with_layer_ids

if TYPE_CHECKING:
    from training.compute import Compute
    from training.dist import Dist

STEPS = ("data", "features", "train")


def run(cfg: TrainHeadConfig, until: str = "train", stop_at: int | None = None) -> Path | None:
    """Run the steps up to `until` in this process (one rank of a torchrun job, or alone); returns the exported
    head directory (None when stopped earlier: `until`, or `stop_at` = the last training step to run)."""
    from training.compute import apply_compute, resolve_compute
    from training.dist import close_dist, env_dist, init_dist

    dist = env_dist()
    compute = resolve_compute(cfg.compute, dist.local_rank, dist.local_world)
    apply_compute(compute, cfg.compute.tf32)
    init_dist(dist, compute.device)
    try:
        return _steps(cfg, until, stop_at, dist, compute)
    finally:
        close_dist(dist)


def _steps(cfg: TrainHeadConfig, until: str, stop_at: int | None, dist: Dist, compute: Compute) -> Path | None:
    from training.compute import load_target
    from training.data import build_data, check_data_key
    from training.features import build_features, online_features, spec_for
    from training.runner import Context, cached_features, make_samples

    if dist.main:
        print(f"train_head: {dist.world} rank(s); {compute.describe()}", flush=True)
    model, tok, target_dir = load_target(cfg.target, compute)
    cfg, note = with_layer_ids(cfg, len(model.model.layers))  # the default capture layers need the target's depth
    if note is not None and dist.main:
        print(f"train_head: {note}", flush=True)
    work, spec, cached = Path(cfg.work_dir), spec_for(cfg), cfg.features.storage == "shards"
    if dist.main:
        check_data_key(work, cfg.data, cfg.target, str(compute.target_dtype))
    dist.barrier()
    data_shards = build_data(model, tok, cfg.data, work, spec if cached else None, dist.rank, dist.world)
    dist.barrier()
    if until == "data":
        return None
    feat_shards = None
    if cached:
        feat_shards = build_features(model, data_shards, work, spec, cfg.features.batch_tokens, dist.rank, dist.world)
        dist.barrier()
    if until == "features":
        return None
    features = cached_features if cached else online_features(model, spec, cfg.features.batch_tokens)
    ctx = Context(cfg, model, target_dir, dist, compute, features, stop_at)
    samples = make_samples(data_shards, feat_shards, spec)
    if cfg.kind.eagle3:
        from training.eagle3_train import train_and_export3

        return train_and_export3(ctx, samples)
    from training.loop import train_and_export

    return train_and_export(ctx, samples)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="eagle-train-head", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument(
        "config", type=Path, help="training YAML (see configs/train/smollm2-eagle.yaml, smollm2-eagle3.yaml)"
    )
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config value, e.g. --set train.epochs=2")
    ap.add_argument("--until", choices=STEPS, default="train", help="stop after this step (default: all)")
    ap.add_argument("--stop-at-step", type=int, default=None, metavar="N",
                    help="end training after global step N with a checkpoint (no export); rerun without it to "
                    "continue, with any number of ranks")
    args = ap.parse_args(argv)
    try:
        cfg = load_train_config(args.config, args.overrides)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    # torch and the training modules load only now: `--help` and a config error answer at once
    from training.compute import ComputeError
    from training.data import DataError
    from training.eagle3_vocab import VocabError
    from training.features import FeatureError
    from training.runner import TrainError

    try:
        out = run(cfg, args.until, args.stop_at_step)
    except (ComputeError, DataError, FeatureError, TrainError, VocabError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if int(os.environ.get("RANK", "0")) == 0:
        if out is not None:
            print(f"head written to {out}")
        elif args.stop_at_step is not None and args.until == "train":
            print(
                f"stopped after step {args.stop_at_step} (checkpoint in {cfg.work_dir}/checkpoints); rerun to continue"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
