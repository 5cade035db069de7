"""Draft trees: presets, TRT-LLM validation rules (each failure names the path), renderings, derived limits.

Upstream references: TensorRT-LLM's default tree = Medusa's mc_sim_7b_63 (tensorrt_llm/runtime/generation.py,
examples/eagle/README.md: 63 paths, depth 4); SafeAILab/EAGLE eagle/model/choices.py mc_sim_7b_63 (25 paths,
depth 5); runtime checks in cpp/tensorrt_llm/runtime/utils/speculativeChoicesUtils.cpp.
"""

from __future__ import annotations

import pytest

from builders.config import BuildConfig
from builders.triton.render import triton_eagle_choices
from core import trees
from core.trees import DraftTree, TreeError


def test_trtllm_default_matches_upstream_shape() -> None:
    t = DraftTree.from_choices(trees.preset("trtllm-default"))
    assert (t.size, t.depth, t.max_top_k) == (63, 4, 10)
    # root; ten depth-1 nodes with children; ten depth-2 parents ([0,0]..[0,7], [1,0], [2,0]); only [0,0,0]
    assert t.non_leaves_per_level() == [1, 10, 10, 1]
    assert t.max_non_leaves_per_layer == 10  # TRT-LLM's default max_non_leaves_per_layer


def test_eagle_default_is_a_different_tree() -> None:
    t = DraftTree.from_choices(trees.preset("eagle-default"))
    assert (t.size, t.depth, t.max_top_k) == (25, 5, 4)
    other = DraftTree.from_choices(trees.preset("trtllm-default"))
    assert set(t.paths) != set(other.paths)


def test_ambiguous_upstream_name_is_refused_with_both_alternatives() -> None:
    with pytest.raises(TreeError, match="ambiguous.*'trtllm-default' \\(63 nodes, depth 4\\).*'eagle-default'"):
        trees.preset("mc_sim_7b_63")


@pytest.mark.parametrize(("name", "size", "depth"), [("chain-1", 1, 1), ("chain-7", 7, 7), ("topk-2-3", 14, 3),
                                                     ("topk-4-2", 20, 2), ("topk-1-5", 5, 5)])
def test_generated_presets(name: str, size: int, depth: int) -> None:
    t = DraftTree.from_choices(trees.preset(name))
    assert (t.size, t.depth) == (size, depth)


def test_chain_and_balanced_exact_paths() -> None:
    assert trees.preset("chain-3") == [[0], [0, 0], [0, 0, 0]]
    assert trees.preset("topk-2-2") == [[0], [1], [0, 0], [0, 1], [1, 0], [1, 1]]


@pytest.mark.parametrize(("name", "msg"), [("chain-0", "chain length must be 1..256"),
                                           ("chain-257", "chain length must be 1..256"),
                                           ("topk-4-4", "this one has 340"),
                                           ("topk-0-3", "needs k >= 1"),
                                           ("bushy", "unknown tree preset 'bushy'")])
def test_bad_presets(name: str, msg: str) -> None:
    with pytest.raises(TreeError, match=msg):
        trees.preset(name)


# ---- the bad trees users actually write ---------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["[[0], [0, 0], [1]]", "{0}, {0,0}, {1}"])
def test_quoted_list_or_triton_braces_in_yaml(text: str) -> None:
    with pytest.raises(TreeError, match="write the paths as a YAML list without quotes"):
        trees.preset(text)


def test_missing_parent_names_the_path_and_the_fix() -> None:
    with pytest.raises(TreeError, match=r"tree path \[1, 0\] has no parent \[1\].*add \[1\] or remove \[1, 0\]"):
        DraftTree.from_choices([[0], [0, 0], [1, 0]])


def test_gap_in_depth_is_a_missing_parent() -> None:
    with pytest.raises(TreeError, match=r"\[0, 0, 0\] has no parent \[0, 0\]"):
        DraftTree.from_choices([[0], [0, 0, 0]])


def test_duplicate_path() -> None:
    with pytest.raises(TreeError, match=r"tree path \[0, 1\] appears twice"):
        DraftTree.from_choices([[0], [0, 1], [0, 1]])


@pytest.mark.parametrize("bad", [[[0], [-1]], [[0], [True]], [[0], [0.5]]])
def test_non_integer_or_negative_ranks(bad: list) -> None:
    with pytest.raises(TreeError, match="only non-negative integer ranks"):
        DraftTree.from_choices(bad)


@pytest.mark.parametrize("bad", [[], [[]], [0, 1], "[[0]]"])
def test_malformed_lists(bad: object) -> None:
    with pytest.raises(TreeError, match="non-empty list"):
        trees.validate_paths(bad)


def test_too_many_nodes() -> None:
    too_big = [[i] for i in range(257)]
    with pytest.raises(TreeError, match="257 nodes; TensorRT-LLM allows at most 256"):
        DraftTree.from_choices(too_big)


def test_engine_limits_depth_must_equal_num_eagle_layers() -> None:
    t = DraftTree.from_choices(trees.preset("eagle-default"))
    with pytest.raises(TreeError, match=r"tree depth 5 \(e.g. path \[0, 0, 0, 0, 1\]\) must equal num_eagle_layers=4"):
        trees.check_engine_limits(t, max_draft_len=63, num_eagle_layers=4, max_non_leaves_per_layer=10)


def test_engine_limits_size_and_non_leaves() -> None:
    t = DraftTree.from_choices(trees.preset("trtllm-default"))
    with pytest.raises(TreeError, match="63 nodes but the engine's max_draft_len is 60"):
        trees.check_engine_limits(t, max_draft_len=60, num_eagle_layers=4, max_non_leaves_per_layer=10)
    with pytest.raises(TreeError, match="level 1 has 10 non-leaf nodes > max_non_leaves_per_layer=8"):
        trees.check_engine_limits(t, max_draft_len=63, num_eagle_layers=4, max_non_leaves_per_layer=8)
    trees.check_engine_limits(t, max_draft_len=63, num_eagle_layers=4, max_non_leaves_per_layer=10)  # passes


# ---- renderings from the one list ---------------------------------------------------------------------------------


def test_sorting_is_depth_then_lexicographic() -> None:
    t = DraftTree.from_choices([[1, 0], [0, 1], [1], [0], [0, 0]])
    assert t.as_lists() == [[0], [1], [0, 0], [0, 1], [1, 0]]


def test_triton_rendering_uses_braces() -> None:
    # tensorrtllm_backend parses `{0}, {0,0}`: brackets make it fall back to mc_sim_7b_63 silently.
    assert triton_eagle_choices(DraftTree.from_choices([[0], [0, 0], [1]])) == "{0}, {1}, {0,0}"
    t = DraftTree.from_choices(trees.preset("eagle-default"))
    parsed = [list(map(int, g.split(","))) for g in triton_eagle_choices(t).replace(" ", "").strip("{}").split("},{")]
    assert parsed == t.as_lists()


def test_dynamic_tree_bound() -> None:
    # TRT-LLM: N + N^2 * (num_eagle_layers - 1)
    assert trees.tree_size_bound(10, 5) == 10 + 100 * 4
    d = trees.DynamicTree(top_k=4, depth=3, total_draft_tokens=20)
    assert (d.size, d.max_non_leaves_per_layer) == (20, 4)


def _cfg(choices: object, **engine: int) -> BuildConfig:
    return BuildConfig.model_validate({
        "name": "t", "trtllm_version": "1.1", "output_dir": "/tmp/x", "target": {"model": "/m", "dtype": "float16"},
        "draft": {"type": "eagle", "model": "random"}, "tree": {"choices": choices},
        "engine": {"backend": "reference", "max_batch_size": 2, "max_input_len": 64, "max_seq_len": 128, **engine},
    })


def test_config_derives_limits_from_the_tree() -> None:
    lim = _cfg("trtllm-default").limits()
    assert (lim.max_draft_len, lim.num_eagle_layers, lim.max_non_leaves_per_layer) == (63, 4, 10)
    assert lim.max_num_tokens == 2 * 64


def test_config_rejects_a_bad_tree_naming_the_path() -> None:
    with pytest.raises(ValueError, match=r"tree.choices: tree path \[2, 0\] has no parent \[2\]"):
        _cfg([[0], [2, 0]])


# ---- every refusal as its whole message, and both sides of every bound ---------------------------------------------

MANY = "[[0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0]]"  # longer than the 40 characters a message quotes


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("chain-0", "tree preset 'chain-0': chain length must be 1..256"),
        ("chain-257", "tree preset 'chain-257': chain length must be 1..256"),
        ("topk-0-3", "tree preset 'topk-0-3': needs k >= 1, depth >= 1 and at most 256 nodes (this one has 0)"),
        ("topk-3-0", "tree preset 'topk-3-0': needs k >= 1, depth >= 1 and at most 256 nodes (this one has 0)"),
        ("topk-1-257", "tree preset 'topk-1-257': needs k >= 1, depth >= 1 and at most 256 nodes (this one has 257)"),
        ("topk-257-1", "tree preset 'topk-257-1': needs k >= 1, depth >= 1 and at most 256 nodes (this one has 257)"),
        ("mc_sim_7b_63", "tree preset 'mc_sim_7b_63' is ambiguous: TensorRT-LLM and the EAGLE repository use this "
         "name for two different trees. Use 'trtllm-default' (63 nodes, depth 4) or 'eagle-default' (25 nodes, "
         "depth 5)"),
        (" " + MANY, f"tree.choices is the string {(' ' + MANY)[:40]!r}...: write the paths as a YAML list without "
         "quotes, e.g. choices: [[0], [0, 0], [1]] (Triton's `{0}, {0,0}` syntax is rendered from it, never written "
         "by hand)"),
    ],
)
def test_preset_refusals_whole_message(name: str, message: str) -> None:
    with pytest.raises(TreeError) as e:
        trees.preset(name)
    assert str(e.value) == message


@pytest.mark.parametrize(("name", "size", "depth"), [("chain-256", 256, 256), ("topk-1-256", 256, 256),
                                                     ("topk-256-1", 256, 1), ("topk-2-1", 2, 1)])
def test_presets_at_their_bounds_are_accepted(name: str, size: int, depth: int) -> None:
    t = DraftTree.from_choices(trees.preset(name))
    assert (t.size, t.depth) == (size, depth)


@pytest.mark.parametrize(
    ("choices", "message"),
    [
        ([], "tree.choices must be a non-empty list of paths such as [[0], [0, 0], [1]]"),
        # two missing parents: the shallower path is named (paths are checked by depth, then lexicographically)
        ([[0], [0, 5, 1], [1, 0]], "tree path [1, 0] has no parent [1]: every prefix of a path must be in the tree "
         "(add [1] or remove [1, 0])"),
        ([[0], [0, 0], [0, 0, 0], [1, 0, 0]], "tree path [1, 0, 0] has no parent [1, 0]: every prefix of a path must "
         "be in the tree (add [1, 0] or remove [1, 0, 0])"),
    ],
)
def test_path_refusals_whole_message(choices: list, message: str) -> None:
    with pytest.raises(TreeError) as e:
        trees.validate_paths(choices)
    assert str(e.value) == message


def test_the_largest_tree_is_accepted() -> None:
    assert DraftTree.from_choices([[i] for i in range(256)]).size == 256


def test_engine_limits_depth_refusal_whole_message() -> None:
    t = DraftTree.from_choices(trees.preset("eagle-default"))
    with pytest.raises(TreeError) as e:
        trees.check_engine_limits(t, max_draft_len=63, num_eagle_layers=4, max_non_leaves_per_layer=10)
    assert str(e.value) == ("tree depth 5 (e.g. path [0, 0, 0, 0, 1]) must equal num_eagle_layers=4 for engine-flow "
                            "EAGLE-1; rebuild with the tree's depth or change the tree")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 3, 4), "dynamic tree top_k=0, depth=3, total_draft_tokens=4: each must be >= 1"),
        ((3, 0, 4), "dynamic tree top_k=3, depth=0, total_draft_tokens=4: each must be >= 1"),
        ((3, 3, 0), "dynamic tree top_k=3, depth=3, total_draft_tokens=0: each must be >= 1"),
        ((2, 3, 11), "total_draft_tokens=11 exceeds the 10 candidates top_k=2, depth=3 can produce; lower it or raise "
         "top_k/depth"),
    ],
)
def test_dynamic_tree_refusals_whole_message(args: tuple[int, int, int], message: str) -> None:
    with pytest.raises(TreeError) as e:
        trees.DynamicTree(*args)
    assert str(e.value) == message


@pytest.mark.parametrize("args", [(1, 1, 1), (2, 3, 10), (4, 1, 4)])
def test_dynamic_trees_at_their_bounds_are_accepted(args: tuple[int, int, int]) -> None:
    assert trees.DynamicTree(*args).size == args[2]


@pytest.mark.parametrize(
    ("choices", "chain"),
    [([[0]], True), ([[0], [0, 0], [0, 0, 0]], True), ([[1]], False), ([[0], [1]], False),
     ([[0], [0, 1]], False), ([[0], [0, 0], [1]], False)],
)
def test_is_chain_means_one_top_1_node_per_depth(choices: list[list[int]], chain: bool) -> None:
    assert DraftTree.from_choices(choices).is_chain() is chain
