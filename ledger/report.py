"""Drift report of the contract ledger: per supported TensorRT-LLM version, every upstream citation of its rows with
the day it was last read (ledger/docs.py SOURCES), oldest first, so that the next reading of
upstream starts from the stalest. `python -m ledger.check --upstream-report [--version V]` prints it.

A citation is matched to the SOURCES entries of its repository whose file names its path; this project's own files
are read with the code and listed last. A citation no entry names is reported as never recorded (first).
"""

from __future__ import annotations

from dataclasses import dataclass

from core import trtllm_versions

from ledger import table as ledger, docs as ledger_docs, rows as ledger_rows

NEVER = "never recorded"
OURS = "this repository"
SHOWN_NAMES = 4  # names listed per citation; the rest are counted


@dataclass(frozen=True)
class Citation:
    cite: str  # repository@ref:path symbol, as the ledger's messages print it
    read_on: str  # UTC date of the latest reading, NEVER, or OURS
    version_read: str  # what that reading looked at (commit / tag / page), "" when none
    names: tuple[str, ...]  # the rows citing it (surface:name)


def _names(entry: str, source: ledger_rows.Source) -> bool:
    """A SOURCES file entry names this citation: its repository and path, and, where the entry narrows the file to
    a symbol ("...llm_args.py DecodingBaseConfig.enable_penalty"), a citation of that symbol."""
    if not entry.startswith(source.repo) or source.path not in entry:
        return False
    narrowed = entry.split(source.path, 1)[1].strip()
    if not narrowed or narrowed.startswith(("(", "+")):  # "(current line)", "+ other files": the whole file
        return True
    return source.symbol.startswith(narrowed.split()[0])


def last_reading(source: ledger_rows.Source) -> tuple[str, str]:
    """(read on, version read) of the latest SOURCES entry naming `source`'s repository and path (and symbol, where
    the entry names one)."""
    if source.repo == ledger_rows.PROJECT:
        return OURS, ""
    hits = [(on, read) for f, read, on, _ in ledger_docs.SOURCES if _names(f, source)]
    return max(hits) if hits else (NEVER, "")


def citations(version: str) -> list[Citation]:
    """Every citation of `version`'s rows, oldest reading first (never recorded first, our own files last)."""
    grouped: dict[str, list[ledger_rows.Row]] = {}
    for r in ledger.all_rows():
        if version in r.versions:
            grouped.setdefault(r.cite(version), []).append(r)
    out = []
    for cite, rows in grouped.items():
        on, read = last_reading(rows[0].source)
        out.append(Citation(cite, on, read, tuple(f"{r.surface}:{r.name}" for r in rows)))
    order = {NEVER: "0", OURS: "9"}
    return sorted(out, key=lambda c: (order.get(c.read_on, "1" + c.read_on), c.cite))


def render(versions: list[str] | None = None) -> str:
    lines: list[str] = []
    for key in versions or list(trtllm_versions.VERSIONS):
        v = trtllm_versions.get(key)
        cs = citations(key)
        lines.append(f"{v.name} (trtllm_version '{key}', tag {v.tag}): {sum(len(c.names) for c in cs)} rows, "
                     f"{len(cs)} citations, oldest reading first")
        for c in cs:
            shown = ", ".join(c.names[:SHOWN_NAMES]) + (f" +{len(c.names) - SHOWN_NAMES} more"
                                                        if len(c.names) > SHOWN_NAMES else "")
            read = f" [read: {c.version_read}]" if c.version_read else ""
            lines.append(f"  {c.read_on:<15} {c.cite}{read}\n  {'':<15} rows: {shown}")
        lines.append("")
    return "\n".join(lines)
