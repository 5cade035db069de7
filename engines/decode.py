"""The decoding loop, as functions over a `Session` (engines/session.py).

One speculative step for a batch of sequences (gpt-fast's `speculative_decode`, with a tree):

    tree   = draft(drafter state)                        # root = last chosen token, nodes = draft tokens
    hidden = verify(tree)                                # ONE target forward: positions len + depth, mask = ancestors
    path, next = walk(tree, hidden)                      # deepest accepted path + one token from the target
    commit(path): compact the path's K/V to len .. len + |path| - 1; emit path tokens + next;
                  drafter(path tokens[1:] + [next], target features on the path) -> drafter state for the next step

Target-only decoding is the same loop with an empty tree. Host-side bookkeeping (tokens, paths, cache lengths) is
kept in Python lists so that a step reads the device back once per walk level and not per sequence or per forward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from engines import skinny
from engines.draft import DraftState
from engines.model import Rows
from engines.sampling import choose, greedy_node, sampling_node
from engines.tree import TreeBatch

if TYPE_CHECKING:
    from engines.drafting import Drafting
    from engines.session import Session

# (accepted path: root .. deepest accepted node, new tokens: the path's draft tokens + the one the target chose)
Walked = tuple[list[int], list[int]]

# Tree rows (all sequences' nodes) up to which `walk` computes the lm_head at every node in one product: the rows one
# pass of the AVX2 kernel multiplies for the price of one; on a GPU a product of a few rows also costs what one does.
EAGER_LM_HEAD_ROWS = skinny.ROWS_PER_PASS


def _rows(s: Session, slots: list[int]) -> Rows:
    return Rows.of(slots, [s.lens[i] for i in slots], s.rt.device)


def _causal(b: int, n: int, device: torch.device) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool, device=device).tril().expand(b, -1, -1)


def prefill(s: Session, group: list[int]) -> None:
    """Prefill requests whose prompts have the same length in one forward; choose each one's first token."""
    dev = s.rt.device
    prompt = torch.tensor([s.req(i).prompt_ids for i in group], device=dev)
    b, p = prompt.shape
    rows = Rows.of(group, [0] * b, dev)
    arange = torch.arange(p, device=dev)
    hidden, captured = s.rt.target.forward(prompt, rows.step(arange.expand(b, p), _causal(b, p, dev)), s.tcache, s.capture)
    logits = s.rt.target.lm_head(hidden[:, -1])
    first = [choose(logits[j], s.req(i).sampling, s.gens[i]) for j, i in enumerate(group)]
    for i in group:
        s.lens[i] = p
    if s.spec:
        # Drafter pairs (x_{t+1}, f_t) for t = 0..p-1: the prompt shifted by one, then the token just chosen.
        d_tokens = torch.cat([prompt[:, 1:], torch.tensor(first, device=dev)[:, None]], 1)
        update_drafter(s, Rows.of(group, [0] * b, dev), d_tokens, s.rt.drafter.features(hidden, captured), [p] * b)  # type: ignore[union-attr]
    for i, tok in zip(group, first):
        s.root[i] = tok
        s.emit(i, [tok])


def target_step(s: Session, active: list[int]) -> None:
    dev = s.rt.device
    rows = _rows(s, active)
    ones = torch.ones(len(active), 1, 1, dtype=torch.bool, device=dev)
    hidden, _ = s.rt.target.forward(s.root[rows.idx][:, None], rows.step(rows.lens[:, None], ones), s.tcache)
    logits = s.rt.target.lm_head(hidden[:, 0])
    s.grow(active, [1] * len(active))
    tops = logits.argmax(-1).tolist()  # one read-back for the greedy sequences of the batch
    for j, i in enumerate(active):
        sp = s.req(i).sampling
        tok = tops[j] if sp.greedy else choose(logits[j], sp, s.gens[i])
        s.stats[i].target_forwards += 1
        s.root[i] = tok
        s.emit(i, [tok])


def speculative_step(s: Session, active: list[int], make_draft: Callable[[Rows], TreeBatch] | None = None) -> None:
    """draft a tree -> verify all of it in ONE target forward -> walk to the accepted path -> commit it.
    `make_draft` replaces the engine's drafting for this step (engines/schedule.py: a shorter draft, or none)."""
    s.laps.start()
    rows = _rows(s, active)
    tree = make_draft(rows) if make_draft is not None else draft(s, rows)
    hidden, captured = verify(s, rows, tree)
    s.laps.lap("verify")
    walked = walk(s, active, tree, hidden)
    s.laps.lap("walk")
    commit(s, rows, tree, walked, hidden, captured)


def draft(s: Session, rows: Rows, drafting: Drafting | None = None) -> TreeBatch:
    """The step's draft trees with the engine's drafting, or with `drafting` (a shorter tree, engines/schedule)."""
    rt = s.rt
    assert rt.drafter is not None
    state = DraftState(s.state.h[rows.idx], s.state.logits[rows.idx])
    root = s.root[rows.idx]
    drafting = drafting if drafting is not None else rt.drafting
    assert drafting is not None
    return drafting.draft(rt.drafter, s.dcache, rows, root, state, s.laps.lap)


def verify(s: Session, rows: Rows, tree: TreeBatch) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The target's forward over every tree node at once: node n at position len + depth(n), seeing the committed
    cache and its ancestors."""
    step = rows.step(rows.lens[:, None] + tree.depth, tree.anc)
    return s.rt.target.forward(tree.tokens, step, s.tcache, s.capture)


def walk(s: Session, active: list[int], tree: TreeBatch, hidden: torch.Tensor) -> list[Walked]:
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
    paths = [[0] for _ in active]
    result: list[Walked | None] = [None] * len(active)
    b, n = hidden.shape[:2]
    every = s.rt.target.lm_head(hidden) if b * n <= EAGER_LM_HEAD_ROWS else None  # (B, N, V)
    while walking := [j for j, r in enumerate(result) if r is None]:
        idx = torch.tensor(walking, device=hidden.device)
        nodes = torch.tensor([paths[j][-1] for j in walking], device=hidden.device)
        logits = every[idx, nodes] if every is not None else s.rt.target.lm_head(hidden[idx, nodes])  # (walking, V)
        tops = logits.argmax(-1).tolist()
        for r, j in enumerate(walking):
            sp, node = s.req(active[j]).sampling, paths[j][-1]
            tok: int | None = tops[r]
            if sp.greedy:
                child = greedy_node(tops[r], kids[j][node], tokens[j])
            else:
                child, tok = sampling_node(logits[r], kids[j][node], tokens[j], sp, s.gens[active[j]])
            if child is None:
                assert tok is not None
                result[j] = (paths[j], [tokens[j][p] for p in paths[j][1:]] + [tok])
            else:
                paths[j].append(child)
    return [r for r in result if r is not None]


def commit(
    s: Session, rows: Rows, tree: TreeBatch, walked: list[Walked], hidden: torch.Tensor, captured: list[torch.Tensor]
) -> None:
    """KV compaction (the accepted path's entries become contiguous after the committed cache), output, and the
    drafter fed with the accepted tokens and the target's features on the path."""
    dev = s.rt.device
    for j, (i, (path, _)) in enumerate(zip(rows.host, walked)):
        if path != list(range(len(path))):  # a path of first children is already in place
            base = rows.host_lens[j]
            s.tcache.move(i, torch.tensor([base + p for p in path], device=dev),
                          torch.arange(base, base + len(path), device=dev))
    s.laps.lap("kv compaction")
    going: list[tuple[int, list[int], torch.Tensor]] = []  # (slot, new tokens, their features)
    for j, (i, (path, new)) in enumerate(zip(rows.host, walked)):
        kept = s.emit(i, new)
        count(s, i, drafted=tree.size - 1, accepted=min(len(path) - 1, kept))
        if s.finish[i] is None:
            s.root[i] = new[-1]
            at = torch.tensor(path, device=dev)
            feats = s.rt.drafter.features(hidden[j, at][None], [c[j, at][None] for c in captured])[0]  # type: ignore[union-attr]
            going.append((i, new, feats))
    s.laps.lap("output")
    if going:
        commit_drafter(s, going)
    s.laps.lap("drafter update")


def count(s: Session, i: int, drafted: int, accepted: int) -> None:
    st = s.stats[i]
    st.target_forwards += 1
    st.draft_tokens += drafted
    st.accepted_draft_tokens += accepted
    for d in range(accepted):
        st.acceptance_by_depth[d] += 1


def commit_drafter(s: Session, going: list[tuple[int, list[int], torch.Tensor]]) -> None:
    """Feed each sequence's newly committed pairs (token, target feature at the previous position) to the
    drafter, all sequences at once (padded to the longest); the caches grow by the path length."""
    dev = s.rt.device
    n = [len(new) for _, new, _ in going]
    b, longest = len(going), max(n)
    tok = torch.tensor([new + [0] * (longest - len(new)) for _, new, _ in going], device=dev)
    ft = going[0][2].new_zeros(b, longest, going[0][2].shape[-1])
    for j, (_, _, feats) in enumerate(going):
        ft[j, : n[j]] = feats
    slots = [i for i, _, _ in going]
    update_drafter(s, _rows(s, slots), tok, ft, n)
    s.grow(slots, n)


def update_drafter(s: Session, rows: Rows, tokens: torch.Tensor, feats: torch.Tensor, n: list[int]) -> None:
    """Append pairs (tokens[:, t], feats[:, t]) at positions lens + t (causal); keep the state of the last real one."""
    d = s.rt.drafter
    assert d is not None
    b, length = tokens.shape
    dev = s.rt.device
    arange = torch.arange(length, device=dev)
    h = d.forward(tokens, feats, rows.step(rows.lens[:, None] + arange, _causal(b, length, dev)), s.dcache)
    last = h[torch.arange(b, device=dev), torch.tensor(n, device=dev) - 1]
    logits = d.logits(last)
    if s.state.logits.numel() == 0:
        s.state = DraftState(last.new_zeros(s.capacity, last.shape[-1]), logits.new_zeros(s.capacity, logits.shape[-1]))
    s.state.h[rows.idx] = last
    s.state.logits[rows.idx] = logits
