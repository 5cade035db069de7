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
from adaptive.publish import RefreshInputError
from triton_repo.models.capture import read_records

MIN_REQUESTS = 4  # fewer usable captured requests: nothing to learn from or hold out (exit 2)
SHARD = 32  # sequences per feature shard (the unit of resume)


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


NGRAM, SIGNATURE, ROWS, NEAR = 4, 32, 2, 0.5  # token 4-gram shingles, min-hash bands of 2 rows, Jaccard >= 0.5


def _shingles(ids: list[int]) -> frozenset[tuple[int, ...]]:
    return frozenset(tuple(ids[i:i + NGRAM]) for i in range(max(1, len(ids) - NGRAM + 1)))


def _signature(sh: frozenset[tuple[int, ...]]) -> list[int]:
    """Min-hash over the shingles (hashes of int tuples are the same in every Python process)."""
    return [min(hash((k, x)) for x in sh) for k in range(SIGNATURE)]


def prompt_groups(records: list[Captured]) -> list[list[Captured]]:
    """Near-duplicate prompts grouped: the same tokens, or at least NEAR of their token 4-grams shared (candidate
    pairs from min-hash bands, each checked exactly). Groups in the order of their first record."""
    parent = list(range(len(records)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    shingles = [_shingles(c.prompt_ids) for c in records]
    buckets: dict[tuple[int, tuple[int, ...]], list[int]] = {}
    for i, sh in enumerate(shingles):
        sig = _signature(sh)
        for b in range(0, SIGNATURE, ROWS):
            buckets.setdefault((b, tuple(sig[b:b + ROWS])), []).append(i)
    for members in buckets.values():
        for j in members[1:]:
            x, y = shingles[members[0]], shingles[j]
            if find(members[0]) != find(j) and len(x & y) >= NEAR * len(x | y):
                parent[find(j)] = find(members[0])
    groups: dict[int, list[Captured]] = {}
    for i, c in enumerate(records):
        groups.setdefault(find(i), []).append(c)
    return list(groups.values())


def group_cap(sizes: list[int], share: float) -> int:
    """The most records one group may keep so that none is over `share` of the records kept (at least 1)."""
    for c in range(max(sizes, default=1), 0, -1):
        if c <= share * sum(min(n, c) for n in sizes):
            return c
    return 1


def split(records: list[Captured], held_out_fraction: float, seed: int,
          max_group_share: float = 1.0) -> tuple[list[Captured], list[Captured]]:
    """(train, held-out) by content: near-duplicate prompts form one group (prompt_groups), which goes whole to one
    side, so the gate never scores a prompt the candidate trained on. Groups are ordered by a hash of (seed, their
    first id) and held out until round(n * fraction) records are (at least one group, and one left to train on);
    in training a group keeps at most group_cap() records (its newest), so no client steers the fine-tune by
    repeating itself. The same store and seed always give the same split."""
    groups = prompt_groups(records)
    if len(groups) < 2:
        raise RefreshInputError(f"the {len(records)} captured requests are near-duplicates of one prompt: nothing "
                                "to hold out that the candidate did not train on; serve more varied traffic first")

    def key(g: list[Captured]) -> str:
        return hashlib.sha256(f"{seed}:{g[0].id}".encode()).hexdigest()

    want = min(len(records) - 1, max(1, round(len(records) * held_out_fraction)))
    held_groups: list[list[Captured]] = []
    ordered = sorted(groups, key=key)
    for g in ordered[:-1]:
        if sum(len(h) for h in held_groups) >= want:
            break
        held_groups.append(g)
    held_ids = {id(g) for g in held_groups}
    train_groups = [g for g in groups if id(g) not in held_ids]

    def capped(side: list[list[Captured]]) -> list[Captured]:
        cap = group_cap([len(g) for g in side], max_group_share)
        keep = {c.id for g in side for c in g[-cap:]}
        return [c for c in records if c.id in keep]

    return capped(train_groups), [c for g in held_groups for c in g]


REFERENCE_PROMPTS = Path(__file__).resolve().parents[1] / "docker" / "prompts.jsonl"  # shipped with the project
MAX_REFERENCE = 64


def reference_records(path: Path, tok: Any, max_input_len: int) -> list[dict[str, Any]]:
    """The gate's prompts never captured: each line {"prompt": text} (tokenized as the served models do, special
    tokens included) or {"prompt_ids": [...]}; at most MAX_REFERENCE, cut to max_input_len tokens."""
    if not path.is_file():
        raise RefreshInputError(f"refresh.reference_prompts {path} not found: give a JSONL file of prompts "
                                '({"prompt": "..."} per line)')
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
            ids = ([int(t) for t in doc["prompt_ids"]] if "prompt_ids" in doc
                   else list(tok(str(doc["prompt"]))["input_ids"]))
        except (ValueError, TypeError, KeyError) as e:
            raise RefreshInputError(f"{path}:{n}: not a prompt ({type(e).__name__}: {e}); write "
                                    '{"prompt": "..."} or {"prompt_ids": [...]} per line') from None
        if ids:
            out.append({"id": f"reference-{n}", "prompt_ids": ids[:max_input_len], "output_ids": [],
                        "sampling": {"temperature": 0.0}})
    if not out:
        raise RefreshInputError(f"{path} holds no prompt: give at least one")
    return out[:MAX_REFERENCE]


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
