"""bench/bench_served.py on the tiny build: with $EAGLE_DEPLOY_STEP_PROFILE the served models record every step
(triton_repo/models/step_profile.py), and the report sets the served decoding step against the same step in
process; its arguments are checked before anything loads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

from bench import bench_served


@pytest.mark.server
def test_the_served_step_against_the_same_step_in_process(triton_build_dir: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "The capital of France is"}) + "\n")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "bench_served.py"), "--build", str(triton_build_dir),
                           "--prompts", str(prompts), "--out", str(out), "--requests", "2", "--max-tokens", "8",
                           "--rounds", "1"], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((out / "served_profile.json").read_text())
    assert doc["concurrency"] == 1
    assert doc["decode_steps"]["in_process"] > 0 and doc["decode_steps"]["served"] > 0
    ip, sv = doc["in_process"], doc["served"]
    assert {"verify", "walk", "drafter update"} <= set(ip["parts_ms"]) and set(ip["parts_ms"]) == set(sv["parts_ms"])
    assert sv["step_ms"] > 0 and sv["send_ms"] > 0 and sv["send_ms"] < sv["step_ms"]
    assert sv["postprocessing_calls"] > 0 and sv["preprocessing_ms_per_call"] > 0
    assert "| decoding step (Session.step) |" in proc.stdout
    names = sorted(f.name.split("-")[0] for f in (out / "profile").glob("*.jsonl"))
    assert names == ["postprocessing", "preprocessing", "tensorrt_llm"]


def test_arguments_are_checked_first(triton_build_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                     ) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    with pytest.raises(SystemExit):
        bench_served.main(["--build", str(triton_build_dir), "--prompts", str(prompts), "--out", str(tmp_path / "o"),
                           "--concurrency", "1,2"])
    assert "--concurrency 1,2: give one level" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
