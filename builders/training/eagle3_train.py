"""EAGLE-3 training driver: draft vocabulary, deterministic resumable loop, held-out eval, HF-style export.

The machinery is the EAGLE-1 loop's (builders/training/loop.py): the batch order of epoch e from (seed, e), the
position subsets of step s from (seed, s), AdamW, gradient value clipping, linear warmup/decay, checkpoints every
`checkpoint_every` steps (the last two kept) that resume bitwise, train_log.jsonl. The loss is eagle3_loop.py's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from tqdm import tqdm

from builders.training.config import TrainHeadConfig
from builders.training.data import load_shards
from builders.training.eagle3_features import load_eagle3_features
from builders.training.eagle3_loop import Example3, chain_accept3, collate3, eagle3_loss
from builders.training.eagle3_model import (
    Eagle3Head,
    eagle3_config_dict,
    eagle3_head_from_target,
    eagle3_state_dict,
)
from builders.training.eagle3_vocab import DraftVocab, answer_token_counts, build_draft_vocab, coverage_table
from builders.training.loop import CKPT_DIR, TrainError, run_training, step_generator, trajectory_key

COVERAGE_SIZES = [1024, 2048, 4096, 8192, 16384, 32000]


def make_examples3(data_shards: list[Path], feat_shards: list[Path], layer_ids: list[int]) -> list[Example3]:
    data = load_shards(data_shards)
    feats = load_eagle3_features(feat_shards, layer_ids)
    if len(data) != len(feats):
        raise TrainError(f"{len(data)} data examples but {len(feats)} feature rows; delete work_dir/eagle3_features")
    return [Example3(f["aux"], f["hidden"], f["greedy"], d["input_ids"], d["loss_mask"]) for d, f in zip(data, feats)]


def draft_vocab_for(train_set: list[Example3], vocab_size: int, size: int) -> tuple[DraftVocab, dict]:
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
    return {**trajectory_key(cfg), "head": "eagle3", "eagle3": e3}


def train3(
    cfg: TrainHeadConfig, head: Eagle3Head, lm_sub: torch.Tensor, train_set: list[Example3],
    eval_set: list[Example3], ckpt_dir: Path, stop_at: int | None = None, first_log: list[dict] | None = None,
) -> list[dict]:
    """Train an EAGLE-3 head in place (loop.run_training); `first_log` starts a fresh log (the vocabulary
    record). Returns the metrics log."""
    tc, e3 = cfg.train, cfg.eagle3
    assert e3 is not None

    def step_loss(step: int, idx: list[int]) -> tuple[torch.Tensor, dict[str, float]]:
        batch = collate3([train_set[i] for i in idx], e3.ttt_steps)
        return eagle3_loss(head, lm_sub, batch, e3.ttt_steps, e3.step_decay, tc, step_generator(tc, step))

    return run_training(
        cfg, head, trajectory_key3(cfg), len(train_set), step_loss, lambda: evaluate3(head, lm_sub, eval_set, cfg),
        ckpt_dir, desc="train eagle3", progress=("acc0", "acc_0"), stop_at=stop_at, first_log=first_log,
    )  # fmt: skip


@torch.no_grad()
def evaluate3(head: Eagle3Head, lm_sub: torch.Tensor, examples: list[Example3], cfg: TrainHeadConfig) -> dict:
    """Held-out teacher-forced TTT losses/accuracies (all positions) and the greedy chain acceptance estimate."""
    e3 = cfg.eagle3
    assert e3 is not None
    head.eval()
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for i in range(0, len(examples), cfg.train.batch_size):
        batch = collate3(examples[i : i + cfg.train.batch_size], e3.ttt_steps)
        _, m = eagle3_loss(head, lm_sub, batch, e3.ttt_steps, e3.step_decay, cfg.train)
        for k in range(e3.ttt_steps):
            n = m[f"tokens_{k}"]
            for name in (f"ploss_{k}", f"acc_{k}"):
                sums[name] = sums.get(name, 0.0) + m[name] * n
                counts[name] = counts.get(name, 0) + n
    out = {k: v / max(counts[k], 1) for k, v in sums.items()}
    out.update(chain_accept3(head, examples, e3.chain_depth))
    return out


def export_eagle3(head: Eagle3Head, config: dict, out_dir: Path, extra_files: dict[str, str], *, embedding: bool) -> Path:
    """config.json + fp16 model.safetensors (+ extra files) written to a temporary dir, then renamed into place;
    a hand-written MODEL_CARD.md already there survives."""
    from safetensors.torch import save_file

    tmp = out_dir.with_name(out_dir.name + ".tmp-export")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(eagle3_state_dict(head, torch.float16, embedding=embedding), str(tmp / "model.safetensors"),
              metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(dict(config, torch_dtype="float16"), indent=2) + "\n")
    for name, text in extra_files.items():
        (tmp / name).write_text(text)
    keep = out_dir / "MODEL_CARD.md"
    if keep.is_file():
        shutil.copy2(keep, tmp / keep.name)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    return out_dir


def setup3(cfg: TrainHeadConfig, model, target_cfg: dict, train_set: list[Example3]) -> tuple[Eagle3Head, torch.Tensor, dict]:
    """(fresh head, target lm_head rows of the draft ids, vocabulary log record); prints the coverage."""
    e3 = cfg.eagle3
    assert e3 is not None
    lm = model.get_output_embeddings().weight.detach().float()
    dv, record = draft_vocab_for(train_set, lm.shape[0], e3.draft_vocab_size)
    tqdm.write(json.dumps(record))
    head = eagle3_head_from_target(
        target_cfg, model.get_input_embeddings().weight.detach(), lm, model.model.norm.weight.detach().float(),
        dv.draft_ids, len(e3.layer_ids), cfg.train.seed, e3.lm_head_init,
    )
    return head, lm[dv.draft_ids].contiguous(), record


def train_and_export3(cfg: TrainHeadConfig, model, target_dir: Path, data_shards: list[Path], feat_shards: list[Path]) -> Path:
    """Split (last num_eval conversations held out), build the draft vocabulary, train, export."""
    import yaml

    e3 = cfg.eagle3
    assert e3 is not None
    examples = make_examples3(data_shards, feat_shards, e3.layer_ids)
    train_set, eval_set = examples[: -cfg.data.num_eval], examples[-cfg.data.num_eval :]
    target_cfg = json.loads((target_dir / "config.json").read_text())
    head, lm_sub, record = setup3(cfg, model, target_cfg, train_set)
    log = train3(cfg, head, lm_sub, train_set, eval_set, Path(cfg.work_dir) / CKPT_DIR, first_log=[record])
    recipe = yaml.safe_dump({"command": "python builders/train_head.py CONFIG", "config": cfg.model_dump(mode="json")},
                            sort_keys=False)
    metrics = "".join(json.dumps(r) + "\n" for r in log)
    config = eagle3_config_dict(target_cfg, e3.draft_vocab_size, e3.layer_ids)
    return export_eagle3(head, config, Path(cfg.output_dir), {"recipe.yaml": recipe, "train_log.jsonl": metrics},
                         embedding=cfg.export_embedding)
