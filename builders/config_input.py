"""What the config loader does to the raw YAML before validation: parse it within bounds, resolve its paths."""

from __future__ import annotations

from pathlib import Path
from typing import Any


PATH_FIELDS = (("target", "model"), ("draft", "model"), ("draft", "draft_vocab"), (None, "output_dir"))


def resolve_paths(data: dict[str, Any], base: Path) -> list[str]:
    """Resolve relative paths against the config's directory; an empty one is refused (it would silently mean
    that directory)."""
    problems = []
    for section, key in PATH_FIELDS:
        sec = data if section is None else data.get(section)
        if not isinstance(sec, dict) or not isinstance(sec.get(key), str):
            continue
        if not sec[key].strip():
            where = key if section is None else f"{section}.{key}"
            problems.append(f"{where}: empty path {sec[key]!r}; give a path (relative paths are relative to the "
                            "config file)")
            sec.pop(key)
            continue
        sec[key] = resolve_path(sec[key], base)
    return problems


def resolve_path(value: str, base: Path) -> str:
    if value == "random" or value.startswith("pip:"):
        return value
    p = Path(value).expanduser()
    return str(p if p.is_absolute() else (base / p).resolve())
