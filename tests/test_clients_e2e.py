"""End to end through the real ensemble: `python builders/build.py` on a tiny config (2-layer Llama + EAGLE-1 head,
reference backend), tritonserver on the rendered repository, then the clients (schema from client.json and from the
server, the sync client streamed and unary, the load tester with the repository's own tokenizer)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from testkit.triton_servers import tiny_reference_repo
from clients import loadtest
from clients import schema as sch
from clients.client import LLMClient
from clients.tokens import make_counter
from triton_repo import contract as C
from triton_repo.launch import TritonServer, free_port

pytestmark = [pytest.mark.server, pytest.mark.slow]
PROMPT = "The quick brown fox"
GREEDY = {"top_k": 0, "top_p": 0.0}  # contract: top_k=0 and top_p=0 = greedy


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path, eagle_head: Path) -> Path:
    return tiny_reference_repo(tmp_path_factory.mktemp("clients_build"), "tiny-clients", tiny_target, eagle_head,
                               max_seq_len=96)


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    log = tmp_path_factory.mktemp("clients_e2e_log") / "tritonserver.log"
    srv = TritonServer(repo, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(), log_path=log)
    srv.start(timeout_s=300)
    try:
        yield srv
    finally:
        srv.stop(timeout_s=15)


def test_descriptor_and_server_schemas_agree(repo: Path, server: TritonServer) -> None:
    on_disk, served = sch.from_descriptor(repo), sch.fetch_schema(server.grpc_url, "ensemble")
    assert on_disk.source.endswith("client.json") and served.source.startswith("model config served at")
    # text_input and max_tokens: required for clients (client.json), declared optional in the served ensemble so a
    # request without them reaches preprocessing, which refuses it by name (builders/triton/render.py ensemble_config)
    checked_by_model = set(C.REQUIRED_HELP)
    assert all(not on_disk.inputs[n].optional and served.inputs[n].optional for n in checked_by_model)
    assert {n: (s.datatype, s.dims, s.optional or n in checked_by_model) for n, s in on_disk.inputs.items()} == {
        n: (s.datatype, s.dims, s.optional) for n, s in served.inputs.items()
    }
    assert set(on_disk.outputs) == set(served.outputs) and on_disk.max_batch_size == served.max_batch_size == 4
    assert on_disk.decoupled and served.decoupled and on_disk.has_perf_metrics
    # the tokenizer is found through the ensemble's steps (preprocessing's tokenizer_dir, relative to the repository):
    # on disk it resolves against the repository; a served one names a directory next to the server's repository,
    # which a client cannot locate (the commands then ask for --tokenizer)
    assert on_disk.tokenizer is not None and served.tokenizer is None
    assert (Path(on_disk.tokenizer) / "tokenizer_config.json").is_file()


def test_streamed_text_and_stats_equal_unary(server: TritonServer) -> None:
    with LLMClient(server.grpc_url) as c:
        unary = c.generate(PROMPT, 10, **GREEDY)
        chunks = list(c.stream(PROMPT, 10, **GREEDY))
        st = c.last_stats
    assert unary.stats.responses == 1 and len(chunks) == st.responses >= 2
    assert "".join(ch.text for ch in chunks) == unary.text and unary.text
    assert (st.accepted_draft_tokens, st.draft_tokens) == (unary.stats.accepted_draft_tokens, unary.stats.draft_tokens)
    assert st.draft_tokens is not None and st.draft_tokens > 0


def test_loadtest_through_the_ensemble(repo: Path, server: TritonServer, tmp_path: Path) -> None:
    """One prompt, greedy, concurrency 1: every request returns the same text and speculative counters, so the
    report's totals are exactly n times one request's (tokens counted with the repository's tokenizer)."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": PROMPT}) + "\n")
    out, n, max_tokens = tmp_path / "out", 3, 8
    with LLMClient(server.grpc_url) as c:
        one = c.generate(PROMPT, max_tokens, stream=True, **GREEDY)
    schema = sch.from_descriptor(repo)
    tokens_one = make_counter(schema.tokenizer).count(one.text)
    rc = loadtest.main(["--url", server.grpc_url, "--repo", str(repo), "--prompts", str(prompts), "--out", str(out),
                        "--concurrency", "1", "--requests", str(n), "--max-tokens", str(max_tokens), "--stream",
                        "--top-k", "0", "--top-p", "0", "--no-progress"])
    assert rc == 0
    doc = json.loads((out / "report.json").read_text())
    assert doc["meta"]["tokenizer"] == schema.tokenizer and doc["meta"]["schema_source"] == str(repo / "client.json")
    (lv,) = doc["levels"]
    assert (lv["requests_sent"], lv["requests_ok"], lv["errors"]) == (n, n, {})
    assert lv["output_tokens"] == n * tokens_one
    assert lv["accepted_draft_tokens"] == n * one.stats.accepted_draft_tokens
    assert lv["draft_tokens"] == n * one.stats.draft_tokens
    acc, drafted = lv["accepted_draft_tokens"], lv["draft_tokens"]
    assert lv["acceptance_rate"] == pytest.approx(acc / drafted)
    toks = lv["output_tokens"] - n  # after each request's prefill token: the engine's and the metrics' tau
    assert lv["tau"] == pytest.approx(toks / (toks - acc))
    assert lv["ttft_s"]["count"] == n and lv["e2e_s"]["p99"] >= lv["ttft_s"]["p99"]


def test_loadtest_chat_sends_the_chat_template(repo: Path, server: TritonServer, tmp_path: Path) -> None:
    """--chat: every request is the prompt inside the repository tokenizer's chat template, so the report's tokens
    are n times those of one request sent already wrapped; a tokenizer that cannot template is refused up front."""
    from clients.prompts import chat_prompt

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "Hi there"}) + "\n")
    schema = sch.from_descriptor(repo)
    wrapped = chat_prompt(schema.tokenizer, "Hi there")
    with LLMClient(server.grpc_url) as c:
        one = c.generate(wrapped, 6, stream=True, **GREEDY)
    out, n = tmp_path / "out", 2
    argv = ["--url", server.grpc_url, "--repo", str(repo), "--prompts", str(prompts), "--concurrency", "1",
            "--requests", str(n), "--max-tokens", "6", "--stream", "--top-k", "0", "--top-p", "0", "--no-progress",
            "--chat"]
    assert loadtest.main([*argv, "--out", str(out)]) == 0
    doc = json.loads((out / "report.json").read_text())
    assert doc["meta"]["chat"] is True
    assert doc["levels"][0]["output_tokens"] == n * make_counter(schema.tokenizer).count(one.text)
    texts = [json.loads(line)["text"] for line in (out / "requests.jsonl").read_text().splitlines()]
    assert texts == [one.text] * n
    assert loadtest.main([*argv, "--out", str(tmp_path / "o2"), "--tokenizer", "whitespace"]) == 2


def test_generate_cli_chat_with_the_repository_tokenizer(
    repo: Path, server: TritonServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """--chat wraps the prompt in the target's chat template (the tokenizer named by the repository)."""
    from clients import generate

    tok_dir = sch.from_descriptor(repo).tokenizer
    wrapped = generate.chat_prompt(tok_dir, "Hi there")
    assert wrapped != "Hi there" and "Hi there" in wrapped
    rc = generate.main(["--url", server.grpc_url, "--repo", str(repo), "--prompt", "Hi there", "--chat",
                        "--max-tokens", "4", "--stream", "--top-k", "0", "--top-p", "0"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert f"({tok_dir})" in err and "speculative: accepted" in err
