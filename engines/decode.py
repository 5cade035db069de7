"""The decoding math: prefill, a target-only step and a speculative step over a batch of sequence slots.

One speculative step for a batch of sequences (gpt-fast's `speculative_decode`, with a tree):

    tree   = draft(drafter state)                        # root = last chosen token, nodes = draft tokens
    hidden = verify(tree)                                # ONE target forward: positions len + depth, mask = ancestors
    path, next = walk(tree, hidden)                      # accept: deepest accepted path + one token from the target
    compact(path)                                        # the path's K/V move to len .. len + |path| - 1
    -- the session outputs path tokens + next; stop conditions end some sequences --
    commit_drafter(path tokens[1:] + [next], target features on the path)   # drafter state for the next step

Target-only decoding is the same loop with an empty tree. The functions read the batch's device state (`TargetBatch`,
and `DraftBatch` when speculating) and each slot's request, generator and committed length (engines/slots.py), and
return what they accepted per slot; the session applies it (output, stop conditions, statistics, streaming).
Host-side bookkeeping (tokens, paths, cache lengths) is kept in Python lists so that a step reads the device back
once per walk level and not per sequence or per forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch

from core.laps import Laps
from engines import skinny
from engines.draft import DraftState
from engines.drafting import Drafting
from engines.cache import KVCache, Rows
from engines.heads import Drafter
from engines.model import Llama
from engines.sampling import choose, greedy_node, sampling_node
from engines.slots import Accepted, Slot
from engines.tree import TreeBatch

if TYPE_CHECKING:
    from engines.generic import GenericTarget

# Tree rows (all sequences' nodes) up to which `walk` computes the lm_head at every node in one product: the rows one
# pass of the AVX2 kernel multiplies for the price of one; on a GPU a product of a few rows also costs what one does.
EAGER_LM_HEAD_ROWS = skinny.ROWS_PER_PASS


@dataclass
class TargetBatch:
    """The target's side of a batch: its model, its KV cache (one row per slot) and each slot's last chosen token."""

    model: Llama | GenericTarget
    cache: KVCache
    root: torch.Tensor  # (capacity,) last chosen token per slot, not yet in the caches
    capture: tuple[int, ...] = ()  # target layers whose outputs the drafter reads (EAGLE-3)

    @property
    def device(self) -> torch.device:
        return self.root.device


@dataclass
class DraftBatch:
    """The drafter's side of a speculating batch: head, drafting strategy, KV cache (with the strategy's scratch
    slots) and each slot's drafter state at its last committed token."""

    drafter: Drafter
    drafting: Drafting
    cache: KVCache
    capacity: int
    # Allocated on the first drafter pass, when the head's hidden size and draft vocabulary are known.
    state: DraftState | None = None


class Walked(NamedTuple):
    """A sequence's accepted path (root .. deepest accepted node) and its new tokens: the path's draft tokens and
    the one the target chose after it."""

    path: list[int]
    tokens: list[int]


@dataclass
class Speculated:
    """A speculative step up to the output: what it accepted per slot, and what the drafter update needs."""

    slots: list[Slot]
    walked: list[Walked]
    hidden: torch.Tensor  # target hidden states at every tree node
    captured: list[torch.Tensor]  # the captured target layers at every tree node (EAGLE-3)
    accepted: list[Accepted]
    on: list[bool]  # per sequence: whether it drafted (False: its drafter pair goes to its backlog)


def rows_of(slots: list[Slot], device: torch.device) -> Rows:
    return Rows.of([s.index for s in slots], [s.length for s in slots], device)


def _causal(b: int, n: int, device: torch.device) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool, device=device).tril().expand(b, -1, -1)


# ---- steps -----------------------------------------------------------------------------------------------------------
def prefill(t: TargetBatch, d: DraftBatch | None, group: list[Slot], defer: bool = False) -> list[Accepted]:
    """Prefill requests whose prompts have the same length in one forward; choose each one's first token. `defer`:
    the batch will not draft, so the drafter's pairs of the prompt go to each sequence's backlog (`Slot.behind`,
    fed by `catch_up` when it drafts) instead of a drafter pass now."""
    dev = t.device
    prompt = torch.tensor([s.request.prompt_ids for s in group], device=dev)
    b, p = prompt.shape
    rows = Rows.of([s.index for s in group], [0] * b, dev)
    arange = torch.arange(p, device=dev)
    hidden, captured = t.model.forward(prompt, rows.step(arange.expand(b, p), _causal(b, p, dev)), t.cache, t.capture)
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


def speculate(t: TargetBatch, d: DraftBatch, slots: list[Slot], laps: Laps, on: list[bool] | None = None
              ) -> Speculated:
    """draft a tree -> verify all of it in ONE target forward -> walk to the accepted path -> compact its K/V.

    `on[j]` False: sequence j does not draft this step (its own acceptance switch): its row verifies the root alone
    in the same forward and its drafter pair goes to its backlog. Sequences that draft again first catch the drafter
    up on their backlog (`catch_up`)."""
    laps.start()
    on = [True] * len(slots) if on is None else on
    behind = [s for s, o in zip(slots, on) if o and s.behind]
    if behind:
        catch_up(d, behind)
        laps.lap("drafter catch-up")
    rows = rows_of(slots, t.device)
    tree, drafted = draft(t, d, rows, laps, on)
    hidden, captured = verify(t, rows, tree)
    laps.lap("verify")
    walked = walk(t, slots, tree, hidden)
    laps.lap("walk")
    compact(t, rows, walked)
    laps.lap("kv compaction")
    accepted = [Accepted(s.index, w.tokens, forwards=1, drafted=n, accepted=len(w.path) - 1)
                for s, w, n in zip(slots, walked, drafted)]
    return Speculated(slots, walked, hidden, captured, accepted, on)


# ---- the parts of a speculative step ---------------------------------------------------------------------------------
def draft(t: TargetBatch, d: DraftBatch, rows: Rows, laps: Laps, on: list[bool] | None = None
          ) -> tuple[TreeBatch, list[int]]:
    """The step's trees (the rows with `on` False: the root alone, padded) and the draft tokens of each row."""
    if d.state is None:
        raise RuntimeError("a speculative step before any prefill: the drafter has no state yet")
    on = [True] * len(rows.host) if on is None else on
    sub = [j for j, o in enumerate(on) if o]
    part = rows if len(sub) == len(on) else Rows.of([rows.host[j] for j in sub], [rows.host_lens[j] for j in sub],
                                                     t.device)
    state = DraftState(d.state.h[part.idx], d.state.logits[part.idx])
    tree = d.drafting.draft(d.drafter, d.cache, part, t.root[part.idx], state, laps.lap)
    drafted = [tree.size - 1 if o else 0 for o in on]
    return (tree if len(sub) == len(on) else root_only_rows(tree, sub, t.root[rows.idx])), drafted


def root_only_rows(tree: TreeBatch, sub: list[int], roots: torch.Tensor) -> TreeBatch:
    """The trees of the rows `sub` in a batch of len(roots) rows whose other rows verify their root alone: their
    other nodes are their own parents (no walk reaches them) and see only themselves."""
    b, n = roots.shape[0], tree.size
    dev = roots.device
    idx = torch.tensor(sub, device=dev)
    tokens = torch.zeros(b, n, dtype=tree.tokens.dtype, device=dev)
    tokens[:, 0] = roots
    tokens[idx] = tree.tokens
    parent = torch.arange(n, device=dev).expand(b, n).clone()
    parent[:, 0] = 0
    parent[idx] = tree.parent
    depth = torch.zeros(b, n, dtype=tree.depth.dtype, device=dev)
    depth[idx] = tree.depth
    anc = torch.eye(n, dtype=torch.bool, device=dev).expand(b, n, n).clone()
    anc[idx] = tree.anc
    return TreeBatch(tokens, parent, depth, anc)


def verify(t: TargetBatch, rows: Rows, tree: TreeBatch) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The target's forward over every tree node at once: node n at position len + depth(n), seeing the committed
    cache and its ancestors."""
    step = rows.step(rows.lens[:, None] + tree.depth, tree.anc)
    return t.model.forward(tree.tokens, step, t.cache, t.capture)


def walk(t: TargetBatch, slots: list[Slot], tree: TreeBatch, hidden: torch.Tensor) -> list[Walked]:
    """Verify every sequence's tree: walk it from the root, moving to an accepted child (greedy_node /
    sampling_node) until none is; returns (path root .. deepest accepted node, new tokens) per sequence.

    For a large batch of trees the target's logits are computed only at the nodes the walk reaches, i.e. the
    accepted path plus the node where it stops: tau rows of the vocabulary-wide lm_head per sequence instead of one
    per tree node, level by level, all sequences still walking in one lm_head product and one read-back of their
    argmax. When all nodes of all trees are at most EAGER_LM_HEAD_ROWS rows, one product covers every node before the
    walk: the lm_head is bound by reading its weights, so a few rows cost what one does, and the walk then needs
    no further product."""
    tokens = tree.tokens.tolist()
    parents = tree.parent.tolist()
    kids: list[list[list[int]]] = []
    for par in parents:
        k: list[list[int]] = [[] for _ in par]
        for n, p in enumerate(par[1:], start=1):
            k[p].append(n)
        kids.append(k)
    paths = [[0] for _ in slots]
    result: list[Walked | None] = [None] * len(slots)
    b, n = hidden.shape[:2]
    lm_head = t.model.lm_head
    every = lm_head(hidden) if b * n <= EAGER_LM_HEAD_ROWS else None  # (B, N, V)
    while walking := [j for j, r in enumerate(result) if r is None]:
        idx = torch.tensor(walking, device=hidden.device)
        nodes = torch.tensor([paths[j][-1] for j in walking], device=hidden.device)
        logits = every[idx, nodes] if every is not None else lm_head(hidden[idx, nodes])  # (walking, V)
        tops = logits.argmax(-1).tolist()
        for r, j in enumerate(walking):
            s, node = slots[j], paths[j][-1]
            sp = s.request.sampling
            tok: int | None = tops[r]
            if sp.greedy:
                child = greedy_node(tops[r], kids[j][node], tokens[j])
            else:
                child, tok = sampling_node(logits[r], kids[j][node], tokens[j], sp, s.gen)
            if child is None:
                assert tok is not None
                result[j] = Walked(paths[j], [tokens[j][p] for p in paths[j][1:]] + [tok])
            else:
                paths[j].append(child)
    return [r for r in result if r is not None]


def compact(t: TargetBatch, rows: Rows, walked: list[Walked]) -> None:
    """KV compaction: the accepted path's entries become contiguous after the committed cache; a target with
    recurrent layers keeps each row's state after its accepted path (engines/recurrent.py)."""
    dev = t.device
    accept = getattr(t.model, "accept", None)
    if accept is not None:
        accept(rows.host, [len(w.path) for w in walked])
    for j, (i, w) in enumerate(zip(rows.host, walked)):
        if w.path != list(range(len(w.path))):  # a path of first children is already in place
            base = rows.host_lens[j]
            t.cache.move(i, torch.tensor([base + p for p in w.path], device=dev),
                         torch.arange(base, base + len(w.path), device=dev))


def commit_drafter(t: TargetBatch, d: DraftBatch, step: Speculated, going: list[bool]) -> None:
    """The sequences still going commit their new tokens: the root moves to the last one, and the drafter reads
    the pairs (token, target feature at the previous position), all sequences at once (padded to the longest);
    the caches grow by the path length."""
    dev = t.device
    feed: list[tuple[Slot, list[int], torch.Tensor]] = []  # (slot, new tokens, their features)
    for j, (s, w) in enumerate(zip(step.slots, step.walked)):
        if not going[j]:
            continue
        t.root[s.index] = w.tokens[-1]
        at = torch.tensor(w.path, device=dev)
        feats = d.drafter.features(step.hidden[j, at][None], [c[j, at][None] for c in step.captured])[0]
        if step.on[j]:
            feed.append((s, w.tokens, feats))
        else:  # not drafting: the root alone was verified (one token), its pair waits in the backlog
            s.behind.append((w.tokens[0], feats[0]))
            s.length += 1
    if not feed:
        return
    n = [len(new) for _, new, _ in feed]
    b, longest = len(feed), max(n)
    tok = torch.tensor([new + [0] * (longest - len(new)) for _, new, _ in feed], device=dev)
    ft = feed[0][2].new_zeros(b, longest, feed[0][2].shape[-1])
    for j, (_, _, feats) in enumerate(feed):
        ft[j, : n[j]] = feats
    slots = [s for s, _, _ in feed]
    update_drafter(d, rows_of(slots, dev), tok, ft, n)
    for s, k in zip(slots, n):
        s.length += k


def update_drafter(d: DraftBatch, rows: Rows, tokens: torch.Tensor, feats: torch.Tensor, n: list[int]) -> None:
    """Append pairs (tokens[:, t], feats[:, t]) at positions lens + t (causal); keep the state of the last real one."""
    b, length = tokens.shape
    dev = tokens.device
    arange = torch.arange(length, device=dev)
    h = d.drafter.forward(tokens, feats, rows.step(rows.lens[:, None] + arange, _causal(b, length, dev)), d.cache)
    last = h[torch.arange(b, device=dev), torch.tensor(n, device=dev) - 1]
    logits = d.drafter.logits(last)
    if d.state is None:
        d.state = DraftState(last.new_zeros(d.capacity, last.shape[-1]), logits.new_zeros(d.capacity, logits.shape[-1]))
    d.state.h[rows.idx] = last
    d.state.logits[rows.idx] = logits


def catch_up(d: DraftBatch, slots: list[Slot]) -> None:
    """Feed the drafter the backlogs of `slots` (the pairs of the steps they took without drafting) in one batched
    pass, padded to the longest; the drafter's cache and state are then those of a drafter fed at every step. Padded
    entries land past each sequence's committed length, where the next step overwrites them; when they would not fit
    the cache, sequences with equal backlogs go together instead."""
    longest = max(len(s.behind) for s in slots)
    if max(s.length - len(s.behind) for s in slots) + longest > d.cache.slots:
        by_len: dict[int, list[Slot]] = {}
        for s in slots:
            by_len.setdefault(len(s.behind), []).append(s)
        if len(by_len) > 1:
            for group in by_len.values():
                catch_up(d, group)
            return
    dev = d.cache.k[0].device
    n = [len(s.behind) for s in slots]
    tok = torch.tensor([[tk for tk, _ in s.behind] + [0] * (longest - len(s.behind)) for s in slots], device=dev)
    f0 = slots[0].behind[0][1]
    ft = f0.new_zeros(len(slots), longest, f0.shape[-1])
    for j, s in enumerate(slots):
        ft[j, : n[j]] = torch.stack([f for _, f in s.behind])
    update_drafter(d, Rows.of([s.index for s in slots], [s.length - k for s, k in zip(slots, n)], dev), tok, ft, n)
    for s in slots:
        s.behind = []
