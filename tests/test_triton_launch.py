"""Launching tritonserver (triton_repo/launch.py): the argv of one server and of the mpirun form
(tensorrtllm_backend scripts/launch_triton_server.py), the bundled binary's environment, and the real CLI serving an
empty repository until SIGTERM."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from triton_repo import launch

REPO_ROOT = Path(__file__).resolve().parent.parent


# ---- launch argv --------------------------------------------------------------------------------------------------


def _binary(tmp_path: Path) -> launch.ServerBinary:
    return launch.ServerBinary(Path("/opt/tritonserver/bin/tritonserver"), Path("/opt/tritonserver/backends"))


def test_single_server_argv_binds_loopback(tmp_path: Path) -> None:
    argv = launch.launch_argv(_binary(tmp_path), Path("/r"), grpc_port=1, http_port=2, metrics_port=3,
                              host="127.0.0.1", shm_tag="t", admin_key="k3y")
    assert argv[0] == "/opt/tritonserver/bin/tritonserver" and "--model-repository=/r" in argv
    assert {"--grpc-address=127.0.0.1", "--http-address=127.0.0.1", "--metrics-address=127.0.0.1"} <= set(argv)
    assert {"--grpc-port=1", "--http-port=2", "--metrics-port=3", "--disable-auto-complete-config"} <= set(argv)
    assert "--backend-config=python,shm-region-prefix-name=eaglet_rank0_" in argv
    assert not any(a.startswith("--load-model") for a in argv)
    group = "logging,model-repository,trace,shared-memory:eagle-admin-key=k3y"  # tritonserver 2.51 --help syntax
    assert {f"--grpc-restricted-protocol={group}", f"--http-restricted-api={group}"} <= set(argv)


def test_world_size_gives_the_mpirun_form(tmp_path: Path) -> None:
    """tensorrtllm_backend scripts/launch_triton_server.py: `mpirun --allow-run-as-root -n 1 <rank0> : -n 1 ...`,
    ranks > 0 load only the LLM model, each rank its own python shm prefix; --allow-run-as-root only as root."""
    kw = dict(grpc_port=1, http_port=2, metrics_port=3, host="127.0.0.1", world_size=2, shm_tag="t", admin_key="k")
    assert launch.launch_argv(_binary(tmp_path), Path("/r"), **kw)[:3] == ["mpirun", "-n", "1"]
    argv = launch.launch_argv(_binary(tmp_path), Path("/r"), as_root=True, **kw)
    assert argv[:5] == ["mpirun", "--allow-run-as-root", "-n", "1", "/opt/tritonserver/bin/tritonserver"]
    sep = argv.index(":")
    rank0, rank1 = argv[4:sep], argv[sep + 3 :]
    assert argv[sep + 1 : sep + 3] == ["-n", "1"] and rank1[0] == rank0[0]
    assert "--backend-config=python,shm-region-prefix-name=eaglet_rank0_" in rank0
    assert "--backend-config=python,shm-region-prefix-name=eaglet_rank1_" in rank1
    assert rank1[-2:] == ["--model-control-mode=explicit", "--load-model=tensorrt_llm"]
    assert not any(a.startswith("--load-model") for a in rank0) and argv.count(":") == 1


def test_launch_cli_prints_the_command(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    out = subprocess.run(
        [sys.executable, str(REPO_ROOT / "triton_repo" / "launch.py"), "--repo", str(tmp_path / "repo"),
         "--world-size", "2", "--grpc-port", "9001", "--print-argv"],
        capture_output=True, text=True, check=True,
    ).stdout.split()
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    assert out[: 1 + len(root)] == ["mpirun", *root] and "--grpc-port=9001" in out and out.count(":") == 1
    assert "eagle-admin-key=***" in " ".join(out), "the admin key is never printed"
    assert f"--model-repository={(tmp_path / 'repo').resolve()}" in out


def test_bundled_binary_env_puts_this_interpreters_libpython_first() -> None:
    b = launch.bundled_binary()
    assert b.bundled and b.executable.is_file()
    assert (b.backend_dir / "python" / "triton_python_backend_stub").exists()
    ld = b.env["LD_LIBRARY_PATH"].split(":")
    assert ld[0] == launch._libpython_dir() and ld[-1].endswith("nvidia_pytriton.libs")
    assert b.env["PATH"].split(":")[0] == str(Path(sys.executable).parent)


def test_free_port_is_bindable() -> None:
    import socket

    port = launch.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


@pytest.mark.server
def test_launch_cli_serves_prints_endpoints_and_stops_on_sigterm(tmp_path: Path) -> None:
    """The real bundled tritonserver on an empty repository (starts in seconds) plus a plain file at the root, as
    client.json is: it is ignored, the server becomes ready, SIGTERM stops it cleanly."""
    import signal
    import urllib.request

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "client.json").write_text("{}\n")
    ports = [launch.free_port() for _ in range(3)]
    proc = subprocess.Popen(
        [sys.executable, str(REPO_ROOT / "triton_repo" / "launch.py"), "--repo", str(repo), "--grpc-port",
         str(ports[0]), "--http-port", str(ports[1]), "--metrics-port", str(ports[2]), "--log", str(tmp_path / "log")],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        lines = [proc.stdout.readline() for _ in range(4)]
        assert lines[0].startswith("tritonserver ready"), lines
        assert lines[1].split() == ["grpc", f"127.0.0.1:{ports[0]}"]
        assert lines[3].split() == ["metrics", f"http://127.0.0.1:{ports[2]}/metrics"]
        with urllib.request.urlopen(f"http://127.0.0.1:{ports[1]}/v2/health/ready", timeout=5) as r:
            assert r.status == 200
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "tritonserver stopped (exit code 0)" in out


@pytest.mark.parametrize("backend", ["pytorch", "reference"])
def test_launch_refuses_a_pytorch_backend_build_at_once(tmp_path: Path, backend: str) -> None:
    """A current-line build for TensorRT-LLM's PyTorch backend needs TensorRT-LLM's own llmapi model.py from its
    image: eagle-launch says so and what to run, before starting tritonserver; the reference build is served."""
    from builders.build import main as build_main
    from builders.versions import CURRENT_GPU_IMAGE
    from testkit import tiny_models as tm

    # 8 layers: the tiny head captures distinct layers ([2, 4, 5]), as the PyTorch backend's capture set needs
    target = tm.make_target(tmp_path / "target", layers=8)
    head = tm.make_eagle3_head(tmp_path / "head", target)
    dtype = "bfloat16" if backend == "pytorch" else "float32"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"name: t\ntrtllm_version: '1.4'\noutput_dir: {tmp_path / 'b'}\n"
                   f"target: {{model: {target}, dtype: {dtype}}}\ndraft: {{type: eagle3, model: {head}}}\n"
                   "tree: {choices: chain-2}\n"
                   f"engine: {{backend: {backend}, device: cpu, max_batch_size: 1, max_input_len: 64, "
                   "max_seq_len: 128}\n")
    assert build_main([str(cfg)]) == 0
    repo = tmp_path / "b" / "triton_repo"
    why = launch.upstream_model_missing(repo)
    if backend == "reference":
        assert why is None
        return
    r = subprocess.run([sys.executable, "-m", "triton_repo.launch", "--repo", str(repo), "--timeout", "5"],
                       capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert r.returncode == 2 and r.stderr.strip() == f"error: {why}"
    assert why is not None and "TensorRT-LLM's own llmapi Triton model" in why
    assert f" {CURRENT_GPU_IMAGE} serve /build/" in why and "docker/serve.py" in why  # the image the project records
    assert "--set engine.backend=reference --set target.dtype=float32" in why
    (repo / "tensorrt_llm" / "1" / launch.UPSTREAM_LLMAPI_MODEL).write_text("# as docker/serve.py copies it\n")
    assert launch.upstream_model_missing(repo) is None  # in the image, after the copy: served
