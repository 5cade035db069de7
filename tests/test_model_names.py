"""Model names are an allow-list (triton_repo/exposure.py MODEL_NAME), at config load and at launch: the python
backend starts each stub through `bash -c` with <repo>/<model>/<version>/model.py unquoted, so a name such as
`bls$(id>FILE)` used to run `id` when the server started. Every path under a repository is checked as well."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from builders.config import ConfigError, load_config
from testkit.echo_repo import render_echo_repo
from tests.test_config_cli import write_cfg
from triton_repo.launch import LaunchError, TritonServer, free_port

REPO = Path(__file__).resolve().parent.parent
FIELDS = ["ensemble_model", "preprocessing_model", "postprocessing_model", "llm_model", "bls_model"]
BAD = ["bls$(id>pwned)", "a;id", "a b", "`id`", "a|id", "a&&id", "x>y", "a<y", ".hidden", "-dash", "_under", "a/b",
       "..", ".", "n\u00e4me", "a" * 65, "", "a\nb", "a\tb", "a*", "a?", "a[1]", "a{b,c}", "a'b", 'a"b', "a\\b",
       "a~", "a!b", "a#b", "a%b", "a=b", "a:b", "a,b", "a.b", "a@b", "a+b", "\u202eab"]
GOOD = ["ensemble", "tensorrt_llm_bls", "m-1", "A9", "x" * 64]


@pytest.mark.parametrize("field", FIELDS)
def test_config_refuses_names_outside_the_allow_list(field: str, tiny_target: Path, tmp_path: Path) -> None:
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, "random", tmp_path / "out")
    for name in BAD:
        with pytest.raises(ConfigError) as e:
            load_config(cfg, [f"triton.{field}={json.dumps(name)}"])
        assert any(p.startswith(f"triton.{field}: Value error, the name {name!r} is not a model name") and
                   "1 to 64 ASCII letters, digits, _ and -" in p for p in e.value.problems), (name, e.value.problems)
    for name in GOOD:
        assert getattr(load_config(cfg, [f"triton.{field}={name}"]).triton, field) == name


def _server(repo: Path) -> TritonServer:
    return TritonServer(repo, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port())


@pytest.mark.server
@pytest.mark.parametrize("name", ["bls$(id>pwned)", "m;id>pwned", "m`id>pwned`", "m|id>pwned", "m&&id>pwned"])
def test_launch_refuses_a_repository_with_such_a_name(name: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # where `id>pwned` would write, were the name ever put on a command line
    repo = render_echo_repo(tmp_path / "repo", model=name)
    srv = _server(repo)
    try:
        with pytest.raises(LaunchError, match=r"is not a model name this server accepts"):
            srv.start(timeout_s=60)
    finally:
        srv.stop(timeout_s=8)
    assert srv.pid is None, "no server process may start"
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("entry", ["ensemble/1/notes $(id).txt", "ensemble/1;x/model.py", "ensemble/v\u00e4/x"])
def test_launch_refuses_unsafe_paths_inside_the_repository(entry: str, tmp_path: Path) -> None:
    repo = render_echo_repo(tmp_path / "repo")
    (repo / entry).parent.mkdir(parents=True, exist_ok=True)
    (repo / entry).write_text("x")
    with pytest.raises(LaunchError, match=r"model repository path .* contains"):
        _server(repo).start(timeout_s=60)


def test_launch_cli_refuses_with_exit_1(tmp_path: Path) -> None:
    repo = render_echo_repo(tmp_path / "repo", model="x$(id>pwned)")
    proc = subprocess.run([sys.executable, str(REPO / "triton_repo" / "launch.py"), "--repo", str(repo),
                           "--grpc-port", str(free_port()), "--http-port", str(free_port()),
                           "--metrics-port", str(free_port())],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 1 and "is not a model name this server accepts" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "pwned").exists()
    proc = subprocess.run([sys.executable, str(REPO / "triton_repo" / "launch.py"), "--repo",
                           str(render_echo_repo(tmp_path / "ok")), "--llm-model", "a;b", "--print-argv"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2 and "--llm-model 'a;b' is not a model name this server accepts" in proc.stderr
