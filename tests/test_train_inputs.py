"""The trainer's bad inputs and damaged state: data that is not UTF-8, a directory or FIFO as data.path, a truncated
or garbage latest checkpoint (resumed from the one before, with a warning), temporary files of killed saves
(removed when their process is gone)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from tests.test_train import fresh_head, tiny_cfg, tiny_run  # noqa: F401  (tiny_run: the module's fixture)
from training import data as tdata
from training.loop import train
from training.shards import remove_stale_temps

ITEMS = [{"id": "0", "conversations": [{"from": "human", "value": "caf\u00e9?"}, {"from": "gpt", "value": "oui"}]}]


def _data_cfg(tmp: Path, target: Path, path: Path) -> tdata.DataConfig:
    return tiny_cfg(tmp, target).data.model_copy(update={"source": "file", "path": str(path), "offset": 0,
                                                         "num_conversations": 1})


@pytest.mark.parametrize("name", ["latin1.json", "latin1.jsonl", "latin1.json.gz", "utf16.json"])
def test_data_that_is_not_utf8_is_a_clear_error(name: str, tmp_path: Path, tiny_target: Path) -> None:
    text = json.dumps(ITEMS, ensure_ascii=False) if ".jsonl" not in name else json.dumps(ITEMS[0], ensure_ascii=False)
    raw = text.encode("utf-16") if name.startswith("utf16") else text.encode("latin-1")
    path = tmp_path / name
    path.write_bytes(gzip.compress(raw) if name.endswith(".gz") else raw)
    tok = AutoTokenizer.from_pretrained(tiny_target)
    with pytest.raises(tdata.DataError, match=r"not UTF-8 text .* convert it \(e.g. iconv -t UTF-8\)"):
        tdata.select_conversations(tok, _data_cfg(tmp_path, tiny_target, path))


def test_a_gz_file_that_is_not_gzip_is_a_clear_error(tmp_path: Path, tiny_target: Path) -> None:
    path = tmp_path / "fake.json.gz"
    path.write_text(json.dumps(ITEMS))
    tok = AutoTokenizer.from_pretrained(tiny_target)
    with pytest.raises(tdata.DataError, match=r"fake.json.gz: cannot be read \(BadGzipFile"):
        tdata.select_conversations(tok, _data_cfg(tmp_path, tiny_target, path))


def test_a_directory_fifo_or_missing_data_path_is_named(tmp_path: Path, tiny_target: Path) -> None:
    (tmp_path / "dir.json").mkdir()
    os.mkfifo(tmp_path / "fifo.json")
    for name, says in (("dir.json", "is a directory; give a regular file"),
                       ("fifo.json", r"is a FIFO \(named pipe\); give a regular file"),
                       ("missing.json", "no such file")):
        with pytest.raises(tdata.DataError, match=f"data.path {tmp_path / name}: {says}; point it at a ShareGPT"):
            tdata.conversations_file(_data_cfg(tmp_path, tiny_target, tmp_path / name))


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_temporary_files_of_killed_saves_are_removed_and_live_ones_kept(tmp_path: Path) -> None:
    dead, live = tmp_path / f"step-0000004.pt.tmp-{_dead_pid()}", tmp_path / f"step-0000005.pt.tmp-{os.getpid()}"
    other = tmp_path / "notes.tmp-x"
    for p in (dead, live, other):
        p.write_bytes(b"\0" * 1024)
    assert remove_stale_temps(tmp_path) == [dead]
    assert not dead.exists() and live.exists() and other.exists()


@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage", "both"])
def test_a_damaged_latest_checkpoint_falls_back_to_the_one_before(damage: str, tiny_run, tiny_target: Path,  # noqa: F811
                                                                  tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Interrupted after step 3 (checkpoints 2 and 3), the newest damaged: the rerun warns, resumes from step 2 and
    ends where the uninterrupted run ends, bitwise; with both damaged it starts over. A killed save's temporary file
    is removed on the way."""
    cfg, model, _, examples = tiny_run
    lm = model.get_output_embeddings().weight.detach()
    straight = fresh_head(cfg, model, tiny_target)
    train(cfg, straight, lm, examples[:-2], examples[-2:], tmp_path / "a")
    ckpt = tmp_path / "b"
    train(cfg, fresh_head(cfg, model, tiny_target), lm, examples[:-2], examples[-2:], ckpt, stop_at=3)
    newest, before = ckpt / "step-0000003.pt", ckpt / "step-0000002.pt"
    for p in ([newest, before] if damage == "both" else [newest]):
        data = p.read_bytes()
        p.write_bytes({"truncated": data[: len(data) // 2], "empty": b"", "garbage": os.urandom(4096),
                       "both": data[:100]}[damage])
    stale = ckpt / f"step-0000004.pt.tmp-{_dead_pid()}"
    stale.write_bytes(b"\0" * 4096)
    capsys.readouterr()
    resumed = fresh_head(cfg, model, tiny_target)
    log = train(cfg, resumed, lm, examples[:-2], examples[-2:], ckpt)
    err = capsys.readouterr().err
    assert f"warning: removed {stale}, left by a save that was killed midway" in err and not stale.exists()
    assert f"warning: checkpoint {newest} does not load" in err and "resuming from the one before it" in err
    steps = [r["step"] for r in log if "loss" in r]
    assert steps == list(range(1, 7))  # resumed at 2 (log of steps 1-2 kept) or started over: the whole log
    for (k, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), k
