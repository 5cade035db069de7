"""Publishing a head reaches every replica, rollback likewise, no request lost; and publish / rollback are
transactions (adaptive/refresh.py, adaptive/servers.py): two CPU Triton servers on one build stand for two
replicas on a shared volume. Every precondition is checked before anything changes (the report, the head's digest,
every server's reachability, admin key and model control); a refused change leaves the repository and the servers
as they were."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tritonclient.grpc")

from tests.test_adaptive import mimic3_build  # noqa: F401 (the module fixture)
from tests.test_adaptive_server import KEY, InFlight, refresh
from testkit.triton_servers import STOP_TIMEOUT_S
from triton_repo.launch import TritonServer, free_port

pytestmark = pytest.mark.server
MODEL = "tensorrt_llm"


def _start(build: Path, log: Path, explicit: bool = True) -> TritonServer:
    return TritonServer(build / "triton_repo", grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(),
                        log_path=log, admin_key=KEY, explicit=explicit).start(timeout_s=240)


@pytest.fixture(scope="module")
def replicas(mimic3_build: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[TritonServer]]:  # noqa: F811
    logs = tmp_path_factory.mktemp("replica_logs")
    servers: list[TritonServer] = []
    try:
        for i in range(2):
            servers.append(_start(mimic3_build, logs / f"r{i}.log"))
        yield servers
    finally:
        for s in servers:
            s.stop(timeout_s=STOP_TIMEOUT_S)


def _gated_run(build: Path, name: str) -> Path:
    """A run as a passing refresh leaves it: the candidate (here the build's own head) and its report, with the
    digest of the candidate's files as the gate records it."""
    from adaptive.publish import head_digest

    run = build / "refresh" / name
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(build / "checkpoint" / "eagle3", run / "head")
    cand = {"tau": 1.5, "position_acceptance": [0.5, 0.0, 0.0], "target_forwards": 2, "accepted_draft_tokens": 1,
            "draft_tokens": 6}
    report = {"run": name, "tau_before": 1.4, "tau_after": 1.5, "published": None,
              "gate": {"publishable": True, "head_digest": head_digest(run / "head"), "candidate": cand,
                       "requests": 2}}
    (run / "report.json").write_text(json.dumps(report))
    return run


def _serving(srv: TritonServer, version: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{srv.http_url}/v2/models/{MODEL}/versions/{version}/ready",
                                    timeout=10) as r:
            return r.status == 200
    except OSError:
        return False


def _state(build: Path) -> dict[str, str]:
    """Every file of the model repository and its digest (what a refused change must leave as it was)."""
    repo = build / "triton_repo" / MODEL
    return {str(p.relative_to(repo)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(repo.rglob("*")) if p.is_file()}


def _history(build: Path) -> list[dict[str, Any]]:
    f = build / "refresh" / "published.json"
    return json.loads(f.read_text()) if f.is_file() else []


def test_publish_and_rollback_reach_every_replica_with_no_request_lost(
        replicas: list[TritonServer], mimic3_build: Path) -> None:  # noqa: F811
    build = mimic3_build
    run = _gated_run(build, "run-replicas")
    flights = [InFlight(s) for s in replicas]
    args = [x for s in replicas for x in ("--server", s.http_url)]
    p = refresh("--build", str(build), "--publish", str(run), *args)
    p2 = refresh("--build", str(build), "--rollback", *args)
    results = [f.close() for f in flights]
    assert p.returncode == 0, p.stdout + p.stderr
    for s in replicas:
        assert f"{MODEL} version 2 serving on {s.http_url}" in p.stdout
    assert p2.returncode == 0 and "serving version 1" in p2.stdout, p2.stdout + p2.stderr
    assert all(_serving(s, 1) and not _serving(s, 2) for s in replicas)
    assert all(errors == [] and done > 0 for done, errors in results), results
    h = _history(build)[-2:]
    assert [e["action"] for e in h] == ["publish", "rollback"]
    assert h[0]["servers"] == [s.http_url for s in replicas] == h[1]["servers"]
    assert h[0]["head_digest"] == json.loads((run / "report.json").read_text())["gate"]["head_digest"]


def _noise(build: Path, name: str) -> Path:
    """A run whose head is not what its report's gate measured: the weights changed after the gate."""
    run = _gated_run(build, name)
    f = run / "head" / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-8:] = b"\x01" * 8
    f.write_bytes(bytes(data))
    return run


def _link_head(build: Path, name: str) -> Path:
    run = _gated_run(build, name)
    shutil.move(str(run / "head"), str(run.parent / f"{name}-elsewhere"))
    (run / "head").symlink_to(run.parent / f"{name}-elsewhere")
    return run


def _link_file(build: Path, name: str) -> Path:
    run = _gated_run(build, name)
    f = run / "head" / "config.json"
    shutil.copy(f, run.parent / f"{name}-config.json")
    f.unlink()
    f.symlink_to(run.parent / f"{name}-config.json")
    return run


def _copied_report(build: Path, name: str) -> Path:
    src = _gated_run(build, f"{name}-src")
    run = build / "refresh" / name
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(build / "checkpoint" / "eagle3", run / "head")
    shutil.copy(src / "report.json", run / "report.json")
    return run


def _report(text: str) -> Any:
    def make(build: Path, name: str) -> Path:
        run = _gated_run(build, name)
        (run / "report.json").write_text(text.replace("NAME", name))
        return run
    return make


@pytest.mark.parametrize(("make", "rc", "message"), [
    (_noise, 1, "is not the head the gate measured"),
    (_link_head, 1, "is a symbolic link"),
    (_link_file, 1, "is a symbolic link"),
    (_copied_report, 2, "is the report of run"),
    (_report("{not json"), 2, "is not JSON"),
    (_report("[1, 2]"), 2, "has no gate figures"),
    (_report('{"run": "NAME", "tau_before": 1, "tau_after": 2, "gate": {"publishable": "yes", "candidate": {}}}'),
     2, "gate.publishable, gate.head_digest missing or of the wrong type"),
    (_report('{"run": "NAME", "gate": {"publishable": true, "head_digest": "x", "candidate": {}}}'),
     2, "tau_before, tau_after missing"),
])
def test_publish_installs_only_the_gated_head(
        replicas: list[TritonServer], mimic3_build: Path, make: Any, rc: int, message: str) -> None:  # noqa: F811
    build = mimic3_build
    before, history = _state(build), _history(build)
    run = make(build, f"run-bad-{make.__name__}")
    p = refresh("--build", str(build), "--publish", str(run), "--server", replicas[0].http_url)
    assert p.returncode == rc and message in p.stderr, p.stdout + p.stderr
    assert _state(build) == before and _history(build) == history and _serving(replicas[0], 1)


def test_publish_refuses_a_run_outside_the_build(mimic3_build: Path, tmp_path: Path) -> None:  # noqa: F811
    run = _gated_run(mimic3_build, "run-outside")
    for bad in (tmp_path / "run-outside", mimic3_build / "refresh" / "run-link"):
        if bad.name == "run-link":
            bad.symlink_to(run)
        else:
            shutil.copytree(run, bad)
        p = refresh("--build", str(mimic3_build), "--publish", str(bad))
        assert p.returncode == 2 and "a run directory of this build" in p.stderr, p.stderr


@pytest.mark.parametrize("action", ["--publish", "--rollback"])
@pytest.mark.parametrize(("case", "message"), [
    ("no key", "$TRITON_ADMIN_KEY is unset"),
    ("wrong key", "the admin key was refused (HTTP 403"),
    ("one replica gone", "not reachable"),
    ("one replica not explicit", "does not load models on request"),
    ("bad server name", "write HOST:PORT"),
    ("unresolvable dns", "does not resolve"),
])
def test_a_refused_change_changes_nothing(
        replicas: list[TritonServer], mimic3_build: Path, tmp_path: Path, action: str, case: str,  # noqa: F811
        message: str) -> None:
    build = mimic3_build
    if action == "--rollback":  # something to roll back: a published version 2 on both replicas
        run = _gated_run(build, "run-for-rollback")
        args = [x for s in replicas for x in ("--server", s.http_url)]
        if not (build / "triton_repo" / MODEL / "2").is_dir():
            assert refresh("--build", str(build), "--publish", str(run), *args).returncode == 0
    before, history = _state(build), _history(build)
    from adaptive.publish import versions

    serving = versions(build / "triton_repo" / MODEL)[-1]  # what every replica serves before the refused change
    env = {**os.environ, "TRITON_ADMIN_KEY": KEY}
    servers = [s.http_url for s in replicas]
    extra: TritonServer | None = None
    if case == "no key":
        env.pop("TRITON_ADMIN_KEY")
    elif case == "wrong key":
        env["TRITON_ADMIN_KEY"] = "not-the-key"
    elif case == "one replica gone":
        servers.append(f"127.0.0.1:{free_port()}")
    elif case == "one replica not explicit":
        extra = _start(build, tmp_path / "polling.log", explicit=False)
        servers.append(extra.http_url)
    elif case == "bad server name":
        servers.append("no-port")
    else:
        servers.append("dns:no-such-service.invalid:8000")
    target = [str(_gated_run(build, "run-transaction"))] if action == "--publish" else []
    import subprocess
    import sys

    try:
        p = subprocess.run([sys.executable, "adaptive/refresh.py", "--build", str(build), action, *target,
                            *[x for s in servers for x in ("--server", s)]], cwd=Path(__file__).parent.parent,
                           capture_output=True, text=True, timeout=600, env={**env, "TQDM_DISABLE": "1"})
    finally:
        if extra is not None:
            extra.stop(timeout_s=STOP_TIMEOUT_S)
    assert p.returncode == 1 and message in p.stderr, p.stdout + p.stderr
    assert "nothing was changed" in p.stderr or case in ("bad server name", "unresolvable dns")
    assert _state(build) == before and _history(build) == history
    assert all(_serving(s, serving) for s in replicas)
