"""Speculation off costs nothing (engines/session.py `_plain_step`, engines/step.py `catch_up`): a step the schedule
or the acceptance switch leaves without drafting is a plain target step (the drafter is not called), the drafter
catches up on the positions it missed in one batched pass when drafting resumes (its cache and state then equal a
drafter fed the whole sequence), and outputs stay the target's; the acceptance switch per sequence (ours) stops one
sequence's drafting while the others keep drafting."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from core.speculation import SpeculationPolicy
from core.trees import DraftTree, preset
from engines.api import GenerationRequest, ReferenceEngine, SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")

A = GenerationRequest([5, 17, 33, 101, 7], 40, SamplingParams(), [])
B = GenerationRequest([9, 8, 7], 10, SamplingParams(), [])


def _engine(ckpt: Path, **policy: Any) -> tuple[ReferenceEngine, ReferenceEngine]:
    base = ReferenceEngine.from_checkpoint(ckpt, tree=DraftTree.from_choices(preset("chain-3")), dtype="float32",
                                           device="cpu")
    return base, base.with_policy(SpeculationPolicy(**policy))


class Counted:
    """The drafter's forward, counted (the real one runs)."""

    def __init__(self, drafter: Any) -> None:
        self.calls, self.real = 0, drafter.forward
        object.__setattr__(drafter, "forward", self)

    def __call__(self, *args: Any, **kw: Any) -> Any:
        self.calls += 1
        return self.real(*args, **kw)


def test_a_step_without_drafting_never_calls_the_drafter_and_catches_up_after(mimic_ckpt: Path) -> None:
    """max_concurrency 1: A drafts alone, B joins (two sequences: plain target steps, no drafter call), B finishes
    (A drafts again, after one catch-up pass over what it missed)."""
    base, engine = _engine(mimic_ckpt, max_concurrency=1)
    [want_a], [want_b] = base.generate([A], speculative=False), base.generate([B], speculative=False)
    s = engine.session(2, 64)
    counted = Counted(s.draft.drafter)
    a = s.add(A)
    s.step()  # prefill
    for _ in range(2):
        s.step()
    assert s.slot(a).behind == []
    b = s.add(B)
    calls = counted.calls
    s.step()  # B's prefill: two sequences will not draft, so its prompt goes to its backlog (no drafter call)
    assert counted.calls == calls and len(s.slot(b).behind) == len(B.prompt_ids)
    plain_steps = 0
    while s.slot(b).going:
        s.step()
        plain_steps += 1
        assert counted.calls == calls  # the drafter is not called while two sequences decode
        assert len(s.slot(a).behind) == plain_steps
    assert plain_steps >= 3
    length, behind = s.slot(a).length, len(s.slot(a).behind)
    got_b = s.pop(b)
    drafted = s.slot(a).stats.draft_tokens
    s.step()  # A alone again: catch-up (one drafter pass) + the draft passes of a speculative step
    assert s.slot(a).behind == [] and s.slot(a).stats.draft_tokens == drafted + 3
    assert counted.calls == calls + 1 + 3  # catch-up, then chain-3's 3 levels (the head's draft passes)
    # the drafter's cache and state equal those of a drafter that read the whole sequence at once
    fresh = engine.session(1, 64)
    seq = A.prompt_ids + s.slot(a).out[: length - len(A.prompt_ids)]
    assert len(seq) == length and behind > 0
    fresh.add(GenerationRequest(seq, 1, SamplingParams(), []))
    fresh.step()
    for k_got, k_want in zip(s.dcache.k, fresh.dcache.k):
        torch.testing.assert_close(k_got[a, :length], k_want[0, :length], rtol=1e-4, atol=1e-4)
    while not s.done:
        s.step()
    assert s.pop(a).output_ids == want_a.output_ids and got_b.output_ids == want_b.output_ids


def test_catch_up_of_sequences_with_different_backlogs_is_one_pass(mimic_ckpt: Path) -> None:
    """Schedule {2: 3, 3: 0}: A and C draft; B joins (three: no drafting), then D (four: its prompt goes to its
    backlog); when C and B end, A and D draft again, their backlogs of different lengths caught up together in one
    drafter pass; outputs are the target's."""
    base, engine = _engine(mimic_ckpt, draft_len_schedule={2: 3, 3: 0})
    c = GenerationRequest([1, 2, 3, 4], 6, SamplingParams(), [])
    d = GenerationRequest([3, 1, 4, 1, 5], 30, SamplingParams(), [])
    reqs = [A, c, B, d]
    want = [base.generate([r], speculative=False)[0].output_ids for r in reqs]
    s = engine.session(4, 64)
    counted = Counted(s.draft.drafter)
    slots: list[int] = []
    for r in reqs:
        slots.append(s.add(r))
        s.step()  # its prefill
        s.step()
    out = {}
    while len(s.active) > 2:
        s.step()
        for i in s.finished:
            out[i] = s.pop(i).output_ids
    assert sorted(out) == [slots[1], slots[2]]  # C and B ended: A and D remain
    backlogs = [len(s.slot(slots[k]).behind) for k in (0, 3)]
    # D joined a batch that did not draft: its prompt waits in its backlog too (no drafter pass at its prefill)
    assert backlogs[0] != backlogs[1] and backlogs[1] > len(d.prompt_ids)
    calls = counted.calls
    s.step()  # two sequences again: one catch-up pass for both, then 3 draft levels
    assert counted.calls == calls + 1 + 3
    assert s.slot(slots[0]).behind == [] and s.slot(slots[3]).behind == []
    while not s.done:
        s.step()
        for i in s.finished:
            out[i] = s.pop(i).output_ids
    assert [out[i] for i in slots] == want


def test_the_acceptance_switch_per_sequence(mimic_ckpt: Path) -> None:
    """Threshold 1.0, window 2, per sequence: each sequence stops drafting once its own window is below 1, at its
    own step; a sequence that stopped verifies its root in the others' forward while they still draft; outputs are
    the target's."""
    base, engine = _engine(mimic_ckpt, acceptance_rate_window_size=2, acceptance_rate_threshold=1.0,
                           per_sequence_switch=True)
    want = [base.generate([r], speculative=False)[0].output_ids for r in (A, B)]
    s = engine.session(2, 64)
    a = s.add(A)
    s.step()
    s.step()
    b = s.add(B)
    s.step()
    mixed = 0
    res = {}
    while not s.done:
        before = {i: s.slot(i).stats.draft_tokens for i in s.active}
        s.step()
        drafted = {i: s.slot(i).stats.draft_tokens - before[i] for i in before}
        if len(drafted) == 2 and sorted(drafted.values())[0] == 0 and sorted(drafted.values())[1] > 0:
            mixed += 1  # one sequence off, the other drafting, in the same step
        for i in s.finished:
            res[i] = s.pop(i)
    assert mixed > 0
    assert [res[a].output_ids, res[b].output_ids] == want
    assert res[a].stats.draft_tokens < base.generate([A])[0].stats.draft_tokens


def test_per_sequence_switch_needs_a_window_and_threshold() -> None:
    with pytest.raises(ValueError, match="per_sequence_switch needs acceptance_rate_window_size"):
        SpeculationPolicy(per_sequence_switch=True)


def test_the_per_sequence_switch_in_the_config() -> None:
    """tree.acceptance_switch_per_sequence reaches the engine's policy (reference.json); it is ours, so refused where
    TensorRT-LLM runs, and it needs the window and threshold."""
    from builders.engine.reference import reference_spec
    from builders.speculation import speculation_problems
    from tests.engine_cases import make_cfg

    on = ["engine.backend=reference", "tree.choices=chain-3", "tree.acceptance_switch_per_sequence=true"]
    window = ["tree.acceptance_rate_window_size=4", "tree.acceptance_rate_threshold=0.3"]
    with pytest.raises(ValueError, match="tree.acceptance_switch_per_sequence needs tree.acceptance_rate_window_size "
                       "and tree.acceptance_rate_threshold"):
        make_cfg(*on)
    good = make_cfg(*on, *window)
    assert speculation_problems(good) == []
    policy = reference_spec(good, random_head=False).policy()
    assert policy is not None and policy.per_sequence_switch and policy.acceptance_rate_window_size == 4
    with pytest.raises(ValueError, match=r"tree.acceptance_switch_per_sequence is ours \(the reference engine's\), not "
                       "TensorRT-LLM's: engine.backend pytorch has only the switch for the whole batch; set it false"):
        make_cfg(*on, *window, "engine.backend=pytorch", "trtllm_version=1.4", "draft.type=eagle3")


def test_speculation_off_samples_exactly_as_target_only_decoding(mimic_ckpt: Path) -> None:
    """Schedule {1: 0}: every decoding step is a plain target step, so a seeded sampled request draws the same
    tokens as target-only decoding (same distribution, same generator use), and the drafter is never called."""
    base, engine = _engine(mimic_ckpt, draft_len_schedule={1: 0})
    req = GenerationRequest([5, 17, 33, 101, 7], 24, SamplingParams(temperature=0.9, top_p=0.95, seed=7), [])
    [want] = base.generate([req], speculative=False)
    s = engine.session(1, 64)
    counted = Counted(s.draft.drafter)
    s.add(req)
    s.step()
    after_prefill = counted.calls
    while not s.done:
        s.step()
    got = s.pop(0)
    assert got.output_ids == want.output_ids and got.stats.draft_tokens == 0
    assert counted.calls == after_prefill == 0  # not even at the prefill: the drafter is never called
