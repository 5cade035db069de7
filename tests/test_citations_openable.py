"""Every provenance note in the contract ledger is one a reader can open: repository, commit or tag, path, symbol,
pull request. Notes that name a private search tool's storage ("index id 123", "index copies ...", "issues corpus")
cannot be followed by anyone else, so neither the ledger sources nor the rendered docs may carry them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from builders.trtllm import architectures, ledger_docs

ROOT = Path(__file__).resolve().parents[1]
UNOPENABLE = re.compile(r"index (id|ids|copies|commits?|versions?)\b|issues corpus", re.IGNORECASE)
FILES = sorted([*ROOT.glob("builders/trtllm/*.py"), ROOT / "docs" / "contracts.md",
                ROOT / "docs" / "bring-your-own-model.md"])


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_no_unopenable_citation_in_ledger_sources_or_docs(path: Path) -> None:
    hits = [f"{path.name}:{n}: {line.strip()}" for n, line in enumerate(path.read_text().splitlines(), 1)
            if UNOPENABLE.search(line)]
    assert not hits, "citations a reader cannot open:\n" + "\n".join(hits)


def test_every_source_and_architecture_names_a_commit_tag_page_or_says_none_was_recorded() -> None:
    # A version read is a commit (7+ hex digits), a tag / release, a published page or thread, a run wheel, or the
    # plain statement that its commit was not recorded; anything else is a note nobody can follow.
    openable = re.compile(r"\b[0-9a-f]{7,40}\b|\br\d\d\.\d\d\b|\d+\.\d+|pages?|threads|run|not recorded|commits named")
    versions = [f"{src}: {v}" for src, v, _, _ in ledger_docs.SOURCES] + [a.read for a in architectures.ARCHITECTURES]
    bad = [v for v in versions if not openable.search(v)]
    assert not bad, bad


def test_the_pattern_bites() -> None:
    for note in ("index id 426411151", "index ids 1, 2", "index copies 5, 6", "(issues corpus)", "index commit 0a7"):
        assert UNOPENABLE.search(note), note
    assert not UNOPENABLE.search("commit 3a5901cd0d77bed18baaf402d1d12fab468d44a9")
