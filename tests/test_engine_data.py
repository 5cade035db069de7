"""Prompt sources (sources/data.py): MT-bench questions and ShareGPT conversations from their pip distributions,
JSONL prompt files, chat templating."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sources.data import (
    DataSourceError,
    chat_ids,
    distribution_file,
    iter_sharegpt,
    mtbench_questions,
    read_prompts,
    sharegpt_prompts,
)


def test_mtbench_has_80_questions_with_two_turns() -> None:
    qs = mtbench_questions()
    assert len(qs) == 80
    assert qs[0].question_id == 81 and qs[0].category == "writing"
    assert all(len(q.turns) == 2 for q in qs)
    assert [q.question_id for q in mtbench_questions(limit=3)] == [81, 82, 83]


def test_missing_distribution_says_what_to_install() -> None:
    with pytest.raises(DataSourceError, match="pip distribution 'no-such-dist-xyz' is not installed"):
        distribution_file("no-such-dist-xyz", "x.json")


def test_sharegpt_streams_a_truncated_array(tmp_path: Path) -> None:
    convs = [{"id": str(i), "conversations": [{"from": "human", "value": f"q{i} [x], {{y}}"}]} for i in range(5)]
    text = json.dumps(convs, indent=2)
    cut = text[: text.index('"id": "4"') + 12]  # mid-object, like the shipped file
    f = tmp_path / "sg.json"
    f.write_text(cut)
    with pytest.raises(ValueError):
        json.loads(cut)
    got = list(iter_sharegpt(f, chunk_chars=7))  # tiny chunks: objects straddle reads
    assert [c["id"] for c in got] == ["0", "1", "2", "3"]
    assert sharegpt_prompts(2, f) == ["q0 [x], {y}", "q1 [x], {y}"]


def test_shipped_sharegpt_file() -> None:
    prompts = sharegpt_prompts(3)
    assert len(prompts) == 3 and prompts[0].startswith("Summarize the main ideas of Jeff Walker")


def test_read_prompts_jsonl(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a"}\n\n{"turns": ["b", "c"]}\n{"prompt": "d"}\n')
    assert read_prompts(f) == ["a", "b", "d"]
    assert read_prompts(f, limit=2) == ["a", "b"]
    f.write_text('{"prompt": "a"}\n{"text": "x"}\n')
    with pytest.raises(DataSourceError, match="line 2 has neither a string `prompt` nor a non-empty `turns`"):
        read_prompts(f)


def test_chat_ids_apply_the_template(tiny_target: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_target))
    ids = chat_ids(tok, "Hello world!")
    assert tok.decode(ids) == "<|im_start|>user\nHello world!<|im_end|>\n<|im_start|>assistant\n"
