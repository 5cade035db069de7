"""bench/bench_switch.py on the tiny build: the four policies decode the same mixed traffic through one session each,
every output equals target-only decoding's, and the switches differ as their rules say (window 1, threshold 1: the
batch switch stops all speculation at the first imperfect step, for every later request too; per sequence, every
request drafts until its own first imperfect step). Arguments are checked before anything loads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.usefixtures("one_thread")


def _prompts(tmp_path: Path) -> tuple[Path, Path]:
    high, low = tmp_path / "high.jsonl", tmp_path / "low.jsonl"
    high.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("The capital of France is", "One, two,")))
    low.write_text(json.dumps({"turns": ["Écris un poème sur la mer.", "ignored second turn"]}) + "\n")
    return high, low


def test_the_switches_on_mixed_traffic(triton_build_dir: Path, tmp_path: Path) -> None:
    high, low = _prompts(tmp_path)
    out = tmp_path / "switch.json"
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "bench_switch.py"), "--build", str(triton_build_dir),
                           "--high", str(high), "--low", str(low), "--concurrency", "1", "--requests", "4",
                           "--max-tokens", "8", "--window", "1", "--threshold", "1.0", "--rounds", "1", "--json",
                           str(out)], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    for name in ("target-only", "always", "batch switch", "per-sequence switch"):
        assert doc[name]["identical_to_target_only"] == doc[name]["outputs"] == 4, name
        assert f"| {name} |" in proc.stdout
    drafted = {name: doc[name]["draft_tokens"] for name in doc if name != "meta"}
    assert drafted["target-only"] == 0 and drafted["always"] > 0
    assert 0 < drafted["batch switch"] < drafted["per-sequence switch"] <= drafted["always"]
    assert doc["meta"]["window"] == 1 and doc["meta"]["threshold"] == 1.0


@pytest.mark.parametrize(("extra", "message"), [
    (["--threshold", "1.5"], "--threshold 1.5: must be in [0, 1]"),
    (["--window", "0"], "--window 0: must be >= 1"),
])
def test_arguments_are_checked_first(triton_build_dir: Path, tmp_path: Path, extra: list[str], message: str) -> None:
    high, low = _prompts(tmp_path)
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "bench_switch.py"), "--build", str(triton_build_dir),
                           "--high", str(high), "--low", str(low), *extra], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 2 and message in proc.stderr


def test_a_build_without_a_reference_engine_is_refused(tmp_path: Path) -> None:
    high, low = _prompts(tmp_path)
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "bench_switch.py"), "--build", str(tmp_path),
                           "--high", str(high), "--low", str(low)], capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "no engine/reference.json (build it with engine.backend: reference)" in proc.stderr
