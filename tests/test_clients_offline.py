"""clients/ without a server: percentile maths, aggregation, Poisson arrivals, prompt files, schema generation from
the rendered repository (client.json) and from model configs, plots."""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from builders.config import load_config
from clients import schema as sch
from clients.cancel import STOP_REQUEST_TENSORS, resolve_stop_model, stop_request_inputs
from clients.client import build_request, decode_text, new_request_id
from clients.load import LevelSpec, poisson_arrivals, prompt_order
from clients.plots import PLOT_FILES, write_plots
from clients.prompts import PromptFileError, load_prompts
from clients.stats import RequestRecord, Summary, aggregate, csv_row, percentile
from testkit.echo_repo import render_echo_repo
from triton_repo import contract
from builders.triton.render import CLIENT_FILE, client_descriptor

REPO = Path(__file__).resolve().parent.parent
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ---- percentiles --------------------------------------------------------------------------------------------------


def test_percentile_known_values() -> None:
    xs = list(range(1, 11))  # 1..10: rank(p) = p/100 * 9
    assert percentile(xs, 50) == pytest.approx(5.5)
    assert percentile(xs, 90) == pytest.approx(9.1)
    assert percentile(xs, 99) == pytest.approx(9.91)
    assert percentile(xs, 0) == 1 and percentile(xs, 100) == 10
    assert percentile([7.0], 99) == 7.0
    assert percentile([3, 1, 2], 50) == 2  # unsorted input


def test_percentile_matches_numpy_linear() -> None:
    rng = np.random.default_rng(3)
    xs = rng.lognormal(size=257).tolist()
    for p in (1, 50, 90, 99, 99.9):
        assert percentile(xs, p) == pytest.approx(float(np.percentile(xs, p)), rel=1e-12)


def test_percentile_errors() -> None:
    with pytest.raises(ValueError, match="empty"):
        percentile([], 50)
    with pytest.raises(ValueError, match="outside"):
        percentile([1.0], 101)


def test_summary_of_known_series() -> None:
    s = Summary.of([0.1, 0.2, 0.3, 0.4])
    assert s is not None
    assert (s.count, s.mean, s.p50, s.min, s.max) == (4, pytest.approx(0.25), pytest.approx(0.25), 0.1, 0.4)
    assert Summary.of([]) is None


# ---- aggregation --------------------------------------------------------------------------------------------------


def _rec(i: int, tokens: int, acc: int | None, drafted: int | None, status: str = "OK") -> RequestRecord:
    ok = status == "OK"
    return RequestRecord(index=i, prompt_index=0, start=10.0 + i, status=status, end=11.0 + i if ok else 10.5 + i,
                         first_response=10.2 + i if ok else None, responses=3, output_tokens=tokens,
                         streamed=True, accepted_draft_tokens=acc, draft_tokens=drafted,
                         error=None if ok else "boom")


def test_aggregate_counts_tokens_and_speculative_stats() -> None:
    recs = [_rec(0, 10, 6, 8), _rec(1, 5, 2, 4), _rec(2, 0, None, None, "UNAVAILABLE"),
            _rec(3, 0, None, None, "DEADLINE_EXCEEDED")]
    rep = aggregate(recs, mode="concurrency", level=4, duration_s=2.0)
    assert (rep.requests_sent, rep.requests_ok) == (4, 2)
    assert rep.errors == {"DEADLINE_EXCEEDED": 1, "UNAVAILABLE": 1}
    assert rep.error_examples["DEADLINE_EXCEEDED"] == "boom"
    assert rep.output_tokens == 15 and rep.output_tokens_per_s == pytest.approx(7.5)
    assert rep.request_throughput == pytest.approx(1.0)
    # token-weighted acceptance 8/12; tau = tokens after the prefills per forward after them = (15 - 2) / (15 - 2 - 8)
    assert rep.acceptance_rate == pytest.approx(8 / 12)
    assert rep.tau == pytest.approx(13 / 5)
    # ITL = (end - first_response) / (tokens - 1): 0.8/9 and 0.8/4
    assert rep.itl_s is not None and rep.itl_s.mean == pytest.approx((0.8 / 9 + 0.8 / 4) / 2)
    assert rep.ttft_s is not None and rep.ttft_s.p50 == pytest.approx(0.2)
    assert rep.e2e_s is not None and rep.e2e_s.max == pytest.approx(1.0)
    row = csv_row(rep)
    assert row["errors"] == "DEADLINE_EXCEEDED=1;UNAVAILABLE=1" and row["tau"] == pytest.approx(13 / 5)


def test_aggregate_without_stats_or_successes() -> None:
    rep = aggregate([_rec(0, 0, None, None, "UNAVAILABLE")], mode="rate", level=2.0, duration_s=1.0)
    assert rep.requests_ok == 0 and rep.tau is None and rep.acceptance_rate is None
    assert rep.ttft_s is None and rep.itl_s is None
    assert csv_row(rep)["ttft_s_p50"] == "" and csv_row(rep)["tau"] == ""


# ---- arrivals, prompt order, level specs ---------------------------------------------------------------------------


def test_poisson_arrivals_seeded_and_bounded() -> None:
    a = poisson_arrivals(20.0, seed=5, count=4000, duration_s=None)
    assert a == poisson_arrivals(20.0, seed=5, count=4000, duration_s=None)
    assert a != poisson_arrivals(20.0, seed=6, count=4000, duration_s=None)
    gaps = np.diff([0.0, *a])
    assert len(a) == 4000 and np.all(gaps > 0)
    # exponential gaps: mean 1/rate and coefficient of variation 1 (4000 samples: ~1.6% standard error)
    assert gaps.mean() == pytest.approx(1 / 20.0, rel=0.06)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.08)
    d = poisson_arrivals(20.0, seed=5, count=None, duration_s=3.0)
    assert d and max(d) < 3.0 and d == [t for t in a if t < 3.0]


def test_prompt_order_is_a_seeded_permutation() -> None:
    order = prompt_order(7, seed=1)
    assert sorted(order.tolist()) == list(range(7))
    assert order.tolist() == prompt_order(7, seed=1).tolist()


def test_text_is_decoded_once_per_request() -> None:
    """The load tester keeps each response's raw UTF-8 bytes and decodes the request's text once: a character split
    across two responses comes out whole (decoding per response would give two U+FFFD and miscount tokens)."""
    e_acute = "\u00e9".encode()  # 2 bytes in UTF-8
    assert decode_text([b"caf" + e_acute[:1], e_acute[1:] + b" ok "]) == "caf\u00e9 ok "
    assert decode_text([]) == ""
    assert decode_text([b"bad \xff end"]) == "bad \ufffd end"  # invalid bytes are replaced, not fatal


def test_level_spec_validation() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        LevelSpec(mode="concurrency", level=2, max_tokens=4, stream=True)
    with pytest.raises(ValueError, match="positive integer"):
        LevelSpec(mode="concurrency", level=1.5, max_tokens=4, stream=True, requests=3)


# ---- prompt files -------------------------------------------------------------------------------------------------


def test_load_prompts_jsonl_and_mtbench(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a b"}\n\n{"turns": ["first turn", "second"], "category": "writing"}\n')
    assert load_prompts(f) == ["a b", "first turn"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"text": "x"}\n', "p.jsonl:1: no `prompt` or `turns`"),
        ('{"prompt": "ok"}\nnot json\n', "p.jsonl:2: not valid JSON"),
        ('{"turns": []}\n', "`turns` must be a non-empty list"),
        ("\n", "holds no prompts"),
    ],
)
def test_load_prompts_errors(tmp_path: Path, content: str, message: str) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text(content)
    with pytest.raises(PromptFileError, match=message.replace("`", ".").replace("[", ".").replace("]", ".")):
        load_prompts(f)


# ---- schema -------------------------------------------------------------------------------------------------------


def test_role_names_are_contract_tensors() -> None:
    ins, outs = contract.by_name(contract.ENSEMBLE_INPUTS), contract.by_name(contract.ENSEMBLE_OUTPUTS)
    for name in (sch.PROMPT, sch.MAX_TOKENS, sch.STREAM, sch.PERF_FLAG):
        assert name in ins, name
    for name in (sch.TEXT_OUTPUT, *sch.PERF_OUTPUTS):
        assert name in outs, name
    assert set(sch.PERF_OUTPUTS) == {t.name for t in contract.PERF_OUTPUTS}


def _write_descriptor(repo: Path, overrides: list[str]) -> Path:
    bc = load_config(REPO / "configs" / "demo.yaml", overrides)
    repo.mkdir(parents=True, exist_ok=True)
    (repo / CLIENT_FILE).write_text(json.dumps(client_descriptor(bc)))
    return repo


def test_schema_from_descriptor_follows_the_rendered_repository(tmp_path: Path) -> None:
    """client.json from builders.triton.render.client_descriptor: the schema is the contract's, and follows a change."""
    s = sch.from_descriptor(_write_descriptor(tmp_path / "a", []))
    assert s.model == "ensemble" and s.max_batch_size == 4 and s.decoupled
    assert list(s.inputs) == [t.name for t in contract.ENSEMBLE_INPUTS]
    for t in contract.ENSEMBLE_INPUTS:
        spec = s.inputs[t.name]
        assert (spec.datatype, spec.dims, spec.optional, spec.default) == (contract.WIRE_DTYPE[t.dtype], t.dims,
                                                                           t.optional, t.default)
    assert s.has_perf_metrics
    changed = sch.from_descriptor(
        _write_descriptor(tmp_path / "b", ["triton.ensemble_model=llm_ensemble", "triton.streaming=false",
                                            "engine.max_batch_size=2"])
    )
    assert (changed.model, changed.max_batch_size, changed.decoupled) == ("llm_ensemble", 2, False)
    req = build_request(changed, "hi", 5, stream=False)
    assert req.model == "llm_ensemble"


def test_schema_descriptor_errors(tmp_path: Path) -> None:
    with pytest.raises(sch.SchemaError, match="no client descriptor"):
        sch.from_descriptor(tmp_path)
    (tmp_path / CLIENT_FILE).write_text('{"model": "ensemble"}')
    with pytest.raises(sch.SchemaError, match="descriptor lacks"):
        sch.from_descriptor(tmp_path)


def test_schema_from_repository_pbtxt_and_encode(tmp_path: Path) -> None:
    """Echo repository (no client.json): schema parsed from its config.pbtxt; requests validated and shaped."""
    s = sch.from_repository(render_echo_repo(tmp_path / "echo"))
    assert s.model == "ensemble" and s.max_batch_size == 64 and s.decoupled and s.tokenizer is None
    assert set(s.inputs) == {t.name for t in contract.ENSEMBLE_INPUTS}
    arrays = s.encode({"text_input": "héllo", "max_tokens": 7, "stop_words": ["a", "b"], "top_p": 0.5})
    assert arrays["text_input"].shape == (1, 1) and arrays["text_input"][0, 0] == "héllo".encode()
    assert arrays["max_tokens"].dtype == np.int32 and arrays["max_tokens"].tolist() == [[7]]
    assert arrays["stop_words"].shape == (1, 2) and arrays["top_p"].dtype == np.float32
    with pytest.raises(sch.SchemaError, match=r"no input\(s\) \['bogus'\]; its inputs are"):
        s.encode({"text_input": "x", "max_tokens": 1, "bogus": 1})
    with pytest.raises(sch.SchemaError, match=r"requires input\(s\) \['max_tokens'\]"):
        s.encode({"text_input": "x"})
    with pytest.raises(sch.SchemaError, match="has dims \\[1\\] but got 2"):
        s.encode({"text_input": ["x", "y"], "max_tokens": 1})
    req = build_request(s, "x y", 3, stream=True, temperature=0.0)
    names = {i.name(): i for i in req.inputs}
    assert set(names) == {"text_input", "max_tokens", "stream", "return_perf_metrics", "temperature"}
    # text + perf outputs are all the model has: none named, so the server returns all (as a bare client's request)
    assert set(s.outputs) == {"text_output", *sch.PERF_OUTPUTS} and req.outputs == [] and req.perf
    # without perf stats only text_output is asked for, by name
    assert [o.name() for o in build_request(s, "x", 3, stream=True, perf=False).outputs] == ["text_output"]
    # non-streamed: the prompt is excluded from text_output (the contract's default would repeat it)
    assert "exclude_input_in_output" in {i.name() for i in build_request(s, "x", 3, stream=False).inputs}


def test_tokenizer_found_in_ensemble_steps(tmp_path: Path) -> None:
    """An ensemble names no tokenizer itself; its preprocessing step does (upstream layout)."""
    steps = [{"model_name": "preprocessing"}, {"model_name": "tensorrt_llm"}]
    ens = {"name": "ensemble", "input": [], "output": [], "ensemble_scheduling": {"step": steps}}
    configs = {"preprocessing": {"parameters": {"tokenizer_dir": {"string_value": "/tok"}}}, "tensorrt_llm": {}}
    assert sch.find_tokenizer(ens, configs.get) == "/tok"
    assert sch.find_tokenizer({"name": "m"}, configs.get) is None


# ---- request ids and cancelling ensemble requests -----------------------------------------------------------------

ID_FORMAT = re.compile(r"r\d+-[0-9a-f]{32}")  # 128 random bits: what a stop request needs


def test_request_ids_are_unique_across_processes() -> None:
    """The stop request stops every request with its id, so ids must not repeat, also across processes: the first
    id of two fresh processes has the same counter part and still differs."""
    code = "from clients.client import new_request_id; print(new_request_id())"
    firsts = [subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
              .stdout.strip() for _ in range(2)]
    assert all(ID_FORMAT.fullmatch(i) and i.startswith("r0-") for i in firsts), firsts
    assert firsts[0] != firsts[1]
    here = [new_request_id() for _ in range(1000)]
    assert len(set(here)) == 1000 and all(ID_FORMAT.fullmatch(i) for i in here)
    counters = [int(i[1:].split("-")[0]) for i in here]
    assert counters == list(range(counters[0], counters[0] + 1000))  # readable: numbered in sending order


def test_stop_request_follows_the_llm_contract() -> None:
    """The stop request carries exactly the LLM model's required inputs (placeholders) and `stop`=true, with the
    contract's wire types, batched as [1, 1]."""
    llm = contract.by_name(contract.LLM_INPUTS)
    required = {t.name for t in contract.LLM_INPUTS if not t.optional}
    assert {name for name, _, _ in STOP_REQUEST_TENSORS} == required | {"stop"}
    for name, datatype, _ in STOP_REQUEST_TENSORS:
        assert datatype == contract.WIRE_DTYPE[llm[name].dtype], name
    inputs = {t.name(): t for t in stop_request_inputs()}
    assert all(t.shape() == [1, 1] for t in inputs.values())
    assert inputs["stop"].datatype() == "BOOL"
    # the serialized BOOL tensor [[True]] is one byte 0x01 (tritonclient keeps it as raw content)
    assert inputs["stop"]._get_content() == b"\x01"


def _configs(llm_inputs: list[str]) -> dict[str, dict]:
    steps = [{"model_name": m} for m in ("preprocessing", "tensorrt_llm", "postprocessing")]
    return {
        "ensemble": {"name": "ensemble", "platform": "ensemble", "ensemble_scheduling": {"step": steps}},
        "preprocessing": {"name": "preprocessing", "backend": "python", "input": [{"name": "QUERY"}]},
        "tensorrt_llm": {"name": "tensorrt_llm", "backend": "python", "input": [{"name": n} for n in llm_inputs]},
        "postprocessing": {"name": "postprocessing", "backend": "python", "input": [{"name": "TOKENS_BATCH"}]},
    }


def test_stop_model_from_the_descriptor(tmp_path: Path) -> None:
    """client.json names the ensemble's LLM model; the BLS model is cancelled plainly; no server is asked."""

    def no_server(name: str) -> dict:
        raise AssertionError(f"asked for the config of {name}")

    s = sch.from_descriptor(_write_descriptor(tmp_path / "a", []))
    assert resolve_stop_model(s, no_server) == "tensorrt_llm"
    renamed = sch.from_descriptor(_write_descriptor(tmp_path / "b", ["triton.llm_model=llm_step"]))
    assert resolve_stop_model(renamed, no_server) == "llm_step"
    assert resolve_stop_model(replace(s, model=s.extra["bls_model"]), no_server) is None


def test_stop_model_from_served_configs(tmp_path: Path) -> None:
    """Without client.json: the ensemble's step whose model takes `stop`; a single model needs no stop request;
    an ensemble none of whose steps can be stopped is an error that says why, not a cancel that leaks."""
    names = [t.name for t in contract.LLM_INPUTS]
    s = sch.from_repository(render_echo_repo(tmp_path / "echo"))  # model "ensemble", no client.json
    assert resolve_stop_model(s, _configs(names).get) == "tensorrt_llm"
    assert resolve_stop_model(s, sch.repo_config_getter(tmp_path / "echo")) is None  # the echo model: python
    with pytest.raises(sch.SchemaError, match=r"ensemble 'ensemble': 0 of its steps \['preprocessing', "
                       r"'tensorrt_llm', 'postprocessing'\] take a 'stop' input .*call the BLS model"):
        resolve_stop_model(s, _configs([n for n in names if n != "stop"]).get)
    with pytest.raises(sch.SchemaError, match="cannot read the config of model 'ensemble'"):
        resolve_stop_model(s, {}.get)


# ---- plots --------------------------------------------------------------------------------------------------------


def test_plots_written_and_non_empty(tmp_path: Path) -> None:
    reports, ttfts = [], []
    for level in (1, 4, 16):
        recs = [_rec(i, 8 + i % 3, 4, 6) for i in range(20)]
        for r in recs:
            r.first_response = r.start + 0.01 * level + 0.001 * r.index
        reports.append(aggregate(recs, mode="concurrency", level=level, duration_s=2.0 / level))
        ttfts.append([r.ttft for r in recs if r.ttft is not None])
    paths = write_plots(reports, ttfts, tmp_path)
    assert [p.name for p in paths] == list(PLOT_FILES)
    for p in paths:
        data = p.read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 10_000, (p, len(data))
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        assert width >= 600 and height >= 400
    assert not math.isnan(reports[0].request_throughput)


def test_loadtest_refuses_a_server_that_is_not_openai(tmp_path: Path) -> None:
    """A web server that is no OpenAI API (a static file server) is named as such, with what to pass."""
    (tmp_path / "v1").mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 30
        while time.monotonic() < end and socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            time.sleep(0.1)
        prompts = tmp_path / "p.jsonl"
        prompts.write_text('{"prompt": "hi"}\n')
        r = subprocess.run([sys.executable, "-m", "clients.loadtest", "--openai-url", f"http://127.0.0.1:{port}/v1",
                            "--prompts", str(prompts), "--out", str(tmp_path / "o"), "--concurrency", "1",
                            "--requests", "1"], capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, PYTHONPATH=str(REPO)))
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert r.returncode == 2, r.stderr
    assert f"GET http://127.0.0.1:{port}/v1/models answered HTTP 404" in r.stderr
    assert "not an OpenAI model list; pass the base URL of an OpenAI-compatible API" in r.stderr
