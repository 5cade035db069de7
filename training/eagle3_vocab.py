"""The EAGLE-3 draft vocabulary: the most frequent target tokens of the training answers, and its d2t/t2d maps.

SafeAILab/EAGLE eagle/traineagle3/cnets.py (`scandata`) counts every token under the loss mask over the training
data, keeps the N most common, sorts them by id and stores
    d2t[i] = used[i] - i            (offsets: target_id = draft_id + d2t[draft_id], what the engines read)
    t2d[v] = v in used              (bool mask over the target vocabulary)
Sorting by id makes the map monotone, so d2t is non-decreasing and >= 0. Ties in the count are broken by the
smaller token id (Counter.most_common breaks them by insertion order, which depends on data order).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class VocabError(RuntimeError):
    """The draft vocabulary cannot be built as configured; the message says what to change."""


@dataclass(frozen=True)
class DraftVocab:
    draft_ids: torch.Tensor  # [N] int64, target ids in the draft vocabulary, ascending (= draft id order)
    d2t: torch.Tensor  # [N] int64 offsets
    t2d: torch.Tensor  # [V] bool
    coverage: float  # fraction of counted answer tokens whose id is in the draft vocabulary
    counted: int  # answer tokens counted
    distinct: int  # distinct answer token ids seen


def answer_token_counts(examples: list[dict], vocab_size: int) -> torch.Tensor:
    """[V] int64 counts of tokens under the loss mask (the answers) over `examples` ({"input_ids", "loss_mask"})."""
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for e in examples:
        ids = e["input_ids"].long()[e["loss_mask"]]
        counts += torch.bincount(ids, minlength=vocab_size)[:vocab_size]
    return counts


def build_draft_vocab(counts: torch.Tensor, size: int) -> DraftVocab:
    """Top-`size` ids by count (ties: smaller id first), sorted by id, with d2t/t2d and the coverage."""
    vocab = counts.shape[0]
    distinct = int((counts > 0).sum())
    if size > vocab:
        raise VocabError(f"eagle3.draft_vocab_size={size} exceeds the target vocabulary ({vocab}); lower it")
    if size > distinct:
        raise VocabError(
            f"eagle3.draft_vocab_size={size} but the training answers hold only {distinct} distinct tokens; lower "
            f"eagle3.draft_vocab_size to <= {distinct} or train on more conversations"
        )
    # Stable sort on -count over ids in ascending order keeps the smaller id first among equal counts.
    order = torch.sort(-counts, stable=True).indices[:size]
    draft_ids = torch.sort(order).values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[draft_ids] = True
    total = int(counts.sum())
    return DraftVocab(
        draft_ids=draft_ids,
        d2t=draft_ids - torch.arange(size),
        t2d=t2d,
        coverage=float(counts[draft_ids].sum()) / max(total, 1),
        counted=total,
        distinct=distinct,
    )


def coverage_table(counts: torch.Tensor, sizes: list[int]) -> dict[int, float]:
    """Answer-token coverage of the top-k vocabulary for each k in `sizes` (to choose draft_vocab_size)."""
    ranked = torch.sort(counts, descending=True).values.cumsum(0)
    total = max(int(counts.sum()), 1)
    return {k: float(ranked[min(k, ranked.shape[0]) - 1]) / total for k in sizes}
