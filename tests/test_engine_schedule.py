"""Reference engine, load-aware speculation (engines/schedule.py): each decoding step drafts the length the schedule
gives its live batch size (upstream's draft_len_schedule / max_concurrency semantics), the acceptance-rate window
switches speculation off, and outputs stay the target's whatever the schedule does."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from engines.api import GenerationRequest, ReferenceEngine, SamplingParams
from core.speculation import SpeculationPolicy, draft_len_for, truncate
from core.trees import DraftTree, DynamicTree, preset

pytestmark = pytest.mark.usefixtures("one_thread")

REQS = [
    GenerationRequest([5, 17, 33, 101, 7], 30, SamplingParams(), []),
    GenerationRequest([9, 8, 7], 14, SamplingParams(), []),
    GenerationRequest([100, 200, 3, 4, 5, 6, 7], 22, SamplingParams(), []),
    GenerationRequest([1, 2, 3, 4], 8, SamplingParams(), []),
]
STARTS = [0, 2, 4, 6]  # request k joins before decoding step STARTS[k]: the batch grows 1 -> 4, then shrinks


@pytest.mark.parametrize(("schedule", "expect"), [
    ({1: 3, 2: 2, 4: 1}, {1: 3, 2: 2, 3: 1, 4: 1, 5: 0, 64: 0}),
    ({4: 4, 8: 2, 32: 1}, {1: 4, 4: 4, 5: 2, 8: 2, 9: 1, 32: 1, 33: 0}),
    ({1: 2}, {1: 2, 2: 0}),
    ({2: 5, 3: 0, 6: 1}, {1: 5, 2: 5, 3: 0, 4: 1, 6: 1, 7: 0}),
])
def test_draft_len_is_the_smallest_threshold_at_or_above_the_batch(
    schedule: dict[int, int], expect: dict[int, int]
) -> None:
    for batch, length in expect.items():
        assert draft_len_for(schedule, batch) == length, batch


def test_max_concurrency_is_the_full_tree_up_to_n_then_nothing() -> None:
    p = SpeculationPolicy(max_concurrency=3)
    assert [p.draft_len(b, 4) for b in (1, 2, 3, 4, 9)] == [4, 4, 4, 0, 0]


@pytest.mark.parametrize("bad", [
    {"draft_len_schedule": {0: 1}}, {"draft_len_schedule": {1: -1}}, {"draft_len_schedule": {}},
    {"draft_len_schedule": {1: 2}, "max_concurrency": 2}, {"max_concurrency": 0},
    {"acceptance_rate_window_size": -1}, {"acceptance_rate_window_size": 4, "acceptance_rate_threshold": 1.5},
])
def test_policy_rejects_what_upstream_rejects(bad: dict) -> None:
    with pytest.raises(ValueError):
        SpeculationPolicy(**bad)


def test_truncate_keeps_the_first_levels() -> None:
    tree = DraftTree.from_choices(preset("eagle-default"))
    for d in range(1, tree.depth + 1):
        t = truncate(tree, d)
        assert t.depth == d and set(t.paths) == {p for p in tree.paths if len(p) <= d}
    dyn = truncate(DynamicTree(4, 4, 16), 2)
    assert (dyn.top_k, dyn.depth, dyn.total_draft_tokens) == (4, 2, 8)
    with pytest.raises(ValueError, match="must be in 1..4"):
        truncate(DynamicTree(4, 4, 16), 5)


def run_staggered(
    engine: ReferenceEngine, speculative: bool = True
) -> tuple[dict[int, list[int]], dict[int, int], object]:
    """Requests join at STARTS; returns ({request: output ids}, {batch size: decoding steps at it}, session)."""
    session = engine.session(len(REQS), 64, speculative=speculative)
    slot_of: dict[int, int] = {}
    out: dict[int, list[int]] = {}
    steps_at: dict[int, int] = {}
    step = 0
    while len(out) < len(REQS):
        for k, at in enumerate(STARTS):
            if at <= step and k not in slot_of:
                slot_of[k] = session.add(REQS[k])
        if not session.pending:  # a decoding step (not a prefill) of the sequences still active
            steps_at[len(session.active)] = steps_at.get(len(session.active), 0) + 1
        session.step()
        step += 1
        for slot in session.finished:
            [k] = [k for k, s in slot_of.items() if s == slot and k not in out]
            out[k] = session.pop(slot).output_ids
    return out, steps_at, session


TREES = {"chain-3": DraftTree.from_choices(preset("chain-3")),
         "eagle-25": DraftTree.from_choices(preset("eagle-default")),
         "dynamic": DynamicTree(4, 3, 10)}
SCHEDULES = [{1: 3, 2: 2, 4: 1}, {1: 3, 3: 1}, {2: 3, 3: 0}, {1: 1}]


@pytest.mark.parametrize("tree_name", list(TREES))
@pytest.mark.parametrize("schedule", SCHEDULES, ids=[str(s) for s in SCHEDULES])
def test_each_step_drafts_what_the_schedule_gives_its_batch_size(
    mimic_ckpt: Path, tree_name: str, schedule: dict[int, int]
) -> None:
    tree = TREES[tree_name]
    base = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=tree, dtype="float32", device="cpu")
    target_only, _, _ = run_staggered(base, speculative=False)
    engine = base.with_policy(SpeculationPolicy(draft_len_schedule=schedule))
    got, steps_at, session = run_staggered(engine)
    assert got == target_only  # greedy outputs are the target's whatever the schedule does
    assert len(steps_at) >= 3  # the batch really changed size
    drafted = session.policy_state.drafted_by_batch
    for batch, steps in steps_at.items():
        length = min(tree.depth, draft_len_for(schedule, batch))
        per_seq = truncate(tree, length).size if length else 0
        assert drafted.get(batch, 0) == steps * batch * per_seq, (batch, steps, length)


def test_speculation_off_above_max_concurrency(mimic_ckpt: Path) -> None:
    base = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=TREES["chain-3"], dtype="float32", device="cpu")
    got, steps_at, session = run_staggered(base.with_policy(SpeculationPolicy(max_concurrency=2)))
    assert got == run_staggered(base, speculative=False)[0]
    drafted = session.policy_state.drafted_by_batch
    assert {b: drafted.get(b, 0) for b in steps_at} == {b: n * b * 3 if b <= 2 else 0 for b, n in steps_at.items()}


def test_acceptance_window_switches_speculation_off_for_good(mimic_ckpt: Path) -> None:
    """Threshold 1.0: the first window whose mean rate is below 1 ends speculation; every later step drafts 0."""
    base = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=TREES["chain-3"], dtype="float32", device="cpu")
    policy = SpeculationPolicy(acceptance_rate_window_size=2, acceptance_rate_threshold=1.0)
    [free] = base.generate([REQS[0]])
    engine = base.with_policy(policy)
    session = engine.session(1, 64)
    session.add(REQS[0])
    drafted_per_step = []
    while not session.done:
        before = session.slot(0).stats.draft_tokens
        session.step()
        drafted_per_step.append(session.slot(0).stats.draft_tokens - before)
    res = session.pop(0)
    assert res.output_ids == free.output_ids
    assert session.policy_state.switched_off
    first_off = drafted_per_step.index(0, 1)  # step 0 is the prefill
    assert first_off >= 3 and all(d == 0 for d in drafted_per_step[first_off:])
    assert all(d == 3 for d in drafted_per_step[1:first_off])
    assert res.stats.draft_tokens < free.stats.draft_tokens
