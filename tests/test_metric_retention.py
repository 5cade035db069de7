"""Retention of metric series (docs/deploy.md "Model versions and their metric series"): a model version that the
server unloads (a published head replaced it: version policy latest 1, adaptive/publish.py) stops
exporting its eagle_* series at once (its finalize() deletes them, triton_repo/models/spec_metrics.py
`SpecMetrics.close`); /metrics holds the series of the loaded version only, however many versions came and went, and a
version loaded again (a rollback) exports afresh. Real tritonserver (explicit model control) on a copy of the shared
tiny build."""

from __future__ import annotations

import re
import shutil
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("tritonclient.grpc")

from adaptive.publish import load
from testkit.triton_requests import inputs, stream_call
from testkit.triton_servers import STOP_TIMEOUT_S
from triton_repo.launch import TritonServer, free_port

pytestmark = pytest.mark.server
KEY = "metric-retention-key"
MODEL = "tensorrt_llm"
UNLOAD_S = 60.0
SERIES = re.compile(r'^(eagle_[a-z_]+)\{([^}]*)\} \S+$')


@pytest.fixture(scope="module")
def served(triton_build_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TritonServer, Path]]:
    build = tmp_path_factory.mktemp("retention") / "build"
    shutil.copytree(triton_build_dir, build, ignore=shutil.ignore_patterns("__pycache__"))
    srv = TritonServer(build / "triton_repo", grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(),
                       log_path=build.parent / "tritonserver.log", admin_key=KEY, explicit=True).start(timeout_s=240)
    try:
        yield srv, build / "triton_repo" / MODEL
    finally:
        srv.stop(timeout_s=STOP_TIMEOUT_S)


def series(srv: TritonServer) -> list[tuple[str, str]]:
    """(family, labels) of every eagle_* series of the LLM model on the server's /metrics."""
    text = urllib.request.urlopen(srv.metrics_url, timeout=10).read().decode()
    return [(m.group(1), m.group(2)) for line in text.splitlines()
            if (m := SERIES.match(line)) and f'model="{MODEL}"' in m.group(2)]


def versions_exported(srv: TritonServer, settle_on: str | None = None) -> set[str]:
    """The versions whose series /metrics holds; with `settle_on`, waits (up to UNLOAD_S) until that version's are
    the only ones: the server unloads the older version after the new one is ready, not before load returns."""
    deadline = time.monotonic() + UNLOAD_S
    while True:
        got = {re.search(r'version="(\d+)"', labels).group(1) for _, labels in series(srv)}  # type: ignore[union-attr]
        if settle_on is None or got == {settle_on} or time.monotonic() > deadline:
            return got
        time.sleep(0.25)


def ask(srv: TritonServer) -> None:
    import tritonclient.grpc as grpcclient

    c = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        assert stream_call(c, "ensemble", inputs("the quick brown fox", 4))
    finally:
        c.close()


def publish_copy(srv: TritonServer, model_dir: Path, version: int) -> None:
    """A new version as a publish writes it (the previous version's files), then the server loads it: it loads the
    new version and unloads the older one (latest 1)."""
    shutil.copytree(model_dir / str(version - 1), model_dir / str(version),
                    ignore=shutil.ignore_patterns("__pycache__"))
    load(srv.http_url, KEY, MODEL, version)


def test_unloaded_versions_stop_exporting_their_series(served: tuple[TritonServer, Path]) -> None:
    srv, model_dir = served
    ask(srv)
    first = series(srv)
    assert versions_exported(srv) == {"1"} and len(first) >= 10, first
    per_version = len(first)
    for version in range(2, 6):
        publish_copy(srv, model_dir, version)
        ask(srv)  # the new version counts: its series are live, not a leftover
        assert versions_exported(srv, str(version)) == {str(version)}, sorted(series(srv))
        now = series(srv)
        assert len(now) == per_version, sorted(now)
        assert {f for f, _ in now} == {f for f, _ in first}
    # a rollback (adaptive/refresh.py --rollback): the newest version goes, the previous one is loaded again
    shutil.rmtree(model_dir / "5")
    load(srv.http_url, KEY, MODEL, 4)
    assert versions_exported(srv, "4") == {"4"} and len(series(srv)) == per_version
