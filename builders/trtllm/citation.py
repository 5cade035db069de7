"""Where an upstream name is read: a file and symbol in a repository, at the ref `ledger.rows.ref_of` picks
per version. The architecture table (`architectures.py`) and the contract ledger (ledger/) cite with it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Source:
    repo: str
    path: str
    symbol: str
