"""The EAGLE training loop (SafeAILab/EAGLE eagle/train/main.py recipe), deterministic and resumable.

Per sequence (T tokens, features f_0..f_{T-1} from features.py) the head sees (f_t, token_{t+1}) and predicts
f_{t+1}, for t = 0..T-2. Loss at positions whose token_{t+1} belongs to the answer (loss mask), averaged over them:

    loss = v_weight * SmoothL1(pred_t, f_{t+1}).mean(over H)
         + p_weight * -sum_v softmax(lm_head(f_{t+1}))_v * log_softmax(lm_head(pred_t))_v

i.e. the soft cross-entropy against the target's full next-token distribution (all V entries; lm_head is
computed only at loss positions, which gives the same value at lower cost). With `p_loss_positions` > 0 the
cross-entropy term is averaged over a uniformly random subset of the loss positions (drawn from the step's seeded
generator): an unbiased estimate of the same mean, at a fraction of the lm_head cost. Input features get uniform noise
U(-0.5, 0.5) * noise_std * 512 / T. AdamW, gradient VALUE clipping (EAGLE clips values, not the norm),
linear warmup then linear decay.

Determinism: the batch order of epoch e comes from a generator seeded with (seed, e) and the noise of step s from
(seed, s), so a run resumed from a checkpoint replays exactly what an uninterrupted run does.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from builders.training.config import TrainConfig, TrainHeadConfig
from builders.training.data import atomic_save, load_shards
from builders.training.features import load_features
from builders.training.model import EagleHead, head_config_dict, head_from_target

CKPT_DIR = "checkpoints"


class TrainError(RuntimeError):
    """Training cannot continue as asked; the message says what to do."""


@dataclass
class Example:
    features: torch.Tensor  # [T, H] float16, f_0..f_{T-1}
    input_ids: torch.Tensor  # [T] int
    loss_mask: torch.Tensor  # [T] bool, True on answer tokens


@dataclass
class Batch:
    features: torch.Tensor  # [B, L, H] float32 inputs f_t (noised in training)
    next_ids: torch.Tensor  # [B, L] token_{t+1}
    targets: torch.Tensor  # [B, L, H] float32 f_{t+1}
    mask: torch.Tensor  # [B, L] bool, loss positions
    lengths: list[int]  # T of each sequence (for the noise scale)


def collate(examples: list[Example]) -> Batch:
    """Shift by one (EAGLE: input f_t with token_{t+1}, target f_{t+1}) and right-pad to the longest."""
    L = max(len(e.input_ids) - 1 for e in examples)
    H = examples[0].features.shape[1]
    b = len(examples)
    feats, tgts = torch.zeros(b, L, H), torch.zeros(b, L, H)
    ids = torch.zeros(b, L, dtype=torch.long)
    mask = torch.zeros(b, L, dtype=torch.bool)
    for i, e in enumerate(examples):
        n = len(e.input_ids) - 1
        feats[i, :n] = e.features[:-1].float()
        tgts[i, :n] = e.features[1:].float()
        ids[i, :n] = e.input_ids[1:].long()
        mask[i, :n] = e.loss_mask[1:]
    return Batch(feats, ids, tgts, mask, [len(e.input_ids) for e in examples])


def add_noise(batch: Batch, std: float, gen: torch.Generator) -> torch.Tensor:
    """EAGLE's AddUniformNoise: (U[0,1) - 0.5) * std * 512 / T, per sequence of length T."""
    noise = torch.rand(batch.features.shape, generator=gen) - 0.5
    scale = torch.tensor([std * 512 / t for t in batch.lengths]).view(-1, 1, 1)
    return batch.features + noise * scale


def eagle_loss(
    head: EagleHead,
    lm_head: torch.Tensor,
    batch: Batch,
    feats: torch.Tensor,
    tc: TrainConfig,
    subset_gen: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """EAGLE's loss on one batch. `subset_gen` given and tc.p_loss_positions > 0: the cross-entropy term uses a
    random subset of the loss positions (see the module docstring); None = all positions (evaluation)."""
    pred = head(feats, batch.next_ids)[batch.mask]  # [N, H] at loss positions only
    target = batch.targets[batch.mask]
    n = max(int(batch.mask.sum()), 1)
    vloss = F.smooth_l1_loss(pred, target, reduction="none").mean(-1).sum() / n
    keep = tc.p_loss_positions * len(batch.lengths)
    if subset_gen is not None and 0 < keep < pred.shape[0]:
        idx = torch.randperm(pred.shape[0], generator=subset_gen)[:keep]
        pred, target = pred[idx], target[idx]
    with torch.no_grad():
        target_logits = target @ lm_head.T
        target_p = target_logits.softmax(-1)
    logp = (pred @ lm_head.T).log_softmax(-1)
    ploss = -(target_p * logp).sum() / max(pred.shape[0], 1)
    loss = tc.v_weight * vloss + tc.p_weight * ploss
    acc = (logp.argmax(-1) == target_logits.argmax(-1)).float().mean().item()
    return loss, {"loss": loss.item(), "vloss": vloss.item(), "ploss": ploss.item(), "acc": acc, "tokens": n,
                  "ce_tokens": int(pred.shape[0])}


def lr_factor(step: int, total: int, warmup: int) -> float:
    """Linear warmup to 1 over `warmup` steps, then linear decay to 0 at `total` (EAGLE's schedule)."""
    if step < warmup:
        return (step + 1) / warmup
    return max(0.0, (total - step) / max(1, total - warmup))


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g).tolist()


def batches_for_step(step: int, n: int, tc: TrainConfig) -> list[int]:
    per_epoch = math.ceil(n / tc.batch_size)
    epoch, j = divmod(step, per_epoch)
    return epoch_order(n, tc.seed, epoch)[j * tc.batch_size : (j + 1) * tc.batch_size]


def total_steps(n: int, tc: TrainConfig) -> int:
    return tc.epochs * math.ceil(n / tc.batch_size)


# ---- checkpoints ----------------------------------------------------------------------------------------------


def trajectory_key(cfg: TrainHeadConfig) -> dict:
    """Everything that changes the training trajectory; a checkpoint is resumed only when this matches."""
    tc = cfg.train.model_dump(mode="json", exclude={"checkpoint_every", "eval_every", "threads"})
    return {"target": cfg.target, "data": cfg.data.model_dump(mode="json"), "train": tc}


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    found = sorted(ckpt_dir.glob("step-*.pt"))
    return found[-1] if found else None


def save_checkpoint(ckpt_dir: Path, step: int, head: EagleHead, opt: torch.optim.Optimizer, key: dict, log: list) -> None:
    state = {"step": step, "head": head.state_dict(), "optim": opt.state_dict(), "key": key, "log": log}
    atomic_save(state, ckpt_dir / f"step-{step:07d}.pt")
    for old in sorted(ckpt_dir.glob("step-*.pt"))[:-2]:  # keep the last two
        old.unlink()


def load_checkpoint(path: Path, head: EagleHead, opt: torch.optim.Optimizer, key: dict) -> tuple[int, list]:
    state = torch.load(path, weights_only=True)
    if state["key"] != key:
        raise TrainError(
            f"checkpoint {path} was written with a different data/train config; resume with the same config, or "
            f"delete {path.parent} (or set a new work_dir) to start over"
        )
    head.load_state_dict(state["head"])
    opt.load_state_dict(state["optim"])
    return int(state["step"]), list(state["log"])


# ---- training -------------------------------------------------------------------------------------------------


def make_examples(data_shards: list[Path], feat_shards: list[Path]) -> list[Example]:
    data = load_shards(data_shards)
    feats = load_features(feat_shards)
    if len(data) != len(feats):
        raise TrainError(f"{len(data)} data examples but {len(feats)} feature rows; delete work_dir/features")
    return [Example(f, d["input_ids"], d["loss_mask"]) for d, f in zip(data, feats)]


StepLoss = Callable[[int, list[int]], tuple[torch.Tensor, dict[str, float]]]


def run_training(
    cfg: TrainHeadConfig,
    head: torch.nn.Module,
    key: dict,
    n_train: int,
    step_loss: StepLoss,
    evaluate_fn: Callable[[], dict],
    ckpt_dir: Path,
    *,
    desc: str,
    progress: tuple[str, str],
    stop_at: int | None = None,
    first_log: list[dict] | None = None,
) -> list[dict]:
    """The training loop both head kinds share: AdamW, lr schedule, value clipping, held-out evaluation every
    eval_every steps, checkpoints (and the live train_log.jsonl) every checkpoint_every steps, resume from the latest
    checkpoint in `ckpt_dir` (refused if written under another `key`). `step_loss(step, example indices)` returns the
    step's loss and metrics; `progress` = (label, metric) shown on the bar. `stop_at` ends early after that many
    steps (as if interrupted; used by tests); `first_log` starts a fresh log. Returns the metrics log."""
    tc = cfg.train
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=tc.lr, betas=tc.betas, weight_decay=tc.weight_decay)
    total = total_steps(n_train, tc)
    step, log = 0, list(first_log or [])
    ckpt = latest_checkpoint(ckpt_dir)
    if ckpt is not None:
        step, log = load_checkpoint(ckpt, head, opt, key)
    end = total if stop_at is None else min(total, stop_at)
    head.train()
    bar = tqdm(range(step, end), initial=step, total=total, desc=desc, unit="step")
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = tc.lr * lr_factor(step, total, tc.warmup_steps)
        loss, m = step_loss(step, batches_for_step(step, n_train, tc))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_value_(params, tc.grad_clip_value)
        opt.step()
        log.append({"step": step + 1, "lr": opt.param_groups[0]["lr"], **m})
        bar.set_postfix(loss=f"{m['loss']:.3f}", **{progress[0]: f"{m[progress[1]]:.2f}"})
        done = step + 1
        if done % tc.eval_every == 0 or done == total:
            log.append({"step": done, **{f"eval_{k}": v for k, v in evaluate_fn().items()}})
            head.train()
            tqdm.write(json.dumps(log[-1]))
        if done % tc.checkpoint_every == 0 or done == end:
            save_checkpoint(ckpt_dir, done, head, opt, key, log)
            write_live_log(ckpt_dir / "train_log.jsonl", log)
    return log


def step_generator(tc: TrainConfig, step: int) -> torch.Generator:
    """The step's own random stream (noise, sampled loss positions): a resumed run draws exactly the same numbers."""
    return torch.Generator().manual_seed(tc.seed * 1_000_003 + 7919 * step + 1)


def write_live_log(path: Path, log: list[dict]) -> None:
    """The log so far, rewritten atomically at every checkpoint (to watch a long run)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in log))
    tmp.replace(path)


def train(
    cfg: TrainHeadConfig,
    head: EagleHead,
    lm_head: torch.Tensor,
    train_set: list[Example],
    eval_set: list[Example],
    ckpt_dir: Path,
    stop_at: int | None = None,
) -> list[dict]:
    """Train an EAGLE-1/2 `head` in place (run_training); returns the metrics log."""
    tc = cfg.train

    def step_loss(step: int, idx: list[int]) -> tuple[torch.Tensor, dict[str, float]]:
        batch = collate([train_set[i] for i in idx])
        gen = step_generator(tc, step)
        return eagle_loss(head, lm_head, batch, add_noise(batch, tc.noise_std, gen), tc, gen)

    return run_training(
        cfg, head, trajectory_key(cfg), len(train_set), step_loss, lambda: evaluate(head, lm_head, eval_set, tc),
        ckpt_dir, desc="train", progress=("acc", "acc"), stop_at=stop_at,
    )  # fmt: skip


@torch.no_grad()
def evaluate(head: EagleHead, lm_head: torch.Tensor, examples: list[Example], tc: TrainConfig) -> dict[str, float]:
    """Held-out teacher-forced losses/accuracy (no noise) and the chain acceptance estimate (see chain_accept)."""
    from builders.training.chain_eval import chain_accept

    head.eval()
    sums = {"vloss": 0.0, "ploss": 0.0, "acc": 0.0}
    n = 0
    for i in range(0, len(examples), tc.batch_size):
        batch = collate(examples[i : i + tc.batch_size])
        _, m = eagle_loss(head, lm_head, batch, batch.features, tc)
        for k in sums:
            sums[k] += m[k] * m["tokens"]
        n += m["tokens"]
    out = {k: v / max(n, 1) for k, v in sums.items()}
    out.update(chain_accept(head, lm_head, examples, depth=5))
    return out


# ---- export ---------------------------------------------------------------------------------------------------


def export_head(
    head: EagleHead, target_cfg: dict, out_dir: Path, extra_files: dict[str, str], *, embedding: bool
) -> Path:
    """Write the SafeAILab layout (config.json + fp16 model.safetensors) atomically into `out_dir`; `embedding`
    False leaves out the frozen embed_tokens copy (converters then use the target's)."""
    from safetensors.torch import save_file

    from builders.training.model import safeailab_state_dict

    tmp = out_dir.with_name(out_dir.name + ".tmp-export")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    bias = head.fc.bias is not None
    state = safeailab_state_dict(head, torch.float16)
    if not embedding:
        del state["embed_tokens.weight"]
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    cfg = dict(head_config_dict(target_cfg, bias), torch_dtype="float16")
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for name, text in extra_files.items():
        (tmp / name).write_text(text)
    keep = out_dir / "MODEL_CARD.md"  # the hand-written card with measured figures survives retraining
    if keep.is_file():
        shutil.copy2(keep, tmp / keep.name)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    return out_dir


def train_and_export(cfg: TrainHeadConfig, model, target_dir: Path, data_shards: list[Path], feat_shards: list[Path]) -> Path:
    """Split the slice (last num_eval conversations held out), train, export with recipe and metrics."""
    import yaml

    examples = make_examples(data_shards, feat_shards)
    n_eval = cfg.data.num_eval
    train_set, eval_set = examples[:-n_eval], examples[-n_eval:]
    target_cfg = json.loads((target_dir / "config.json").read_text())
    head = head_from_target(target_cfg, model.get_input_embeddings().weight.detach(), cfg.train.seed)
    lm_head = model.get_output_embeddings().weight.detach().float()
    log = train(cfg, head, lm_head, train_set, eval_set, Path(cfg.work_dir) / CKPT_DIR)
    recipe = yaml.safe_dump({"command": "python builders/train_head.py CONFIG", "config": cfg.model_dump(mode="json")},
                            sort_keys=False)
    metrics = "".join(json.dumps(r) + "\n" for r in log)
    return export_head(head, target_cfg, Path(cfg.output_dir), {"recipe.yaml": recipe, "train_log.jsonl": metrics},
                       embedding=cfg.export_embedding)
