"""EAGLE-3 training driver: draft vocabulary, deterministic resumable loop, held-out eval, HF-style export.

The machinery is the shared loop's (training/runner.py): the batch order of epoch e from (seed, e), the
position subsets of step s from (seed, s), AdamW, gradient value clipping, linear warmup/decay, DDP over torchrun
ranks, checkpoints every `checkpoint_every` steps (the last two kept) that resume bitwise, train_log.jsonl. The
loss is eagle3_loop.py's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tqdm import tqdm

from core.atomic import atomic_dir
from training.compute import Compute
from training.config import TrainHeadConfig
from training.dist import Dist
from training.eagle3_loop import Example3, chain_accept3, collate3, eagle3_loss, empty_metrics3, plan3
from training.eagle3_model import (
    Eagle3Head,
    eagle3_config_dict,
    eagle3_head_from_target,
    eagle3_state_dict,
)
from training.eagle3_vocab import DraftVocab, answer_token_counts, build_draft_vocab, coverage_table
from training.model import MODEL_CARD, export_dtype_keys
from training.plan import Positions
from training import runner
from training.runner import Context, FeatureFn, Sample

if TYPE_CHECKING:
    from transformers import PreTrainedModel

COVERAGE_SIZES = [1024, 2048, 4096, 8192, 16384, 32000]


def examples3_of(samples: list[Sample], features: FeatureFn) -> list[Example3]:
    return [Example3(f["aux"], f["hidden"], f["greedy"], s.input_ids, s.loss_mask)
            for s, f in zip(samples, features(samples))]


def draft_vocab_for(train_set: list[Sample], vocab_size: int, size: int) -> tuple[DraftVocab, dict]:
    """The draft vocabulary from the TRAINING answers (held-out conversations excluded) and a log record."""
    counts = answer_token_counts([{"input_ids": e.input_ids, "loss_mask": e.loss_mask} for e in train_set], vocab_size)
    dv = build_draft_vocab(counts, size)
    sizes = sorted({s for s in COVERAGE_SIZES if s < vocab_size} | {size})
    record = {"draft_vocab_size": size, "coverage": dv.coverage, "answer_tokens": dv.counted,
              "distinct_answer_tokens": dv.distinct, "coverage_by_size": coverage_table(counts, sizes)}
    return dv, record


def trajectory_key3(cfg: TrainHeadConfig) -> dict:
    assert cfg.eagle3 is not None
    e3 = cfg.eagle3.model_dump(mode="json", exclude={"chain_depth"})
    return {**runner.trajectory_key(cfg), "head": "eagle3", "eagle3": e3}


def train3(
    cfg: TrainHeadConfig, head: Eagle3Head, lm_sub: torch.Tensor, train_set: list[Sample], eval_set: list[Sample],
    ckpt_dir: Path, stop_at: int | None = None, first_log: list[dict] | None = None, *, dist: Dist | None = None,
    compute: Compute | None = None, features: FeatureFn = runner.cached_features,
) -> list[dict]:
    """Train an EAGLE-3 head in place (runner.run_training); `first_log` starts a fresh log (the vocabulary
    record). Returns the metrics log."""
    tc, e3, dist = cfg.train, cfg.eagle3, dist or Dist()
    assert e3 is not None
    compute = compute or Compute(torch.device("cpu"), bf16=False, threads=torch.get_num_threads(), device_map=False)
    eval_examples = examples3_of(eval_set, features) if dist.main else []

    def loss_fn(h: Eagle3Head, step: int, batch: list[int], mine: list[int]) -> tuple[torch.Tensor, dict[str, float]]:
        plans = plan3([train_set[i].loss_mask for i in batch], e3.ttt_steps, tc.p_loss_positions * len(batch),
                      runner.step_generator(tc, step))
        if not mine:
            return runner.zero_loss(h), empty_metrics3(e3.ttt_steps)
        at = {i: k for k, i in enumerate(batch)}
        local = [Positions([p.loss[at[i]] for i in mine], [p.ce[at[i]] for i in mine]) for p in plans]
        b = collate3(examples3_of([train_set[i] for i in mine], features), e3.ttt_steps, compute.device)
        return eagle3_loss(h, lm_sub, b, e3.ttt_steps, e3.step_decay, tc, local, [p.n_ce for p in plans])

    return runner.run_training(
        cfg, head, trajectory_key3(cfg), len(train_set), loss_fn,
        lambda: evaluate3(head, lm_sub, eval_examples, cfg, compute), ckpt_dir, desc="train eagle3",
        progress=("acc0", "acc_0"), dist=dist, compute=compute, stop_at=stop_at, first_log=first_log,
    )


@torch.no_grad()
def evaluate3(
    head: Eagle3Head, lm_sub: torch.Tensor, examples: list[Example3], cfg: TrainHeadConfig, compute: Compute
) -> dict:
    """Held-out teacher-forced TTT losses/accuracies (all positions) and the greedy chain acceptance estimate."""
    e3 = cfg.eagle3
    assert e3 is not None
    head.eval()
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    with compute.autocast():
        for i in range(0, len(examples), cfg.train.batch_size):
            part = examples[i : i + cfg.train.batch_size]
            plans = plan3([e.loss_mask for e in part], e3.ttt_steps, 0, None)
            batch = collate3(part, e3.ttt_steps, compute.device)
            _, m = eagle3_loss(head, lm_sub, batch, e3.ttt_steps, e3.step_decay, cfg.train, plans,
                               [p.n_ce for p in plans])
            for k in range(e3.ttt_steps):
                n = m[f"tokens_{k}"]
                for name in (f"ploss_{k}", f"acc_{k}"):
                    sums[name] = sums.get(name, 0.0) + m[name] * n
                    counts[name] = counts.get(name, 0) + n
        out = {k: v / max(counts[k], 1) for k, v in sums.items()}
        out.update(chain_accept3(head, examples, e3.chain_depth))
    return out


def export_eagle3(
    head: Eagle3Head, config: dict, out_dir: Path, extra_files: dict[str, str], *, embedding: bool
) -> Path:
    """config.json + fp16 model.safetensors (+ extra files) written to a temporary dir, then renamed into place;
    a hand-written MODEL_CARD.md already there survives."""
    from safetensors.torch import save_file

    with atomic_dir(out_dir, keep=(MODEL_CARD,)) as tmp:
        save_file(eagle3_state_dict(head, torch.float16, embedding=embedding), str(tmp / "model.safetensors"),
                  metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(export_dtype_keys(config, "float16"), indent=2) + "\n")
        for name, text in extra_files.items():
            (tmp / name).write_text(text)
    return out_dir


def _final_norm(model: PreTrainedModel) -> torch.Tensor:
    """The weight of the target's final norm: `norm` in transformers' decoder stacks, `norm_f` in Nemotron-H's."""
    base = model.model
    norm = getattr(base, "norm", None) or getattr(base, "norm_f", None)
    weight = getattr(norm, "weight", None)
    if not isinstance(weight, torch.Tensor):
        raise ValueError(f"{type(model).__name__}: no final norm (model.norm / model.norm_f) to start the head from")
    return weight


def setup3(
    cfg: TrainHeadConfig, model: PreTrainedModel, target_cfg: dict[str, Any], train_set: list[Sample]
) -> tuple[Eagle3Head, torch.Tensor, dict]:
    """(fresh head, target lm_head rows of the draft ids, vocabulary log record) on the CPU; prints the coverage."""
    e3 = cfg.eagle3
    assert e3 is not None
    lm = model.get_output_embeddings().weight.detach().float().cpu()
    dv, record = draft_vocab_for(train_set, lm.shape[0], e3.draft_vocab_size)
    tqdm.write(json.dumps(record))
    head = eagle3_head_from_target(
        target_cfg, model.get_input_embeddings().weight.detach().float().cpu(), lm,
        _final_norm(model).detach().float().cpu(), dv.draft_ids, len(e3.layer_ids or ()), cfg.train.seed,
        e3.lm_head_init,
    )
    return head, lm[dv.draft_ids].contiguous(), record


def train_and_export3(ctx: Context, samples: list[Sample]) -> Path | None:
    """Split (held-out conversations per data.held_out), build the draft vocabulary, train, export (rank 0). None
    when ctx.stop_at ended the run before its last step."""
    cfg, c = ctx.cfg, ctx.compute
    e3 = cfg.eagle3
    assert e3 is not None
    train_set, eval_set = runner.split(samples, cfg)
    head, lm_sub, record = setup3(cfg, ctx.model, ctx.target_cfg, train_set)
    head = head.to(c.device)
    lm_sub = lm_sub.to(c.device, ctx.compute.target_dtype)
    log = train3(cfg, head, lm_sub, train_set, eval_set, Path(cfg.work_dir) / runner.CKPT_DIR, ctx.stop_at,
                 first_log=[record], dist=ctx.dist, compute=c, features=ctx.features)
    if not runner.finished(log, len(train_set), cfg.train):
        return None
    out = Path(cfg.output_dir)
    if ctx.dist.main:
        config = eagle3_config_dict(ctx.target_cfg, e3.draft_vocab_size, list(e3.layer_ids or ()))
        export_eagle3(head, config, out, runner.recipe_files(cfg, log), embedding=cfg.export_embedding)
    ctx.dist.barrier()
    return out
