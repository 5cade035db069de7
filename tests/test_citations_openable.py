"""Every provenance note in the contract ledger is one a reader can open: repository, commit or tag, path, symbol,
pull request. Notes that name a private search tool's storage ("index id 123", "index copies ...", "issues corpus")
cannot be followed by anyone else, so neither the ledger sources nor the rendered docs may carry them; nor may they
say a reading's commit "was not recorded": a version read names the commit it was opened at, or says which opened
commit does not bear the statement out ("not found at commit X")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from builders.trtllm import architectures

from ledger import docs as ledger_docs

ROOT = Path(__file__).resolve().parents[1]
UNOPENABLE = re.compile(r"index (id|ids|copies|commits?|versions?)\b|issues corpus", re.IGNORECASE)
UNPINNED = re.compile(r"\bnot\s+(recorded|kept|noted)\b", re.IGNORECASE)
FILES = sorted([*ROOT.glob("builders/trtllm/*.py"), ROOT / "docs" / "contracts.md",
                ROOT / "docs" / "bring-your-own-model.md"])


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_no_unopenable_citation_in_ledger_sources_or_docs(path: Path) -> None:
    hits = [f"{path.name}:{n}: {line.strip()}" for n, line in enumerate(path.read_text().splitlines(), 1)
            if UNOPENABLE.search(line)]
    assert not hits, "citations a reader cannot open:\n" + "\n".join(hits)


def _versions() -> list[str]:
    return [f"{src}: {v}" for src, v, _, _ in ledger_docs.SOURCES] + [a.read for a in architectures.ARCHITECTURES]


def test_every_source_and_architecture_names_a_commit_tag_or_page() -> None:
    # A version read is a commit (7+ hex digits), a tag / release, a published page or thread, a run wheel, or the
    # commits another table names; anything else is a note nobody can follow.
    openable = re.compile(r"\b[0-9a-f]{7,40}\b|\br\d\d\.\d\d\b|\d+\.\d+|pages?|threads|run|commits named")
    bad = [v for v in _versions() if not openable.search(v)]
    assert not bad, bad


def test_no_reading_is_left_without_its_commit() -> None:
    unpinned = [v for v in _versions() if UNPINNED.search(v)]
    assert not unpinned, unpinned
    hits = [f"{path.name}:{n}: {line.strip()}" for path in FILES
            for n, line in enumerate(path.read_text().splitlines(), 1) if UNPINNED.search(line)]
    assert not hits, "readings whose commit was not kept:\n" + "\n".join(hits)


def test_a_statement_not_borne_out_names_the_commit_opened() -> None:
    # "not found" without the commit that was opened is as unfollowable as "not recorded".
    named = re.compile(r"not found(?: as stated)? at commits? [0-9a-f]{8,40}\b")
    bad = [v for v in _versions() if v.count("not found") != len(named.findall(v))]
    assert not bad, bad


def test_the_pattern_bites() -> None:
    for note in ("index id 426411151", "index ids 1, 2", "index copies 5, 6", "(issues corpus)", "index commit 0a7"):
        assert UNOPENABLE.search(note), note
    assert not UNOPENABLE.search("commit 3a5901cd0d77bed18baaf402d1d12fab468d44a9")
    for note in ("a version read, commit not recorded", "two versions, commits not recorded",
                 "one more version read (commit NOT RECORDED)", "commit not kept"):
        assert UNPINNED.search(note), note
    assert not UNPINNED.search("not found at commit 14e801da3632eb71367b847e335c4f2b09098651")
    named = re.compile(r"not found(?: as stated)? at commits? [0-9a-f]{8,40}\b")
    assert not named.search("not found at an opened commit") and not named.search("not found at commit 0a7")
