"""One slot's host bookkeeping (engines/slots.py), tested directly: the failure record a failing sequence ends with,
the undo a failing batch step relies on (every field a step changes comes back, the statistics are a copy, the
sampling generator rewinds), and stop strings that span more tokens than characters."""

from __future__ import annotations

import pytest
import torch

from core.types import GenerationRequest, RequestStats, SamplingParams
from engines.slots import Accepted, Slot


def _slot(sampling: SamplingParams, stop_strings: list[str] | None = None, max_new: int = 32) -> Slot:
    req = GenerationRequest([1, 2, 3], max_new, sampling, stop_token_ids=[0], stop_strings=stop_strings or [])
    gen = torch.Generator().manual_seed(7)
    return Slot(0, req, gen, stats=RequestStats(acceptance_by_depth=[0, 0, 0]))


def _chars(ids: list[int]) -> str:
    """A tokenizer where token t is the character chr(ord('a') + t - 1)."""
    return "".join(chr(ord("a") + t - 1) for t in ids)


def test_a_failed_slot_ends_with_the_exception_named_in_its_result() -> None:
    s = _slot(SamplingParams())
    s.take([5, 6], _chars)
    s.fail(ValueError("boom"))
    assert not s.going and s.finish == "error"
    r = s.result()
    assert (r.finish_reason, r.error, r.output_ids) == ("error", "ValueError: boom", [5, 6])


def test_a_finished_slot_without_error_reports_none() -> None:
    s = _slot(SamplingParams(), max_new=2)
    s.take([5, 6, 7], _chars)
    r = s.result()
    assert (r.finish_reason, r.error, r.output_ids) == ("length", None, [5, 6])


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8, seed=3)],
                         ids=["greedy", "sampled"])
def test_restore_undoes_everything_a_step_changed(sampling: SamplingParams) -> None:
    s = _slot(sampling)
    s.length = 4
    s.count(Accepted(0, [5, 6, 7], forwards=1, drafted=3, accepted=2), len(s.take([5, 6, 7], _chars)))
    before = (s.length, list(s.out), s.finish, s.error, RequestStats(**vars(s.stats) | {
        "acceptance_by_depth": list(s.stats.acceptance_by_depth)}))
    first_draw = torch.rand(4, generator=torch.Generator().set_state(s.gen.get_state()))
    snap = s.snapshot()
    assert (snap[5] is None) == sampling.greedy  # the generator state is kept only when the request samples
    # the failing step: more tokens, statistics counted in place, the generator advanced, the slot failed
    s.length = 9
    s.count(Accepted(0, [8, 9], forwards=1, drafted=3, accepted=1), len(s.take([8, 9], _chars)))
    torch.rand(4, generator=s.gen)
    s.fail(RuntimeError("step failed"))
    s.restore(snap)
    assert (s.length, s.out, s.finish, s.error, s.stats) == before
    assert s.stats.acceptance_by_depth == [1, 1, 0]  # a copy: the failing step's in-place counts are gone
    if not sampling.greedy:
        assert torch.equal(torch.rand(4, generator=s.gen), first_draw)  # the generator rewound


def test_a_stop_string_longer_than_its_tokens_window_slack_is_found() -> None:
    """The stop-string check decodes only the tail: enough tokens for the longest stop string plus slack. A
    12-character stop string that takes 12 one-character tokens must still be found when its last token arrives."""
    stop = "abcdefghijkl"
    s = _slot(SamplingParams(), [stop], max_new=64)
    ids = [20, 21] + [ord(c) - ord("a") + 1 for c in stop] + [22]
    kept = s.take(ids, _chars)
    assert s.finish == "stop" and kept == ids[:-1] and _chars(kept).endswith(stop)
