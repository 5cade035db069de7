"""Fine-tune the served EAGLE-3 head on refresh data with the trainer's own loop (training/eagle3_train.py train3:
the TTT loss, AdamW, checkpoints that resume), one epoch at a time, keeping the epoch whose held-out greedy chain
acceptance (eval chain_tau on the held-out captured requests) is best and stopping after `patience` epochs without
a better one. The draft vocabulary (d2t) stays the served head's: the candidate drops into the same deployment."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from tqdm import tqdm

from builders.adaptive_config import RefreshConfig
from training.compute import Compute
from training.config import (
    ComputeConfig,
    DataConfig,
    Eagle3Config,
    FeaturesConfig,
    TrainConfig,
    TrainHeadConfig,
)
from training.eagle3_model import NON_LLAMA_KEYS, Eagle3Head, eagle3_config_dict, eagle3_head_from_target
from training.runner import CKPT_DIR, Sample
from training.shards import atomic_save

BEST = "best.pt"


def compute_config(threads: int) -> ComputeConfig:
    """The refresh's compute: the GPU when there is one, bf16 where the device has it, `threads` CPU threads (0 =
    every usable core: a refresh is an offline job)."""
    return ComputeConfig(device="auto", precision="auto", tf32=False, threads=threads, target_device_map="none")


FEATURES = FeaturesConfig(storage="shards", dtype="bfloat16", batch_tokens=2048)
FEATURE_DTYPE = torch.bfloat16  # = FEATURES.dtype


def load_target(target_dir: Path, c: Compute) -> tuple[Any, Any, Path]:
    """(model, tokenizer, dir): the build's HF target in c.target_dtype on c.device, eval mode. Unlike the trainer's
    loader it needs no chat template: the captured sequences are token ids already."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target_dir)
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=c.target_dtype).to(c.device)
    return model.eval().requires_grad_(False), tok, Path(target_dir)


@dataclass
class Served:
    """The head being refreshed (normalized layout) and what the trainer needs to rebuild it."""

    dir: Path
    layer_ids: list[int]
    draft_ids: torch.Tensor  # target ids of the draft vocabulary, ascending
    config: dict[str, Any]


def read_served(head_dir: Path) -> Served:
    cfg = json.loads((head_dir / "config.json").read_text())
    t = load_file(str(head_dir / "model.safetensors"))
    if "d2t" not in t or "lm_head.weight" not in t:
        from adaptive.publish import RefreshInputError

        raise RefreshInputError(f"{head_dir}: an EAGLE-3 head with its own lm_head and d2t is refreshed; this one "
                                "has none (a full-vocabulary head keeps the target's)")
    n = t["d2t"].numel()
    return Served(head_dir, [int(i) for i in cfg["eagle_aux_hidden_state_layer_ids"]],
                  torch.arange(n) + t["d2t"].long(), cfg)


def load_head(served: Served, model: Any) -> tuple[Eagle3Head, torch.Tensor]:
    """(head with the served weights, target lm_head rows of its draft ids) on the CPU, float32."""
    lm = model.get_output_embeddings().weight.detach().float().cpu()
    cfg = {k: v for k, v in served.config.items() if k not in NON_LLAMA_KEYS and k != "eagle_deploy"}
    head = eagle3_head_from_target(cfg, model.get_input_embeddings().weight.detach().float().cpu(), lm,
                                   model.model.norm.weight.detach().float().cpu(), served.draft_ids,
                                   len(served.layer_ids), 0, "target")
    weights = {k: v.float() if v.is_floating_point() else v for k, v in
               load_file(str(served.dir / "model.safetensors")).items()}
    missing, unexpected = head.load_state_dict(weights, strict=False)
    lost = [k for k in missing if not k.startswith(("embed_tokens.", "rotary."))]
    if lost or unexpected:
        raise ValueError(f"{served.dir}: tensors missing {lost} / unexpected {unexpected} for the trainer's head")
    return head, lm[served.draft_ids].contiguous()


def train_config(rc: RefreshConfig, served: Served, target: Path, work: Path, out: Path, n_train: int,
                 depth: int) -> TrainHeadConfig:
    """The trainer's config for this fine-tune: one evaluation and one checkpoint per epoch."""
    per_epoch = math.ceil(n_train / rc.batch_size)
    return TrainHeadConfig(
        name="refresh", head="eagle3", target=str(target), work_dir=str(work), output_dir=str(out),
        export_embedding=False,
        # not read by the fine-tune (its data are the captured requests); recorded in recipe.yaml as the source
        data=DataConfig(source="file", path=str(work / "train.jsonl"), offset=0, num_conversations=n_train + 1,
                        num_eval=1, held_out="last", turns="first", responses="dataset", max_prompt_tokens=8,
                        max_new_tokens=1, max_seq_len=max(rc.max_seq_len, 16), generate_batch_size=1, shard_size=64),
        features=FEATURES, compute=compute_config(rc.threads),
        train=TrainConfig(seed=rc.seed, epochs=rc.epochs, batch_size=rc.batch_size, lr=rc.lr, betas=(0.9, 0.95),
                          weight_decay=0.0, warmup_steps=min(10, per_epoch), grad_clip_value=0.5, v_weight=0.0,
                          p_weight=1.0, p_loss_positions=48, noise_std=0.0, checkpoint_every=per_epoch,
                          eval_every=per_epoch),
        eagle3=Eagle3Config(draft_vocab_size=int(served.draft_ids.numel()), ttt_steps=3, step_decay=0.8,
                            layer_ids=served.layer_ids, chain_depth=depth, lm_head_init="target"),
    )


def evals(log: list[dict[str, Any]]) -> list[float]:
    """Held-out chain tau after each epoch, from the trainer's log."""
    return [float(r["eval_chain_tau"]) for r in log if "eval_chain_tau" in r]


def finetune(cfg: TrainHeadConfig, head: Eagle3Head, lm_sub: torch.Tensor, train: list[Sample],
             held: list[Sample], compute: Compute, patience: int, seconds: float) -> dict[str, Any]:
    """Train epoch by epoch (resuming from the work directory's checkpoints); the best epoch's weights stay in
    `head`. No epoch after the first starts when the last one's duration would take the fine-tune past `seconds`
    (counted in this process: a resumed run gets its budget again). Returns {before, by_epoch, best_epoch, log,
    stopped, epoch_seconds}: before = the served head's held-out chain tau; stopped = why it ended (epochs,
    patience, budget)."""
    from training.eagle3_train import evaluate3, examples3_of, train3
    from training.runner import cached_features

    work, tc = Path(cfg.work_dir), cfg.train
    per_epoch = math.ceil(len(train) / tc.batch_size)
    before = float(evaluate3(head, lm_sub, examples3_of(held, cached_features), cfg, compute)["chain_tau"])
    best_path = work / BEST
    best: dict[str, Any] = torch.load(best_path, weights_only=True) if best_path.is_file() else {
        "epoch": 0, "chain_tau": before, "head": {k: v.clone() for k, v in head.state_dict().items()}}
    log: list[dict[str, Any]] = []
    t0, stopped = time.monotonic(), "epochs"
    took: list[float] = []
    for epoch in tqdm(range(1, tc.epochs + 1), desc="refresh epochs", unit="epoch"):
        if took and time.monotonic() - t0 + took[-1] > seconds:
            stopped = "budget"
            break
        start = time.monotonic()
        log = train3(cfg, head, lm_sub, train, held, work / CKPT_DIR, stop_at=epoch * per_epoch, compute=compute)
        by_epoch = evals(log)
        if len(by_epoch) >= epoch and by_epoch[epoch - 1] > best["chain_tau"]:
            best = {"epoch": epoch, "chain_tau": by_epoch[epoch - 1],
                    "head": {k: v.clone() for k, v in head.state_dict().items()}}
            atomic_save(best, best_path)
        took.append(time.monotonic() - start)
        if epoch - best["epoch"] >= patience:
            stopped = "patience"
            break
    head.load_state_dict(best["head"])
    return {"before": before, "by_epoch": evals(log), "best_epoch": best["epoch"], "log": log, "stopped": stopped,
            "epoch_seconds": [round(t, 1) for t in took]}


def export(head: Eagle3Head, cfg: TrainHeadConfig, target_cfg: dict[str, Any], out: Path,
           log: list[dict[str, Any]]) -> Path:
    """The candidate in the trainer's export layout (what draft.model takes), with its recipe and log."""
    from training.eagle3_train import export_eagle3
    from training.runner import recipe_files

    assert cfg.eagle3 is not None and cfg.eagle3.layer_ids is not None  # the served head's layers (finetune_config)
    config = eagle3_config_dict(target_cfg, cfg.eagle3.draft_vocab_size, cfg.eagle3.layer_ids)
    build_dir = out.parent.parent.parent  # BUILD/refresh/<run>/head
    files = recipe_files(cfg, log, "python adaptive/refresh.py --build BUILD", build_dir, "the build directory BUILD")
    return export_eagle3(head, config, out, files, embedding=False)
