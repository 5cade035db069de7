"""A batch of sequence slots decoded together (in-flight batching); the decoding math is engines/decode.py."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import torch

from engines import decode
from engines.types import GenerationRequest, GenerationResult, OnTokens, RequestStats
from engines.draft import DraftState
from engines.model import KVCache
from engines.profile import NO_LAPS, Laps

if TYPE_CHECKING:
    from engines.runtime import Runtime


class Session:
    """A batch of sequence slots decoded together, step by step (in-flight batching).

    `add(request)` puts a request in a free slot (its prompt is prefilled by the next `step()`); `step()` either
    prefills the requests added since the last step or advances every active sequence by one speculative (or
    target-only) step; a sequence leaves the batch when it finishes or is `cancel`led, and `pop(slot)` returns its
    result and frees the slot for the next request. `on_tokens(slot, new_ids)` streams accepted tokens; returning
    False cancels that sequence. Every row of the caches belongs to one slot; a new request overwrites its slot's
    rows from position 0 (prefill), so nothing of the previous occupant is visible to it.

    `laps` (engines/profile.py) splits each decoding step's wall time into its parts when a profiler sets it.

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
        drafting = rt.drafting if speculative else None
        tree_size = (drafting.tree.size if drafting is not None else 0) + 1
        slots = max_len + tree_size + 1
        self.tcache = KVCache.allocate(len(tgt.layers), capacity, slots, tgt.kv_heads, tgt.head_dim, rt.dtype, dev)
        # Committed cache entries per slot (target = drafter), kept on the host: building a step's slots and mask
        # then needs no device -> host copy.
        self.lens = [0] * capacity
        self.root = torch.zeros(capacity, dtype=torch.long, device=dev)  # last chosen token, not yet in the caches
        self.reqs: list[GenerationRequest | None] = [None] * capacity  # None = free slot
        self.out: list[list[int]] = [[] for _ in range(capacity)]
        self.finish: list[str | None] = [None] * capacity
        self.stats = [RequestStats() for _ in range(capacity)]
        self.gens = [torch.Generator() for _ in range(capacity)]
        self.pending: list[int] = []  # slots added since the last step: prefilled by the next one
        self.depth = drafting.tree.depth if drafting is not None else 0
        self.capture: tuple[int, ...] = ()
        self.laps: Laps = NO_LAPS
        if speculative:
            d = rt.drafter
            assert d is not None and drafting is not None
            self.dcache = KVCache.allocate(
                len(d.layers), capacity, slots + drafting.scratch_slots, d.kv_heads, d.head_dim, rt.dtype, dev
            )
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

    def req(self, i: int) -> GenerationRequest:
        r = self.reqs[i]
        assert r is not None, f"slot {i} is free"
        return r

    def grow(self, rows: list[int], by: list[int]) -> None:
        """The caches of `rows` now hold `by` more committed entries."""
        for i, n in zip(rows, by):
            self.lens[i] += n

    # ---- loop ---------------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> None:
        """Prefill the requests added since the last step (same prompt length = one forward), or, when there are
        none, advance every active sequence by one decoding step. A new request thus waits for at most the step
        in progress plus its prefill, and then decodes with the others."""
        if self.pending:
            by_length: dict[int, list[int]] = {}
            for i in self.pending:
                by_length.setdefault(len(self.req(i).prompt_ids), []).append(i)
            self.pending = []
            for group in by_length.values():
                decode.prefill(self, group)
            return
        if active := self.active:
            decode.speculative_step(self, active) if self.spec else decode.target_step(self, active)

    # ---- output -------------------------------------------------------------------------------------------------
    def emit(self, i: int, tokens: list[int]) -> int:
        """Append accepted tokens until a stop condition; stream them; return how many were kept."""
        req, out = self.req(i), self.out[i]
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
