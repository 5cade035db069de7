"""The load tester reports acceptance per concurrency level, relative to the first level (acceptance can fall as the
batch grows on TensorRT-LLM: NVIDIA/TensorRT-LLM#9208), in report.json and in one line at the end of a run."""

from __future__ import annotations

import pytest

from clients.loadtest import acceptance_line
from clients.stats import LevelReport, RequestRecord, acceptance_by_level, aggregate


def _level(level: int, accepted: int, drafted: int, tokens: int = 20) -> LevelReport:
    recs = [RequestRecord(index=i, prompt_index=0, start=0.0, status="OK", end=1.0, first_response=0.1, responses=3,
                          output_tokens=tokens, streamed=True, accepted_draft_tokens=accepted, draft_tokens=drafted)
            for i in range(2)]
    return aggregate(recs, mode="concurrency", level=level, duration_s=1.0)


@pytest.mark.parametrize(("accepted", "want"), [((8, 6, 4), (1.0, 0.75, 0.5)), ((5, 5, 6), (1.0, 1.0, 1.2))])
def test_acceptance_per_level_relative_to_the_first(accepted: tuple[int, ...], want: tuple[float, ...]) -> None:
    reports = [_level(c, a, 16) for c, a in zip((1, 2, 4), accepted, strict=True)]
    rows = acceptance_by_level(reports)
    assert [r["level"] for r in rows] == [1, 2, 4]
    assert [r["acceptance_rate"] for r in rows] == pytest.approx([a / 16 for a in accepted])
    assert [r["vs_first_level"] for r in rows] == pytest.approx(list(want))
    line = acceptance_line(reports)
    assert line is not None and line.startswith(f"acceptance by level: concurrency=1 {accepted[0] / 16:.3f} (tau ")
    assert f"concurrency=4 {accepted[2] / 16:.3f}" in line and f" {want[2]:.2f}x" in line
    assert "NVIDIA/TensorRT-LLM#9208" in line


def test_no_line_for_one_level_or_without_speculative_stats() -> None:
    assert acceptance_line([_level(1, 4, 8)]) is None
    plain = aggregate([RequestRecord(index=0, prompt_index=0, start=0.0, status="OK", end=1.0, first_response=0.1,
                                     responses=1, output_tokens=5, streamed=True)], mode="concurrency", level=2,
                      duration_s=1.0)
    assert acceptance_by_level([plain]) == [] and acceptance_line([plain, plain]) is None
