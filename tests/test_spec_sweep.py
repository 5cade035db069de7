"""Speculation on / off sweep: the speculation-off copy of a repository (scripts/spec_sweep.py) differs only in the
reference LLM model's `speculative` parameter, and loadtest's comparison (clients/loadtest.py --baseline-url) pairs
the two runs level by level: both curves and their ratio."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from clients.loadtest import write_comparison
from clients.stats import LevelReport, RequestRecord, aggregate

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

import spec_sweep


def _cfg(path: Path) -> mc.ModelConfig:
    return text_format.Parse(path.read_text(), mc.ModelConfig())


def test_spec_off_copy_flips_only_the_speculative_parameter(triton_build_dir: Path, tmp_path: Path) -> None:
    repo = triton_build_dir / "triton_repo"
    assert _cfg(repo / "tensorrt_llm" / "config.pbtxt").parameters["speculative"].string_value == "true"
    off = spec_sweep.spec_off_copy(repo, tmp_path / "off")
    a, b = _cfg(repo / "tensorrt_llm" / "config.pbtxt"), _cfg(off / "tensorrt_llm" / "config.pbtxt")
    assert b.parameters["speculative"].string_value == "false"
    b.parameters["speculative"].string_value = "true"
    assert a == b  # nothing else changed
    for model in ("preprocessing", "postprocessing", "ensemble"):
        assert (off / model / "config.pbtxt").read_text() == (repo / model / "config.pbtxt").read_text()


def test_spec_off_copy_refuses_a_repository_without_the_parameter(tmp_path: Path) -> None:
    (tmp_path / "r" / "tensorrt_llm").mkdir(parents=True)
    (tmp_path / "r" / "tensorrt_llm" / "config.pbtxt").write_text('name: "tensorrt_llm"\nbackend: "python"\n')
    with pytest.raises(ValueError, match="has no `speculative` parameter"):
        spec_sweep.spec_off_copy(tmp_path / "r", tmp_path / "off")


def _level(level: int, tokens_per_request: int, seconds: float) -> LevelReport:
    recs = [RequestRecord(index=i, prompt_index=0, start=0.0, status="OK", end=seconds, first_response=0.1,
                          responses=2, output_tokens=tokens_per_request, streamed=True) for i in range(level)]
    return aggregate(recs, mode="concurrency", level=level, duration_s=seconds)


@pytest.mark.parametrize("levels", [[1, 2, 4], [1], [2, 8, 32]])
def test_comparison_pairs_levels_and_plots_both_curves(tmp_path: Path, levels: list[int]) -> None:
    on = [_level(c, 60, 2.0) for c in levels]
    off = [_level(c, 60, 2.0 * (1 + c / 4)) for c in levels]  # off is slower by a factor that grows with c
    write_comparison(tmp_path, on, off)
    doc = json.loads((tmp_path / "comparison.json").read_text())
    assert [row["level"] for row in doc["levels"]] == levels
    for row, a, b in zip(doc["levels"], on, off, strict=True):
        assert row["on_tokens_per_s"] == a.output_tokens_per_s and row["off_tokens_per_s"] == b.output_tokens_per_s
        assert row["ratio"] == pytest.approx(1 + row["level"] / 4)
    assert (tmp_path / "speculation_on_off.png").stat().st_size > 0
