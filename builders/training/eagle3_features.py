"""Target features for EAGLE-3, one row per token, cached per data shard in `<work_dir>/eagle3_features/`.

  aux     [T, n*H]  the INPUTS of the target decoder layers at `layer_ids`, concatenated in that order (id j = the
                    residual stream entering layer j, 0 = the embeddings): what the reference engine captures
                    (engines/model.py Llama.forward) and SafeAILab's EAGLE-3 fc fuses.
  hidden  [T, H]    the post-norm last hidden state: the target's logits restricted to the draft vocabulary are
                    hidden @ lm_head[draft_ids].T (cheap), so the distributions are not stored.
  greedy  [T]       argmax of the target's FULL logits at each position (the target's greedy next token), for the
                    SafeAILab position mask (train only where that token is in the draft vocabulary) and accuracy.

Captured by forward pre-hooks on the decoder layers, so "input of layer j" holds whatever HF's hidden_states tuple
convention is. One sequence at a time (no padding), float16 (checked finite), written atomically: the unit of
resume; a shard written for other layer ids is refused.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tqdm import tqdm

from builders.training.data import atomic_save, shard_path

KIND = "eagle3_features"


class FeatureError(RuntimeError):
    """Cached features do not fit the config; the message says what to delete."""


@torch.no_grad()
def eagle3_target_features(model, input_ids: torch.Tensor, layer_ids: list[int]) -> dict[str, torch.Tensor]:
    """[T] token ids -> {"aux" [T, n*H], "hidden" [T, H], "greedy" [T]} in float32/int64 (see module docstring)."""
    layers = model.model.layers
    got: dict[int, torch.Tensor] = {}

    def grab(j: int):
        def hook(_mod, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            got[j] = x[0].float()

        return hook

    handles = [layers[j].register_forward_pre_hook(grab(j), with_kwargs=True) for j in layer_ids]
    try:
        hidden = model.model(input_ids=input_ids.long()[None, :]).last_hidden_state[0].float()
    finally:
        for h in handles:
            h.remove()
    greedy = (hidden @ model.get_output_embeddings().weight.float().T).argmax(-1)
    return {"aux": torch.cat([got[j] for j in layer_ids], dim=-1), "hidden": hidden, "greedy": greedy}


def _half(x: torch.Tensor, what: str) -> torch.Tensor:
    h = x.half()
    if not bool(torch.isfinite(h).all()):
        raise FeatureError(f"{what} overflows float16 (max |x| = {x.abs().max().item():.4g})")
    return h


def build_eagle3_features(model, data_shards: list[Path], work_dir: Path, layer_ids: list[int]) -> list[Path]:
    """Write (or reuse) one EAGLE-3 feature shard per data shard; returns their paths in order."""
    n_layers = len(model.model.layers)
    bad = [j for j in layer_ids if not 0 <= j < n_layers]
    if bad:
        raise FeatureError(f"eagle3.layer_ids {bad} are outside 0..{n_layers - 1} (the target's decoder layers)")
    paths = []
    for i, data_path in enumerate(tqdm(data_shards, desc="eagle3 feature shards", unit="shard")):
        path = shard_path(work_dir, KIND, i)
        paths.append(path)
        if path.is_file():
            continue
        data = torch.load(data_path, weights_only=True)
        rows = [eagle3_target_features(model, ids, layer_ids) for ids in data["input_ids"]]
        atomic_save({
            "layer_ids": list(layer_ids),
            "aux": [_half(r["aux"], f"{data_path}: captured layer inputs") for r in rows],
            "hidden": [_half(r["hidden"], f"{data_path}: last hidden state") for r in rows],
            "greedy": [r["greedy"].to(torch.int32) for r in rows],
        }, path)
    return paths


def load_eagle3_features(paths: list[Path], layer_ids: list[int]) -> list[dict[str, torch.Tensor]]:
    out: list[dict[str, torch.Tensor]] = []
    for p in paths:
        d = torch.load(p, weights_only=True)
        if d["layer_ids"] != list(layer_ids):
            raise FeatureError(f"{p} holds layers {d['layer_ids']} but eagle3.layer_ids={layer_ids}; delete "
                               f"{p.parent} to recompute")
        out += [{"aux": a, "hidden": h, "greedy": g} for a, h, g in zip(d["aux"], d["hidden"], d["greedy"])]
    return out
