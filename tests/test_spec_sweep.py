"""Speculation on / off sweep: the speculation-off copy of a repository (scripts/spec_sweep.py) differs only in the
reference LLM model's `speculative` parameter (llmapi layout: model.yaml's speculative_config) and in paths rewritten
to name the build's files from wherever the copy is; the sweep runs end to end on both layouts; and loadtest's
comparison (clients/loadtest.py --baseline-url) pairs the two runs level by level: both curves and their ratio."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from clients.loadtest import write_comparison
from clients.stats import LevelReport, RequestRecord, aggregate

REPO = Path(__file__).resolve().parent.parent
from scripts import spec_sweep


def _cfg(path: Path) -> mc.ModelConfig:
    return text_format.Parse(path.read_text(), mc.ModelConfig())


def test_spec_off_copy_flips_only_the_speculative_parameter(triton_build_dir: Path, tmp_path: Path) -> None:
    repo = triton_build_dir / "triton_repo"
    assert _cfg(repo / "tensorrt_llm" / "config.pbtxt").parameters["speculative"].string_value == "true"
    off = spec_sweep.spec_off_copy(repo, tmp_path / "off")
    a, b = _cfg(repo / "tensorrt_llm" / "config.pbtxt"), _cfg(off / "tensorrt_llm" / "config.pbtxt")
    assert b.parameters["speculative"].string_value == "false"
    b.parameters["speculative"].string_value = "true"
    assert _pathless(a) == _pathless(b)  # nothing else changed (the paths: test_the_copy_elsewhere_names_...)
    for model in ("preprocessing", "postprocessing", "ensemble"):
        assert _pathless(_cfg(off / model / "config.pbtxt")) == _pathless(_cfg(repo / model / "config.pbtxt"))


def _pathless(cfg: mc.ModelConfig) -> mc.ModelConfig:
    from builders.triton.render import REPOSITORY_RELATIVE

    for key in REPOSITORY_RELATIVE:
        if key in cfg.parameters:
            cfg.parameters[key].string_value = "PATH"
    return cfg


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


# ---- the sweep end to end: OUT anywhere, both layouts ----------------------------------------------------------------
def _resolved_paths(repo: Path) -> dict[str, str]:
    """Every path the repository's models and clients resolve, made absolute against the repository."""
    import yaml

    from builders.triton.render import REPOSITORY_RELATIVE

    out: dict[str, str] = {}
    for pbtxt in repo.glob("*/config.pbtxt"):
        cfg = _cfg(pbtxt)
        for key in REPOSITORY_RELATIVE:
            if key in cfg.parameters:
                out[f"{pbtxt.parent.name}.{key}"] = str((repo / cfg.parameters[key].string_value).resolve())
    for f in repo.glob("*/*/model.yaml"):
        doc = yaml.safe_load(f.read_text())
        out[f"{f.parent.parent.name}.model"] = str((repo / doc["model"]).resolve())
    desc = json.loads((repo / "client.json").read_text())
    if desc.get("tokenizer"):  # the llmapi layout's descriptor names it
        out["client.tokenizer"] = str((repo / desc["tokenizer"]).resolve())
    return out


def test_the_copy_elsewhere_names_the_build_files(triton_build_dir: Path, tmp_path: Path) -> None:
    repo = triton_build_dir / "triton_repo"
    off = spec_sweep.spec_off_copy(repo, tmp_path / "far" / "away" / "off")
    want = _resolved_paths(repo)
    assert want["tensorrt_llm.build_dir"] == str(triton_build_dir.resolve())
    assert _resolved_paths(off) == want


@pytest.mark.parametrize("argv, message", [
    (["--concurrency", "0"], "--concurrency '0': every level must be >= 1"),
    (["--concurrency", "1,x"], "--concurrency '1,x': comma-separated integers"),
    (["--rounds", "0"], "--rounds 0: must be >= 1"),
    (["--requests", "-1"], "--requests -1: must be >= 1"),
])
def test_bad_arguments_fail_before_anything_loads(triton_build_dir: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str], argv: list[str],
                                                  message: str) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    with pytest.raises(SystemExit) as e:
        spec_sweep.main(["--build", str(triton_build_dir), "--prompts", str(prompts), "--out", str(tmp_path / "o"),
                         *argv])
    assert e.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_directory_that_is_no_build_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    with pytest.raises(SystemExit):
        spec_sweep.main(["--build", str(tmp_path), "--prompts", str(prompts), "--out", str(tmp_path / "o")])
    assert f"--build {tmp_path}: {tmp_path / 'triton_repo' / 'tensorrt_llm' / 'config.pbtxt'} not found" in (
        capsys.readouterr().err)


def _sweep(build: Path, out: Path, tmp_path: Path) -> dict:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("The capital of France is", "One, two,")))
    rc = subprocess.run([sys.executable, str(REPO / "scripts" / "spec_sweep.py"), "--build", str(build), "--prompts",
                         str(prompts), "--out", str(out), "--concurrency", "1,2", "--requests", "2", "--max-tokens",
                         "6", "--rounds", "2", "--threads", "1", "--chat"], cwd=tmp_path, check=False).returncode
    assert rc == 0
    return json.loads((out / "sweep.json").read_text())


def _check_sweep(doc: dict, out: Path) -> None:
    assert [row["level"] for row in doc["levels"]] == [1, 2]
    for row in doc["levels"]:
        assert len(row["ratios"]) == 2 and row["median_ratio"] > 0
    for k in (1, 2):
        assert json.loads((out / f"round-{k}" / "report.json").read_text())["meta"]["chat"] is True
        on = json.loads((out / f"round-{k}" / "report.json").read_text())["levels"]
        off = json.loads((out / f"round-{k}" / "baseline" / "report.json").read_text())["levels"]
        assert [(lv["requests_ok"], lv["errors"]) for lv in on + off] == [(2, {})] * 4
        if k == 2:  # the second round ran speculation off first
            on, off = off, on
        assert all(lv["draft_tokens"] > 0 for lv in on)  # speculation on ...
        assert all(not lv["draft_tokens"] for lv in off)  # ... and off
    assert doc["off_first"] == [False, True]
    for row in doc["levels"]:  # greedy: the same texts with and without speculation, prompt by prompt, every round
        assert [{k: v for k, v in x.items() if k != "empty"} for x in row["outputs"]] == [
            {"prompts": 2, "identical": 2, "differ": []}] * 2
        assert (row["outputs_identical"], row["outputs_compared"]) == (4, 4)
        assert row["outputs_empty"] == sum(len(x["empty"]) for x in row["outputs"])
    texts = [json.loads(x)["text"] for x in (out / "round-1" / "requests.jsonl").read_text().splitlines()]
    assert len(texts) == 4 and all(isinstance(t, str) for t in texts)  # the load tester records each answer


def test_outputs_that_differ_are_listed_by_prompt(tmp_path: Path) -> None:
    def write(d: Path, rows: list[tuple[int, int, str]]) -> None:
        d.mkdir(parents=True, exist_ok=True)
        (d / "requests.jsonl").write_text("".join(json.dumps({"level": lv, "prompt_index": p, "status": "OK",
                                                              "text": t}) + "\n" for lv, p, t in rows))

    write(tmp_path, [(1, 0, "a"), (1, 1, "b"), (2, 0, ""), (2, 1, "b"), (2, 1, "b")])
    write(tmp_path / "baseline", [(1, 0, "a"), (1, 1, "c"), (2, 0, ""), (2, 1, "b"), (2, 2, "z")])
    assert spec_sweep.identical(tmp_path, 1.0) == {"prompts": 2, "identical": 1, "differ": [1], "empty": []}
    # prompt 2 answered by one server only: not compared; prompt 0 empty on both: identical, and reported as empty
    assert spec_sweep.identical(tmp_path, 2.0) == {"prompts": 2, "identical": 2, "differ": [], "empty": [0]}


@pytest.mark.server
def test_sweep_runs_end_to_end_with_out_outside_the_build(triton_build_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "elsewhere" / "sweep"
    _check_sweep(_sweep(triton_build_dir, out, tmp_path), out)


@pytest.mark.server
def test_sweep_runs_on_the_llmapi_layout(tmp_path: Path) -> None:
    from builders.build import main as build_main
    from testkit import tiny_models as tm

    target, head = tm.make_llmapi_pair(tmp_path)
    cfg = tmp_path / "b.yaml"
    cfg.write_text(f"name: l\ntrtllm_version: '1.4'\noutput_dir: {tmp_path / 'build'}\n"
                   f"target: {{model: {target}, dtype: float32}}\ndraft: {{type: eagle3, model: {head}}}\n"
                   "tree: {choices: chain-3}\n"
                   "engine: {backend: reference, device: cpu, max_batch_size: 4, max_input_len: 48, "
                   "max_seq_len: 128}\n")
    assert build_main([str(cfg)]) == 0
    assert spec_sweep.layout_of(tmp_path / "build" / "triton_repo") == "llmapi"
    out = tmp_path / "out"
    _check_sweep(_sweep(tmp_path / "build", out, tmp_path), out)
