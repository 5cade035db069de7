"""Oracle heads: drafters whose drafts are the target's own greedy continuation, placed at a chosen rank.

A random head is almost never accepted past depth 1 and the mimic head (tests/conftest.py) rarely reaches the deepest
level, so a bug in the tree mask, the RoPE positions or the KV compaction of deep nodes goes unseen. An `OracleDrafter`
wraps a real drafter (its forward still runs, with its cache, masks and positions) and rewrites its logits: at a node
whose context (every token so far) lies on the target's greedy path, the greedy next token is put at the rank the
`schedule` names for that context (None = ranked below every other token, so no tree drafts it). Off the path the real
head's logits are kept. Every tree kind then accepts exactly as deep as the schedule allows, and `expected_stats`
computes, independently of the engine, the exact per-request forwards and acceptance that follow.

The context id rides in one extra column of the drafter's output `h` (stripped before the real forward), so the
oracle needs no view of the engine's bookkeeping beyond each forward's cache rows and positions. Contexts are the
tokens after the first prompt token: the drafter sees pairs (x_{t+1}, f_t) and never x_0.

Families: `FAMILIES` maps a target family to a tiny-model factory `(out_dir, seed) -> HF model dir`; a family whose
converter and engine exist plugs in with one line in that dict (e.g. `"qwen3": lambda out, seed:
tm.make_qwen3_target(out, seed=seed),`), and every oracle test parametrized over `FAMILIES` runs on it. The tests
`sharpen` each target so that its greedy tokens depend on the context (see there).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from engines.api import GenerationRequest, GenerationResult, ReferenceEngine, SamplingParams
from core.trees import DraftTree, DynamicTree
from testkit import tiny_families as tf
from testkit import tiny_models as tm

Context = tuple[int, ...]
Schedule = Callable[[Context], int | None]  # rank at which the greedy next token is drafted (None = nowhere)

FAMILIES: dict[str, Callable[[Path, int], Path]] = {
    "llama": lambda out, seed: tm.make_target(out, seed=seed),
    "llama3-rope": lambda out, seed: tm.make_target(out, seed=seed, rope_scaling=tm.LLAMA3_ROPE),
    "qwen3": lambda out, seed: tf.make_family_target(out, "qwen3", seed=seed),
    "qwen2": lambda out, seed: tf.make_family_target(out, "qwen2", seed=seed),
    "mistral": lambda out, seed: tf.make_family_target(out, "mistral", seed=seed),
}

QK_SCALE = 4.0
O_SCALE = 4.0


def sharpen(model_dir: Path, qk: float = QK_SCALE, o: float = O_SCALE) -> Path:
    """Make a tiny random target depend on its context: attention logits x qk^2 (peaked on a few positions instead of
    a near-uniform average) and attention outputs x o (they outweigh the token's own embedding). A random tiny model's
    greedy token is otherwise nearly a function of the last token alone, and a mask that hides one ancestor changes
    nothing. Works on any family's safetensors: where q_norm / k_norm exist (Qwen3) they are scaled instead of the
    projections they would normalize away."""
    from safetensors.torch import load_file, save_file

    f = model_dir / "model.safetensors"
    t = load_file(str(f))
    has_qk_norm = any(k.endswith(("q_norm.weight", "k_norm.weight")) for k in t)
    for k in t:
        qk_names = ("q_norm.weight", "k_norm.weight") if has_qk_norm else ("q_proj.weight", "k_proj.weight",
                                                                            "q_proj.bias", "k_proj.bias")
        if k.endswith(qk_names):
            t[k] = t[k] * qk
        elif k.endswith("o_proj.weight"):
            t[k] = t[k] * o
    save_file(t, str(f), metadata={"format": "pt"})
    return model_dir


def always_top(ctx: Context) -> int | None:
    return 0


def mixed(ranks: Sequence[int | None]) -> Schedule:
    """A deterministic mix: the rank cycles through `ranks` with the context (its length and last token), so one
    step accepts deep, the next stops at a runner-up or a miss; the same context always gets the same rank."""
    return lambda ctx: ranks[(len(ctx) * 7 + ctx[-1]) % len(ranks)]


class OracleDrafter:
    """A drafter proxy (engines/heads.py Drafter interface) that drafts the target's greedy continuation."""

    def __init__(self, real: Any, greedy: dict[Context, int], schedule: Schedule, hidden: int) -> None:
        self.real = real
        self.greedy = greedy
        self.schedule = schedule
        self.hidden = hidden
        self.ids: dict[Context, int] = {}
        self.contexts: list[Context] = []
        self.rows: dict[int, list[int]] = {}  # cache row -> drafter tokens at positions 0, 1, ...
        self.placed = 0  # contexts whose greedy token was placed (so a test can see the oracle was used)

    def __getattr__(self, name: str) -> Any:  # layers, kv_heads, head_dim, capture, lm_head, ...
        return getattr(self.real, name)

    def features(self, hidden: torch.Tensor, captured: list[torch.Tensor]) -> torch.Tensor:
        return self.real.features(hidden, captured)

    def _id(self, ctx: Context) -> int:
        if ctx not in self.ids:
            self.ids[ctx] = len(self.contexts)
            self.contexts.append(ctx)
        return self.ids[ctx]

    def forward(self, tokens: torch.Tensor, feats: torch.Tensor, step: Any, cache: Any) -> torch.Tensor:
        tagged = feats.shape[-1] == self.hidden + 1  # a tree node: feats = its parent's (tagged) output
        h = self.real.forward(tokens, feats[..., : self.hidden] if tagged else feats, step, cache)
        toks, pos, rows = tokens.tolist(), step.positions.tolist(), step.rows.tolist()
        tags = []
        for b, row in enumerate(rows):
            if tagged:  # context = the parent's + this node's token
                parents = feats[b, :, -1].tolist()
                tags.append([self._id(self.contexts[int(p)] + (t,)) for p, t in zip(parents, toks[b])])
            else:  # committed pairs written at positions pos[b][0], ...: the row's context grows (padding included)
                seq = self.rows.setdefault(row, [])
                del seq[pos[b][0] :]
                seq.extend(toks[b])
                tags.append([self._id(tuple(seq[: p + 1])) for p in pos[b]])
        tag = torch.tensor(tags, dtype=h.dtype, device=h.device)
        return torch.cat([h, tag[..., None]], -1)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        logits = self.real.logits(h[..., : self.hidden]).clone()
        flat = logits.view(-1, logits.shape[-1])
        for j, t in enumerate(h[..., -1].reshape(-1).tolist()):
            ctx = self.contexts[int(t)]
            if ctx in self.greedy:
                place(flat[j], self.draft_id(self.greedy[ctx]), self.rank(ctx))
                self.placed += 1
        return logits

    def draft_id(self, target_id: int) -> int | None:
        """The draft-vocabulary id of a target token (None: not in the head's draft vocabulary)."""
        d2t = getattr(self.real, "d2t", None)
        ids = getattr(self.real, "draft_ids", None)
        if d2t is not None:
            ids = torch.arange(d2t.shape[0], device=d2t.device) + d2t
        if ids is None:
            return target_id
        hit = (ids == target_id).nonzero()
        return int(hit[0, 0]) if hit.numel() else None

    def rank(self, ctx: Context) -> int | None:
        """The rank the greedy token after `ctx` is drafted at (None when the schedule or the vocabulary says no)."""
        return None if self.draft_id(self.greedy[ctx]) is None else self.schedule(ctx)

    def to_target_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return self.real.to_target_ids(ids)


def place(row: torch.Tensor, i: int | None, rank: int | None) -> None:
    """Make token i the rank-th most likely in `row` (rank 0: by a margin of 30 nats, so an EAGLE-2 score keeps it
    first; None: below every other token)."""
    if i is None:
        return
    others = torch.cat([row[:i], row[i + 1 :]]).sort(descending=True).values
    if rank is None:
        row[i] = others[-1] - 1.0
    elif rank == 0:
        row[i] = others[0] + 30.0
    else:
        row[i] = (others[rank - 1] + others[rank]) / 2


def greedy_table(engine: ReferenceEngine, reqs: list[GenerationRequest], extra: int) -> dict[Context, int]:
    """context (tokens after the first prompt token) -> the target's greedy next token, `extra` tokens past each
    request's max_new_tokens (the oracle drafts past the end of an output too)."""
    longer = [dataclasses.replace(r, max_new_tokens=r.max_new_tokens + extra, stop_token_ids=[]) for r in reqs]
    table: dict[Context, int] = {}
    for r, res in zip(longer, engine.generate(longer, speculative=False)):
        seq = r.prompt_ids + res.output_ids
        for k in range(len(r.prompt_ids), len(seq)):
            key = tuple(seq[1:k])
            assert table.setdefault(key, seq[k]) == seq[k], "two requests share a context with different continuations"
    return table


def with_oracle(
    engine: ReferenceEngine, reqs: list[GenerationRequest], schedule: Schedule = always_top
) -> ReferenceEngine:
    """The same engine (weights shared) drafting with an oracle for `reqs` (contexts of other requests get the real
    head's drafts)."""
    rt = engine._rt
    assert rt.drafter is not None and rt.drafting is not None, "the oracle wraps an engine with a head and a tree"
    assert rt.dtype == torch.float32, "context ids ride in a float column: float32 keeps them exact"
    depth = rt.drafting.tree.depth
    table = greedy_table(engine, reqs, depth + 2)
    hidden = rt.target.norm.shape[-1]  # the drafter's output width (EAGLE-1/2 and EAGLE-3 heads: the target's hidden)
    oracle = OracleDrafter(rt.drafter, table, schedule, hidden)
    return ReferenceEngine(dataclasses.replace(rt, drafter=oracle))


def oracle_of(engine: ReferenceEngine) -> OracleDrafter:
    d = engine._rt.drafter
    assert isinstance(d, OracleDrafter)
    return d


@dataclasses.dataclass
class Expected:
    output_ids: list[int]
    target_forwards: int
    accepted_draft_tokens: int
    acceptance_by_depth: list[int]


def _accepted_static(paths: set[tuple[int, ...]], oracle: OracleDrafter, ctx: Context) -> int:
    """Walk a static tree: follow the node holding the greedy token while the tree has it."""
    path: tuple[int, ...] = ()
    while True:
        r = oracle.rank(ctx)
        if r is None or path + (r,) not in paths:
            return len(path)
        path += (r,)
        ctx += (oracle.greedy[ctx],)


def _accepted_dynamic(tree: DynamicTree, oracle: OracleDrafter, ctx: Context) -> int:
    """EAGLE-2 with a rank-0 oracle: the greedy chain scores ~0 and every other candidate <= -30, so the chain is
    expanded and kept to the tree depth; it stops at the first context the schedule misses."""
    n = 0
    while n < tree.depth:
        r = oracle.rank(ctx)
        if r is None:
            return n
        assert r == 0, "exact EAGLE-2 acceptance is defined for schedules of ranks 0 and None only"
        n += 1
        ctx += (oracle.greedy[ctx],)
    return n


def expected_stats(engine: ReferenceEngine, req: GenerationRequest) -> Expected:
    """Output and statistics of `req` under the oracle, from the greedy table and the tree alone."""
    oracle = oracle_of(engine)
    tree = engine.tree
    depth = tree.depth
    paths = set(tree.paths) if isinstance(tree, DraftTree) else set()
    out: list[int] = []
    ctx = tuple(req.prompt_ids[1:])
    out.append(oracle.greedy[ctx])  # the prefill's token
    ctx += (out[-1],)
    fw, acc, by_depth = 0, 0, [0] * depth
    while len(out) < req.max_new_tokens:
        a = _accepted_static(paths, oracle, ctx) if paths else _accepted_dynamic(tree, oracle, ctx)
        new = []
        for _ in range(a + 1):
            new.append(oracle.greedy[ctx])
            ctx += (new[-1],)
        kept = min(len(new), req.max_new_tokens - len(out))
        out += new[:kept]
        fw += 1
        acc += min(a, kept)
        for d in range(min(a, kept)):
            by_depth[d] += 1
    return Expected(out, fw, acc, by_depth)


def check_exact(
    engine: ReferenceEngine, reqs: list[GenerationRequest], results: list[GenerationResult], what: str
) -> None:
    """Lossless (the plain greedy output) and exact tau (forwards and acceptance by depth as `expected_stats`), with
    messages that name the likely cause."""
    plain = engine.generate(reqs, speculative=False)
    for i, (req, res, ref) in enumerate(zip(reqs, results, plain)):
        exp = expected_stats(engine, req)
        assert exp.output_ids == ref.output_ids, "the oracle's own simulation disagrees with target-only decoding"
        if res.output_ids != ref.output_ids:
            k = next((j for j, (a, b) in enumerate(zip(res.output_ids, ref.output_ids)) if a != b), len(res.output_ids))
            raise AssertionError(
                f"{what}, request {i}: speculative output differs from the target's greedy output at token {k} "
                f"({res.output_ids[k:k + 4]} vs {ref.output_ids[k:k + 4]}); with every draft on the greedy path this "
                "means the target verified a deep tree node wrongly: check the tree attention mask (ancestor_mask), "
                "the node positions (committed length + depth) and the KV compaction of accepted paths"
            )
        st = res.stats
        got = (st.target_forwards, st.accepted_draft_tokens, list(st.acceptance_by_depth))
        want = (exp.target_forwards, exp.accepted_draft_tokens, exp.acceptance_by_depth)
        assert got == want, (
            f"{what}, request {i}: (forwards, accepted, acceptance by depth) = {got}, expected {want} for an oracle "
            "head: the output is right but drafts on the greedy path were rejected or mis-counted (tree mask, "
            "positions, drafter state after commit, or the acceptance counters)"
        )


def requests(prompts: Sequence[Sequence[int]], new: Sequence[int]) -> list[GenerationRequest]:
    return [GenerationRequest(list(p), n, SamplingParams(), []) for p, n in zip(prompts, new)]
