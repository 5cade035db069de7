"""Tree tuning: estimator, optimal tree (checked against brute force), snippet, and the CLI on a tiny build."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest
import yaml

from measure import tune_tree
from builders.convert.stage import CONVERT_STAGE
from builders.engine.stage import ENGINE_STAGE
from builders.pipeline import run_stage
from measure.tree_tuning import AcceptanceTable, chain, optimal_tree, snippet_yaml
from core.trees import DraftTree
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
                                 ["The quick brown fox", "What is the capital of France?", "Hello world!",
                                  "Name a colour.", "Count to three."]) + "\n")  # 5 > the build's max_batch_size
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


def test_speed_model_picks_the_fastest_size() -> None:
    from measure.tree_tuning import SizeCost, fastest, nested_trees

    t = AcceptanceTable([[100, 60, 30], [100, 20, 0]])
    sizes = nested_trees(t, 3)
    assert [s.size for s in sizes] == [1, 2, 3]
    assert all(set(a.paths) <= set(b.paths) for a, b in zip(sizes, sizes[1:]))  # nested: each adds one path
    assert [s.size for s in nested_trees(AcceptanceTable([[10, 5, 2]]), 5)] == [1, 2]  # only 2 paths measured
    # speedup = E[tau] * target_ms / step_ms: 1.6 * 50 / 60, 1.9 * 50 / 90, 2.1 * 50 / 100
    costs = [SizeCost(s, t.expected_tau(s), ms) for s, ms in zip(sizes, [60.0, 90.0, 100.0])]
    assert [round(c.speedup(50.0), 4) for c in costs] == [1.3333, 1.0556, 1.05]
    assert fastest(costs, 50.0).nodes == 1
    # on a GPU-like device a step costs about the same at every size: the biggest tree wins
    flat = [SizeCost(c.tree, c.expected_tau, 20.0) for c in costs]
    assert fastest(flat, 20.0).nodes == 3
    tie = [SizeCost(chain(0, 1), 1.5, 30.0), SizeCost(DraftTree.from_choices([[0], [1]]), 2.0, 40.0)]
    assert fastest(tie, 10.0).nodes == 1  # equal speedup: the smaller tree
    with pytest.raises(ValueError, match="no tree sizes"):
        fastest([], 10.0)


def test_read_table_rejects_what_is_not_a_table(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    for text, msg in [
        ("not json", "not a tune_tree.py --json file"),
        ('{"table": {}}', "not a tune_tree.py --json file"),
        ('{"table": {"reach": [[10, 5], [10]]}}', "equal-length lists"),
        ('{"table": {"reach": [[10, -1]]}}', "counts >= 0"),
        ('{"table": {"reach": []}}', "one per rank"),
    ]:
        bad.write_text(text)
        with pytest.raises(ValueError, match=msg):
            tune_tree.read_table(bad)
    with pytest.raises(ValueError, match="missing.json: not a tune_tree.py --json file"):
        tune_tree.read_table(tmp_path / "missing.json")


def test_cli_speed_objective_on_tiny_build(tiny_build: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ["The quick brown fox", "Hello world!"]) + "\n")
    first = tmp_path / "tau.json"
    common = ["--build", str(tiny_build), "--prompts", str(prompts), "--max-new-tokens", "8", "--presets", ""]
    assert tune_tree.main(common + ["--budget", "3", "--top-k", "2", "--max-depth", "3", "--json", str(first)]) == 0
    capsys.readouterr()
    out, js = tmp_path / "fast.yaml", tmp_path / "fast.json"
    rc = tune_tree.main(common + ["--budget", "4", "--objective", "speed", "--table", str(first), "--cost-prompts", "1",
                                  "--cost-rounds", "1", "--out", str(out), "--json", str(js)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "rank chains" not in printed and "target-only decoding:" in printed and "<- fastest" in printed
    res = json.loads(js.read_text())
    assert res["objective"] == "speed" and res["table"]["reach"] == json.loads(first.read_text())["table"]["reach"]
    assert [s["nodes"] for s in res["sizes"]] == [1, 2, 3, 4] and res["target_step_ms"] > 0
    best = max(res["sizes"], key=lambda s: (s["predicted_speedup"], -s["nodes"]))
    [row] = res["results"]
    assert row["nodes"] == best["nodes"] == len(res["tuned"]) and row["measured_speedup"] > 0
    assert row["identical"] == row["prompts"] == 2  # lossless: the fastest tree's outputs equal target-only decoding
    assert yaml.safe_load(out.read_text())["tree"]["choices"] == res["tuned"]
    assert "--objective speed" in out.read_text() and f"acceptance table read from {first}" in out.read_text()


def test_cli_speed_errors(tiny_build: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "Hello"}) + "\n")
    base = ["--build", str(tiny_build), "--prompts", str(prompts), "--budget", "2", "--objective", "speed"]
    assert tune_tree.main(base + ["--cost-rounds", "0"]) == 2
    assert tune_tree.main(base + ["--table", str(tmp_path / "none.json")]) == 2
    assert tune_tree.main(["--build", str(tmp_path), "--prompts", str(prompts), "--budget", "2"]) == 2
    err = capsys.readouterr().err
    assert "--cost-prompts and --cost-rounds must be >= 1" in err
    assert "none.json: not a tune_tree.py --json file" in err
    assert "is not a finished build with engine.backend=reference" in err


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parent.parent / "configs" / "trees").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_shipped_tree_snippets_load_into_a_config(path: Path) -> None:
    text = path.read_text()
    choices = yaml.safe_load(text)["tree"]["choices"]
    tree = DraftTree.from_choices(choices)
    assert make_cfg(f"tree.choices={choices}").limits().max_draft_len == tree.size
    assert "expected tau" in text and "measured tau" in text  # every shipped tree says what it was measured at


@pytest.mark.parametrize(("args", "says"), [
    (["--batch-sizes", "0"], "--batch-sizes 0: give sizes from 1 to at most 512"),
    (["--batch-sizes", "0,1,2"], "--batch-sizes 0,1,2: give sizes from 1"),
    (["--batch-sizes", "2,4"], "including 1 (draft_len_schedule must hold batch size 1)"),
    (["--batch-sizes", "1,100000"], "--batch-sizes 1,100000: give sizes from 1 to at most 512"),
    (["--batch-sizes", "1,two"], "--batch-sizes 1,two: give comma-separated integers"),
    (["--batch-sizes", ","], "--batch-sizes ,: give sizes from 1"),
    (["--steps", "0"], "--steps 0: must be >= 1"),
    (["--top-k", "0", "--max-depth", "-1"], "--max-depth -1, --top-k 0: must be >= 1"),
    (["--num-prompts", "0"], "--num-prompts 0: must be >= 1"),
])
def test_arguments_are_refused_before_anything_is_loaded(args: list[str], says: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Neither the build nor the prompts exist: the argument's own error comes first, so nothing was loaded."""
    from measure.tune_tree import main

    code = main(["--build", str(tmp_path / "no-build"), "--prompts", str(tmp_path / "no.jsonl"), "--objective",
                 "schedule", "--budget", "8", *args])
    assert code == 2 and says in capsys.readouterr().err
