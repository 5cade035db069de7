"""The import-linter contracts in pyproject.toml: layers point down, engines/ and clients/ import nothing else of
ours, no import cycles. Runs the real `lint-imports` on the tree, and on a copy with one forbidden import added to
show that the contracts bite."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("builders", "engines", "triton_repo", "clients")
LINT = Path(sys.executable).parent / "lint-imports"


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
    assert "Contracts: 4 kept, 0 broken." in proc.stdout


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        ("engines/spec.py", "import builders.config", "engines/ (the reference engine) imports nothing else of ours"),
        ("clients/prompts.py", "import engines.types", "clients/ imports nothing else of ours"),
        ("triton_repo/contract.py", "import builders.layout", "builders on top; serve-time triton_repo and clients"),
        ("engines/types.py", "import engines.api", "no import cycle between the modules"),
        ("builders/versions.py", "import builders.trtllm.registry", "no import cycle between the modules"),
        ("builders/trtllm/ledger_rows.py", "import builders.trtllm.ledger", "no import cycle between the modules"),
    ],
)
def test_a_forbidden_import_breaks_its_contract(tmp_path: Path, module: str, line: str, broken: str) -> None:
    root = _copy(tmp_path)
    f = root / module
    f.write_text(f.read_text() + f"\n{line}  # added by the test\n")
    proc = _lint(root)
    assert proc.returncode == 1, proc.stdout
    report = proc.stdout.split("Broken contracts")[-1]
    assert broken in report.replace("\n", " "), proc.stdout
