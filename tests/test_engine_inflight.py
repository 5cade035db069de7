"""Reference engine, in-flight batching (engines.session.Session via ReferenceEngine.session): requests join a running
batch between steps and leave it when they finish or are cancelled; a request's tokens do not depend on when it
joined or who else is in the batch (greedy: identical to running it alone, speculative and target-only; seeded
sampling: identical too, each slot draws from its own generator)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from core.trees import DraftTree, DynamicTree, preset
from engines.api import GenerationRequest, GenerationResult, ReferenceEngine, SamplingParams

LONG = GenerationRequest([5, 17, 33, 101, 7], 40, SamplingParams(), [])
MID = GenerationRequest([9, 8, 7], 25, SamplingParams(), [])
LATE = GenerationRequest([100, 200, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13], 20, SamplingParams(), [])


pytestmark = pytest.mark.usefixtures("one_thread")


def alone(engine: ReferenceEngine, req: GenerationRequest, speculative: bool) -> GenerationResult:
    [res] = engine.generate([req], speculative=speculative)
    return res


def staggered(
    engine: ReferenceEngine, schedule: list[tuple[int, GenerationRequest]], *, speculative: bool, capacity: int = 3
) -> dict[int, GenerationResult]:
    """Run requests through one session, request k added before step number `schedule[k][0]` (or the first later
    step with a free slot); finished sequences are popped after every step (their slots are reused). Returns
    {k: result}."""
    session = engine.session(capacity, 64, speculative=speculative)
    slot_of: dict[int, int] = {}
    results: dict[int, GenerationResult] = {}
    step = 0
    while len(results) < len(schedule):
        for k, (at, req) in enumerate(schedule):
            if at <= step and k not in slot_of and session.free:
                slot_of[k] = session.add(req)
        session.step()
        step += 1
        for slot in session.finished:
            [k] = [k for k, s in slot_of.items() if s == slot and k not in results]
            results[k] = session.pop(slot)
    assert session.done and session.free == capacity
    return results


TREES = [
    DraftTree.from_choices(preset("chain-3")), DraftTree.from_choices(preset("eagle-default")), DynamicTree(4, 4, 16)
]


@pytest.mark.parametrize("tree", TREES, ids=["chain-3", "eagle-25", "dynamic"])
@pytest.mark.parametrize("speculative", [True, False], ids=["speculative", "target-only"])
def test_request_added_mid_way_equals_running_it_alone(
    mimic_ckpt: Path, tree: DraftTree | DynamicTree, speculative: bool
) -> None:
    engine = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=tree, dtype="float32", device="cpu")
    schedule = [(0, LONG), (3, MID), (6, LATE)]  # MID joins after LONG's prefill + 2 decoding steps, LATE later
    got = staggered(engine, schedule, speculative=speculative)
    for k, (_, req) in enumerate(schedule):
        ref = alone(engine, req, speculative)
        assert got[k].output_ids == ref.output_ids, k
        assert got[k].finish_reason == ref.finish_reason == "length"
        assert got[k].stats.target_forwards == ref.stats.target_forwards
        assert got[k].stats.accepted_draft_tokens == ref.stats.accepted_draft_tokens
    if speculative:
        assert sum(got[k].stats.accepted_draft_tokens for k in got) > 0  # the head accepted: paths differ per row


def test_seeded_sampling_mid_way_equals_running_it_alone(mimic_ckpt: Path) -> None:
    engine = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=TREES[1], dtype="float32", device="cpu")
    sampled = GenerationRequest([9, 8, 7], 25, SamplingParams(temperature=0.8, top_k=20, seed=1234), [])
    got = staggered(engine, [(0, LONG), (4, sampled)], speculative=True)
    assert got[1].output_ids == alone(engine, sampled, True).output_ids
    assert got[0].output_ids == alone(engine, LONG, True).output_ids


def test_freed_slot_is_reused_without_seeing_its_previous_occupant(mimic_ckpt: Path) -> None:
    """capacity 1: each request reuses the same cache rows after the previous one was popped."""
    engine = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=TREES[0], dtype="float32", device="cpu")
    short = GenerationRequest([5, 17, 33, 101, 7], 6, SamplingParams(), [])
    got = staggered(engine, [(0, short), (4, LATE), (30, MID)], speculative=True, capacity=1)
    assert [got[k].output_ids for k in range(3)] == [alone(engine, r, True).output_ids for r in (short, LATE, MID)]


def test_cancel_leaves_the_batch_and_the_others_are_unaffected(mimic_ckpt: Path) -> None:
    engine = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=TREES[0], dtype="float32", device="cpu")
    streamed: dict[int, list[int]] = {}
    session = engine.session(2, 64, on_tokens=lambda slot, new: streamed.setdefault(slot, []).extend(new) is None)
    a, b = session.add(LONG), session.add(MID)
    assert (a, b) == (0, 1)
    for _ in range(3):
        session.step()
    session.cancel(a)
    assert session.active == [b] and session.finished == [a]
    cancelled = session.pop(a)
    assert cancelled.finish_reason == "cancelled" and 0 < len(cancelled.output_ids) < LONG.max_new_tokens
    assert streamed[a] == cancelled.output_ids
    while not session.done:
        session.step()
    assert session.pop(b).output_ids == alone(engine, MID, True).output_ids


def test_on_tokens_returning_false_cancels_that_slot(mimic_ckpt: Path) -> None:
    engine = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=TREES[0], dtype="float32", device="cpu")
    session = engine.session(2, 64, on_tokens=lambda slot, new: slot != 1)
    session.add(LONG)
    session.add(MID)
    while not session.done:
        session.step()
    assert session.pop(1).finish_reason == "cancelled"
    assert session.pop(0).output_ids == alone(engine, LONG, True).output_ids


def test_session_errors_name_the_problem(mimic_ckpt: Path) -> None:
    engine = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=TREES[0], dtype="float32", device="cpu")
    with pytest.raises(ValueError, match="capacity and max_len are required"):
        engine.session()
    session = engine.session(1, 32)
    with pytest.raises(ValueError, match=r"prompt 5 \+ max_new_tokens 40 exceeds the session's max_len=32"):
        session.add(LONG)
    slot = session.add(MID)
    with pytest.raises(ValueError, match="session full: all 1 slots are taken"):
        session.add(MID)
    with pytest.raises(ValueError, match=f"slot {slot} holds no finished sequence"):
        session.pop(slot)
    session.cancel(slot)  # before its prefill: it never runs
    res = session.pop(slot)
    assert res.finish_reason == "cancelled" and res.output_ids == [] and session.done
    with pytest.raises(ValueError, match="slot 0 is free"):
        session.cancel(0)


# ---- isolation: a bad request is refused before it joins, a failing sequence ends alone ----------------------------


def test_requests_with_ids_outside_the_vocabulary_or_nan_sampling_are_refused_before_they_join(
    mimic_ckpt: Path,
) -> None:
    engine = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=TREES[0], dtype="float32", device="cpu")
    session = engine.session(2, 64)
    for ids, bad, pos in (([5, 100_000_000], 100_000_000, 1), ([-7, 5], -7, 0), ([5, 320], 320, 1)):
        with pytest.raises(ValueError, match=rf"prompt token id {bad} at position {pos} is out of range; token ids "
                                             r"must be in \[0, 320\)"):
            session.add(GenerationRequest(ids, 4, SamplingParams(), []))
    for temperature in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match=rf"temperature={temperature} must be a finite number >= 0"):
            SamplingParams(temperature=temperature, top_k=5)
    with pytest.raises(ValueError, match=r"top_p=nan must be in \(0, 1\]"):
        SamplingParams(temperature=1.0, top_p=float("nan"))
    req = GenerationRequest([9, 8, 7], 4, SamplingParams(temperature=1.0, top_k=5), [])
    req.sampling.temperature = float("nan")  # changed after construction: add() checks again
    with pytest.raises(ValueError, match="temperature=nan must be a finite number"):
        session.add(req)
    assert session.free == 2 and session.done


@pytest.mark.parametrize("speculative", [True, False], ids=["speculative", "target-only"])
def test_a_sequence_that_fails_while_stepping_ends_alone_and_the_others_are_unchanged(
    mimic_ckpt: Path, speculative: bool
) -> None:
    """A fault inside a batched step (here: NaN probabilities, the sampler raises) ends that sequence with
    finish_reason "error" and the message; the step is redone for the others, whose tokens equal their solo runs."""
    engine = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=TREES[1], dtype="float32", device="cpu")
    seeded = GenerationRequest([100, 200, 3, 4], 20, SamplingParams(temperature=0.8, top_k=20, seed=7), [])
    poisoned = GenerationRequest([9, 8, 7], 25, SamplingParams(temperature=0.8, top_k=5, seed=1), [])
    streamed: dict[int, list[int]] = {}
    session = engine.session(3, 64, speculative=speculative,
                             on_tokens=lambda slot, new: streamed.setdefault(slot, []).extend(new) is None)
    a, b, c = session.add(LONG), session.add(poisoned), session.add(seeded)
    session.step()  # the prefills
    poisoned.sampling.temperature = float("nan")  # the checks at add() passed: this is a fault while stepping
    while not session.done:
        session.step()
    bad = session.pop(b)
    assert bad.finish_reason == "error" and bad.error is not None
    assert bad.error.startswith("RuntimeError: probability tensor contains either `inf`, `nan` or element < 0"), (
        bad.error
    )
    assert streamed[b] == bad.output_ids and len(bad.output_ids) == 1  # its prefill token only, nothing twice
    for slot, req in ((a, LONG), (c, seeded)):
        res = session.pop(slot)
        solo = alone(engine, req, speculative)
        assert res.output_ids == solo.output_ids == streamed[slot]
        assert res.stats.target_forwards == solo.stats.target_forwards
        assert res.stats.accepted_draft_tokens == solo.stats.accepted_draft_tokens

    def refuse_slot_1(slot: int, new: list[int]) -> bool:
        if slot == 1:
            raise ConnectionError("client gone")
        return True

    with pytest.raises(RuntimeError, match=r"^generation failed for request 1: ConnectionError: client gone$"):
        engine.generate([MID, LATE], speculative=speculative, on_tokens=refuse_slot_1)
