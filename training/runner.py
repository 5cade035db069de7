"""The training loop both head kinds share: schedule, AdamW, value clipping, DDP, checkpoints, resume, evaluation.

Determinism: the batch order of epoch e comes from a generator seeded with (seed, e), the random draws of step s
from (seed, s) and of an example within it from (seed, s, example index), so a run resumed from a checkpoint replays
exactly what an uninterrupted run does, under any number of ranks (dist.py has the rule that makes N ranks equal
one process). Rank 0 writes checkpoints, the live log and the export; every rank reads the same checkpoint.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from core.families import text_config
from core.records import relative_record
from training.compute import Compute
from training.config import TrainConfig, TrainHeadConfig
from training.shards import atomic_save, remove_stale_temps
from training.dist import Dist

REPO_ROOT = Path(__file__).resolve().parent.parent  # recipes name paths relative to it
CKPT_DIR = "checkpoints"


class TrainError(RuntimeError):
    """Training cannot continue as asked; the message says what to do."""


@dataclass
class Sample:
    """One training conversation: tokens, answer mask, and its features (views into the cached shards, or None
    when they are computed online in the step)."""

    input_ids: torch.Tensor  # [T] int
    loss_mask: torch.Tensor  # [T] bool, True on answer tokens
    features: dict[str, torch.Tensor] | None


# Features of a list of samples: views of the cached shards, or computed online by the target.
FeatureFn = Callable[[list[Sample]], list[dict[str, torch.Tensor]]]


def cached_features(samples: list[Sample]) -> list[dict[str, torch.Tensor]]:
    out = []
    for s in samples:
        if s.features is None:  # cached features are loaded with every sample
            raise TrainError("a sample without its cached features reached the step")
        out.append(s.features)
    return out


@dataclass
class Context:
    """What a training run needs besides its samples: config, target, ranks, device, where features come from."""

    cfg: TrainHeadConfig
    model: Any  # the HF target
    target_dir: Path
    dist: Dist
    compute: Compute
    features: FeatureFn
    stop_at: int | None = None  # end after this global step (checkpoint written, no export): a time-boxed run

    @property
    def target_cfg(self) -> dict:
        """The target's text-model keys (a multimodal target's text_config, e.g. Llama 4)."""
        return text_config(json.loads((self.target_dir / "config.json").read_text()))

    def lm_head(self) -> torch.Tensor:
        """The target's lm_head weight [V, H] on the training device, in the target's dtype."""
        return self.model.get_output_embeddings().weight.detach().to(self.compute.device)


def make_samples(data_shards: list[Path], feat_shards: list[Path] | None, spec: Any) -> list[Sample]:
    """Samples in slice order; features from the cached shards (memory-mapped) or None (online)."""
    from training.data import load_shards
    from training.features import load_features

    data = load_shards(data_shards)
    if feat_shards is None:
        return [Sample(d["input_ids"], d["loss_mask"], None) for d in data]
    feats = list(load_features(feat_shards, spec))
    if len(data) != len(feats) or any(len(f["hidden"]) != len(d["input_ids"]) for d, f in zip(data, feats)):
        where = feat_shards[0].parent if feat_shards else "work_dir/features"
        raise TrainError(f"{len(data)} data examples do not match {len(feats)} feature rows; delete {where}")
    return [Sample(d["input_ids"], d["loss_mask"], f) for d, f in zip(data, feats)]


def split(samples: list[Sample], cfg: TrainHeadConfig) -> tuple[list[Sample], list[Sample]]:
    """(training, held-out): the first or the last data.num_eval conversations of the slice are held out."""
    n = cfg.data.num_eval
    if cfg.data.held_out == "first":
        return samples[n:], samples[:n]
    return samples[:-n], samples[-n:]


def finished(log: list[dict], n_train: int, tc: TrainConfig) -> bool:
    """True when the log reaches the last step (a run stopped by stop_at is not exported)."""
    steps = [r["step"] for r in log if "loss" in r]
    return bool(steps) and steps[-1] == total_steps(n_train, tc)


def recipe_files(cfg: TrainHeadConfig, log: list[dict], command: str = "python training/train_head.py CONFIG",
                 base: Path = REPO_ROOT, base_name: str = "the repository root") -> dict[str, str]:
    """recipe.yaml (the exact config and command; paths relative to `base`, never the absolute paths of the machine
    that trained it: core/records.py) and train_log.jsonl, written next to the exported head."""
    import yaml

    config = relative_record(cfg.model_dump(mode="json"), base)
    recipe = yaml.safe_dump({"command": f"{command}  # paths relative to {base_name}", "config": config},
                            sort_keys=False)
    return {"recipe.yaml": recipe, "train_log.jsonl": "".join(json.dumps(r) + "\n" for r in log)}


def lr_factor(step: int, total: int, warmup: int) -> float:
    """Linear warmup to 1 over `warmup` steps, then linear decay to 0 at `total` (EAGLE's schedule)."""
    if step < warmup:
        return (step + 1) / warmup
    return max(0.0, (total - step) / max(1, total - warmup))


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g).tolist()


def batches_for_step(step: int, n: int, tc: TrainConfig) -> list[int]:
    """The global batch of `step`: example indices, the same on every rank."""
    per_epoch = math.ceil(n / tc.batch_size)
    epoch, j = divmod(step, per_epoch)
    return epoch_order(n, tc.seed, epoch)[j * tc.batch_size : (j + 1) * tc.batch_size]


def total_steps(n: int, tc: TrainConfig) -> int:
    return tc.epochs * math.ceil(n / tc.batch_size)


def step_generator(tc: TrainConfig, step: int) -> torch.Generator:
    """The step's own random stream (loss-position subsets): a resumed run draws exactly the same numbers."""
    return torch.Generator().manual_seed(tc.seed * 1_000_003 + 7919 * step + 1)


def example_generator(tc: TrainConfig, step: int, example: int) -> torch.Generator:
    """The random stream of one example in one step (feature noise): the same on whichever rank it lands."""
    return torch.Generator().manual_seed((tc.seed * 1_000_003 + 7919 * step + 1) * 1_000_033 + example)


# ---- checkpoints ----------------------------------------------------------------------------------------------


def trajectory_key(cfg: TrainHeadConfig) -> dict:
    """Everything that changes the training trajectory; a checkpoint is resumed only when this matches. The
    compute section (device, precision, threads) and the rank count are not part of it: a run may resume on
    other hardware (bitwise equality then needs the same precision and device)."""
    tc = cfg.train.model_dump(mode="json", exclude={"checkpoint_every", "eval_every"})
    data = cfg.data.model_dump(mode="json", exclude={"generate_batch_size"})
    return {"target": cfg.target, "data": data, "train": tc}


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    found = sorted(ckpt_dir.glob("step-*.pt"))
    return found[-1] if found else None


def latest_intact_state(ckpt_dir: Path, device: torch.device) -> tuple[Path, dict] | None:
    """The newest checkpoint that loads, with its state; a newer one that does not (truncated: a disk that filled,
    a copy cut short) is skipped with a warning naming it, so the run resumes from the one before. None: none loads.
    Temporary files of saves killed midway (`step-*.pt.tmp-<pid>`) are removed first."""
    for p in remove_stale_temps(ckpt_dir):
        print(f"warning: removed {p}, left by a save that was killed midway", file=sys.stderr)
    for path in sorted(ckpt_dir.glob("step-*.pt"), reverse=True):
        try:
            state = torch.load(path, weights_only=True, map_location=device)
            if not isinstance(state, dict) or not {"step", "head", "optim", "key", "log"} <= state.keys():
                raise ValueError("not a checkpoint of this trainer")
        except Exception as e:  # torch raises RuntimeError, EOFError, pickle / zip errors for a cut file
            print(f"warning: checkpoint {path} does not load ({type(e).__name__}: {str(e)[:200]}); resuming from "
                  "the one before it", file=sys.stderr)
            continue
        return path, state
    return None


def save_checkpoint(
    ckpt_dir: Path, step: int, head: torch.nn.Module, opt: torch.optim.Optimizer, key: dict, log: list
) -> None:
    state = {"step": step, "head": head.state_dict(), "optim": opt.state_dict(), "key": key, "log": log}
    atomic_save(state, ckpt_dir / f"step-{step:07d}.pt")
    for old in sorted(ckpt_dir.glob("step-*.pt"))[:-2]:  # keep the last two
        old.unlink()


def load_checkpoint(path: Path, head: torch.nn.Module, opt: torch.optim.Optimizer, key: dict,
                    state: dict | None = None) -> tuple[int, list]:
    if state is None:
        state = torch.load(path, weights_only=True, map_location=next(head.parameters()).device)
    if state["key"] != key:
        raise TrainError(
            f"checkpoint {path} was written with a different data/train config; resume with the same config, or "
            f"delete {path.parent} (or set a new work_dir) to start over"
        )
    head.load_state_dict(state["head"])
    opt.load_state_dict(state["optim"])
    return int(state["step"]), list(state["log"])


def write_live_log(path: Path, log: list[dict]) -> None:
    """The log so far, rewritten atomically at every checkpoint (to watch a long run)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in log))
    tmp.replace(path)


# ---- the loop -------------------------------------------------------------------------------------------------

# loss_fn(head, step, global batch indices, this rank's indices) -> (this rank's share L_r of the global loss,
# this rank's shares of the logged metrics: they sum over ranks to the global values).
# (head, step, batch, mine) -> (loss, figures); the head is the trainer's own nn.Module subclass (EagleHead, Eagle3Head)
LossFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]


class LossModule(torch.nn.Module):
    """The head with the loss computation as its forward, so DistributedDataParallel sees every use of the head's
    parameters inside its forward (it synchronizes their gradients in the backward that follows)."""

    def __init__(self, head: torch.nn.Module, loss_fn: LossFn) -> None:
        super().__init__()
        self.head, self.loss_fn = head, loss_fn

    def forward(self, step: int, batch: list[int], mine: list[int]) -> tuple[torch.Tensor, dict[str, float]]:
        return self.loss_fn(self.head, step, batch, mine)


def zero_loss(head: torch.nn.Module) -> torch.Tensor:
    """A loss whose gradient is zero for every trainable parameter: a rank with no example in the (last, short)
    batch still takes part in the gradient all-reduce."""
    zero = torch.zeros((), device=next(head.parameters()).device)
    return sum((p.sum() * 0 for p in head.parameters() if p.requires_grad), zero)


def wrap(module: LossModule, dist: Dist, compute: Compute) -> torch.nn.Module:
    if dist.world == 1:
        return module
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [compute.device.index] if compute.device.type == "cuda" else None
    # broadcast_buffers False: the buffers (rotary tables, d2t/t2d) are identical on every rank by construction.
    return DDP(module, device_ids=ids, broadcast_buffers=False)


def run_training(
    cfg: TrainHeadConfig,
    head: torch.nn.Module,
    key: dict,
    n_train: int,
    loss_fn: LossFn,
    evaluate_fn: Callable[[], dict],
    ckpt_dir: Path,
    *,
    desc: str,
    progress: tuple[str, str],
    dist: Dist,
    compute: Compute,
    stop_at: int | None = None,
    first_log: list[dict] | None = None,
) -> list[dict]:
    """Train `head` in place: AdamW, lr schedule, value clipping, held-out evaluation every eval_every steps (rank 0),
    checkpoints and the live train_log.jsonl every checkpoint_every steps (rank 0), resume from the latest checkpoint
    in `ckpt_dir` (refused if written under another `key`). `progress` = (label, metric) shown on the bar;
    `stop_at` ends early after that many steps (as if interrupted; used by tests); `first_log` starts a fresh log.
    Returns the metrics log (the same on every rank)."""
    tc = cfg.train
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=tc.lr, betas=tc.betas, weight_decay=tc.weight_decay)
    total = total_steps(n_train, tc)
    step, log = 0, list(first_log or [])
    found = latest_intact_state(ckpt_dir, next(head.parameters()).device)
    if found is not None:
        step, log = load_checkpoint(found[0], head, opt, key, found[1])
    model = wrap(LossModule(head, loss_fn), dist, compute)
    end = total if stop_at is None else min(total, stop_at)
    head.train()
    bar = tqdm(range(step, end), initial=step, total=total, desc=desc, unit="step", disable=not dist.main)
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = tc.lr * lr_factor(step, total, tc.warmup_steps)
        batch = batches_for_step(step, n_train, tc)
        with compute.autocast():
            loss, shares = model(step, batch, dist.share(batch))
        opt.zero_grad(set_to_none=True)
        (loss.float() * dist.world).backward()  # DDP averages over ranks; the ranks' L_r sum to the loss
        torch.nn.utils.clip_grad_value_(params, tc.grad_clip_value)
        opt.step()
        m = dist.all_sum(shares, compute.device)
        log.append({"step": step + 1, "lr": opt.param_groups[0]["lr"], **m})
        bar.set_postfix({"loss": f"{m['loss']:.3f}", progress[0]: f"{m[progress[1]]:.2f}"})
        done = step + 1
        if done % tc.eval_every == 0 or done == total:
            log.append({"step": done, **{f"eval_{k}": v for k, v in _main_eval(evaluate_fn, dist).items()}})
            head.train()
            if dist.main:
                tqdm.write(json.dumps(log[-1]))
        if (done % tc.checkpoint_every == 0 or done == end) and dist.main:
            save_checkpoint(ckpt_dir, done, head, opt, key, log)
            write_live_log(ckpt_dir / "train_log.jsonl", log)
    dist.barrier()
    return log


def _main_eval(evaluate_fn: Callable[[], dict], dist: Dist) -> dict:
    """Rank 0 evaluates; the result is broadcast so every rank keeps the same log."""
    out = evaluate_fn() if dist.main else {}
    if dist.world > 1:
        import torch.distributed as tdist

        box = [out]
        tdist.broadcast_object_list(box, src=0)
        out = box[0]
    return out
