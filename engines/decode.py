"""The steps around the speculative one (engines/step.py): the prefill and the target-only step.

The functions read the batch's device state (`TargetBatch`, and `DraftBatch` when speculating) and each slot's
request, generator and committed length (engines/slots.py), and return what they accepted per slot; the session
applies it (output, stop conditions, statistics, streaming).
"""

from __future__ import annotations

import torch

from core.types import SamplingParams
from engines.cache import Rows
from engines.slots import Accepted, Slot
from engines.step import DraftBatch, TargetBatch, causal, draw, rows_of, target_probs, update_drafter


def prefill(t: TargetBatch, d: DraftBatch | None, group: list[Slot], defer: bool = False) -> list[Accepted]:
    """Prefill requests whose prompts have the same length in one forward; choose each one's first token. `defer`:
    the batch will not draft, so the drafter's pairs of the prompt go to each sequence's backlog (`Slot.behind`,
    fed by `catch_up` when it drafts) instead of a drafter pass now."""
    dev = t.device
    prompt = torch.tensor([s.request.prompt_ids for s in group], device=dev)
    b, p = prompt.shape
    rows = Rows.of([s.index for s in group], [0] * b, dev)
    arange = torch.arange(p, device=dev)
    hidden, captured = t.model.forward(prompt, rows.step(arange.expand(b, p), causal(b, p, dev)), t.cache, t.capture)
    logits = t.model.lm_head(hidden[:, -1])
    first = [choose(logits[j], s.request.sampling, s.gen) for j, s in enumerate(group)]
    for s in group:
        s.length = p
    if d is not None:
        # Drafter pairs (x_{t+1}, f_t) for t = 0..p-1: the prompt shifted by one, then the token just chosen.
        d_tokens = torch.cat([prompt[:, 1:], torch.tensor(first, device=dev)[:, None]], 1)
        feats = d.drafter.features(hidden, captured)
        if defer:
            for j, s in enumerate(group):
                s.behind = list(zip(d_tokens[j].tolist(), feats[j].unbind(0)))
        else:
            update_drafter(d, rows, d_tokens, feats, [p] * b)
    for s, tok in zip(group, first):
        t.root[s.index] = tok
    return [Accepted(s.index, [tok], forwards=0) for s, tok in zip(group, first)]


def target_step(t: TargetBatch, slots: list[Slot]) -> list[Accepted]:
    """One target forward per sequence at its last chosen token; the next token from its logits."""
    return _target_step(t, slots, ())[0]


def plain_step(t: TargetBatch, d: DraftBatch, slots: list[Slot]) -> tuple[list[Accepted], torch.Tensor]:
    """A step without drafting in a speculating batch: exactly a target-only step (no drafter forward, no tree),
    which also returns each sequence's drafter feature at its position (B, F), for its backlog (`Slot.behind`)."""
    accepted, hidden, captured = _target_step(t, slots, t.capture)
    return accepted, d.drafter.features(hidden, captured)[:, 0]


def _target_step(t: TargetBatch, slots: list[Slot], capture: tuple[int, ...]
                 ) -> tuple[list[Accepted], torch.Tensor, list[torch.Tensor]]:
    dev = t.device
    rows = rows_of(slots, dev)
    ones = torch.ones(len(slots), 1, 1, dtype=torch.bool, device=dev)
    hidden, captured = t.model.forward(t.root[rows.idx][:, None], rows.step(rows.lens[:, None], ones), t.cache,
                                       capture)
    logits = t.model.lm_head(hidden[:, 0])
    tops = logits.argmax(-1).tolist()  # one read-back for the greedy sequences of the batch
    accepted = []
    for j, s in enumerate(slots):
        s.length += 1
        sp = s.request.sampling
        tok = tops[j] if sp.greedy else choose(logits[j], sp, s.gen)
        t.root[s.index] = tok
        accepted.append(Accepted(s.index, [tok]))
    return accepted, hidden, captured


def choose(logits: torch.Tensor, sp: SamplingParams, gen: torch.Generator) -> int:
    """Target-only next token from a 1-D logits row: the argmax, or a draw from the target distribution that the
    speculative step's acceptance rule also reads (engines/step.py `target_probs`)."""
    if sp.greedy:
        return int(torch.argmax(logits))
    return draw(target_probs(logits, sp), gen)
