"""The perf bridge of the C++ `tensorrtllm` backend (triton_repo/models/perf_bridge.py) on the real CPU Triton server:
a reference repository rendered with the engine flow's wiring (the reference model writes upstream's perf outputs,
running totals on every response, as the C++ backend does) and /metrics shows the bridged families
(`backend="tensorrtllm"`) equal to the per-request perf outputs summed and to the reference engine's own counters."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

tritonclient_grpc = pytest.importorskip("tritonclient.grpc")

from builders.build import main as build_main
from builders.config import load_config
from ledger.check import check_emitted, triton_names
from builders.triton.render import RenderError, draft_tokens_per_step, render
from ledger import table as ledger
from tests.test_production_metrics import scrape
from testkit.triton_requests import inputs, stream_call, text_of
from testkit.triton_servers import STOP_TIMEOUT_S, server_on
from triton_repo.launch import TritonServer

pytestmark = pytest.mark.server
PROMPTS = ["the quick brown fox jumps", "hello world how are you", "a b c d e f g", "once upon a time"]
MAX_TOKENS = 12
ROLES = {"preprocessing": "preprocessing", "postprocessing": "postprocessing", "tensorrt_llm": "llm",
         "ensemble": "ensemble", "tensorrt_llm_bls": "bls"}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, mimic_pair: tuple[Path, Path]) -> tuple[Any, Path, Path]:
    """(config, build dir, the bridged repository rendered from that build)."""
    root = tmp_path_factory.mktemp("perf_bridge")
    target, head = mimic_pair
    cfg = root / "bridge.yaml"
    cfg.write_text(
        f"name: bridge\ntrtllm_version: '1.1'\noutput_dir: {root / 'build'}\n"
        f"target: {{model: {target}, dtype: float32}}\ndraft: {{type: eagle, model: {head}}}\n"
        "tree: {choices: topk-2-3}\n"
        "engine: {backend: reference, device: cpu, max_batch_size: 4, max_input_len: 48, max_seq_len: 200}\n"
    )
    assert build_main([str(cfg)]) == 0
    bc = load_config(cfg)
    repo = root / "bridged_repo"
    render(bc, root / "build", repo, perf_bridge=True)
    return bc, root / "build", repo


@pytest.fixture(scope="module")
def server(built: tuple[Any, Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    srv = server_on(built[2], tmp_path_factory.mktemp("perf_bridge_log") / "tritonserver.log").start(timeout_s=240)
    try:
        yield srv
    finally:
        srv.stop(timeout_s=STOP_TIMEOUT_S)


def _call(srv: TritonServer, prompt: str, stream: bool, perf: bool, model: str = "ensemble") -> list[dict[str, Any]]:
    c = tritonclient_grpc.InferenceServerClient(srv.grpc_url)
    try:
        extra: dict[str, tuple[Any, str]] = {"stream": (stream, "BOOL")}
        if perf:
            extra["return_perf_metrics"] = (True, "BOOL")
        return stream_call(c, model, inputs(prompt, MAX_TOKENS, **extra))
    finally:
        c.close()


def _key(name: str, backend: str) -> str:
    # the served models label their Triton model version; the bridge (counting in postprocessing / BLS for the C++
    # backend, whose version it does not see) does not
    version = ',version="1"' if backend == "reference" else ""
    return f'{name}{{backend="{backend}",model="tensorrt_llm"{version}}}'


def test_bridged_families_equal_the_perf_outputs_summed(server: TritonServer, built: tuple[Any, Path, Path]) -> None:
    before = scrape(server)
    finals, streamed_chunks = [], 0
    # streamed and whole responses, with and without the client asking for the perf outputs: every request counts
    for i, prompt in enumerate(PROMPTS):
        for stream in (True, False):
            resps = _call(server, prompt, stream, perf=i % 2 == 0)
            assert text_of(resps)
            totals = [(int(r["total_accepted_draft_tokens"].reshape(-1)[0]),
                       int(r["total_draft_tokens"].reshape(-1)[0])) for r in resps]
            assert totals == sorted(totals)  # running totals: never decrease along a stream
            finals.append(totals[-1])
            streamed_chunks += len(resps) if stream else 0
    after = scrape(server)

    def delta(name: str, backend: str) -> float:
        return after[_key(name, backend)] - before.get(_key(name, backend), 0.0)

    assert streamed_chunks > 2 * len(PROMPTS)  # the streams carried several running totals each
    accepted, drafted = sum(a for a, _ in finals), sum(d for _, d in finals)
    assert delta("eagle_llm_accepted_draft_tokens_total", "tensorrtllm") == accepted > 0
    assert delta("eagle_llm_draft_tokens_total", "tensorrtllm") == drafted > accepted
    # the reference model's own counters (from its engine) agree, forwards included (derived by the bridge)
    for name in ("eagle_llm_accepted_draft_tokens_total", "eagle_llm_draft_tokens_total",
                 "eagle_llm_target_forwards_total"):
        assert delta(name, "tensorrtllm") == delta(name, "reference"), name
    forwards = after[_key("eagle_llm_target_forwards_total", "tensorrtllm")]
    acc_total = after[_key("eagle_llm_accepted_draft_tokens_total", "tensorrtllm")]
    assert after[_key("eagle_llm_tau", "tensorrtllm")] == pytest.approx(1 + acc_total / forwards)
    assert after[_key("eagle_llm_speculation_enabled", "tensorrtllm")] == 1
    # what the C++ backend cannot feed is not exported under its label
    assert not [k for k in after if 'backend="tensorrtllm"' in k and "position" in k]
    bc = built[0]
    assert delta("eagle_llm_draft_tokens_total", "tensorrtllm") % draft_tokens_per_step(bc) == 0


def test_bls_counts_into_the_same_families(server: TritonServer) -> None:
    """The BLS model asks the LLM model for the perf outputs on every request too and counts each request's final
    totals (the ones it returns to its client) into the same counters."""
    before = scrape(server)
    finals = []
    for i, prompt in enumerate(PROMPTS[:2]):
        for stream in (True, False):
            resps = _call(server, prompt, stream, perf=i == 0, model="tensorrt_llm_bls")
            assert text_of(resps)
            last = resps[-1]
            finals.append((int(last["total_accepted_draft_tokens"].reshape(-1)[0]),
                           int(last["total_draft_tokens"].reshape(-1)[0])))
    after = scrape(server)

    def delta(name: str, backend: str) -> float:
        return after[_key(name, backend)] - before.get(_key(name, backend), 0.0)

    assert delta("eagle_llm_accepted_draft_tokens_total", "tensorrtllm") == sum(a for a, _ in finals) > 0
    assert delta("eagle_llm_draft_tokens_total", "tensorrtllm") == sum(d for _, d in finals)
    for name in ("eagle_llm_accepted_draft_tokens_total", "eagle_llm_draft_tokens_total",
                 "eagle_llm_target_forwards_total"):
        assert delta(name, "tensorrtllm") == delta(name, "reference"), name


def test_bridged_repository_is_cited_in_the_ledger(built: tuple[Any, Path, Path]) -> None:
    emitted = triton_names(built[2], ROLES)
    flags = ledger.flags_of(eagle=True, perf=True, tree=True, reference=True)
    assert check_emitted(emitted, "1.1", flags) == []
    assert {"OUT_RETURN_PERF_METRICS", "TOTAL_DRAFT_TOKENS", "ARRIVAL_TIME_NS", "arrival_time_ns"} <= emitted[
        "triton.python.tensor"]
    assert "draft_tokens_per_step" in emitted["triton.postprocessing.parameter"]


def test_bridge_refused_for_a_backend_that_counts_itself(built: tuple[Any, Path, Path], tmp_path: Path) -> None:
    bc, build, _repo = built
    other = bc.model_copy(update={"engine": bc.engine.model_copy(update={"backend": "pytorch"})})
    with pytest.raises(RenderError, match="exports its own metrics"):
        render(other, build, tmp_path / "r", perf_bridge=True)
