"""The EAGLE-1/2 training step (SafeAILab/EAGLE eagle/train/main.py recipe), deterministic and resumable.

Per sequence (T tokens, features f_0..f_{T-1} from features.py) the head sees (f_t, token_{t+1}) and predicts
f_{t+1}, for t = 0..T-2. Loss at positions whose token_{t+1} belongs to the answer (loss mask), averaged over the
N loss positions of the whole (global) batch:

    loss = v_weight * SmoothL1(pred_t, f_{t+1}).mean(over H)
         + p_weight * -sum_v softmax(lm_head(f_{t+1}))_v * log_softmax(lm_head(pred_t))_v

i.e. the soft cross-entropy against the target's full next-token distribution (all V entries; lm_head is
computed only at loss positions, which gives the same value at lower cost). With `p_loss_positions` > 0 the
cross-entropy term is averaged over a uniformly random subset of p_loss_positions * batch_size of the batch's loss
positions (plan.py: an unbiased estimate of the same mean, at a fraction of the lm_head cost). Input features get
uniform noise U(-0.5, 0.5) * noise_std * 512 / T, drawn per example. AdamW, gradient VALUE clipping (EAGLE clips
values, not the norm), linear warmup then linear decay (runner.py, which also has the resume and rank rules).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from training.compute import Compute
from training.config import TrainConfig, TrainHeadConfig
from training.dist import Dist
from core.atomic import atomic_dir
from training.model import MODEL_CARD, EagleHead, export_dtype_keys, head_config_dict, head_from_target
from training.plan import Positions, plan_positions, position_mask
from training.runner import (
    CKPT_DIR,
    Context,
    FeatureFn,
    Sample,
    cached_features,
    example_generator,
    finished,
    recipe_files,
    run_training,
    split,
    step_generator,
    trajectory_key,
    zero_loss,
)

@dataclass
class Example:
    features: torch.Tensor  # [T, H] f_0..f_{T-1}
    input_ids: torch.Tensor  # [T] int
    loss_mask: torch.Tensor  # [T] bool, True on answer tokens


@dataclass
class Batch:
    features: torch.Tensor  # [B, L, H] float32 inputs f_t (noised in training)
    next_ids: torch.Tensor  # [B, L] token_{t+1}
    targets: torch.Tensor  # [B, L, H] float32 f_{t+1}
    mask: torch.Tensor  # [B, L] bool, loss positions
    lengths: list[int]  # T of each sequence (for the noise scale)


def examples_of(samples: list[Sample], features: FeatureFn) -> list[Example]:
    return [Example(f["hidden"], s.input_ids, s.loss_mask) for s, f in zip(samples, features(samples))]


def collate(examples: list[Example], device: torch.device | str = "cpu") -> Batch:
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
    feats, ids, tgts, mask = (t.to(device, non_blocking=True) for t in (feats, ids, tgts, mask))
    return Batch(feats, ids, tgts, mask, [len(e.input_ids) for e in examples])


def add_noise(batch: Batch, std: float, gens: list[torch.Generator]) -> torch.Tensor:
    """EAGLE's AddUniformNoise: (U[0,1) - 0.5) * std * 512 / T, per sequence of length T; example i draws from
    gens[i] (its own stream: the same noise on whichever rank and in whichever batch layout it lands)."""
    noise = torch.zeros(batch.features.shape)
    for i, (t, g) in enumerate(zip(batch.lengths, gens)):
        noise[i, : t - 1] = (torch.rand((t - 1, noise.shape[-1]), generator=g) - 0.5) * (std * 512 / t)
    return batch.features + noise.to(batch.features.device)


def eagle_loss(
    head: EagleHead, lm_head: torch.Tensor, batch: Batch, feats: torch.Tensor, tc: TrainConfig, pos: Positions,
    n_loss: int, n_ce: int,
) -> tuple[torch.Tensor, dict[str, float]]:
    """This batch's share of EAGLE's loss: sums over its positions divided by the global counts n_loss (feature
    loss) and n_ce (cross-entropy positions, `pos.ce`). Returns the loss and the metric shares (sums over the
    ranks' shares are the global means; `tokens`/`ce_tokens` are counts)."""
    out = head(feats, batch.next_ids).float()  # [B, L, H]
    vl = F.smooth_l1_loss(out[batch.mask], batch.targets[batch.mask], reduction="none").mean(-1).sum() / max(n_loss, 1)
    ce_mask = position_mask(pos.ce, batch.mask.shape[1]).to(out.device)
    pred, target = out[ce_mask], batch.targets[ce_mask]
    with torch.no_grad():
        target_logits = target @ lm_head.T
        target_p = target_logits.float().softmax(-1)
    logp = (pred @ lm_head.T).float().log_softmax(-1)
    pl = -(target_p * logp).sum() / max(n_ce, 1)
    loss = tc.v_weight * vl + tc.p_weight * pl
    correct = (logp.argmax(-1) == target_logits.argmax(-1)).sum().item()
    return loss, {"loss": loss.item(), "vloss": vl.item(), "ploss": pl.item(), "acc": correct / max(n_ce, 1),
                  "tokens": int(batch.mask.sum()), "ce_tokens": int(pred.shape[0])}


EMPTY = {"loss": 0.0, "vloss": 0.0, "ploss": 0.0, "acc": 0.0, "tokens": 0, "ce_tokens": 0}


def train(
    cfg: TrainHeadConfig,
    head: EagleHead,
    lm_head: torch.Tensor,
    train_set: list[Sample],
    eval_set: list[Sample],
    ckpt_dir: Path,
    stop_at: int | None = None,
    *,
    dist: Dist | None = None,
    compute: Compute | None = None,
    features: FeatureFn = cached_features,
) -> list[dict]:
    """Train an EAGLE-1/2 `head` in place (runner.run_training); returns the metrics log."""
    from training.compute import Compute as C

    tc, dist = cfg.train, dist or Dist()
    compute = compute or C(torch.device("cpu"), bf16=False, threads=torch.get_num_threads(), device_map=False)
    eval_examples = examples_of(eval_set, features) if dist.main else []

    def loss_fn(h: EagleHead, step: int, batch: list[int], mine: list[int]) -> tuple[torch.Tensor, dict[str, float]]:
        keep = tc.p_loss_positions * len(batch)
        pos = plan_positions([train_set[i].loss_mask for i in batch], keep, step_generator(tc, step))
        if not mine:
            return zero_loss(h), dict(EMPTY)
        b = collate(examples_of([train_set[i] for i in mine], features), compute.device)
        noisy = add_noise(b, tc.noise_std, [example_generator(tc, step, i) for i in mine])
        at = {i: k for k, i in enumerate(batch)}
        mine_pos = Positions([pos.loss[at[i]] for i in mine], [pos.ce[at[i]] for i in mine])
        return eagle_loss(h, lm_head, b, noisy, tc, mine_pos, pos.n_loss, pos.n_ce)

    return run_training(
        cfg, head, trajectory_key(cfg), len(train_set), loss_fn,
        lambda: evaluate(head, lm_head, eval_examples, tc, compute), ckpt_dir, desc="train", progress=("acc", "acc"),
        dist=dist, compute=compute, stop_at=stop_at,
    )


@torch.no_grad()
def evaluate(
    head: EagleHead, lm_head: torch.Tensor, examples: list[Example], tc: TrainConfig, compute: Compute
) -> dict[str, float]:
    """Held-out teacher-forced losses/accuracy over every loss position (no noise) and the chain acceptance
    estimate (see chain_eval.py)."""
    from training.chain_eval import chain_accept

    head.eval()
    sums = {"vloss": 0.0, "ploss": 0.0, "acc": 0.0}
    n = 0.0
    with compute.autocast():
        for i in range(0, len(examples), tc.batch_size):
            part = examples[i : i + tc.batch_size]
            batch = collate(part, compute.device)
            pos = plan_positions([e.loss_mask for e in part], 0, None)
            _, m = eagle_loss(head, lm_head, batch, batch.features, tc, pos, pos.n_loss, pos.n_ce)
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

    from training.model import safeailab_state_dict

    bias = head.fc.bias is not None
    state = safeailab_state_dict(head, torch.float16)
    if not embedding:
        del state["embed_tokens.weight"]
    # The hand-written card with measured figures survives retraining.
    with atomic_dir(out_dir, keep=(MODEL_CARD,)) as tmp:
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        cfg = export_dtype_keys(head_config_dict(target_cfg, bias), "float16")
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        for name, text in extra_files.items():
            (tmp / name).write_text(text)
    return out_dir


def train_and_export(ctx: Context, samples: list[Sample]) -> Path | None:
    """Split the slice (held-out conversations per data.held_out), train, export with recipe and metrics (rank 0).
    None when ctx.stop_at ended the run before its last step."""
    cfg, c = ctx.cfg, ctx.compute
    train_set, eval_set = split(samples, cfg)
    head = head_from_target(ctx.target_cfg, ctx.model.get_input_embeddings().weight.detach().float().cpu(),
                            cfg.train.seed).to(c.device)
    log = train(cfg, head, ctx.lm_head(), train_set, eval_set, Path(cfg.work_dir) / CKPT_DIR, ctx.stop_at,
                dist=ctx.dist, compute=c, features=ctx.features)
    if not finished(log, len(train_set), cfg.train):
        return None
    out = Path(cfg.output_dir)
    if ctx.dist.main:
        export_head(head, ctx.target_cfg, out, recipe_files(cfg, log), embedding=cfg.export_embedding)
    ctx.dist.barrier()
    return out
