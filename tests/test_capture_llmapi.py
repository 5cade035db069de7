"""The current line's llmapi model (engine.backend pytorch) records what the refresh needs: the prompt's and the
output's token ids of each request the target finished, from TensorRT-LLM's RequestOutput fields, with the sampling
parameters the request gave; nothing for a request that ended otherwise (triton_repo/models/llmapi_capture.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from adaptive.dataset import usable
from triton_repo.models.llmapi_capture import record_of


def _output(prompt: list[int], tokens: list[int], reason: str | None, finished: bool = True) -> Any:
    return SimpleNamespace(finished=finished, prompt_token_ids=prompt,
                           outputs=[SimpleNamespace(token_ids=tokens, finish_reason=reason, text="x")])


@pytest.mark.parametrize(("params", "temperature", "max_new", "seed"), [
    ({}, 0.0, 32, None),  # nothing given: greedy, SamplingParams' max_tokens default
    ({"max_tokens": 8, "best_of": 1}, 0.0, 8, None),
    ({"temperature": 0.7, "top_k": 20, "top_p": 0.9, "seed": 3, "max_tokens": 5}, 0.7, 5, 3),
])
def test_a_finished_request_is_recorded_for_the_refresh(params: dict[str, Any], temperature: float, max_new: int,
                                                        seed: int | None) -> None:
    rec = record_of(_output([1, 2, 3], [7, 8, 9], "length"), params, "4")
    assert rec is not None and rec["prompt_ids"] == [1, 2, 3] and rec["output_ids"] == [7, 8, 9]
    assert rec["sampling"]["temperature"] == temperature and rec["sampling"]["seed"] == seed
    assert rec["max_new_tokens"] == max_new and rec["model_version"] == "4" and rec["acceptance"] is None
    c = usable(rec)  # what the refresh reads of it
    assert c is not None and c.prompt_ids == [1, 2, 3] and c.greedy == (temperature == 0.0)


@pytest.mark.parametrize("out", [
    _output([1, 2], [5, 6], "cancelled"),
    _output([1, 2], [5, 6], None),
    _output([1, 2], [5, 6], "length", finished=False),  # a streamed chunk
    _output([1, 2], [], "stop"),
    SimpleNamespace(finished=True, prompt_token_ids=[1], outputs=[]),
])
def test_nothing_is_recorded_for_a_request_the_target_did_not_finish(out: Any) -> None:
    assert record_of(out, {"max_tokens": 4}, "1") is None
