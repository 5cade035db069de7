"""The checkers people use, configured in pyproject.toml ([tool.ruff], [tool.mypy]), pass on the whole tree, and their
configuration bites: `make test` (and CI, .ci/run) runs them from the project's venv, where the `test` extra and
requirements.txt install them."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _checker(module: str, *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    if importlib.util.find_spec(module) is None:
        pytest.fail(f"{module} is not installed in {sys.prefix}: run `make setup` (requirements.txt pins it)")
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, check=False)


def _report(p: subprocess.CompletedProcess[str]) -> str:
    return f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"


def test_ruff_passes_on_the_tree() -> None:
    p = _checker("ruff", "check", "--no-cache", ".")
    assert p.returncode == 0, _report(p)


def test_mypy_passes_on_the_product_and_scripts() -> None:
    # [tool.mypy] names the files; its cache (.mypy_cache) makes later runs take seconds
    p = _checker("mypy")
    assert p.returncode == 0, _report(p)
    assert "Success: no issues found" in p.stdout, _report(p)


@pytest.mark.parametrize(
    ("source", "code"),
    [
        ("import os\n", "F401"),  # pyflakes: unused import
        ("x = 1\n" + "y = '" + "a" * 120 + "'\n", "E501"),  # the 120-character line length
        ("def f(items: list[int] = []) -> list[int]:\n    return items\n", "B006"),  # bugbear: mutable default
        ("from typing import List\n\nx: List[int] = []\n", "UP006"),  # pyupgrade: builtin generics
        ("def f(a: bool) -> bool:\n    if a:\n        return True\n    else:\n        return False\n", "SIM103"),
        ("import os  # noqa: E501\n\nprint(os.sep)\n", "RUF100"),  # a suppression that suppresses nothing
    ],
)
def test_ruff_configuration_reports_each_rule_family(tmp_path: Path, source: str, code: str) -> None:
    f = tmp_path / "sample.py"
    f.write_text(source)
    p = _checker("ruff", "check", "--no-cache", "--config", str(REPO / "pyproject.toml"), str(f), cwd=tmp_path)
    assert p.returncode == 1 and code in p.stdout, _report(p)


@pytest.mark.parametrize(
    ("source", "code"),
    [
        ("def f(x: int) -> str:\n    return x\n", "return-value"),
        ("def f(x):\n    return x\n", "no-untyped-def"),  # full type hints
        ("def f(x: int) -> str:\n    return x  # type: ignore\n", "ignore-without-code"),
        ("def f(x: int) -> int:\n    return x  # type: ignore[arg-type]\n", "unused-ignore"),
        ("def f(x: int | None) -> int:\n    return x + 1\n", "operator"),  # None is not silently allowed
    ],
)
def test_mypy_configuration_reports_each_class_of_error(tmp_path: Path, source: str, code: str) -> None:
    f = tmp_path / "sample.py"
    f.write_text(source)
    p = _checker("mypy", "--config-file", str(REPO / "pyproject.toml"), "--cache-dir", str(tmp_path / "cache"),
                 str(f), cwd=tmp_path)
    assert p.returncode == 1 and f"[{code}]" in p.stdout, _report(p)
