"""Serving targets beyond Llama: stop tokens from generation_config.json, the chat template's thinking switch in the
clients, and (server) a tiny Qwen3 target with an EAGLE-3 head trained by builders/train_head.py, built for the
current line on the reference backend, served by the llmapi model on the real CPU Triton server, answering exactly
what transformers' greedy `generate` answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clients import generate
from engines.stops import StopTokenError, generation_eos_ids, stop_token_ids
from tests.tiny_families import make_family_target


@pytest.fixture(scope="module")
def qwen3_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_family_target(tmp_path_factory.mktemp("q3") / "target", "qwen3", layers=4, block_scale=0.3)


def test_stop_tokens_are_the_tokenizers_eos_and_generation_configs(qwen3_target: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(qwen3_target))
    assert tok.eos_token_id == 2 and json.loads((qwen3_target / "generation_config.json").read_text())[
        "eos_token_id"] == [2, 0]
    assert stop_token_ids(tok) == [2, 0]
    for value, want in ((7, [7]), ([7, 8], [7, 8]), (None, [])):
        d = tmp_path / f"g{want}"
        d.mkdir()
        (d / "generation_config.json").write_text(json.dumps({"eos_token_id": value}))
        assert generation_eos_ids(d) == want
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "generation_config.json").write_text(json.dumps({"eos_token_id": "<|im_end|>"}))
    with pytest.raises(StopTokenError, match="eos_token_id='<|im_end|>' must be an int or a list of ints"):
        generation_eos_ids(tmp_path / "bad")
    assert generation_eos_ids(tmp_path / "none") == []


def test_chat_thinking_switch(qwen3_target: Path, tiny_target: Path, capsys: pytest.CaptureFixture) -> None:
    off = generate.chat_prompt(str(qwen3_target), "Hi", "off")
    on = generate.chat_prompt(str(qwen3_target), "Hi", "on")
    default = generate.chat_prompt(str(qwen3_target), "Hi")
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") and "<think>" not in on and on == default
    with pytest.raises(ValueError, match="has no `enable_thinking` switch"):
        generate.chat_prompt(str(tiny_target), "Hi", "off")
    assert generate.main(["--prompt", "Hi", "--thinking", "off", "--url", "127.0.0.1:1"]) == 2
    assert "--thinking switches the chat template's reasoning: add --chat" in capsys.readouterr().err
