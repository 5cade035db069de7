"""Training on your own conversations: `data.source: file` + `data.path` (JSON array or JSON Lines, optionally .gz,
ShareGPT `from`/`value` turns or chat `role`/`content` turns), through the real CLI on the tiny target."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from builders.config import ConfigError
from training import data as tdata
from training.config import load_train_config

REPO = Path(__file__).resolve().parent.parent


def items(n: int, chat_style: bool = False) -> list[dict]:
    def turn(who: str, text: str) -> dict:
        if chat_style:
            return {"role": {"human": "user", "gpt": "assistant"}[who], "content": text}
        return {"from": who, "value": text}

    return [{"id": f"c{i}", "conversations": [turn("human", f"Question {i}: name a colour."),
                                              turn("gpt", f"Answer {i}: blue.")]} for i in range(n)]


def write(path: Path, rows: list[dict], jsonl: bool) -> Path:
    text = "".join(json.dumps(r) + "\n" for r in rows) if jsonl else json.dumps(rows)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def recipe(tmp: Path, target: Path, data_path: str | None, **data) -> Path:
    raw = yaml.safe_load((REPO / "configs/train/smollm2-eagle.yaml").read_text())
    raw.update(target=str(target), work_dir="work", output_dir="head")
    raw["data"].update(num_conversations=6, num_eval=2, max_prompt_tokens=48, max_seq_len=64, shard_size=4,
                       max_new_tokens=6, generate_batch_size=4, source="file", **data)
    if data_path is not None:
        raw["data"]["path"] = data_path
    raw["train"].update(epochs=1, batch_size=2, warmup_steps=1, checkpoint_every=100, eval_every=100)
    raw["compute"].update(device="cpu", threads=1)
    f = tmp / "recipe.yaml"
    f.write_text(yaml.safe_dump(raw))
    return f


@pytest.mark.parametrize("name,jsonl,chat_style", [("c.json", False, False), ("c.jsonl", True, True),
                                                   ("c.jsonl.gz", True, False), ("c.json.gz", False, True)])
def test_every_file_layout_reads_the_same_conversations(tmp_path: Path, name: str, jsonl: bool,
                                                         chat_style: bool) -> None:
    f = write(tmp_path / name, items(3, chat_style), jsonl)
    convs = list(tdata.sharegpt_conversations(f, "first"))
    assert [c.id for c in convs] == ["c0", "c1", "c2"]
    assert convs[1].messages == [{"role": "user", "content": "Question 1: name a colour."},
                                 {"role": "assistant", "content": "Answer 1: blue."}]


def test_config_rules_and_relative_path(tmp_path: Path, tiny_target: Path) -> None:
    write(tmp_path / "mine.jsonl", items(8), True)
    cfg = load_train_config(recipe(tmp_path, tiny_target, "mine.jsonl"))
    assert cfg.data.path == str(tmp_path / "mine.jsonl")  # relative to the config file, like work_dir
    with pytest.raises(ConfigError, match=r"data.source=file needs data.path"):
        load_train_config(recipe(tmp_path, tiny_target, None))
    with pytest.raises(ConfigError, match=r"data.path='.*mine.jsonl' is only read with data.source=file; set data."
                                          r"source: file or remove"):
        load_train_config(recipe(tmp_path, tiny_target, "mine.jsonl"), ["data.source=sharegpt"])


def test_missing_file_says_what_to_fix(tmp_path: Path, tiny_target: Path) -> None:
    cfg = load_train_config(recipe(tmp_path, tiny_target, "absent.jsonl"))
    with pytest.raises(tdata.DataError, match=r"data.path .*absent.jsonl: no such file; point it at a ShareGPT"):
        tdata.conversations_file(cfg.data)


def test_cli_trains_on_the_file_and_refuses_its_cache_once_the_file_changes(tmp_path: Path,
                                                                            tiny_target: Path) -> None:
    data = write(tmp_path / "mine.jsonl.gz", items(8, chat_style=True), True)
    config = recipe(tmp_path, tiny_target, "mine.jsonl.gz", responses="regenerate")
    cmd = [sys.executable, str(REPO / "training/train_head.py"), str(config)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "head" / "model.safetensors").is_file()
    key = json.loads((tmp_path / "work" / "data" / "key.json").read_text())
    assert key["data"]["source"] == "file" and key["data"]["path"] == str(data)
    assert len(key["file_sha256"]) == 64
    shard = __import__("torch").load(tmp_path / "work" / "data" / "shard-00000.pt", weights_only=True)
    assert shard["ids"] == ["c0", "c1", "c2", "c3"]
    write(data, items(8, chat_style=True)[::-1], True)  # same path, other conversations
    again = subprocess.run(cmd + ["--until", "data"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert again.returncode != 0
    assert "holds shards made with other data settings or another target" in again.stderr


def test_sharegpt_cache_key_is_unchanged_by_the_new_field() -> None:
    """Shards cached before data.path existed (key without `path`) stay valid for source=sharegpt."""
    cfg = load_train_config(REPO / "configs/train/smollm2-eagle.yaml")
    assert "path" not in tdata.data_key(cfg.data)
    assert tdata.data_key(cfg.data)["source"] == "sharegpt"
