"""clients/ against a real tritonserver (the CPU server bundled in nvidia-pytriton) serving the echo model
(testkit/echo_repo: the ensemble contract, deterministic output, speculative stats with k=3 tokens/step),
(cancellation through a real ensemble: test_clients_cancel.py).

Echo maths: N tokens, k tokens per step -> steps = ceil(N/k), accepted = N - steps, drafted = steps*(k-1),
tau = (N - 1)/(steps - 1): the clients count a request's first token as the prefill's (clients/stats.py)."""

from __future__ import annotations

import asyncio
import io
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from clients import generate, loadtest
from clients import schema as sch
from clients.client import AsyncLLMClient, GenerationError, GenerationStats, LLMClient, build_request
from clients.load import LevelResult, LevelSpec
from clients.tokens import WhitespaceCounter
from testkit.echo_repo import render_echo_repo
from triton_repo import contract
from testkit.triton_servers import serve as _serve
from triton_repo.launch import TritonServer, free_port

pytestmark = pytest.mark.server
REPO = Path(__file__).resolve().parent.parent
K = 3  # echo tokens per step
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def echo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    d = tmp_path_factory.mktemp("echo")
    with _serve(render_echo_repo(d / "repo", tokens_per_step=K), d / "server.log") as srv:
        yield srv


@pytest.fixture(scope="module")
def slow_echo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """Echo taking 5 ms per token, so requests are in flight when the server is killed or a deadline passes."""
    d = tmp_path_factory.mktemp("slow_echo")
    with _serve(render_echo_repo(d / "repo", tokens_per_step=K, token_delay_ms=5), d / "server.log") as srv:
        yield srv


@pytest.fixture()
def prompts(tmp_path: Path) -> Path:
    f = tmp_path / "prompts.jsonl"
    lines = [{"prompt": "alpha beta gamma"}, {"turns": ["delta epsilon", "ignored second turn"]}, {"prompt": "zeta"}]
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return f


def _echo_text(prompt: str, n: int) -> str:
    words = prompt.split()
    return "".join(words[i % len(words)] + " " for i in range(n))


def _spec_stats(n: int) -> tuple[int, int, float]:
    steps = math.ceil(n / K)
    return n - steps, steps * (K - 1), (n - 1) / (steps - 1)


def test_sync_client_stream_and_generate(echo: TritonServer) -> None:
    with LLMClient(echo.grpc_url) as c:
        assert c.schema.source.startswith("model config served at") and c.schema.decoupled
        chunks = list(c.stream("one two", 7, temperature=0.0))
        # one response per decoding step of k tokens: 3 + 3 + 1
        assert [ch.text for ch in chunks] == ["one two one ", "two one two ", "one "]
        st = c.last_stats
        acc, drafted, _ = _spec_stats(7)
        assert (st.responses, st.accepted_draft_tokens, st.draft_tokens) == (3, acc, drafted)
        assert st.acceptance_rate == pytest.approx(acc / drafted, rel=1e-6)  # FP32 on the wire
        assert st.ttft is not None and st.e2e is not None and 0 < st.ttft <= st.e2e
        g = c.generate("a b c", 5)
        assert g.text == "a b c a b " and g.stats.responses == 1 and not g.stats.streamed
        with pytest.raises(GenerationError) as err:  # the model's own error reaches the caller with a status
            c.generate("   ", 3)
        assert err.value.status == "SERVER_ERROR" and "no words to echo" in err.value.message
        assert c.generate("after error", 2).text == "after error "  # the stream is reopened
        first = next(iter(c.stream("abandoned request", 9)))  # stop reading after one chunk of three
        assert first.text == "abandoned request abandoned "
        assert c.generate("next one", 3).text == "next one next "  # nothing stale from the abandoned request
        with pytest.raises(sch.SchemaError, match="no input"):
            c.generate("x", 2, bogus=3)


def test_async_client_concurrent(echo: TritonServer) -> None:
    async def go() -> list[str]:
        async with await AsyncLLMClient.connect(echo.grpc_url) as c:
            gens = await asyncio.gather(*(c.generate(f"w{i} v{i}", 4 + i, stream=bool(i % 2)) for i in range(12)))
            return [g.text for g in gens]

    texts = asyncio.run(go())
    assert texts == [_echo_text(f"w{i} v{i}", 4 + i) for i in range(12)]


def test_async_complete_stats_and_non_ascii_text(echo: TritonServer) -> None:
    """complete() (the load tester's path) keeps O(1) bookkeeping per response: count, first and last arrival; the
    text is decoded once per request, non-ASCII intact."""
    prompt = "caf\u00e9 na\u00efve \u00fcber"

    async def go() -> tuple[str, GenerationStats]:
        async with await AsyncLLMClient.connect(echo.grpc_url) as c:
            stats = GenerationStats(start=time.perf_counter(), streamed=True)
            text = await c.complete(build_request(c.schema, prompt, 7, stream=True), stats)
            return text, stats

    text, st = asyncio.run(go())
    assert text == _echo_text(prompt, 7)
    acc, drafted, _ = _spec_stats(7)
    assert (st.responses, st.accepted_draft_tokens, st.draft_tokens) == (math.ceil(7 / K), acc, drafted)
    assert st.first_response is not None and st.last_response is not None
    assert st.start < st.first_response <= st.last_response == st.end


def test_run_level_progress_bar_counts_requests(echo: TritonServer) -> None:
    """run_level (the CLI's level, which bench/bench_client.py measures) updates the bar once per finished
    request: it ends at n/n, not at the number of responses."""
    n, max_tokens = 9, 8
    spec = LevelSpec(mode="concurrency", level=3, max_tokens=max_tokens, stream=True, requests=n)
    bar = io.StringIO()

    async def go() -> LevelResult:
        async with await AsyncLLMClient.connect(echo.grpc_url) as c:
            return await loadtest.run_level(c, ["one two"], WhitespaceCounter(), spec, asyncio.Event(),
                                            progress=True, progress_file=bar)

    result = asyncio.run(go())
    assert [r.status for r in result.records] == ["OK"] * n
    assert [r.output_tokens for r in result.records] == [max_tokens] * n
    assert [r.responses for r in result.records] == [math.ceil(max_tokens / K)] * n
    assert f"{n}/{n} [" in bar.getvalue() and f"{n + 1}/{n}" not in bar.getvalue()


def test_loadtest_counts_agree_with_what_was_sent(echo: TritonServer, prompts: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    n, max_tokens = 15, 8
    rc = loadtest.main(["--url", echo.grpc_url, "--prompts", str(prompts), "--out", str(out), "--concurrency", "1,4",
                        "--requests", str(n), "--max-tokens", str(max_tokens), "--stream", "--tokenizer", "whitespace",
                        "--warmup", "2", "--no-progress", "--seed", "7"])
    assert rc == 0
    doc = json.loads((out / "report.json").read_text())
    assert doc["meta"]["prompts"] == 3 and doc["meta"]["tokenizer"] == "whitespace"
    acc, drafted, tau = _spec_stats(max_tokens)
    assert [lv["level"] for lv in doc["levels"]] == [1, 4]
    for lv in doc["levels"]:
        assert (lv["requests_sent"], lv["requests_ok"], lv["errors"]) == (n, n, {})
        assert lv["output_tokens"] == n * max_tokens
        assert lv["accepted_draft_tokens"] == n * acc and lv["draft_tokens"] == n * drafted
        assert lv["tau"] == pytest.approx(tau) and lv["acceptance_rate"] == pytest.approx(acc / drafted)
        assert lv["ttft_s"]["count"] == n and lv["itl_s"]["count"] == n
        assert lv["ttft_s"]["p50"] <= lv["e2e_s"]["p50"]
        assert lv["request_throughput"] == pytest.approx(n / lv["duration_s"])
    rows = (out / "report.csv").read_text().splitlines()
    assert len(rows) == 3 and rows[1].startswith("concurrency,1,15,15,")
    reqs = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    assert len(reqs) == 2 * n and all(r["status"] == "OK" and r["responses"] == math.ceil(max_tokens / K) for r in reqs)
    # the seeded order visits every prompt before repeating one
    assert sorted(r["prompt_index"] for r in reqs[:3]) == [0, 1, 2]
    for name in ("throughput.png", "latency_percentiles.png", "ttft_distribution.png"):
        data = (out / name).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 10_000


def test_loadtest_poisson_rate(echo: TritonServer, prompts: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    rc = loadtest.main(["--url", echo.grpc_url, "--prompts", str(prompts), "--out", str(out), "--request-rate", "40",
                        "--requests", "12", "--max-tokens", "4", "--tokenizer", "whitespace",
                        "--no-progress"])
    assert rc == 0
    (lv,) = json.loads((out / "report.json").read_text())["levels"]
    assert (lv["mode"], lv["level"], lv["requests_sent"], lv["requests_ok"]) == ("rate", 40, 12, 12)
    assert lv["output_tokens"] == 12 * 4
    assert lv["itl_s"] is None  # not streamed: no per-token timing


def test_refused_connection_is_counted(prompts: Path, tmp_path: Path) -> None:
    """No server on the port: every request is UNAVAILABLE, the run finishes and reports it (schema from the repo)."""
    repo = render_echo_repo(tmp_path / "repo")
    out = tmp_path / "out"
    rc = loadtest.main(["--url", f"127.0.0.1:{free_port()}", "--repo", str(repo), "--prompts", str(prompts),
                        "--out", str(out), "--concurrency", "2", "--requests", "6", "--max-tokens", "4",
                        "--tokenizer", "whitespace", "--no-progress"])
    assert rc == 0
    (lv,) = json.loads((out / "report.json").read_text())["levels"]
    assert (lv["requests_sent"], lv["requests_ok"], lv["errors"]) == (6, 0, {"UNAVAILABLE": 6})
    assert lv["ttft_s"] is None and lv["output_tokens"] == 0


def test_timeouts_are_counted(slow_echo: TritonServer, prompts: Path, tmp_path: Path) -> None:
    """60 tokens at 5 ms each take 0.3 s; a 0.1 s deadline fails every request with DEADLINE_EXCEEDED."""
    out = tmp_path / "out"
    rc = loadtest.main(["--url", slow_echo.grpc_url, "--prompts", str(prompts), "--out", str(out), "--concurrency",
                        "2", "--requests", "4", "--max-tokens", "60", "--stream", "--timeout", "0.1",
                        "--tokenizer", "whitespace", "--no-progress"])
    assert rc == 0
    (lv,) = json.loads((out / "report.json").read_text())["levels"]
    assert (lv["requests_sent"], lv["requests_ok"], lv["errors"]) == (4, 0, {"DEADLINE_EXCEEDED": 4})


def test_server_killed_and_restarted_mid_run(slow_echo: TritonServer, prompts: Path, tmp_path: Path) -> None:
    """SIGKILL the server 2.5 s into a 7 s run, restart it 1.5 s later: failures are counted per status, requests
    succeed again after the restart, nothing crashes."""
    out = tmp_path / "out"
    events: dict[str, float] = {}

    def chaos() -> None:
        time.sleep(2.5)
        assert slow_echo.pid is not None
        os.killpg(slow_echo.pid, signal.SIGKILL)
        slow_echo.stop(timeout_s=5)
        events["killed"] = time.perf_counter()
        time.sleep(1.5)
        slow_echo.start(timeout_s=60)
        events["restarted"] = time.perf_counter()

    t = threading.Thread(target=chaos)
    t.start()
    try:
        rc = loadtest.main(["--url", slow_echo.grpc_url, "--prompts", str(prompts), "--out", str(out), "--concurrency",
                            "3", "--duration", "7", "--max-tokens", "6", "--stream", "--tokenizer", "whitespace",
                            "--timeout", "5", "--no-progress"])
    finally:
        t.join()
    assert rc == 0 and "restarted" in events
    (lv,) = json.loads((out / "report.json").read_text())["levels"]
    reqs = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    assert lv["requests_sent"] == len(reqs) and lv["requests_ok"] + sum(lv["errors"].values()) == len(reqs)
    assert lv["errors"].get("UNAVAILABLE", 0) >= 1, lv["errors"]
    assert lv["output_tokens"] == 6 * lv["requests_ok"]
    # successes before the kill and after the restart (perf_counter is shared: same process)
    ok_ends = [r["end"] for r in reqs if r["status"] == "OK"]
    assert min(ok_ends) < events["killed"] < events["restarted"] < max(ok_ends)


def test_sigint_writes_what_was_measured(slow_echo: TritonServer, prompts: Path, tmp_path: Path) -> None:
    """Ctrl-C during the second level: exit 130, both levels in the report, the second marked interrupted."""
    out = tmp_path / "out"
    argv = [sys.executable, str(REPO / "clients" / "loadtest.py"), "--url", slow_echo.grpc_url, "--prompts",
            str(prompts), "--out", str(out), "--concurrency", "1,2", "--duration", "2", "--max-tokens", "6",
            "--stream", "--tokenizer", "whitespace", "--no-progress"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # the level-1 summary, printed once its report is written
        assert first.startswith("concurrency=1:"), (first, proc.stderr.read() if proc.stderr else "")
        time.sleep(1.0)  # inside level 2 (it starts right after the level-1 line)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == loadtest.EXIT_INTERRUPTED, err
    doc = json.loads((out / "report.json").read_text())
    assert doc["meta"]["interrupted"] is True
    assert [lv["interrupted"] for lv in doc["levels"]] == [False, True]
    lv2 = doc["levels"][1]
    assert lv2["requests_ok"] >= 1 and lv2["requests_sent"] == lv2["requests_ok"] + sum(lv2["errors"].values())
    assert set(lv2["errors"]) <= {"INTERRUPTED"}


def test_generate_cli_prints_text_and_stats(echo: TritonServer, capsys: pytest.CaptureFixture[str]) -> None:
    rc = generate.main(["--url", echo.grpc_url, "--prompt", "red green", "--stream", "--max-tokens", "5",
                        "--tokenizer", "whitespace", "--temperature", "0"])
    cap = capsys.readouterr()
    assert rc == 0
    assert cap.out == "red green red green red \n"
    acc, drafted, tau = _spec_stats(5)
    assert f"accepted {acc} of {drafted} draft tokens (acceptance {acc / drafted:.3f}), tau {tau:.2f}" in cap.err
    assert "output tokens: 5 (whitespace)" in cap.err and "responses: 2" in cap.err
    rc = generate.main(["--url", echo.grpc_url, "--prompt", "x", "--chat"])
    assert rc == 2 and "--chat needs the model's tokenizer" in capsys.readouterr().err


def test_schema_follows_the_served_repository(tmp_path: Path) -> None:
    """Render the echo repository with one optional input fewer: the fetched schema drops it and the client refuses
    it before sending; the on-disk schema of the same repository agrees with the served one."""
    reduced = tuple(t for t in contract.ENSEMBLE_INPUTS if t.name != "top_k")
    repo = render_echo_repo(tmp_path / "repo", inputs=reduced)
    with _serve(repo, tmp_path / "server.log") as srv:
        served = sch.fetch_schema(srv.grpc_url, "ensemble")
        assert "top_k" not in served.inputs and "top_p" in served.inputs
        on_disk = sch.from_repository(repo)
        assert {n: (s.datatype, s.dims, s.optional) for n, s in served.inputs.items()} == {
            n: (s.datatype, s.dims, s.optional) for n, s in on_disk.inputs.items()
        }
        with LLMClient(srv.grpc_url) as c:
            assert c.generate("p q", 2, top_p=0.9).text == "p q "
            with pytest.raises(sch.SchemaError, match="no input\\(s\\) \\['top_k'\\]"):
                c.generate("p q", 2, top_k=5)


# ---- request ids ---------------------------------------------------------------------------------------------------

ID_FORMAT = re.compile(r"r\d+-[0-9a-f]{32}")  # 128 random bits: what a stop request needs


def test_request_ids_differ_between_clients(echo: TritonServer) -> None:
    """Every request is sent with its own id (new_request_id), whichever client sends it."""
    with LLMClient(echo.grpc_url) as a, LLMClient(echo.grpc_url) as b:
        ids = [a.generate("x y", 2).stats.request_id, b.generate("x y", 2).stats.request_id,
               a.generate("x y", 2).stats.request_id]

    async def go() -> list[str | None]:
        async with await AsyncLLMClient.connect(echo.grpc_url) as c:
            return [g.stats.request_id for g in await asyncio.gather(c.generate("x", 2), c.generate("x", 2))]

    ids += asyncio.run(go())
    assert all(i is not None and ID_FORMAT.fullmatch(i) for i in ids), ids
    assert len(set(ids)) == len(ids) == 5
