"""A batch of sequence slots decoded together (in-flight batching); the speculative step is engines/step.py, the
prefill and target-only steps engines/decode.py, each slot's bookkeeping engines/slots.py."""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from core.laps import NO_LAPS, Laps
from core.types import GenerationRequest, GenerationResult, OnTokens, RequestStats
from engines import decode, schedule, step
from engines.cache import KVCache
from engines.drafting import DraftState
from engines.runtime import Runtime
from engines.slots import Accepted, Slot
from engines.step import DraftBatch, TargetBatch


class Session:
    """A batch of sequence slots decoded together, step by step (in-flight batching).

    `add(request)` puts a request in a free slot (its prompt is prefilled by the next `step()`); `step()` either
    prefills the requests added since the last step or advances every active sequence by one speculative (or
    target-only) step; a sequence leaves the batch when it finishes, fails or is `cancel`led, and `pop(slot)`
    returns its result and frees the slot for the next request. `on_tokens(slot, new_ids)` streams accepted tokens
    at the end of each step; returning False cancels that sequence. Every row of the caches belongs to one slot; a
    new request overwrites its slot's rows from position 0 (prefill), so nothing of the previous occupant is visible
    to it.

    Isolation: a request is checked when it is added (token ids in the vocabulary, finite sampling parameters), and
    an exception raised while stepping ends only the sequence that raises it (finish_reason "error", the message in
    its result): the step is undone for its sequences and rerun for each alone, and streamed tokens leave the
    session only once a step has succeeded, so the others continue exactly as if the failing one had not been there.

    `laps` (core/laps.py) splits each decoding step's wall time into its parts when a profiler sets it.

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
        self.rt, self.capacity, self.max_len, self.on_tokens = rt, capacity, max_len, on_tokens
        dev, tgt = rt.device, rt.target
        drafting = rt.drafting if speculative and rt.drafter is not None else None
        tree_size = (drafting.tree.size if drafting is not None else 0) + 1
        cache_slots = max_len + tree_size + 1
        self.draft: DraftBatch | None = None
        capture: tuple[int, ...] = ()
        if drafting is not None and rt.drafter is not None:
            d = rt.drafter
            dcache = KVCache.allocate(len(d.layers), capacity, cache_slots + drafting.scratch_slots, d.kv_heads,
                                      d.head_dim, rt.dtype, dev)
            self.draft = DraftBatch(d, drafting, dcache, capacity)
            capture = d.capture
        # Load-aware speculation (engines/schedule.py): each step's draft length from the live batch size.
        policy = rt.policy
        self.policy_state = (schedule.PolicyState(policy, drafting, dev)
                             if self.draft is not None and drafting is not None and policy is not None
                             and not policy.is_static else None)
        tcache = KVCache.allocate(len(tgt.layers), capacity, cache_slots, tgt.kv_heads, tgt.head_dim, rt.dtype, dev)
        self.target = TargetBatch(tgt, tcache, torch.zeros(capacity, dtype=torch.long, device=dev), capture)
        self.depth = drafting.tree.depth if drafting is not None else 0
        self.slots: list[Slot | None] = [None] * capacity  # None = free slot
        self.pending: list[int] = []  # slots added since the last step: prefilled by the next one
        self.laps: Laps = NO_LAPS
        self._outbox: list[tuple[int, list[int]]] = []  # accepted tokens to stream once the step succeeded
        for r in requests:
            self.add(r)

    # ---- slots --------------------------------------------------------------------------------------------------
    def add(self, request: GenerationRequest) -> int:
        """Put `request` in the lowest free slot and return the slot; its prefill runs at the next `step()`."""
        free = [i for i, s in enumerate(self.slots) if s is None]
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
        stats = RequestStats(acceptance_by_depth=[0] * self.depth)
        self.slots[slot] = Slot(slot, request, torch.Generator().manual_seed(seed), stats=stats)
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

    def slot(self, i: int) -> Slot:
        """The sequence in slot `i` (its request, output so far, finish reason, statistics)."""
        s = self.slots[i]
        if s is None:
            raise ValueError(f"slot {i} is free")
        return s

    def cancel(self, slot: int) -> None:
        """Stop the sequence in `slot` (finish_reason "cancelled"); it takes no further step. `pop` frees the slot."""
        if self.slots[slot] is None:
            raise ValueError(f"slot {slot} is free; nothing to cancel")
        s = self.slot(slot)
        if s.finish is None:
            s.finish = "cancelled"
        if slot in self.pending:
            self.pending.remove(slot)

    def pop(self, slot: int) -> GenerationResult:
        """The result of the finished sequence in `slot`; the slot becomes free."""
        s = self.slots[slot]
        if s is None or s.finish is None:
            raise ValueError(f"slot {slot} holds no finished sequence")
        self.slots[slot] = None
        return s.result()

    @property
    def active(self) -> list[int]:
        """Slots whose sequence is still generating (prefilled or waiting for its prefill)."""
        return [i for i, s in enumerate(self.slots) if s is not None and s.finish is None]

    @property
    def finished(self) -> list[int]:
        """Slots whose sequence finished (or was cancelled) and was not popped yet."""
        return [i for i, s in enumerate(self.slots) if s is not None and s.finish is not None]

    @property
    def free(self) -> int:
        return sum(s is None for s in self.slots)

    @property
    def done(self) -> bool:
        return not self.active

    # ---- the device state, for inspection -----------------------------------------------------------------------
    @property
    def tcache(self) -> KVCache:
        return self.target.cache

    @property
    def dcache(self) -> KVCache:
        if self.draft is None:
            raise ValueError("a target-only session has no drafter cache")
        return self.draft.cache

    @property
    def state(self) -> DraftState:
        if self.draft is None or self.draft.state is None:
            raise ValueError("no drafter state: a target-only session, or no prefill yet")
        return self.draft.state

    # ---- loop ---------------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> None:
        """Prefill the requests added since the last step (same prompt length = one forward), or, when there are
        none, advance every active sequence by one decoding step. A new request thus waits for at most the step
        in progress plus its prefill, and then decodes with the others."""
        if self.pending:
            by_length: dict[int, list[int]] = {}
            for i in self.pending:
                by_length.setdefault(len(self.slot(i).request.prompt_ids), []).append(i)
            self.pending = []
            for group in by_length.values():
                self._isolated(self._prefill, group)
        elif active := self.active:
            run = self._target_step if self.draft is None else partial(self._speculative_step, self.draft)
            self._isolated(run, active)
        self._stream()

    def _prefill(self, group: list[int]) -> None:
        """When the batch these requests join will not draft (the schedule at its size), the drafter's reading of
        the prompts waits in their backlogs: speculation off costs nothing at prefill either."""
        ps = self.policy_state
        defer = ps is not None and ps.length(len(self.active)) == 0
        self._output(decode.prefill(self.target, self.draft, [self.slot(i) for i in group], defer))

    def _target_step(self, active: list[int]) -> None:
        self._output(decode.target_step(self.target, [self.slot(i) for i in active]))

    def _speculative_step(self, d: DraftBatch, active: list[int]) -> None:
        """A speculative step of the active sequences (engines/step.py: draft, verify, accept, commit; `_output`
        applies its tokens). When the schedule or the acceptance switch leaves no sequence drafting, the step is a
        plain target step (`_plain_step`); a sequence switched off alone verifies its root in the others' forward."""
        ps = self.policy_state  # a shorter draft (or none) for this batch size; the drafter state stays in `d`
        slots = [self.slot(i) for i in active]
        on = [True] * len(slots) if ps is None else ps.drafting_now(slots)
        if not any(on):
            self._plain_step(d, slots)
            return
        accepted = step.speculative_step(self.target, d, slots, self._output, self.laps, None if all(on) else on,
                                         None if ps is None else ps.for_step(d, len(active)).drafting)
        if ps is not None:
            ps.after_step(len(active), accepted, slots)

    def _plain_step(self, d: DraftBatch, slots: list[Slot]) -> None:
        """A target-only step (no drafter forward, no tree); each sequence still going keeps its drafter pair in
        its backlog, fed in one batched pass when it drafts again (step.catch_up)."""
        self.laps.start()
        accepted, feats = decode.plain_step(self.target, d, slots)
        self.laps.lap("target step")
        going = self._output(accepted)
        for j, (s, a) in enumerate(zip(slots, accepted)):
            if going[j]:
                s.behind.append((a.tokens[0], feats[j]))
        self.laps.lap("output")
        if self.policy_state is not None:
            self.policy_state.after_step(len(slots), accepted, slots)

    def _output(self, accepted: list[Accepted]) -> list[bool]:
        """Apply what a step accepted: tokens up to a stop condition, statistics, the outbox; returns, per entry,
        whether its sequence is still going."""
        going = []
        for a in accepted:
            s = self.slot(a.slot)
            kept = s.take(a.tokens, self.rt.tokenizer.decode)
            s.count(a, len(kept))
            if kept:
                self._outbox.append((a.slot, kept))  # streamed when the step is over (`_stream`)
            going.append(s.going)
        return going

    # ---- isolation ----------------------------------------------------------------------------------------------
    def _isolated(self, run: Callable[[list[int]], None], slots: list[int]) -> None:
        """run(slots); if it raises, undo what it did to their host state and run each slot alone, so the error
        ends only the sequence that raises it. Undoing is complete because a step writes the device caches only
        past the committed lengths (restored here), and its tokens stay in the outbox until the step is over."""
        saved = self._save(slots)
        try:
            run(slots)
        except Exception as e:  # any error of one sequence must end that sequence only
            self._restore(saved)
            if len(slots) == 1:
                self.slot(slots[0]).fail(e)
                return
            for i in slots:
                self._isolated(run, [i])

    def _save(self, slots: list[int]) -> tuple[Any, ...]:
        return {i: self.slot(i).snapshot() for i in slots}, self.target.root.clone(), len(self._outbox)

    def _restore(self, saved: tuple[Any, ...]) -> None:
        per_slot, root, outbox = saved
        for i, snap in per_slot.items():
            self.slot(i).restore(snap)
            self.target.root[i] = root[i]
        del self._outbox[outbox:]

    def _stream(self) -> None:
        """Hand the step's accepted tokens to `on_tokens`; False (or an exception) ends that sequence."""
        box, self._outbox = self._outbox, []
        if self.on_tokens is None:
            return
        for i, tokens in box:
            try:
                go_on = self.on_tokens(i, tokens)
            except Exception as e:  # any error of one sequence must end that sequence only
                self.slot(i).fail(e)
                continue
            s = self.slot(i)
            if go_on is False and s.finish is None:
                s.finish = "cancelled"


def generate(
    rt: Runtime, requests: list[GenerationRequest], *, speculative: bool, on_tokens: OnTokens | None
) -> list[GenerationResult]:
    """Decode `requests` together to the end: a session holding exactly them, stepped until all are done."""
    if not requests:
        return []
    if rt.limits is not None:
        rt.limits.check(requests)
    rt.check_window(max(len(r.prompt_ids) + r.max_new_tokens for r in requests))
    # A session sized for exactly these requests, all added before the first step: the prefill groups and
    # decoding steps are those of one static batch.
    with torch.inference_mode():
        session = Session(rt, requests, speculative, on_tokens)
        while not session.done:
            session.step()
        results = [session.pop(i) for i in range(len(requests))]
    failed = [f"request {i}: {r.error}" for i, r in enumerate(results) if r.finish_reason == "error"]
    if failed:  # the others finished; an offline caller still gets an error, never a partial list
        raise RuntimeError("generation failed for " + "; ".join(failed))
    return results


def open_session(rt: Runtime, capacity: int, max_len: int, *, speculative: bool, on_tokens: OnTokens | None) -> Session:
    """An empty session with `capacity` sequence slots, each holding up to `max_len` tokens (prompt + output)."""
    if capacity < 1 or max_len < 2:
        raise ValueError(f"session capacity={capacity} and max_len={max_len} must be >= 1 and >= 2")
    if rt.limits is not None and capacity > rt.limits.max_batch_size:
        raise ValueError(
            f"session capacity {capacity} exceeds the build's engine.max_batch_size={rt.limits.max_batch_size}"
        )
    rt.check_window(max_len)
    return Session(rt, [], speculative, on_tokens, capacity=capacity, max_len=max_len)
