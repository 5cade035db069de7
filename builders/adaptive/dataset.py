"""Refresh data: the captured requests, split by request into train and held-out, their target features (the
sequences are the target's own outputs: one forward each, no generation), and a share of the head's original
training conversations against forgetting. Features are cached in feature shards under the run's work directory
(training/features.py), so an interrupted refresh resumes without recomputing them."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from training.features import FeatureSpec, check_shard, load_features, pack, sequence_features
from training.runner import Sample
from training.shards import atomic_save
from triton_repo.models.capture import read_records

MIN_REQUESTS = 4  # fewer usable captured requests: nothing to learn from or hold out (exit 2)
SHARD = 32  # sequences per feature shard (the unit of resume)


class RefreshInputError(ValueError):
    """The build, its store or its head cannot be refreshed (exit 2); the message says what to do."""


@dataclass(frozen=True)
class Captured:
    id: str
    prompt_ids: list[int]
    output_ids: list[int]
    greedy: bool
    raw: dict[str, Any]


def usable(rec: dict[str, Any]) -> Captured | None:
    try:
        prompt, out = [int(t) for t in rec["prompt_ids"]], [int(t) for t in rec["output_ids"]]
        greedy = float(rec.get("sampling", {}).get("temperature", 0.0)) == 0.0
        return Captured(str(rec["id"]), prompt, out, greedy, rec) if prompt and len(out) >= 2 else None
    except (KeyError, TypeError, ValueError):
        return None


def load_captured(store: Path, limit: int) -> list[Captured]:
    """The newest `limit` usable records (at least two output tokens), one per id, oldest first."""
    if not store.is_dir():
        raise RefreshInputError(f"capture store {store} does not exist: enable capture (capture.enabled: true), "
                                "rebuild, serve traffic, then refresh")
    seen: dict[str, Captured] = {}
    for rec in read_records(store):
        c = usable(rec)
        if c is not None:
            seen[c.id] = c
    got = list(seen.values())[-limit:]
    if len(got) < MIN_REQUESTS:
        raise RefreshInputError(f"capture store {store} holds {len(got)} usable requests (with >= 2 output tokens); "
                                f"a refresh needs at least {MIN_REQUESTS}: serve more traffic first")
    return got


def split(records: list[Captured], held_out_fraction: float, seed: int) -> tuple[list[Captured], list[Captured]]:
    """(train, held-out) by request: ordered by a hash of (seed, id), the first round(n * fraction) held out (at
    least one, and at least one left to train on). The same store and seed always give the same split."""
    def key(c: Captured) -> str:
        return hashlib.sha256(f"{seed}:{c.id}".encode()).hexdigest()

    ordered = sorted(records, key=key)
    k = min(len(records) - 1, max(1, round(len(records) * held_out_fraction)))
    held = {c.id for c in ordered[:k]}
    return [c for c in records if c.id not in held], [c for c in records if c.id in held]


def write_jsonl(path: Path, records: list[Captured]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(c.raw) + "\n" for c in records))
    tmp.replace(path)


def read_jsonl(path: Path) -> list[Captured]:
    out = []
    for line in path.read_text().splitlines():
        c = usable(json.loads(line)) if line.strip() else None
        if c is not None:
            out.append(c)
    return out


def captured_sequence(c: Captured, max_seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, loss mask): prompt + output cut to max_seq_len; the loss on the output tokens (what the head drafts)."""
    ids = (c.prompt_ids + c.output_ids)[:max_seq_len]
    mask = [False] * len(c.prompt_ids) + [True] * len(c.output_ids)
    return torch.tensor(ids, dtype=torch.int32), torch.tensor(mask[:max_seq_len], dtype=torch.bool)


def original_sequences(recipe: Path, tok: Any, n: int, max_seq_len: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The first `n` training conversations of the head's own recipe (its `data` section, ShareGPT's answers:
    regenerating answers would be new generation), as (ids, loss mask)."""
    import yaml

    from training.config import DataConfig
    from training.data import dataset_example, select_conversations

    if n == 0:
        return []
    if not recipe.is_file():
        raise RefreshInputError(f"{recipe} not found: the head does not say which data it was trained on; set "
                                "refresh.original_share: 0 (captured traffic only) or give the head its recipe.yaml")
    data = dict(yaml.safe_load(recipe.read_text())["config"]["data"])
    first = data.get("held_out") == "first"
    data.update(responses="dataset", offset=int(data["offset"]) + (int(data["num_eval"]) if first else 0),
                num_conversations=max(2, n), num_eval=1, held_out="last", turns="first")
    convs = select_conversations(tok, DataConfig.model_validate(data))[:n]
    return [dataset_example(tok, c, max_seq_len) for c in convs]


def feature_samples(model: Any, seqs: list[tuple[torch.Tensor, torch.Tensor]], spec: FeatureSpec, work: Path,
                    name: str, batch_tokens: int) -> list[Sample]:
    """Samples with their features, computed in shards of SHARD sequences under `work` (reused when present)."""
    work.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in tqdm(range(0, len(seqs), SHARD), desc=f"features ({name})", unit="shard"):
        p = work / f"{name}-{i // SHARD:05d}.pt"
        part = seqs[i:i + SHARD]
        if p.is_file():
            check_shard(p, spec)
        else:
            rows = sequence_features(model, [ids for ids, _ in part], spec, batch_tokens)
            atomic_save(pack(rows, spec, name), p)
        paths.append(p)
    feats = list(load_features(paths, spec))
    if len(feats) != len(seqs):
        raise RefreshInputError(f"{work} holds features of {len(feats)} sequences, not {len(seqs)}: delete it")
    return [Sample(ids, mask, f) for (ids, mask), f in zip(seqs, feats)]


def aux_of(samples: list[Sample]) -> list[torch.Tensor]:
    """The captured target layer inputs of each sample (its cached EAGLE-3 features)."""
    out = []
    for s in samples:
        if s.features is None or "aux" not in s.features:
            raise RefreshInputError("a refresh sample without its EAGLE-3 features (aux): delete the run's work/")
        out.append(s.features["aux"])
    return out
