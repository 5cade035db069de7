"""The speculative step, top to bottom: draft, verify, accept, commit (gpt-fast's `speculative_decode`, with a tree
and a batch of sequences).

    tree   = draft(drafter state)                     # root x_n = last chosen token; nodes = draft tokens
    hidden = verify(tree)                             # ONE target forward: node at position n + depth, sees ancestors
    path, next = walk(tree, logits at reached nodes)  # accept: deepest accepted path + one token from the target
    compact(path)                                     # commit, target: the path's K/V move to n .. n + |path| - 1
    going  = output(path tokens[1:] + [next])         # the session: stop conditions, statistics, streaming
    commit_drafter(path tokens[1:] + [next], target features on the path)   # commit, drafter: its state at the end

`speculative_step` is exactly these lines; the functions below it are the parts, in that order. The step delegates
only to the models (the `Target` protocol below, the drafter of engines/heads.py), their caches (engines/cache.py)
and the `Drafting` protocol that grows the tree (engines/drafting.py).
The prefill and the target-only steps are engines/decode.py; the session (engines/session.py) picks the step.

Host-side bookkeeping (tokens, paths, cache lengths) is kept in Python lists so that a step reads the device back
once per walk level and not per sequence or per forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch

from core.laps import Laps
from core.types import SamplingParams
from engines import skinny
from engines.cache import KVCache, Rows, Step
from engines.drafting import Drafting, DraftState
from engines.heads import Drafter
from engines.slots import Accepted, Slot
from engines.tree import TreeBatch, root_only_rows

# Tree rows (all sequences' nodes) up to which `walk` computes the lm_head at every node in one product: the rows one
# pass of the AVX2 kernel multiplies for the price of one; on a GPU a product of a few rows also costs what one does.
EAGER_LM_HEAD_ROWS = skinny.ROWS_PER_PASS


class Target(Protocol):
    """What a step asks of the target (engines/model.py `Llama`, engines/generic.py `GenericTarget`): a forward over
    its KV cache, the lm_head, and `accept` for what it keeps besides the cache."""

    @property
    def lm_head(self) -> Callable[[torch.Tensor], torch.Tensor]: ...  # hidden (..., H) -> float32 logits (..., V)

    def forward(self, tokens: torch.Tensor, step: Step, cache: KVCache, capture: tuple[int, ...] = ()
                ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Post-norm last hidden state (B, T, H) of `tokens` written where `step` says, and the residual stream at
        the layer ids in `capture` (EAGLE-3)."""
        ...

    def accept(self, rows: list[int], lengths: list[int]) -> None:
        """After a verification: state the target keeps besides its KV cache (recurrent layers) follows each row's
        accepted path of `lengths` nodes."""
        ...


@dataclass
class TargetBatch:
    """The target's side of a batch: its model, its KV cache (one row per slot) and each slot's last chosen token."""

    model: Target
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


Output = Callable[[list[Accepted]], list[bool]]  # the session applies a step's tokens; per entry: still going


def rows_of(slots: list[Slot], device: torch.device) -> Rows:
    return Rows.of([s.index for s in slots], [s.length for s in slots], device)


def causal(b: int, n: int, device: torch.device) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool, device=device).tril().expand(b, -1, -1)


# ---- the step ----------------------------------------------------------------------------------------------------
def speculative_step(t: TargetBatch, d: DraftBatch, slots: list[Slot], output: Output, laps: Laps,
                     on: list[bool] | None = None, drafting: Drafting | None = None) -> list[Accepted]:
    """One speculative step of `slots`; returns what it accepted per slot (after `output` applied it).

    `on[j]` False: sequence j does not draft this step (its own acceptance switch): its row verifies the root alone
    in the same forward and its drafter pair goes to its backlog. `drafting`: a shorter draft than `d.drafting`
    for this step (the load-aware schedule, engines/schedule.py); same head, cache and state."""
    laps.start()
    on = [True] * len(slots) if on is None else on
    # 0. Sequences that draft again after steps without drafting first feed the drafter their backlog.
    if behind := [s for s, o in zip(slots, on) if o and s.behind]:
        catch_up(d, behind)
        laps.lap("drafter catch-up")
    rows = rows_of(slots, t.device)
    # 1. Draft: from its state at x_n (h_n = drafter(x_n, f_{n-1}), logits q_n) the drafter grows a tree: a node's
    #    children are the top-k tokens of q at the node; a node of depth k > 1 is fed (its token, its parent's h).
    tree, drafted = draft(t, d, rows, laps, on, drafting)
    # 2. Verify: one target forward over every node of every tree; p(. | x_<=n, path to node) at each node.
    hidden, captured = verify(t, rows, tree)
    laps.lap("verify")
    # 3. Accept: walk each tree from the root while the target accepts a child (greedy: token = argmax p; sampling:
    #    with probability p(x) / sum p, rejected x removed from p); then one token of the target's own.
    walked = walk(t, slots, tree, hidden)
    laps.lap("walk")
    # 4. Commit to the target: the accepted path's K/V (and recurrent state) become the committed cache's next ones.
    compact(t, rows, walked)
    laps.lap("kv compaction")
    accepted = [Accepted(s.index, w.tokens, forwards=1, drafted=n, accepted=len(w.path) - 1)
                for s, w, n in zip(slots, walked, drafted)]
    going = output(accepted)
    laps.lap("output")
    # 5. Commit to the drafter: the sequences still going feed it their new pairs (x_{t+1}, f_t): each new token
    #    with the target's feature at the position before it; its state moves to the last one.
    commit_drafter(t, d, slots, walked, hidden, captured, on, going)
    laps.lap("drafter update")
    return accepted


# ---- 1. draft ------------------------------------------------------------------------------------------------------
def draft(t: TargetBatch, d: DraftBatch, rows: Rows, laps: Laps, on: list[bool] | None = None,
          drafting: Drafting | None = None) -> tuple[TreeBatch, list[int]]:
    """The step's trees (the rows with `on` False: the root alone, padded) and the draft tokens of each row."""
    if d.state is None:
        raise RuntimeError("a speculative step before any prefill: the drafter has no state yet")
    on = [True] * len(rows.host) if on is None else on
    sub = [j for j, o in enumerate(on) if o]
    part = rows if len(sub) == len(on) else Rows.of([rows.host[j] for j in sub], [rows.host_lens[j] for j in sub],
                                                     t.device)
    state = DraftState(d.state.h[part.idx], d.state.logits[part.idx])
    grow = d.drafting if drafting is None else drafting
    tree = grow.draft(d.drafter, d.cache, part, t.root[part.idx], state, laps.lap)
    drafted = [tree.size - 1 if o else 0 for o in on]
    return (tree if len(sub) == len(on) else root_only_rows(tree, sub, t.root[rows.idx])), drafted


# ---- 2. verify -----------------------------------------------------------------------------------------------------
def verify(t: TargetBatch, rows: Rows, tree: TreeBatch) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The target's forward over every tree node at once: node i at position n + depth(i), seeing the committed
    cache (positions < n) and its ancestors; logits(i) = lm_head(hidden(i)) is the target's next-token
    distribution after the path root .. i."""
    step = rows.step(rows.lens[:, None] + tree.depth, tree.anc)
    return t.model.forward(tree.tokens, step, t.cache, t.capture)


# ---- 3. accept -----------------------------------------------------------------------------------------------------
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


def greedy_node(top: int, kids: list[int], tokens: list[int]) -> int | None:
    """Greedy acceptance at one node where the target's argmax is `top` (EAGLE eagle/model/utils.py
    `evaluate_posterior`, TRT-LLM EagleSampleAndAcceptDraftTokens with greedy_sampling): the child drafted with it
    (None when no child was; siblings carry distinct tokens, so at most one matches). Walking this from the root
    accepts the longest drafted prefix of what target-only greedy decoding outputs, then its argmax (the bonus
    token): the output equals target-only greedy decoding."""
    return next((c for c in kids if tokens[c] == top), None)


def sampling_node(
    logits: torch.Tensor, kids: list[int], tokens: list[int], sp: SamplingParams, gen: torch.Generator
) -> tuple[int | None, int | None]:
    """Sibling rejection at one node (drafts are the drafter's deterministic top-k; EAGLE-2/3 `evaluate_posterior`
    with sampling): with p the target distribution there (temperature, top-k, top-p), try the children in rank
    order; accept child x with probability p(x) / sum(p); on rejection set p(x) = 0 and renormalize; when every
    child is rejected (or the node is a leaf) draw the next token from what is left of p. The step outputs x with
    probability exactly p(x) (a rejection removes x only from the mass a later draw can still hit), so outputs are
    distributed as target-only sampling's. Returns (accepted child, None) or (None, the drawn token)."""
    p = target_probs(logits, sp).cpu()
    for child in kids:
        x = tokens[child]
        mass = float(p.sum())
        if mass > 0 and float(torch.rand((), generator=gen)) * mass < float(p[x]):
            return child, None
        p[x] = 0.0  # rejected: x cannot be the token at this position; renormalize over the rest
    return None, draw(p, gen)


def target_probs(logits: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
    """The target distribution p that sampling reads (target-only sampling too: engines/decode.py `choose`): float32
    probabilities of softmax(logits / temperature) over the top_k tokens, then the smallest set of most likely tokens
    whose mass reaches top_p, renormalized (last dim = vocab). Not for greedy requests."""
    x = logits.float() / sp.temperature
    if sp.top_k > 0 and sp.top_k < x.shape[-1]:
        kth = torch.topk(x, sp.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    p = torch.softmax(x, dim=-1)
    if sp.top_p < 1.0:
        sp_sorted, idx = torch.sort(p, dim=-1, descending=True)
        before = torch.cumsum(sp_sorted, dim=-1) - sp_sorted  # mass of strictly more likely tokens
        drop = before >= sp.top_p  # keep the smallest prefix reaching top_p (always >= 1 token)
        p = p.scatter(-1, idx, sp_sorted.masked_fill(drop, 0.0))
        p = p / p.sum(-1, keepdim=True)
    return p


def draw(p: torch.Tensor, gen: torch.Generator) -> int:
    """One categorical draw from a 1-D probability vector with the request's generator (on CPU)."""
    return int(torch.multinomial(p.cpu(), 1, generator=gen))


# ---- 4. commit to the target -------------------------------------------------------------------------------------
def compact(t: TargetBatch, rows: Rows, walked: list[Walked]) -> None:
    """KV compaction: the accepted path's entries (at slots n + node) become contiguous after the committed cache
    (slots n .. n + |path| - 1); a target with recurrent layers keeps each row's state after its accepted path
    (engines/recurrent.py)."""
    dev = t.device
    t.model.accept(rows.host, [len(w.path) for w in walked])
    for j, (i, w) in enumerate(zip(rows.host, walked)):
        if w.path != list(range(len(w.path))):  # a path of first children is already in place
            base = rows.host_lens[j]
            t.cache.move(i, torch.tensor([base + p for p in w.path], device=dev),
                         torch.arange(base, base + len(w.path), device=dev))


# ---- 5. commit to the drafter ------------------------------------------------------------------------------------
def commit_drafter(t: TargetBatch, d: DraftBatch, slots: list[Slot], walked: list[Walked], hidden: torch.Tensor,
                   captured: list[torch.Tensor], on: list[bool], going: list[bool]) -> None:
    """The sequences still going commit their new tokens: the root moves to the last one, and the drafter reads
    the pairs (token, target feature at the previous position), all sequences at once (padded to the longest);
    the caches grow by the path length."""
    dev = t.device
    feed: list[tuple[Slot, list[int], torch.Tensor]] = []  # (slot, new tokens, their features)
    for j, (s, w) in enumerate(zip(slots, walked)):
        if not going[j]:
            continue
        t.root[s.index] = w.tokens[-1]
        at = torch.tensor(w.path, device=dev)
        feats = d.drafter.features(hidden[j, at][None], [c[j, at][None] for c in captured])[0]
        if on[j]:
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
    fed = [s for s, _, _ in feed]
    update_drafter(d, rows_of(fed, dev), tok, ft, n)
    for s, k in zip(fed, n):
        s.length += k


def update_drafter(d: DraftBatch, rows: Rows, tokens: torch.Tensor, feats: torch.Tensor, n: list[int]) -> None:
    """Append pairs (tokens[:, t], feats[:, t]) at positions lens + t (causal); keep the state of the last real one."""
    b, length = tokens.shape
    dev = tokens.device
    arange = torch.arange(length, device=dev)
    h = d.drafter.forward(tokens, feats, rows.step(rows.lens[:, None] + arange, causal(b, length, dev)), d.cache)
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
