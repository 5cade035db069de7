"""Which positions of a GLOBAL batch carry loss, decided identically on every rank (see dist.py).

Index t of an example (T tokens) pairs feature f_t with token x_{t+1}; with a shift k (EAGLE-3 training-time-test
step k) it is scored against position t+1+k. Its loss positions are the t with x_{t+1+k} an answer token. The
soft cross-entropy may use a uniformly random subset of `keep` of the batch's loss positions (an unbiased estimate of
the mean over all of them, at a fraction of the lm_head cost): positions are numbered example by example in batch
order, a permutation drawn from the step's generator picks `keep` of them, and each example gets its own picks.
Every rank draws the same permutation from the same generator over the same global numbering, so the subset does
not depend on how the batch is split.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Positions:
    loss: list[torch.Tensor]  # per example of the global batch: its loss positions t (ascending)
    ce: list[torch.Tensor]  # per example: the positions its cross-entropy term uses (a subset of `loss`, ascending)

    @property
    def n_loss(self) -> int:
        """Loss positions in the whole global batch (the normalizer of per-position means)."""
        return sum(len(x) for x in self.loss)

    @property
    def n_ce(self) -> int:
        return sum(len(x) for x in self.ce)


def loss_positions(loss_mask: torch.Tensor, shift: int = 0) -> torch.Tensor:
    """Indices t in [0, T-1-shift) whose target token x_{t+1+shift} is an answer token."""
    return loss_mask[1 + shift :].nonzero().flatten()


def plan_positions(masks: list[torch.Tensor], keep: int, gen: torch.Generator | None, shift: int = 0) -> Positions:
    """Positions of every example of a global batch; `keep` > 0 with a generator = the random subset."""
    loss = [loss_positions(m, shift) for m in masks]
    total = sum(len(x) for x in loss)
    if gen is None or not 0 < keep < total:
        return Positions(loss, loss)
    picked = torch.zeros(total, dtype=torch.bool)
    picked[torch.randperm(total, generator=gen)[:keep]] = True
    ce, start = [], 0
    for x in loss:
        ce.append(x[picked[start : start + len(x)]])
        start += len(x)
    return Positions(loss, ce)


def position_mask(positions: list[torch.Tensor], width: int) -> torch.Tensor:
    """[B, width] bool with True at each example's positions."""
    out = torch.zeros(len(positions), width, dtype=torch.bool)
    for i, p in enumerate(positions):
        out[i, p] = True
    return out
