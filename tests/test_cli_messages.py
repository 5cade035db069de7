"""What the commands say where a user would otherwise guess: the client's tau is the engine's and the metrics'
(tokens per target forward after the prefill), the generate client says why tokens are not counted, eagle-verify
says when 16-bit rounding can explain a differing greedy output and how to check it, eagle-ledger-check says what it
checked against what."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.check import summary_line
from clients.client import GenerationStats
from clients.generate import stats_lines
from clients.stats import tau_of
from clients.tokens import WHITESPACE, make_counter
from measure.verify import rounding_hint


@pytest.mark.parametrize(("forwards", "accepted", "requests"), [(32, 15, 1), (10, 0, 1), (40, 25, 3), (7, 7, 2)])
def test_the_clients_tau_is_the_engines(forwards: int, accepted: int, requests: int) -> None:
    """tokens = one prefill token per request + one per forward + the accepted draft tokens; the engine's tau is
    (accepted + forwards) / forwards (core/types.py RequestStats.tau), the served metric 1 + accepted / forwards."""
    from core.types import RequestStats

    tokens = requests + forwards + accepted
    engine = RequestStats(target_forwards=forwards, accepted_draft_tokens=accepted).tau
    assert tau_of(tokens, accepted, requests) == pytest.approx(engine) == pytest.approx(1 + accepted / forwards)
    assert tau_of(requests + accepted, accepted, requests) is None  # no forward after the prefill


def test_one_request_prints_the_metrics_tau() -> None:
    """48 tokens with 15 accepted: the request's tau is the served metric's 1.46875 (printed 1.47), not 48/33."""
    st = GenerationStats(start=0.0, streamed=True, end=2.0, first_response=0.5, accepted_draft_tokens=15,
                         draft_tokens=60)
    lines = stats_lines(" ".join(["w"] * 48), st, make_counter(WHITESPACE))
    assert lines[-1] == ("speculative: accepted 15 of 60 draft tokens (acceptance 0.250), tau 1.47 tokens per target "
                         "forward")
    assert stats_lines("a b", st, None)[1] == ("output tokens: not counted (the server names no tokenizer on this "
                                               "machine: pass --repo BUILD/triton_repo or --tokenizer DIR)")


@pytest.mark.parametrize(("dtype", "differ", "hint"), [
    ("torch.bfloat16", True, True), ("torch.float16", True, True), ("torch.float32", True, False),
    ("torch.bfloat16", False, False)])
def test_verify_names_16_bit_rounding_only_where_it_can_explain_a_difference(dtype: str, differ: bool,
                                                                             hint: bool) -> None:
    text = rounding_hint(dtype, differ)
    assert (text is not None) == hint
    if text is not None:
        name = dtype.removeprefix("torch.")
        assert text.startswith(f"note: this build runs in {name}.")
        assert "--set target.dtype=float32" in text and "float32 outputs must be identical" in text


def test_ledger_check_says_what_it_checked_against_what() -> None:
    emitted = {"llmapi.option": {"a", "b"}, "triton.llmapi.input": {"text_input"}}
    line = summary_line(emitted, "1.4", Path("build/x"), [])
    assert line.startswith("ledger (1.4): 3 names build/x writes (llmapi.option 2, triton.llmapi.input 1) checked "
                           "against the contract ledger's rows for TensorRT-LLM 1.4")
    assert line.endswith("not against an installed TensorRT-LLM: all cited")
    assert summary_line(emitted, "1.1", Path("b"), ["p1", "p2"]).endswith(": 2 problem(s)")
