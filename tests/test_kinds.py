"""core/kinds.py: one class per draft kind and per backend, chosen by the config's own fields; every value the
config accepts has its class, and the stages keyed by the class cover every backend."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import get_args

import pytest

from core import kinds
from builders.config import DraftConfig, EngineConfig, load_config
from builders.engine.stage import STEPS
from tests.deploy_files import _tensorrt_config


def test_every_accepted_value_has_its_class() -> None:
    assert set(kinds.BACKENDS) == set(get_args(EngineConfig.model_fields["backend"].annotation))
    assert set(kinds.DRAFT_KINDS) == set(get_args(DraftConfig.model_fields["type"].annotation))
    assert set(STEPS) == {type(b) for b in kinds.BACKENDS.values()}
    assert all(k.name == name for name, k in {**kinds.BACKENDS, **kinds.DRAFT_KINDS}.items())


@pytest.mark.parametrize("backend", ["tensorrt", "pytorch", "reference"])
def test_a_loaded_config_carries_its_kinds(tmp_path: Path, tiny_target: Path, eagle_head: Path, backend: str) -> None:
    kind = ["draft.type=eagle3", "trtllm_version='1.4'"] if backend == "pytorch" else []
    cfg = load_config(_tensorrt_config(tmp_path, tiny_target, eagle_head), [f"engine.backend={backend}", *kind])
    assert cfg.engine.kind is kinds.BACKENDS[backend] and cfg.draft.kind is kinds.DRAFT_KINDS[cfg.draft.type]
    assert "kind" not in cfg.model_dump()["engine"] and "kind" not in cfg.model_dump()["draft"]  # not a config field


def test_the_traits_that_decide_serving() -> None:
    t, p, r = (kinds.BACKENDS[n] for n in ("tensorrt", "pytorch", "reference"))
    assert [b.name for b in (t, p, r) if b.engine_flow] == ["tensorrt"] == [b.name for b in (t, p, r)
                                                                            if b.cpp_triton_model]
    assert (t.world_size(_Par(2, 2)), p.world_size(_Par(2, 2)), r.world_size(_Par(2, 1))) == (4, 1, 1)
    assert [b.name for b in (t, p, r) if b.runs_trtllm] == ["tensorrt", "pytorch"]
    assert (t.python_llm_model, p.python_llm_model, r.python_llm_model) == (None, "llmapi_llm.py", "reference_llm.py")
    assert r.parallel_problems(_Par(1, 2)) == ["parallel.pp=2: the reference engine runs tp only; set pp=1"]
    assert t.parallel_problems(_Par(1, 2)) == []


class _Par:
    def __init__(self, tp: int, pp: int) -> None:
        self.tp, self.pp = tp, pp


# ---- the vocabulary is asked, never spelled again ------------------------------------------------------------------

REPO = Path(__file__).resolve().parent.parent
PRODUCT = ("adaptive", "doctor", "ledger", "builders", "core", "engines", "measure", "sources", "training",
           "triton_repo", "clients", "dynamo_serve", "scripts")
NAMES = set(kinds.BACKENDS) | set(kinds.DRAFT_KINDS)


def _literals(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {v for e in node.elts for v in _literals(e)}
    return set()


def kind_literal_comparisons(root: Path) -> list[str]:
    """Every comparison (==, !=, in, match case) of a value against a draft kind's or a backend's name, in product
    code: `file:line: expression`."""
    found = []
    for f in sorted(p for pkg in PRODUCT for p in (root / pkg).rglob("*.py")):
        nodes = sorted(ast.walk(ast.parse(f.read_text(), str(f))), key=lambda n: getattr(n, "lineno", 0))
        for node in nodes:
            if isinstance(node, ast.Compare):
                names = _literals(node.left).union(*(_literals(c) for c in node.comparators))
            elif isinstance(node, ast.MatchValue):
                names = _literals(node.value)
            else:
                continue
            if names & NAMES:
                found.append(f"{f.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_product_code_asks_the_kind_instead_of_comparing_its_name(tmp_path: Path) -> None:
    assert kind_literal_comparisons(REPO) == []
    bad = tmp_path / "training"  # the check itself finds each form it looks for
    bad.mkdir()
    (bad / "x.py").write_text('a == "eagle3"\nb != "reference"\nc in ("pytorch", "x")\n'
                              'match d:\n    case "tensorrt":\n        pass\n"eagle" == e\nf == "eagle-3"\n')
    assert [x.split(": ", 1)[0] for x in kind_literal_comparisons(tmp_path)] == [
        "training/x.py:1", "training/x.py:2", "training/x.py:3", "training/x.py:5", "training/x.py:7"]


def test_product_code_reads_the_configs_version_entry() -> None:
    """cfg.version, checked when the config is read; never the table looked up again by the config's string."""
    lookup = re.compile(r"(registry|trtllm_versions)\.get\((cfg|bc|b\.cfg)\.trtllm_version\)")
    found = [f"{p.relative_to(REPO)}:{i}" for pkg in PRODUCT for p in sorted((REPO / pkg).rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if lookup.search(line)]
    assert found == []
