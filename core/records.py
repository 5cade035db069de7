"""Paths in records (manifests, recipes, model cards): relative to the directory the record describes, never the
absolute paths of the machine that wrote it, so a build or a head that moves (or is shared) keeps records that mean
the same thing.

A reader turns a recorded path back into a file with `resolve_recorded(value, base)`: an absolute value (a record
written before this rule) is taken as it is.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def record_path(value: str | Path, base: Path) -> str:
    """`value` relative to `base` when it is an absolute path (`..` where it lies outside); other strings as given
    (a relative path, `pip:NAME`, `random`)."""
    s = str(value)
    if not os.path.isabs(s):
        return s
    return os.path.relpath(os.path.normpath(s), os.path.abspath(base))


def record_text(text: str, base: Path) -> str:
    """A command line or sentence with each absolute-path word made relative to `base`."""
    return " ".join(record_path(w, base) if w.startswith("/") else w for w in text.split(" "))


def relative_record(value: Any, base: Path) -> Any:
    """Every absolute path in a JSON-like record (strings, lists, dicts) made relative to `base`."""
    if isinstance(value, dict):
        return {k: relative_record(v, base) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [relative_record(v, base) for v in value]
    if isinstance(value, Path):
        return record_path(value, base)
    if isinstance(value, str) and "/" in value:
        return record_text(value, base) if " " in value else record_path(value, base)
    return value


def resolve_recorded(value: str, base: Path) -> Path:
    """A path read from a record, as a path on this machine (relative ones against `base`)."""
    p = Path(value)
    return p if p.is_absolute() else Path(os.path.normpath(Path(base) / p))
