"""Loading an engine and the decoding loop.

One speculative step for a batch of sequences (gpt-fast's `speculative_decode`, with a tree):

    tree   = draft(drafter state)                        # root = last chosen token, nodes = draft tokens
    logits = target(tree.tokens, positions = len + depth, mask = ancestors)   # one forward verifies the tree
    path, next = accept(tree, logits)                    # deepest accepted path + one token from the target
    commit(path): compact the path's K/V to len .. len + |path| - 1; emit path tokens + next
    drafter(path tokens[1:] + [next], target features on the path)           # drafter state for the next step

Target-only decoding is the same loop with an empty tree.

`Session` holds the batch as slots (one cache row each): `add` a request at any time, `step` prefills the new ones
or advances every active sequence by one step, finished or cancelled sequences leave (`pop`). `generate` is a
session holding exactly its requests, stepped until all are done; Triton's reference model keeps one session for
its lifetime (in-flight batching).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from builders.trees import DraftTree, DynamicTree
from engines.api import GenerationRequest, GenerationResult, OnTokens, RequestStats
from engines.checkpoint import (
    DTYPES,
    CheckpointError,
    Loader,
    Tensors,
    load_eagle1,
    load_eagle3,
    load_target,
    quant_of,
    rank_file,
    read_config,
    require,
)
from engines.draft import DraftState, draft_dynamic, draft_static
from engines.model import Drafter, Eagle1Drafter, KVCache, Llama, make_step, prepack_cpu
from engines.parallel import TPGroup, current_group
from engines.sampling import choose, greedy_node, sampling_node
from engines.spec import ReferenceSpec
from engines.tree import StaticTree, TreeBatch


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device=cuda but no CUDA device is visible; use device auto or cpu")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r}: use auto, cpu or cuda")
    return torch.device(device)


def load_tokenizer(path: Path) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    if not (path / "tokenizer_config.json").is_file() and not (path / "tokenizer.json").is_file():
        raise CheckpointError(f"{path}: no tokenizer files; the convert stage copies them to <checkpoint>/tokenizer")
    return AutoTokenizer.from_pretrained(str(path))


@dataclass(frozen=True)
class Limits:
    max_batch_size: int
    max_input_len: int
    max_seq_len: int

    def check(self, requests: list[GenerationRequest]) -> None:
        if len(requests) > self.max_batch_size:
            raise ValueError(f"{len(requests)} requests exceed the build's engine.max_batch_size={self.max_batch_size}")
        for i, r in enumerate(requests):
            self.check_request(i, r)

    def check_request(self, i: int, r: GenerationRequest) -> None:
        if len(r.prompt_ids) > self.max_input_len:
            raise ValueError(
                f"request {i}: prompt of {len(r.prompt_ids)} tokens exceeds engine.max_input_len={self.max_input_len}"
            )
        if len(r.prompt_ids) + r.max_new_tokens > self.max_seq_len:
            raise ValueError(
                f"request {i}: prompt {len(r.prompt_ids)} + max_new_tokens {r.max_new_tokens} exceeds "
                f"engine.max_seq_len={self.max_seq_len}; lower max_new_tokens"
            )


@dataclass
class Runtime:
    target: Llama
    drafter: Drafter | None
    tree: DraftTree | DynamicTree | None
    static: StaticTree | None
    tokenizer: Any
    device: torch.device
    dtype: torch.dtype
    random_head: bool
    group: TPGroup
    limits: Limits | None = None  # from the build's reference.json; None = only memory limits

    @classmethod
    def load(
        cls, ckpt: Path, *, tree: DraftTree | DynamicTree | None, dtype: str, device: str,
        eagle3_head_dir: Path | None, tokenizer_dir: Path | None = None,
    ) -> Runtime:
        if dtype not in DTYPES:
            raise ValueError(f"dtype={dtype!r}: use one of {', '.join(DTYPES)}")
        dev = resolve_device(device)
        cfg = read_config(ckpt)
        group = current_group(int(require(cfg, "mapping", ckpt)["tp_size"]))
        tensors = Tensors(rank_file(ckpt, group.rank), dev)
        ld = Loader(tensors, DTYPES[dtype], quant_of(cfg, ckpt))
        target = load_target(ld, cfg, ckpt, group, dev)
        arch = require(cfg, "architecture", ckpt)
        drafter: Drafter | None = None
        ignore: tuple[str, ...] = ()
        if arch == "EagleForCausalLM":
            ignore = tuple(f"eagle_nets.{k}." for k in range(1 if tree is not None else 0, cfg["num_eagle_layers"]))
            if tree is not None:
                if eagle3_head_dir is not None:
                    raise CheckpointError(f"{ckpt} is an EagleForCausalLM (EAGLE-1/2) checkpoint; do not pass an EAGLE-3 head")
                drafter = load_eagle1(ld, cfg, ckpt, group, dev)
        elif arch != "LlamaForCausalLM":
            raise CheckpointError(f"{ckpt}/config.json: architecture {arch!r}; expected LlamaForCausalLM or EagleForCausalLM")
        elif tree is not None:
            if eagle3_head_dir is None:
                raise CheckpointError(
                    f"{ckpt} holds no EAGLE head (architecture LlamaForCausalLM): pass eagle3_head_dir for an EAGLE-3 "
                    "head, convert with an EAGLE-1/2 head, or use tree=None for target-only decoding"
                )
            drafter = load_eagle3(Path(eagle3_head_dir), target, len(target.layers), DTYPES[dtype], dev)
        tensors.check_all_used(ignore)
        tensors.close()
        prepack_cpu(target, drafter)  # float32 on CPU: W^T for one-row and oneDNN-packed W for multi-row products
        static = StaticTree.build(tree, dev) if isinstance(tree, DraftTree) else None
        if tree is not None:
            check_tree_fits(tree, drafter)
        random_head = bool(cfg.get("eagle_deploy", {}).get("random_head", False))
        tok = load_tokenizer(tokenizer_dir or ckpt / "tokenizer")
        return cls(target, drafter, tree, static, tok, dev, DTYPES[dtype], random_head, group)

    def generate(self, requests: list[GenerationRequest], *, speculative: bool, on_tokens: OnTokens | None) -> list[GenerationResult]:
        if not requests:
            return []
        if self.limits is not None:
            self.limits.check(requests)
        # A session sized for exactly these requests, all added before the first step: the prefill groups and
        # decoding steps are those of one static batch.
        with torch.inference_mode():
            session = Session(self, requests, speculative and self.drafter is not None, on_tokens)
            while not session.done:
                session.step()
            return [session.pop(i) for i in range(len(requests))]

    def open_session(self, capacity: int, max_len: int, *, speculative: bool, on_tokens: OnTokens | None) -> Session:
        """An empty session with `capacity` sequence slots, each holding up to `max_len` tokens (prompt + output)."""
        if capacity < 1 or max_len < 2:
            raise ValueError(f"session capacity={capacity} and max_len={max_len} must be >= 1 and >= 2")
        if self.limits is not None and capacity > self.limits.max_batch_size:
            raise ValueError(
                f"session capacity {capacity} exceeds the build's engine.max_batch_size={self.limits.max_batch_size}"
            )
        spec = speculative and self.drafter is not None
        return Session(self, [], spec, on_tokens, capacity=capacity, max_len=max_len)


def check_tree_fits(tree: DraftTree | DynamicTree, drafter: Drafter | None) -> None:
    assert drafter is not None
    k = tree.max_top_k if isinstance(tree, DraftTree) else tree.top_k
    vocab = drafter.lm_head.vocab_size if isinstance(drafter, Eagle1Drafter) else drafter.lm_head.weight.shape[0]
    if k > vocab:
        raise ValueError(f"the tree needs the top {k} draft tokens per node but the draft vocabulary has {vocab}")
    if isinstance(tree, DynamicTree):
        from builders.trees import tree_size_bound

        bound = tree_size_bound(tree.top_k, tree.depth)
        if tree.total_draft_tokens > bound:
            raise ValueError(
                f"dynamic tree total_draft_tokens={tree.total_draft_tokens} exceeds the {bound} candidates "
                f"top_k={tree.top_k}, depth={tree.depth} produce"
            )


def runtime_from_spec(spec: ReferenceSpec, build_dir: Path, device: str | None) -> Runtime:
    tree: DraftTree | DynamicTree | None
    if spec.tree_choices is not None:
        tree = DraftTree.from_choices(spec.tree_choices)
    elif spec.dynamic_tree is not None:
        d = spec.dynamic_tree
        tree = DynamicTree(d.top_k, d.depth, d.total_draft_tokens)
    else:
        raise CheckpointError(f"{build_dir}/engine/reference.json: neither tree_choices nor dynamic_tree is set")
    head = spec.path(build_dir, spec.eagle3_head_dir) if spec.eagle3_head_dir else None
    rt = Runtime.load(
        spec.path(build_dir, spec.checkpoint_dir), tree=tree, dtype=spec.dtype, device=device or spec.device,
        eagle3_head_dir=head, tokenizer_dir=spec.path(build_dir, spec.tokenizer_dir),
    )
    if rt.group.size != spec.tp:
        raise CheckpointError(f"reference.json says tp={spec.tp} but the checkpoint has tp_size={rt.group.size}")
    rt.limits = Limits(spec.max_batch_size, spec.max_input_len, spec.max_seq_len)
    return rt


class Session:
    """A batch of sequence slots decoded together, step by step (in-flight batching).

    `add(request)` puts a request in a free slot (its prompt is prefilled by the next `step()`); `step()` either
    prefills the requests added since the last step or advances every active sequence by one speculative (or
    target-only) step; a sequence leaves the batch when it finishes or is `cancel`led, and `pop(slot)` returns its
    result and frees the slot for the next request. `on_tokens(slot, new_ids)` streams accepted tokens; returning
    False cancels that sequence. Every row of the caches belongs to one slot; a new request overwrites its slot's
    rows from position 0 (prefill), so nothing of the previous occupant is visible to it.

    Not thread-safe: one thread drives a session (Triton's reference model runs it on its batcher thread)."""

    def __init__(
        self, rt: Runtime, requests: list[GenerationRequest], speculative: bool, on_tokens: OnTokens | None, *,
        capacity: int | None = None, max_len: int | None = None,
    ) -> None:
        """`requests` are added in order (slots 0, 1, ...). `capacity` (slots) defaults to len(requests) and
        `max_len` (prompt + output tokens of one slot) to the longest request: `generate` sizes its session exactly
        as the static batch it replaces."""
        capacity = len(requests) if capacity is None else capacity
        max_len = max(len(r.prompt_ids) + r.max_new_tokens for r in requests) if max_len is None else max_len
        self.rt, self.capacity, self.max_len, self.spec, self.on_tokens = rt, capacity, max_len, speculative, on_tokens
        dev, tgt = rt.device, rt.target
        tree_size = (rt.tree.size if speculative and rt.tree is not None else 0) + 1
        slots = max_len + tree_size + 1
        self.tcache = KVCache.allocate(len(tgt.layers), capacity, slots, tgt.kv_heads, tgt.head_dim, rt.dtype, dev)
        self.lens = torch.zeros(capacity, dtype=torch.long, device=dev)  # committed cache entries (target = drafter)
        self.root = torch.zeros(capacity, dtype=torch.long, device=dev)  # last chosen token, not yet in the caches
        self.reqs: list[GenerationRequest | None] = [None] * capacity  # None = free slot
        self.out: list[list[int]] = [[] for _ in range(capacity)]
        self.finish: list[str | None] = [None] * capacity
        self.stats = [RequestStats() for _ in range(capacity)]
        self.gens = [torch.Generator() for _ in range(capacity)]
        self.pending: list[int] = []  # slots added since the last step: prefilled by the next one
        self.depth = rt.tree.depth if speculative and rt.tree is not None else 0
        self.capture: tuple[int, ...] = ()
        if speculative:
            d = rt.drafter
            assert d is not None
            scratch = rt.static.num_runs if rt.static is not None else (rt.tree.depth - 1) * rt.tree.top_k  # type: ignore[union-attr]
            self.dcache = KVCache.allocate(len(d.layers), capacity, slots + scratch, d.kv_heads, d.head_dim, rt.dtype, dev)
            self.capture = d.capture
            # Allocated on the first drafter pass, when the head's hidden size and draft vocabulary are known.
            self.state = DraftState(torch.zeros(0, device=dev), torch.zeros(0, device=dev))
        for r in requests:
            self.add(r)

    # ---- slots --------------------------------------------------------------------------------------------------
    def add(self, request: GenerationRequest) -> int:
        """Put `request` in the lowest free slot and return the slot; its prefill runs at the next `step()`."""
        free = [i for i, r in enumerate(self.reqs) if r is None]
        if not free:
            raise ValueError(f"session full: all {self.capacity} slots are taken; pop a finished sequence first")
        slot = free[0]
        if self.rt.limits is not None:
            self.rt.limits.check_request(slot, request)
        if len(request.prompt_ids) + request.max_new_tokens > self.max_len:
            raise ValueError(
                f"request in slot {slot}: prompt {len(request.prompt_ids)} + max_new_tokens {request.max_new_tokens} "
                f"exceeds the session's max_len={self.max_len}"
            )
        # Unseeded requests get a random seed, the same on every TP rank (ranks must sample identically).
        s = request.sampling.seed
        [seed] = self.rt.group.broadcast_ints([s if s is not None else random.getrandbits(62)])
        self.reqs[slot], self.out[slot], self.finish[slot] = request, [], None
        self.stats[slot] = RequestStats(acceptance_by_depth=[0] * self.depth)
        self.gens[slot] = torch.Generator().manual_seed(seed)
        self.pending.append(slot)
        return slot

    def cancel(self, slot: int) -> None:
        """Stop the sequence in `slot` (finish_reason "cancelled"); it takes no further step. `pop` frees the slot."""
        if self.reqs[slot] is None:
            raise ValueError(f"slot {slot} is free; nothing to cancel")
        if self.finish[slot] is None:
            self.finish[slot] = "cancelled"
        if slot in self.pending:
            self.pending.remove(slot)

    def pop(self, slot: int) -> GenerationResult:
        """The result of the finished sequence in `slot`; the slot becomes free."""
        if self.reqs[slot] is None or self.finish[slot] is None:
            raise ValueError(f"slot {slot} holds no finished sequence")
        res = GenerationResult(self.out[slot], self.finish[slot], self.stats[slot])  # type: ignore[arg-type]
        self.reqs[slot], self.out[slot], self.finish[slot] = None, [], None
        return res

    @property
    def active(self) -> list[int]:
        """Slots whose sequence is still generating (prefilled or waiting for its prefill)."""
        return [i for i, r in enumerate(self.reqs) if r is not None and self.finish[i] is None]

    @property
    def finished(self) -> list[int]:
        """Slots whose sequence finished (or was cancelled) and was not popped yet."""
        return [i for i, r in enumerate(self.reqs) if r is not None and self.finish[i] is not None]

    @property
    def free(self) -> int:
        return sum(r is None for r in self.reqs)

    @property
    def done(self) -> bool:
        return not self.active

    # ---- loop ---------------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> None:
        """Prefill the requests added since the last step (same prompt length = one forward), or, when there are
        none, advance every active sequence by one decoding step. A new request thus waits for at most the step
        in progress plus its prefill, and then decodes with the others."""
        if self.pending:
            by_length: dict[int, list[int]] = {}
            for i in self.pending:
                by_length.setdefault(len(self._req(i).prompt_ids), []).append(i)
            self.pending = []
            for group in by_length.values():
                self.prefill(group)
            return
        if active := self.active:
            self.speculative_step(active) if self.spec else self.target_step(active)

    def _req(self, i: int) -> GenerationRequest:
        r = self.reqs[i]
        assert r is not None, f"slot {i} is free"
        return r

    def prefill(self, group: list[int]) -> None:
        """Prefill requests whose prompts have the same length in one forward; choose each one's first token."""
        dev = self.rt.device
        prompt = torch.tensor([self._req(i).prompt_ids for i in group], device=dev)
        b, p = prompt.shape
        rows, zero = torch.tensor(group, device=dev), torch.zeros(b, dtype=torch.long, device=dev)
        causal = torch.ones(p, p, dtype=torch.bool, device=dev).tril().expand(b, -1, -1)
        arange = torch.arange(p, device=dev)
        step = make_step(rows, zero, arange, arange.expand(b, p), causal)
        hidden, captured = self.rt.target.forward(prompt, step, self.tcache, self.capture)
        logits = self.rt.target.lm_head(hidden[:, -1])
        first = [choose(logits[j], self._req(i).sampling, self.gens[i]) for j, i in enumerate(group)]
        self.lens[rows] = p
        if self.spec:
            # Drafter pairs (x_{t+1}, f_t) for t = 0..p-1: the prompt shifted by one, then the token just chosen.
            d_tokens = torch.cat([prompt[:, 1:], torch.tensor(first, device=dev)[:, None]], 1)
            self.update_drafter(rows, zero, d_tokens, self._features(hidden, captured), [p] * b)
        for i, tok in zip(group, first):
            self.root[i] = tok
            self.emit(i, [tok])

    def target_step(self, active: list[int]) -> None:
        rows = torch.tensor(active, device=self.rt.device)
        lens = self.lens[rows]
        b = len(active)
        ones = torch.ones(b, 1, 1, dtype=torch.bool, device=self.rt.device)
        step = make_step(rows, lens, torch.zeros(1, dtype=torch.long, device=self.rt.device), lens[:, None], ones)
        hidden, _ = self.rt.target.forward(self.root[rows][:, None], step, self.tcache)
        logits = self.rt.target.lm_head(hidden[:, 0])
        self.lens[rows] += 1
        for j, i in enumerate(active):
            tok = choose(logits[j], self._req(i).sampling, self.gens[i])
            self.stats[i].target_forwards += 1
            self.root[i] = tok
            self.emit(i, [tok])

    def speculative_step(self, active: list[int]) -> None:
        """draft a tree -> verify all of it in ONE target forward -> accept a path -> commit it."""
        rt, dev = self.rt, self.rt.device
        rows = torch.tensor(active, device=dev)
        lens = self.lens[rows]
        tree = self.draft(rows, lens)
        step = make_step(rows, lens, torch.arange(tree.size, device=dev), lens[:, None] + tree.depth, tree.anc)
        hidden, captured = rt.target.forward(tree.tokens, step, self.tcache, self.capture)
        accepted = self.walk(active, tree, hidden)
        going: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (request, new tokens, their features)
        for j, i in enumerate(active):
            node, nxt = accepted[j]
            path = torch.nonzero(tree.anc[j, node])[:, 0]  # root .. node (tree order = depth order)
            new = torch.cat([tree.tokens[j, path[1:]], torch.tensor([nxt], device=dev)])
            if path.shape[0] > 1:  # KV compaction: the accepted path's entries become contiguous after the cache
                base = int(lens[j])
                self.tcache.move(i, base + path, base + torch.arange(path.shape[0], device=dev))
            kept = self.emit(i, new.tolist())
            self._count(i, drafted=tree.size - 1, accepted=min(path.shape[0] - 1, kept))
            if self.finish[i] is None:
                self.root[i] = nxt
                feats = self._features(hidden[j, path][None], [c[j, path][None] for c in captured])[0]
                going.append((i, new, feats))
        if going:
            self._commit_drafter(going)

    def walk(self, active: list[int], tree: TreeBatch, hidden: torch.Tensor) -> list[tuple[int, int]]:
        """Verify every sequence's tree: walk it from the root, moving to an accepted child (greedy_node /
        sampling_node) until none is; returns (deepest accepted node, next token) per sequence.

        The target's logits are computed only at the nodes the walk reaches, i.e. the accepted path plus the node
        where it stops: tau rows of the 49k-wide lm_head per sequence instead of one per tree node (on a CPU the
        lm_head of a whole tree costs as much as a fifth of the verification forward). The walk goes level by level,
        all sequences still walking in one lm_head call."""
        tokens = tree.tokens.tolist()
        kids = [tree.children(j) for j in range(len(active))]
        at = [0] * len(active)
        result: list[tuple[int, int] | None] = [None] * len(active)
        while walking := [j for j, r in enumerate(result) if r is None]:
            rows = torch.tensor(walking, device=hidden.device)
            nodes = torch.tensor([at[j] for j in walking], device=hidden.device)
            logits = self.rt.target.lm_head(hidden[rows, nodes])  # (walking, V)
            for r, j in enumerate(walking):
                sp, node = self._req(active[j]).sampling, at[j]
                if sp.greedy:
                    child, tok = greedy_node(logits[r], kids[j][node], tokens[j])
                else:
                    child, tok = sampling_node(logits[r], kids[j][node], tokens[j], sp, self.gens[active[j]])
                if child is None:
                    assert tok is not None
                    result[j] = (node, tok)
                else:
                    at[j] = child
        return cast(list[tuple[int, int]], result)  # the loop ends only when every sequence has its result

    def _count(self, i: int, drafted: int, accepted: int) -> None:
        s = self.stats[i]
        s.target_forwards += 1
        s.draft_tokens += drafted
        s.accepted_draft_tokens += accepted
        for d in range(accepted):
            s.acceptance_by_depth[d] += 1

    # ---- drafter ------------------------------------------------------------------------------------------------
    def _features(self, hidden: torch.Tensor, captured: list[torch.Tensor]) -> torch.Tensor:
        assert self.rt.drafter is not None
        return self.rt.drafter.features(hidden, captured)

    def draft(self, rows: torch.Tensor, lens: torch.Tensor) -> TreeBatch:
        rt = self.rt
        assert rt.drafter is not None
        state = DraftState(self.state.h[rows], self.state.logits[rows])
        if rt.static is not None:
            return draft_static(rt.drafter, self.dcache, rt.static, rows, lens, self.root[rows], state)
        assert isinstance(rt.tree, DynamicTree)
        return draft_dynamic(rt.drafter, self.dcache, rt.tree, rows, lens, self.root[rows], state)

    def _commit_drafter(self, going: list[tuple[int, torch.Tensor, torch.Tensor]]) -> None:
        """Feed each sequence's newly committed pairs (token, target feature at the previous position) to the
        drafter, all sequences at once (padded to the longest); the caches grow by the path length."""
        dev = self.rt.device
        n = [len(new) for _, new, _ in going]
        b, longest = len(going), max(n)
        tok = torch.zeros(b, longest, dtype=torch.long, device=dev)
        ft = going[0][2].new_zeros(b, longest, going[0][2].shape[-1])
        for j, (_, new, feats) in enumerate(going):
            tok[j, : n[j]] = new
            ft[j, : n[j]] = feats
        rows = torch.tensor([i for i, _, _ in going], device=dev)
        self.update_drafter(rows, self.lens[rows], tok, ft, n)
        self.lens[rows] += torch.tensor(n, device=dev)

    def update_drafter(self, rows: torch.Tensor, lens: torch.Tensor, tokens: torch.Tensor, feats: torch.Tensor, n: list[int]) -> None:
        """Append pairs (tokens[:, t], feats[:, t]) at positions lens + t (causal); keep the state of the last real one."""
        d = self.rt.drafter
        assert d is not None
        b, length = tokens.shape
        dev = self.rt.device
        causal = torch.ones(length, length, dtype=torch.bool, device=dev).tril().expand(b, -1, -1)
        arange = torch.arange(length, device=dev)
        step = make_step(rows, lens, arange, lens[:, None] + arange, causal)
        h = d.forward(tokens, feats, step, self.dcache)
        last = h[torch.arange(b, device=dev), torch.tensor(n, device=dev) - 1]
        logits = d.logits(last)
        if self.state.logits.numel() == 0:
            self.state = DraftState(last.new_zeros(self.capacity, last.shape[-1]), logits.new_zeros(self.capacity, logits.shape[-1]))
        self.state.h[rows] = last
        self.state.logits[rows] = logits

    # ---- output -------------------------------------------------------------------------------------------------
    def emit(self, i: int, tokens: list[int]) -> int:
        """Append accepted tokens until a stop condition; stream them; return how many were kept."""
        req, out = self._req(i), self.out[i]
        kept: list[int] = []
        for tok in tokens:
            out.append(tok)
            kept.append(tok)
            if tok in req.stop_token_ids:
                self.finish[i] = "eos"
            elif req.stop_strings and self._hit_stop_string(out, req.stop_strings):
                self.finish[i] = "stop"
            elif len(out) >= req.max_new_tokens:
                self.finish[i] = "length"
            if self.finish[i] is not None:
                break
        self.stats[i].generated_tokens = len(out)
        if kept and self.on_tokens is not None and self.on_tokens(i, list(kept)) is False and self.finish[i] is None:
            self.finish[i] = "cancelled"
        return len(kept)

    def _hit_stop_string(self, out: list[int], stops: list[str]) -> bool:
        # Only the tail can contain a stop string that the previous token did not complete.
        tail = self.rt.tokenizer.decode(out[-(max(len(s) for s in stops) + 8) :])
        return any(s in tail for s in stops)
