"""Draft trees: the single source of truth for `eagle_choices`.

A tree is a list of paths; each path is the sequence of top-k ranks taken from the root (the last verified
token). `[0, 1]` = "the runner-up child of the top-1 child". Every other place that needs the tree (the
TRT-LLM checkpoint's derived limits, trtllm-build argv, Triton's `eagle_choices`, the LLM API YAML, the reference
engine) renders it from a `DraftTree` built here; each rendering lives next to its consumer (Triton's brace syntax:
builders/triton/render.py).

Validation follows TensorRT-LLM's runtime checks (cpp/tensorrt_llm/runtime/utils/speculativeChoicesUtils.cpp and
tensorrt_llm/runtime/generation.py): prefix-closed, contiguous depths, size <= max_draft_len <= 256, depth ==
num_eagle_layers for engine-flow EAGLE-1, non-leaf nodes per level <= max_non_leaves_per_layer.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field

Path = tuple[int, ...]

# TRT-LLM's default tree: Medusa's mc_sim_7b_63 (63 nodes, depth 4). Used by TRT-LLM when no choices are given
# (tensorrt_llm/runtime/generation.py, examples/eagle/README.md).
TRTLLM_MC_SIM_7B_63: list[list[int]] = [
    [0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0], [0, 2], [3], [0, 3], [4], [0, 4], [2, 0], [0, 5], [0, 0, 1],
    [5], [0, 6], [6], [0, 7], [0, 1, 0], [1, 1], [7], [0, 8], [0, 0, 2], [3, 0], [0, 9], [8], [9], [1, 0, 0],
    [0, 2, 0], [1, 2], [0, 0, 3], [4, 0], [2, 1], [0, 0, 4], [0, 0, 5], [0, 0, 0, 0], [0, 1, 1], [0, 0, 6],
    [0, 3, 0], [5, 0], [1, 3], [0, 0, 7], [0, 0, 8], [0, 0, 9], [6, 0], [0, 4, 0], [1, 4], [7, 0], [0, 1, 2],
    [2, 0, 0], [3, 1], [2, 2], [8, 0], [0, 5, 0], [1, 5], [1, 0, 1], [0, 2, 1], [9, 0], [0, 6, 0], [0, 0, 0, 1],
    [1, 6], [0, 7, 0],
]

# The EAGLE repository's default tree (eagle/model/choices.py), confusingly ALSO named mc_sim_7b_63:
# 25 nodes, depth 5.
EAGLE_MC_SIM_7B_63: list[list[int]] = [
    [0], [1], [2], [3], [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [2, 0], [2, 1], [3, 0], [0, 0, 0], [0, 0, 1],
    [0, 0, 2], [0, 1, 0], [0, 1, 1], [0, 2, 0], [0, 2, 1], [1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2],
    [0, 0, 0, 0, 0], [0, 0, 0, 0, 1],
]

MAX_DRAFT_LEN_LIMIT = 256  # TRT-LLM: max_draft_len <= 256 (tensorrt_llm/models/eagle/config.py)

PRESET_HELP = (
    "'trtllm-default' (TensorRT-LLM's mc_sim_7b_63: 63 nodes, depth 4), 'eagle-default' (the EAGLE repository's "
    "mc_sim_7b_63: 25 nodes, depth 5), 'chain-N' (N tokens in a line), 'topk-K-D' (balanced: K children per node, "
    "depth D)"
)


class TreeError(ValueError):
    """An invalid draft tree; the message names the offending path and the fix."""


def _chain(n: int) -> list[list[int]]:
    return [[0] * d for d in range(1, n + 1)]


def _balanced(k: int, depth: int) -> list[list[int]]:
    return [list(p) for d in range(1, depth + 1) for p in itertools.product(range(k), repeat=d)]


def preset(name: str) -> list[list[int]]:
    """Resolve a preset name to its list of paths."""
    if name == "trtllm-default":
        return [list(p) for p in TRTLLM_MC_SIM_7B_63]
    if name == "eagle-default":
        return [list(p) for p in EAGLE_MC_SIM_7B_63]
    if m := re.fullmatch(r"chain-(\d+)", name):
        n = int(m.group(1))
        if not 1 <= n <= MAX_DRAFT_LEN_LIMIT:
            raise TreeError(f"tree preset {name!r}: chain length must be 1..{MAX_DRAFT_LEN_LIMIT}")
        return _chain(n)
    if m := re.fullmatch(r"topk-(\d+)-(\d+)", name):
        k, depth = int(m.group(1)), int(m.group(2))
        size = sum(k**d for d in range(1, depth + 1)) if k >= 1 and depth >= 1 else 0
        if k < 1 or depth < 1 or size > MAX_DRAFT_LEN_LIMIT:
            raise TreeError(
                f"tree preset {name!r}: needs k >= 1, depth >= 1 and at most {MAX_DRAFT_LEN_LIMIT} nodes "
                f"(this one has {size})"
            )
        return _balanced(k, depth)
    if name == "mc_sim_7b_63":
        raise TreeError(
            "tree preset 'mc_sim_7b_63' is ambiguous: TensorRT-LLM and the EAGLE repository use this name for two "
            "different trees. Use 'trtllm-default' (63 nodes, depth 4) or 'eagle-default' (25 nodes, depth 5)"
        )
    if name.lstrip().startswith(("[", "{")):
        # A quoted Python list (run.py --eagle_choices style) or Triton's brace syntax pasted into the YAML.
        raise TreeError(
            f"tree.choices is the string {name[:40]!r}...: write the paths as a YAML list without quotes, e.g. "
            "choices: [[0], [0, 0], [1]] (Triton's `{0}, {0,0}` syntax is rendered from it, never written by hand)"
        )
    raise TreeError(f"unknown tree preset {name!r}; use one of {PRESET_HELP}")


def sort_key(path: Path) -> tuple[int, Path]:
    """TRT-LLM and EAGLE order: by depth, then lexicographically."""
    return (len(path), path)


@dataclass(frozen=True)
class DraftTree:
    """A validated static draft tree, sorted by (depth, path). Every construction validates (from_choices, or a
    file holding `{"kind": "static", "paths": ...}` read through `Tree`)."""

    paths: tuple[Path, ...]
    kind: Literal["static"] = "static"

    def __post_init__(self) -> None:
        validate_paths(self.paths)
        object.__setattr__(self, "paths", tuple(sorted((tuple(p) for p in self.paths), key=sort_key)))

    @classmethod
    def from_choices(cls, choices: list[list[int]] | list[tuple[int, ...]]) -> DraftTree:
        validate_paths(choices)
        return cls(tuple(tuple(p) for p in choices))

    @property
    def size(self) -> int:
        """Number of draft tokens (the root is not counted): what max_draft_len must hold."""
        return len(self.paths)

    @property
    def depth(self) -> int:
        return max(len(p) for p in self.paths)

    @property
    def max_top_k(self) -> int:
        """Largest rank used anywhere + 1: how many candidates the drafter must keep per node."""
        return max(p[-1] for p in self.paths) + 1

    def non_leaves_per_level(self) -> list[int]:
        """Non-leaf nodes per depth level, counting the root as level 0."""
        parents = {p[:-1] for p in self.paths}
        return [sum(1 for p in parents if len(p) == d) for d in range(self.depth)]

    @property
    def max_non_leaves_per_layer(self) -> int:
        return max(self.non_leaves_per_level())

    def is_chain(self) -> bool:
        """A linear tree: one node per depth, always the top-1 child (what TensorRT-LLM calls a linear tree)."""
        return all(all(r == 0 for r in p) for p in self.paths) and self.size == self.depth

    def as_lists(self) -> list[list[int]]:
        return [list(p) for p in self.paths]


def validate_paths(choices: object) -> None:
    """Check a raw choices list; raise TreeError naming the offending path."""
    if not isinstance(choices, (list, tuple)) or not choices:
        raise TreeError("tree.choices must be a non-empty list of paths such as [[0], [0, 0], [1]]")
    seen: set[Path] = set()
    for raw in choices:
        if not isinstance(raw, (list, tuple)) or not raw:
            raise TreeError(f"tree path {raw!r} must be a non-empty list of ranks such as [0, 1]")
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in raw):
            raise TreeError(f"tree path {list(raw)} must contain only non-negative integer ranks")
        p = tuple(raw)
        if p in seen:
            raise TreeError(f"tree path {list(p)} appears twice; remove the duplicate")
        seen.add(p)
    for p in sorted(seen, key=sort_key):
        if len(p) > 1 and p[:-1] not in seen:
            raise TreeError(
                f"tree path {list(p)} has no parent {list(p[:-1])}: every prefix of a path must be in the tree "
                f"(add {list(p[:-1])} or remove {list(p)})"
            )
    if len(seen) > MAX_DRAFT_LEN_LIMIT:
        raise TreeError(f"tree has {len(seen)} nodes; TensorRT-LLM allows at most {MAX_DRAFT_LEN_LIMIT}")


def check_engine_limits(
    tree: DraftTree,
    *,
    max_draft_len: int,
    num_eagle_layers: int | None,
    max_non_leaves_per_layer: int,
) -> None:
    """Check a tree against the limits an engine was built with (TRT-LLM runtime rules)."""
    if tree.size > max_draft_len:
        raise TreeError(f"tree has {tree.size} nodes but the engine's max_draft_len is {max_draft_len}")
    if num_eagle_layers is not None and tree.depth != num_eagle_layers:
        deepest = next(p for p in reversed(tree.paths) if len(p) == tree.depth)
        raise TreeError(
            f"tree depth {tree.depth} (e.g. path {list(deepest)}) must equal num_eagle_layers={num_eagle_layers} "
            "for engine-flow EAGLE-1; rebuild with the tree's depth or change the tree"
        )
    for level, n in enumerate(tree.non_leaves_per_level()):
        if n > max_non_leaves_per_layer:
            raise TreeError(
                f"tree level {level} has {n} non-leaf nodes > max_non_leaves_per_layer={max_non_leaves_per_layer}"
            )


@dataclass(frozen=True)
class DynamicTree:
    """EAGLE-2 dynamic tree: expand `top_k` per node for `depth` steps, keep `total_draft_tokens` by score."""

    top_k: int
    depth: int
    total_draft_tokens: int
    kind: Literal["dynamic"] = "dynamic"

    def __post_init__(self) -> None:
        if min(self.top_k, self.depth, self.total_draft_tokens) < 1:
            raise TreeError(
                f"dynamic tree top_k={self.top_k}, depth={self.depth}, total_draft_tokens={self.total_draft_tokens}: "
                "each must be >= 1"
            )
        bound = tree_size_bound(self.top_k, self.depth)
        if self.total_draft_tokens > bound:
            raise TreeError(
                f"total_draft_tokens={self.total_draft_tokens} exceeds the {bound} candidates "
                f"top_k={self.top_k}, depth={self.depth} can produce; lower it or raise top_k/depth"
            )

    @property
    def size(self) -> int:
        return self.total_draft_tokens

    @property
    def max_non_leaves_per_layer(self) -> int:
        return self.top_k

    @property
    def max_top_k(self) -> int:
        """Candidates the drafter must keep per expanded node."""
        return self.top_k

    @property
    def drafter_runs(self) -> int:
        """Drafter scratch slots per step: the top_k frontier is run through the drafter at depths 1..depth-1."""
        return (self.depth - 1) * self.top_k


# The one tree type: a static tree or an EAGLE-2 dynamic one, told apart by `kind` wherever it is read from a file
# (core.spec's reference.json). Only the drafting strategy (engines/drafting.py `drafting_for`) dispatches on it.
Tree = Annotated[DraftTree | DynamicTree, Field(discriminator="kind")]


def tree_size_bound(top_k: int, depth: int) -> int:
    """Upper bound of EAGLE-2 candidates: top_k at depth 1, then top_k * top_k per later level
    (TRT-LLM: N + N^2 * (num_eagle_layers - 1))."""
    return top_k + top_k * top_k * (depth - 1)
