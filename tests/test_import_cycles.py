"""No import circle between our modules, reading EVERY import: module level, inside functions, and under
`if TYPE_CHECKING:` (which import-linter skips, see pyproject.toml). A circle through annotations still ties two
modules together: neither can be read, typed or moved without the other."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("adaptive", "doctor", "ledger", "builders", "core", "engines", "measure", "training", "triton_repo",
            "clients")


def _modules(root: Path) -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for f in (root / pkg).rglob("*.py"):
            if "__pycache__" in f.parts:
                continue
            parts = f.relative_to(root).with_suffix("").parts
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return mods


def _imports(name: str, f: Path, mods: dict[str, Path]) -> set[str]:
    """The modules of ours that `f` imports anywhere in its text."""
    pkg = name if f.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(f.read_text(), str(f))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:
                found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base)
    # `import a.b.c` names a module; a name that is not one is an attribute of the nearest enclosing module.
    resolved = set()
    for m in found:
        while m and m not in mods:
            m = m.rpartition(".")[0]
        if m and m != name and m.split(".")[0] in PACKAGES and m not in PACKAGES:
            resolved.add(m)
    return resolved


def import_circles(root: Path) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted; sorted list."""
    mods = _modules(root)
    graph = {m: _imports(m, f, mods) for m, f in mods.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return sorted(circles)


def test_no_module_imports_itself_back_through_any_import() -> None:
    assert import_circles(REPO) == []


def test_a_type_checking_import_that_closes_a_circle_is_found(tmp_path: Path) -> None:
    """The reading above sees what import-linter does not: a circle closed under `if TYPE_CHECKING:` (or inside a
    function)."""
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "engines" / "a.py").write_text("from engines.b import thing\n")
    (tmp_path / "engines" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from engines.a import Other\nthing = 1\n"
    )
    (tmp_path / "core" / "c.py").write_text("def f():\n    from .d import g\n")
    (tmp_path / "core" / "d.py").write_text("from core import c\n")
    (tmp_path / "core" / "e.py").write_text("import core.c\n")
    assert import_circles(tmp_path) == [["core.c", "core.d"], ["engines.a", "engines.b"]]
