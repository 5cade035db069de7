"""The step profiler's and the vLLM peer benchmark's pure parts: how --trees is read (inline paths hold commas),
each kind of tree it names, vLLM's server command and the peer table's ratios and answer check. The runs themselves
are benchmarks (docs/benchmarks.md), not tests; vLLM is no dependency of the project."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.bench_step import parse_tree, split_trees
from bench.bench_vllm_peer import SYSTEMS, summarize, vllm_argv
from core.trees import DraftTree, DynamicTree, TreeError


@pytest.mark.parametrize(("items", "want"), [
    (["cur=config,[[0],[1],[0,0]],chain-2"], {"cur": ["config", "[[0],[1],[0,0]]", "chain-2"]}),
    (["a=[[0]]", "b=dyn:2:3:6,topk-2-3", "a=chain-1"], {"a": ["[[0]]", "chain-1"], "b": ["dyn:2:3:6", "topk-2-3"]}),
])
def test_trees_split_on_commas_outside_brackets(items: list[str], want: dict[str, list[str]]) -> None:
    assert split_trees(items) == want


def test_each_kind_of_tree(tmp_path: Path) -> None:
    snippet = tmp_path / "fast.yaml"
    snippet.write_text("tree:\n  choices: [[0], [0, 0]]\n")
    assert parse_tree("chain-2", None) == ("chain-2", DraftTree.from_choices([[0], [0, 0]]))  # type: ignore[arg-type]
    assert parse_tree("[[0], [1]]", None) == ("[[0],[1]]", DraftTree.from_choices([[0], [1]]))  # type: ignore[arg-type]
    assert parse_tree("dyn:2:3:6", None) == ("dyn:2:3:6", DynamicTree(2, 3, 6))  # type: ignore[arg-type]
    assert parse_tree(f"file:{snippet}", None) == ("fast", DraftTree.from_choices([[0], [0, 0]]))  # type: ignore[arg-type]
    with pytest.raises(TreeError, match="unknown tree preset 'chain2'"):
        parse_tree("chain2", None)  # type: ignore[arg-type]


@pytest.mark.parametrize("draft_len", [1, 3])
def test_vllm_command_with_and_without_the_head(draft_len: int) -> None:
    on = vllm_argv("py", Path("/t"), 8000, Path("/h"), draft_len, 1024, "float32")
    off = vllm_argv("py", Path("/t"), 8001, None, draft_len, 1024, "float32")
    assert on[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"] and "--speculative-config" not in off
    spec = json.loads(on[on.index("--speculative-config") + 1])
    assert spec == {"method": "eagle3", "model": "/h", "num_speculative_tokens": draft_len}
    assert on[on.index("--port") + 1] == "8000" and off[off.index("--dtype") + 1] == "float32"


def test_peer_table_ratios_and_answers() -> None:
    def side(tps: float, texts: list[str]) -> dict:
        return {"tokens_per_s": tps, "texts": texts}

    same, other = ["a", "b"], ["a", "x"]
    rounds = [{1: {"ours EAGLE-3": side(6, same), "ours off": side(4, same), "vLLM EAGLE-3": side(3, same),
                   "vLLM off": side(4, other)}},
              {1: {"ours EAGLE-3": side(8, same), "ours off": side(4, same), "vLLM EAGLE-3": side(4, same),
                   "vLLM off": side(2, same)}}]
    row = summarize(rounds, [1])[1]
    assert row["ours EAGLE-3 / ours off"] == {"rounds": [1.5, 2.0], "median": 1.75}
    assert row["ours EAGLE-3 / vLLM EAGLE-3"]["rounds"] == [2.0, 2.0]
    assert row["vLLM EAGLE-3 / vLLM off"]["median"] == pytest.approx((0.75 + 2.0) / 2)
    assert row["answers"] == 2 * 2 * len(SYSTEMS) and row["identical"] == row["answers"] - 1  # "x" differs
