"""Target features for EAGLE-1/2: the target's LAST hidden state AFTER its final RMSNorm, one per token.

That is `model.model(input_ids).last_hidden_state` in HF (SafeAILab/EAGLE ge_data: `outs.hidden_states[-1]`, which
HF Llama returns after `model.norm`). They are computed once per data shard, one sequence at a time (no padding, so
each feature is exactly what the target computes at inference), and cached as float16 (`<work_dir>/features/`).
"""

from __future__ import annotations

from pathlib import Path

import torch
from tqdm import tqdm

from builders.training.data import atomic_save, shard_path


@torch.no_grad()
def target_features(model, input_ids: torch.Tensor) -> torch.Tensor:
    """[T] token ids -> [T, H] post-norm last hidden states (float32)."""
    out = model.model(input_ids=input_ids.long()[None, :])
    return out.last_hidden_state[0].float()


def build_features(model, data_shards: list[Path], work_dir: Path) -> list[Path]:
    """Write (or reuse) one feature shard per data shard; returns their paths in order."""
    paths = []
    for i, data_path in enumerate(tqdm(data_shards, desc="feature shards", unit="shard")):
        path = shard_path(work_dir, "features", i)
        paths.append(path)
        if path.is_file():
            continue
        data = torch.load(data_path, weights_only=True)
        hidden = [target_features(model, ids).half() for ids in data["input_ids"]]
        atomic_save({"hidden": hidden}, path)
    return paths


def load_features(paths: list[Path]) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for p in paths:
        out += torch.load(p, weights_only=True)["hidden"]
    return out
