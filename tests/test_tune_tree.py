"""Tree tuning: estimator, optimal tree (checked against brute force), snippet, and the CLI on a tiny build."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest
import yaml

from builders import tune_tree
from builders.convert.stage import CONVERT_STAGE
from builders.engine.stage import ENGINE_STAGE
from builders.pipeline import run_stage
from builders.tree_tuning import AcceptanceTable, chain, optimal_tree, snippet_yaml
from engines.trees import DraftTree
from tests.engine_cases import make_cfg


def _random_table(seed: int, k: int, depth: int) -> AcceptanceTable:
    rng = random.Random(seed)
    reach = []
    for _ in range(k):
        row = [1000]
        for _ in range(depth):
            row.append(int(row[-1] * rng.random()))
        reach.append(row)
    return AcceptanceTable(reach)


def _all_trees(k: int, depth: int, size: int) -> list[list[tuple[int, ...]]]:
    paths = [p for d in range(1, depth + 1) for p in itertools.product(range(k), repeat=d)]
    out = []
    for combo in itertools.combinations(paths, size):
        s = set(combo)
        if all(len(p) == 1 or p[:-1] in s for p in combo):
            out.append(list(combo))
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("budget", [1, 3, 4])
def test_greedy_tree_is_optimal_by_brute_force(seed: int, budget: int) -> None:
    table = _random_table(seed, k=3, depth=3)
    best = max(sum(table.weight(p) for p in t) for t in _all_trees(3, 3, budget))
    tuned = optimal_tree(table, budget)
    assert tuned.size == budget
    assert table.expected_tau(tuned) - 1 == pytest.approx(best, abs=1e-12)


def test_estimator_and_expected_tau() -> None:
    # rank 0: 100 steps, 60 reached depth 1, 30 depth 2; rank 1: 100 steps, 20 reached depth 1, 0 depth 2
    t = AcceptanceTable([[100, 60, 30], [100, 20, 0]])
    assert (t.p(1, 0), t.p(2, 0), t.p(1, 1), t.p(2, 1)) == (0.6, 0.5, 0.2, 0.0)
    assert t.p(3, 0) == 0.0 and t.p(1, 5) == 0.0  # no evidence beyond what was measured
    # chain of rank 0: telescoping product -> 1 + (60 + 30) / 100
    assert t.expected_tau(chain(0, 2)) == pytest.approx(1.9)
    tree = DraftTree.from_choices([[0], [1], [0, 0], [1, 0]])
    assert t.expected_tau(tree) == pytest.approx(1 + 0.6 + 0.2 + 0.6 * 0.5 + 0.2 * 0.5)
    assert optimal_tree(t, 3).as_lists() == [[0], [1], [0, 0]]  # weights .6, .3 ([0,0]), .2 ([1]) beat .1 ([1,0])
    assert AcceptanceTable([[10, 0, 0]]).p(2, 0) == 0.0  # zero trials -> 0, never a division error


def test_optimal_tree_prefers_observed_paths_and_is_valid() -> None:
    t = AcceptanceTable([[50, 40, 30, 20], [50, 5, 0, 0], [50, 0, 0, 0]])
    tuned = optimal_tree(t, 5)
    # weights: [0] .8, [0,0] .6, [0,0,0] .4, [1] .1, [1,0] .1*.75; [0,1] has p(2,1) = 0/5 -> excluded
    assert tuned.as_lists() == [[0], [1], [0, 0], [1, 0], [0, 0, 0]]
    with pytest.raises(ValueError, match="need at least one node"):
        optimal_tree(t, 0)


def test_snippet_round_trips_into_the_config() -> None:
    tree = DraftTree.from_choices([[0], [1], [0, 0]])
    text = snippet_yaml(tree, "tuned\nexpected tau 1.5")
    assert text.startswith("# tuned\n# expected tau 1.5\ntree:\n")
    data = yaml.safe_load(text)
    assert data == {"tree": {"choices": [[0], [1], [0, 0]]}}
    assert make_cfg(f"tree.choices={data['tree']['choices']}").limits().max_draft_len == 3


@pytest.fixture(scope="module")
def tiny_build(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path, eagle_head: Path) -> Path:
    root = tmp_path_factory.mktemp("tune")
    cfg = make_cfg("engine.backend=reference", "engine.device=cpu", "tree.choices=chain-3", "target.dtype=float32",
                   f"target.model={tiny_target}", f"draft.model={eagle_head}", f"output_dir={root}")
    run_stage(CONVERT_STAGE, cfg, root)
    run_stage(ENGINE_STAGE, cfg, root)
    return root


def test_cli_on_tiny_build(tiny_build: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in
                                 ["The quick brown fox", "What is the capital of France?", "Hello world!"]) + "\n")
    out, js = tmp_path / "snippet.yaml", tmp_path / "r.json"
    rc = tune_tree.main(["--build", str(tiny_build), "--prompts", str(prompts), "--budget", "4", "--top-k", "3",
                         "--max-depth", "3", "--max-new-tokens", "8", "--presets", "chain-3,topk-2-2",
                         "--out", str(out), "--json", str(js)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "expected tau" in printed and "measured tau" in printed and "topk-2-2" in printed
    res = json.loads(js.read_text())
    tuned = yaml.safe_load(out.read_text())["tree"]["choices"]
    assert len(tuned) == 4 and res["tuned"] == tuned
    DraftTree.from_choices(tuned)  # valid, prefix-closed
    by = {r["tree"]: r for r in res["results"]}
    # The rank-0 chain's expected tau is exact (telescoping): a direct check of the estimator on real runs.
    assert by["chain-3"]["expected_tau"] == pytest.approx(by["chain-3"]["measured_tau"], abs=1e-9)
    assert all(r["measured_tau"] >= 1.0 for r in res["results"])
    # The tuned tree is at least as good as any 4-node tree by the model; never worse than the chain in expectation.
    assert by["tuned"]["expected_tau"] >= by["chain-3"]["expected_tau"] - 1e-12
    assert len(res["table"]["reach"]) == 3 and len(res["table"]["reach"][0]) == 4


def test_cli_errors(tiny_build: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert tune_tree.main(["--build", str(tiny_build), "--prompts", str(tmp_path / "none.jsonl"),
                           "--budget", "4"]) == 2
    assert tune_tree.main(["--build", str(tiny_build), "--prompts", "x", "--budget", "300"]) == 2
    err = capsys.readouterr().err
    assert "--budget 300 must be in 1..256" in err
