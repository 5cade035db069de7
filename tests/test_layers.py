"""The import-linter contracts in pyproject.toml: layers point down, core/ imports nothing else of ours and no torch,
engines/ and sources/ only core/, clients/ nothing else of ours, the engine is used through engines.api, no import
cycles. Runs the real `lint-imports` on the tree, and on a copy with one forbidden import added to show that the
contracts bite."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parent.parent
PACKAGES = (
    "adaptive", "doctor", "ledger", "builders", "core", "engines", "measure", "sources", "training", "triton_repo",
    "clients", "scripts", "testkit", "dynamo_serve",
)
LINT = Path(sys.executable).parent / "lint-imports"
# The layers contract's name, as lint-imports reports it: the packages above the build, and the build's own layers.
ABOVE = "the refresh, the doctor, the ledger above the build"
LAYERS = "above the build; builders; the trainer; measure, serve-time"


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(root))
    return subprocess.run([str(LINT), "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=300)


def _copy(tmp: Path) -> Path:
    for name in PACKAGES:
        shutil.copytree(REPO / name, tmp / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp / "pyproject.toml")
    return tmp


def test_the_tree_keeps_every_contract() -> None:
    proc = _lint(REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Contracts: 8 kept, 0 broken." in proc.stdout


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        ("engines/session.py", "import builders.config", "engines/ (the reference engine's runtime) imports nothing"),
        ("engines/step.py", "import measure.costs", "engines/ (the reference engine's runtime) imports nothing"),
        ("core/trees.py", "import engines.api", "core/ imports nothing else of ours"),
        ("core/types.py", "import torch", "core/ imports nothing else of ours, and neither torch"),
        ("core/hfconfig.py", "import numpy", "core/ imports nothing else of ours, and neither torch"),
        ("clients/prompts.py", "import core.types", "clients/ imports nothing else of ours"),
        ("clients/prompts.py", "import engines.api", "clients/ imports nothing else of ours"),
        ("triton_repo/contract.py", "import builders.layout", LAYERS),
        ("triton_repo/contract.py", "import measure.costs", LAYERS),
        ("training/model.py", "import builders.config", LAYERS),
        ("sources/data.py", "import training.config", LAYERS),
        ("sources/targets.py", "import measure.verify", LAYERS),
        ("sources/data.py", "import engines.api", "sources/ (data sets and target models) imports nothing else"),
        ("sources/data.py", "import torch", "sources/ (data sets and target models) imports nothing else"),
        ("builders/layout.py", "import testkit.tiny_models", "no product module imports testkit/"),
        ("scripts/demo.py", "import testkit.triton_servers", "no product module imports testkit/"),
        ("builders/layout.py", "import engines.session", "the reference engine is imported through engines.api only"),
        (
            "triton_repo/models/llm_io.py",
            "import engines.model",
            "the reference engine is imported through engines.api",
        ),
        ("engines/tree.py", "import engines.api", "no import cycle between the modules"),
        ("core/trees.py", "import core.spec", "no import cycle between the modules"),
        ("measure/lossless.py", "import measure.verify", "no import cycle between the modules"),
        ("builders/trtllm/citation.py", "import builders.trtllm.architectures", "no import cycle between the modules"),
        ("ledger/rows.py", "import ledger.table", "no import cycle between the modules"),
        ("builders/pipeline.py", "import doctor.findings", ABOVE),
        ("builders/config.py", "import adaptive.publish", ABOVE),
        ("builders/layout.py", "import ledger.rows", ABOVE),
        ("ledger/check.py", "import doctor.findings", ABOVE),
    ],
)
def test_a_forbidden_import_breaks_its_contract(tmp_path: Path, module: str, line: str, broken: str) -> None:
    root = _copy(tmp_path)
    f = root / module
    f.write_text(f.read_text() + f"\n{line}  # added by the test\n")
    proc = _lint(root)
    assert proc.returncode == 1, proc.stdout
    report = proc.stdout.split("Broken contracts")[-1]
    assert broken in " ".join(report.split()), proc.stdout


def test_the_api_contract_protects_every_engine_module() -> None:
    """A new engines/ module is inside the engines-api contract from the day it is added (else it would be silently
    importable from builders/ and triton_repo/)."""
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    [contract] = [c for c in cfg if c["id"] == "engines-api"]
    modules = {f"engines.{p.stem}" for p in (REPO / "engines").glob("*.py")} - {"engines.__init__", "engines.api"}
    assert set(contract["protected_modules"]) == modules


def test_core_imports_without_torch() -> None:
    """core/ is the floor everybody imports: importing all of it loads no torch, numpy or transformers."""
    mods = sorted(f"core.{p.stem}" for p in (REPO / "core").glob("*.py") if p.stem != "__init__")
    code = "import sys\n" + "".join(f"import {m}\n" for m in mods) + (
        "print(sorted(m for m in ('torch', 'numpy', 'transformers') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert len(mods) >= 5 and proc.stdout.strip() == "[]", proc.stdout


def test_every_package_is_a_protected_source_dir() -> None:
    """A build's output_dir may not be inside the project's sources (a stage rerun swaps whole directories): every
    top-level package of ours is in that list."""
    from builders.build_dir import SOURCE_DIRS

    packages = {p.parent.name for p in REPO.glob("*/__init__.py")}
    assert set(PACKAGES) <= packages and packages <= set(SOURCE_DIRS)


# Everything outside tests/ that is python: the packages, the benchmarks and developer tools, the container's programs.
OUTSIDE_TESTS = (*PACKAGES, "bench", "devtools", "docker")


def _imports_tests(path: Path, root: Path = REPO) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
        found += [f"{path.relative_to(root)}:{node.lineno}: {n}" for n in names if n.split(".")[0] == "tests"]
    return found


def test_nothing_outside_tests_imports_from_tests() -> None:
    """tests/ is not a library: what a benchmark shares with the tests lives in testkit/ (import-linter does not
    see tests/, so this reads every file's imports, the ones inside functions included)."""
    found = [hit for d in OUTSIDE_TESTS for p in sorted((REPO / d).rglob("*.py")) for hit in _imports_tests(p)]
    assert not found, "modules outside tests/ that import tests/ (move the helper into testkit/):\n" + "\n".join(found)


def test_the_tests_import_check_sees_one(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from tests.tiny_models import VOCAB\n    import tests.oracle\n")
    assert _imports_tests(f, tmp_path) == ["m.py:2: tests.tiny_models", "m.py:3: tests.oracle"]
