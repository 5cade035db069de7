"""A batch of sequence slots decoded together (in-flight batching); the decoding math is engines/decode.py."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from engines import decode, schedule
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
    target-only) step; a sequence leaves the batch when it finishes, fails or is `cancel`led, and `pop(slot)`
    returns its result and frees the slot for the next request. `on_tokens(slot, new_ids)` streams accepted tokens
    at the end of each step; returning False cancels that sequence. Every row of the caches belongs to one slot; a new request overwrites its slot's
    rows from position 0 (prefill), so nothing of the previous occupant is visible to it.

    Isolation: a request is checked when it is added (token ids in the vocabulary, finite sampling parameters), and
    an exception raised while stepping ends only the sequence that raises it (finish_reason "error", the message in
    its result): the step is undone for its sequences and rerun for each alone, and streamed tokens leave the
    session only once a step has succeeded, so the others continue exactly as if the failing one had not been there.

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
        self.errors: dict[int, str] = {}  # slot -> why its sequence failed (finish "error")
        self._outbox: list[tuple[int, list[int]]] = []  # accepted tokens to stream once the step succeeded
        self.depth = drafting.tree.depth if drafting is not None else 0
        self.capture: tuple[int, ...] = ()
        self.laps: Laps = NO_LAPS
        # Load-aware speculation (engines/schedule.py): each step's draft length from the live batch size.
        policy = rt.policy
        self.policy_state = (schedule.PolicyState(policy, drafting, dev)
                             if drafting is not None and policy is not None and not policy.is_static else None)
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
        self._check_tokens(slot, request)
        request.sampling.check()
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

    def _check_tokens(self, slot: int, request: GenerationRequest) -> None:
        """Token ids outside the vocabulary would index past the embedding table inside a batched forward."""
        vocab = self.rt.target.embed.shape[0]  # the rows the first forward indexes
        lo, hi = min(request.prompt_ids), max(request.prompt_ids)
        if lo < 0 or hi >= vocab:
            bad = lo if lo < 0 else hi
            raise ValueError(f"request in slot {slot}: prompt token id {bad} at position "
                             f"{request.prompt_ids.index(bad)} is out of range; token ids must be in [0, {vocab})")

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
        res = GenerationResult(self.out[slot], self.finish[slot], self.stats[slot], self.errors.pop(slot, None))  # type: ignore[arg-type]
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
                self._isolated(lambda slots: decode.prefill(self, slots), group)
        elif active := self.active:
            run = decode.target_step if not self.spec else (
                schedule.scheduled_step if self.policy_state is not None else decode.speculative_step)
            self._isolated(lambda slots: run(self, slots), active)
        self._stream()

    # ---- isolation ----------------------------------------------------------------------------------------------
    def _isolated(self, run: Callable[[list[int]], None], slots: list[int]) -> None:
        """run(slots); if it raises, undo what it did to their host state and run each slot alone, so the error
        ends only the sequence that raises it. Undoing is complete because a step writes the device caches only
        past the committed lengths (restored here), and its tokens stay in the outbox until the step is over."""
        saved = self._save(slots)
        try:
            run(slots)
        except Exception as e:  # noqa: BLE001 - any error of one sequence must end that sequence only
            self._restore(saved)
            if len(slots) == 1:
                self._fail(slots[0], e)
                return
            for i in slots:
                self._isolated(run, [i])

    def _save(self, slots: list[int]) -> tuple[Any, ...]:
        """What a step changes on the host (a few scalars per slot; the generator state only when it samples)."""
        per_slot = {i: (self.lens[i], len(self.out[i]), self.finish[i], self._copy_stats(i),
                        None if self.req(i).sampling.greedy else self.gens[i].get_state()) for i in slots}  # fmt: skip
        return per_slot, self.root.clone(), len(self._outbox)

    def _copy_stats(self, i: int) -> RequestStats:
        st = self.stats[i]
        return dataclasses.replace(st, acceptance_by_depth=list(st.acceptance_by_depth))

    def _restore(self, saved: tuple[Any, ...]) -> None:
        per_slot, root, outbox = saved
        for i, (n, n_out, finish, stats, gen) in per_slot.items():
            self.lens[i], self.finish[i], self.stats[i] = n, finish, stats
            del self.out[i][n_out:]
            if gen is not None:
                self.gens[i].set_state(gen)
            self.root[i] = root[i]
        del self._outbox[outbox:]

    def _fail(self, slot: int, e: BaseException) -> None:
        self.finish[slot] = "error"
        self.errors[slot] = f"{type(e).__name__}: {e}"

    def _stream(self) -> None:
        """Hand the step's accepted tokens to `on_tokens`; False (or an exception) ends that sequence."""
        box, self._outbox = self._outbox, []
        if self.on_tokens is None:
            return
        for i, tokens in box:
            try:
                go_on = self.on_tokens(i, tokens)
            except Exception as e:  # noqa: BLE001
                self._fail(i, e)
                continue
            if go_on is False and self.finish[i] is None:
                self.finish[i] = "cancelled"

    # ---- output -------------------------------------------------------------------------------------------------
    def emit(self, i: int, tokens: list[int]) -> int:
        """Append accepted tokens until a stop condition; queue them for streaming; return how many were kept."""
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
        if kept:
            self._outbox.append((i, kept))  # streamed when the step is over (`_stream`)
        return len(kept)

    def _hit_stop_string(self, out: list[int], stops: list[str]) -> bool:
        # Only the tail can contain a stop string that the previous token did not complete.
        tail = self.rt.tokenizer.decode(out[-(max(len(s) for s in stops) + 8) :])
        return any(s in tail for s in stops)
