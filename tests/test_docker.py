"""Containers and scale-out deployment (issue 8): lint, validate and run what docker/ ships.

- hadolint on every Dockerfile, shellcheck on the entrypoint (no finding left unexplained);
- (the Kubernetes manifests: test_k8s.py)
- the compose file: services, ports, healthcheck, GPU reservation, shm, mounts;
- the one version pin (builders/versions.py) against the Dockerfile, compose, manifests and docs, and the start-up
  check refusing the engine flow with a TensorRT-LLM that no longer has it;
- the entrypoint run outside Docker: build -> serve -> loadtest on the tiny fixtures against the CPU Triton server.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from builders import versions
from builders.config import load_config
from core import trtllm_versions
from tests.deploy_files import (
    DOCKER,
    REPO,
    _cfg,
    _compose,
    _containers,
    _manifests,
    _run,
    _tensorrt_config,
    render,
    serve,
)

VENV_BIN = Path(sys.executable).parent
DOCKERFILES = sorted(p for p in DOCKER.glob("Dockerfile*") if p.suffix != ".dockerignore")



# ---- Dockerfiles and the entrypoint: linters ----------------------------------------------------------------------


def test_dockerfiles_found() -> None:
    assert [p.name for p in DOCKERFILES] == ["Dockerfile", "Dockerfile.cpu", "Dockerfile.current"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_image_makes_the_project_importable(dockerfile: Path) -> None:
    """The images copy the project without installing it: PYTHONPATH names it, so docker/serve.py and a package
    module run as a file (which reruns itself as `python -m`) import it from any working directory."""
    text = dockerfile.read_text().replace("\\\n", " ")
    home = re.search(r"^ENV .*\bEAGLE_DEPLOY_HOME=(\S+)", text, flags=re.M)
    assert home and re.search(rf"^ENV .*\bPYTHONPATH={re.escape(home.group(1))}(\s|$)", text, flags=re.M), dockerfile


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_clean(dockerfile: Path) -> None:
    proc = _run([str(VENV_BIN / "hadolint"), "--no-color", "--format", "json", str(dockerfile)])
    findings = json.loads(proc.stdout or "[]")
    assert findings == [], f"hadolint findings in {dockerfile.name}: {findings}"
    assert proc.returncode == 0
    # An ignore is allowed only with its reason on the comment line just above it.
    lines = dockerfile.read_text().splitlines()
    for i, line in enumerate(lines):
        if "hadolint ignore=" in line:
            assert i > 0 and lines[i - 1].startswith("#") and "hadolint" not in lines[i - 1], (
                f"{dockerfile.name}:{i + 1}: `{line.strip()}` needs a reason comment on the line above"
            )


def test_hadolint_catches_unpinned_pip(tmp_path: Path) -> None:
    """Control: the linter really runs and reports (an unpinned, cached pip install)."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.11-slim\nRUN pip install requests\n")
    proc = _run([str(VENV_BIN / "hadolint"), "--no-color", "--format", "json", str(bad)])
    codes = {f["code"] for f in json.loads(proc.stdout)}
    assert {"DL3013", "DL3042"} <= codes and proc.returncode != 0


def test_shellcheck_entrypoint() -> None:
    proc = _run([str(VENV_BIN / "shellcheck"), "--format", "gcc", str(DOCKER / "entrypoint.sh")])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert os.access(DOCKER / "entrypoint.sh", os.X_OK), "docker/entrypoint.sh must be executable (ENTRYPOINT execs it)"


def test_entrypoint_port_defaults_match_serve() -> None:
    text = (DOCKER / "entrypoint.sh").read_text()
    for key, port in serve.TRITON_PORTS.items():
        assert f'"${{TRITON_{key.upper()}_PORT:-{port}}}"' in text
    assert f"TRITON_READY_TIMEOUT:-{render.READY_TIMEOUT_S}" in text


# ---- the one version pin ------------------------------------------------------------------------------------------


def test_pin_matches_dockerfile_compose_manifests_docs() -> None:
    assert re.fullmatch(r"\d\d\.\d\d", versions.TRITON_RELEASE)
    assert f"nvcr.io/nvidia/tritonserver:{versions.TRITON_RELEASE}-trtllm-python-py3" == versions.TRITON_IMAGE
    froms = [ln.split()[1] for ln in (DOCKER / "Dockerfile").read_text().splitlines() if ln.startswith("FROM ")]
    assert froms == [versions.TRITON_IMAGE]
    compose = yaml.safe_load((DOCKER / "docker-compose.yml").read_text())["services"]
    assert {compose[s]["image"] for s in ("build-gpu", "triton-gpu")} == {versions.GPU_IMAGE}
    assert {compose[s]["image"] for s in ("build-cpu", "triton-cpu", "loadtest-cpu", "loadtest-gpu")} == {
        versions.CPU_IMAGE
    }
    assert versions.TRITON_RELEASE in versions.GPU_IMAGE and versions.TRTLLM_VERSION in versions.GPU_IMAGE
    for doc in _manifests():
        for c in _containers(doc):
            assert c["image"] == versions.GPU_IMAGE, f"{doc['kind']} {c['name']}"
    deploy = (REPO / "docs" / "deploy.md").read_text()
    assert versions.TRITON_IMAGE in deploy and f"TensorRT-LLM {versions.TRTLLM_VERSION}" in deploy
    assert versions.GPU_IMAGE in deploy


def test_no_other_triton_tag_anywhere() -> None:
    """Any `tritonserver:<yy.mm>` named in docker/ or the guide must be the pinned one (or the current line's base)."""
    allowed = {versions.TRITON_RELEASE, re.findall(r"tritonserver:(\d\d\.\d\d)", versions.CURRENT_TRITON_BASE)[0]}
    files = [p for p in DOCKER.rglob("*") if p.is_file() and p.suffix != ".pyc"] + [REPO / "docs" / "deploy.md"]
    for p in files:
        for tag in re.findall(r"tritonserver:(\d\d\.\d\d)", p.read_text(errors="replace")):
            assert tag in allowed, f"{p.relative_to(REPO)} names tritonserver:{tag}"


@pytest.mark.parametrize(
    "version,has_it",
    [("0.15.0", True), ("1.0.3.2510", True), ("1.1.0", True), ("1.2.1", True), ("1.3.0rc1", False),
     ("1.3.0", False), ("2.0.0", False)],
)
def test_has_engine_flow(version: str, has_it: bool) -> None:
    assert versions.has_engine_flow(version) is has_it


def test_pinned_trtllm_has_engine_flow() -> None:
    assert versions.has_engine_flow(versions.TRTLLM_VERSION)


def test_engine_flow_problems() -> None:
    new = versions.InstalledTrtllm("tensorrt_llm", "1.3.0")
    (msg,) = versions.engine_flow_problems("tensorrt", new)
    assert "engine.backend=tensorrt" in msg and "1.3.0" in msg and "removed after 1.2.x" in msg
    assert versions.TRITON_IMAGE in msg and "engine.backend=pytorch" in msg
    assert versions.engine_flow_problems("pytorch", new) == []
    assert versions.engine_flow_problems("reference", new) == []
    assert versions.engine_flow_problems("tensorrt", versions.InstalledTrtllm("tensorrt_llm", "1.2.1")) == []
    assert versions.engine_flow_problems("tensorrt", None) == []
    (bad,) = versions.engine_flow_problems("tensorrt", versions.InstalledTrtllm("tensorrt_llm", "not-a-version"))
    assert "cannot parse" in bad and "'not-a-version'" in bad


def _dist_info(site: Path, version: str) -> None:
    """The metadata pip writes for an installed tensorrt_llm wheel: what the start-up check reads."""
    d = site / f"tensorrt_llm-{version}.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tensorrt_llm\nVersion: {version}\n")


@pytest.mark.parametrize(
    ("installed", "msgs"),
    [
        ("1.3.0", ["installed TensorRT-LLM is 1.3.0", versions.TRITON_IMAGE]),
        ("1.2.1", ["for TensorRT-LLM 1.1.0, but the installed TensorRT-LLM is 1.2.1"]),
    ],
)
def test_build_refuses_an_installed_trtllm_the_config_is_not_for(
    tmp_path: Path, tiny_target: Path, eagle_head: Path, installed: str, msgs: list[str]
) -> None:
    """builders/build.py runs the start-up check before any stage: exit 2, the fix named, nothing written."""
    config = _tensorrt_config(tmp_path, tiny_target, eagle_head)
    site = tmp_path / "site"
    _dist_info(site, installed)
    env = {**os.environ, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1"}
    proc = _run([sys.executable, "builders/build.py", str(config)], env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert all(m in proc.stderr for m in msgs) and not (tmp_path / "out").exists()


# ---- docker/serve.py ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend,tp,world", [("tensorrt", 2, 2), ("tensorrt", 1, 1), ("pytorch", 2, 1),
                                              ("reference", 2, 1)])
def test_serve_world_size(tmp_path: Path, tiny_target: Path, eagle_head: Path, backend: str, tp: int,
                          world: int) -> None:
    cfg = _cfg(tmp_path, tiny_target, eagle_head, backend, tp)
    argv = serve.serve_argv(Path(cfg.output_dir), cfg, "triton_repo", python="py", host="0.0.0.0", http_port=1,
                            grpc_port=2, metrics_port=3, log="/dev/stdout", timeout_s=5.0)
    assert argv[:2] == ["py", str(REPO / "triton_repo" / "launch.py")]
    assert argv[argv.index("--world-size") + 1] == str(world)
    assert argv[argv.index("--repo") + 1] == str(Path(cfg.output_dir) / "triton_repo")


def test_serve_refuses_unfinished_build(tmp_path: Path, tiny_target: Path, eagle_head: Path) -> None:
    cfg = _cfg(tmp_path, tiny_target, eagle_head, "reference", 1)
    problems = serve.check_build(tmp_path / "elsewhere", cfg, "triton_repo")
    assert any("triton_repo/manifest.json not found" in p for p in problems)
    proc = _run([sys.executable, "docker/serve.py", str(tmp_path)])
    assert proc.returncode == 2 and "config.resolved.yaml not found" in proc.stderr


def test_resolved_config_names_no_absolute_path_and_moves_with_the_build(
    tmp_path: Path, tiny_target: Path, eagle_head: Path
) -> None:
    """config.resolved.yaml records paths relative to the build directory: it names nothing of the machine that
    built it, and a build read from another place reads its own location (the repository is relocatable too:
    tests/test_triton_moved_build.py)."""
    import shutil

    from builders import build_dir as owned
    from builders.resolved import dump_resolved

    cfg = _cfg(tmp_path, tiny_target, eagle_head, "reference", 1)
    built = Path(cfg.output_dir)
    built.mkdir(parents=True, exist_ok=True)
    owned.write_resolved(built, dump_resolved(cfg))
    text = (built / "config.resolved.yaml").read_text()
    record = yaml.safe_load(text)
    # deploy: names the cluster's mount points (/build, /models, /capture), not this machine's paths
    assert {k: v for k, v in record["deploy"].items() if k.endswith("_root")} == {
        "build_root": "/build", "models_root": "/models", "capture_root": "/capture"}
    text = yaml.safe_dump({k: v for k, v in record.items() if k != "deploy"})
    assert str(tmp_path) not in text and "\n/" not in text and ": /" not in text
    assert record["output_dir"] == "." and not Path(record["target"]["model"]).is_absolute()
    moved = tmp_path / "volume" / "mounted"
    moved.parent.mkdir()
    shutil.copytree(built, moved)
    again = serve.load_build_config(moved)
    assert Path(again.output_dir) == moved.resolve()
    assert Path(again.target.model) == (moved / record["target"]["model"]).resolve()
    same = serve.load_build_config(built)
    assert (same.target.model, same.draft.model) == (cfg.target.model, cfg.draft.model)
    assert same.config_hash() == cfg.config_hash()
    (problem,) = serve.check_build(moved, again, "triton_repo")  # not "built elsewhere": only the missing stage
    assert problem.startswith(f"{moved}/triton_repo/manifest.json not found")


# ---- compose ------------------------------------------------------------------------------------------------------


def _expand(value: str) -> str:
    """Compose's `${VAR:-default}` with nothing set: the default."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


def test_compose_services_and_profiles() -> None:
    services = _compose()["services"]
    assert {n: s["profiles"] for n, s in services.items()} == {
        "build-gpu": ["gpu"], "triton-gpu": ["gpu"], "loadtest-gpu": ["gpu"],
        "build-current": ["current"], "triton-current": ["current"], "loadtest-current": ["current"],
        "build-cpu": ["cpu"], "triton-cpu": ["cpu"], "loadtest-cpu": ["cpu"],
    }
    for p in ("gpu", "cpu"):  # build -> serve -> loadtest, each waiting on the previous one
        assert services[f"triton-{p}"]["depends_on"] == {f"build-{p}": {"condition": "service_completed_successfully"}}
        assert services[f"loadtest-{p}"]["depends_on"] == {f"triton-{p}": {"condition": "service_healthy"}}
        build_cmd = [_expand(a) for a in services[f"build-{p}"]["command"]]
        serve_cmd = [_expand(a) for a in services[f"triton-{p}"]["command"]]
        assert build_cmd == ["build", "configs/demo.yaml", "--set", "output_dir=/build/demo"]
        assert serve_cmd == ["serve", "/build/demo"]  # served at the path it was built at
        assert (REPO / build_cmd[1]).is_file()
        entry = services[f"loadtest-{p}"]["entrypoint"]
        assert entry[1:] == ["loadtest", f"triton-{p}:{serve.TRITON_PORTS['grpc']}"]
        args = [_expand(a) for a in services[f"loadtest-{p}"]["command"]]
        assert (REPO / args[args.index("--prompts") + 1]).is_file()
        assert args[args.index("--repo") + 1] == "/build/demo/triton_repo"  # the tokenizer: served paths are relative


def test_compose_current_line_profile() -> None:
    """build -> serve -> loadtest on the current-line image, with a config written for that line."""
    services = _compose()["services"]
    assert {services[s]["image"] for s in ("build-current", "triton-current")} == {versions.CURRENT_GPU_IMAGE}
    assert services["build-current"]["build"]["dockerfile"] == "docker/Dockerfile.current"
    assert services["triton-current"]["depends_on"] == {
        "build-current": {"condition": "service_completed_successfully"}
    }
    assert services["loadtest-current"]["depends_on"] == {"triton-current": {"condition": "service_healthy"}}
    build_cmd = [_expand(a) for a in services["build-current"]["command"]]
    assert build_cmd[:2] == ["build", "configs/llama31-8b-eagle3-current.yaml"]
    cfg = load_config(REPO / build_cmd[1])
    assert cfg.version.triton_layout == "llmapi" and cfg.engine.backend == "pytorch"
    assert [_expand(a) for a in services["triton-current"]["command"]] == ["serve", "/build/llama31-8b-eagle3-current"]
    assert services["loadtest-current"]["entrypoint"][2:] == ["triton-current:8001", "--model", "tensorrt_llm"]
    text = (DOCKER / "Dockerfile.current").read_text()
    assert f"ARG TRITON_BASE={versions.CURRENT_TRITON_BASE}" in text
    assert (
        f"ARG TRTLLM_VERSION={versions.CURRENT_TRTLLM_VERSION}" in text
        and f"ARG TRTLLM_TAG={versions.CURRENT_TRTLLM_TAG}" in text
    )
    assert "current_image_problems" in text and f"-t {versions.CURRENT_GPU_IMAGE} ." in text
    assert trtllm_versions.get("1.4").release == versions.CURRENT_TRTLLM_VERSION
    assert versions.CURRENT_GPU_IMAGE in (REPO / "docs" / "deploy.md").read_text()


def test_compose_server_ports_healthcheck_shm_mounts() -> None:
    services = _compose()["services"]
    for name in ("triton-gpu", "triton-cpu"):
        s = services[name]
        # Host loopback unless PUBLISH_ADDR says otherwise.
        assert sorted(_expand(p) for p in s["ports"]) == sorted(
            f"127.0.0.1:{p}:{p}" for p in serve.TRITON_PORTS.values()
        )
        assert s["environment"] == {"TRITON_ADMIN_KEY": "${TRITON_ADMIN_KEY:-}"}
        test = s["healthcheck"]["test"]
        assert test[0] == "CMD" and f"127.0.0.1:{serve.TRITON_PORTS['http']}/v2/health/ready" in test[-1]
        assert s["healthcheck"]["start_period"] == "30m" and render.READY_TIMEOUT_S == 30 * 60
        assert s["shm_size"] == "2gb" and render.SHM_SIZE == "2Gi"
        assert [_expand(v) for v in s["volumes"]] == ["../build:/build"]
    # The healthcheck command itself works: run it against nothing listening -> it must fail.
    cmd = services["triton-cpu"]["healthcheck"]["test"][1:]
    cmd[-1] = cmd[-1].replace(f":{serve.TRITON_PORTS['http']}/", ":9/")
    assert _run([sys.executable, *cmd[1:]]).returncode != 0


def test_compose_gpu_reservation() -> None:
    services = _compose()["services"]
    for name in ("build-gpu", "triton-gpu"):
        (dev,) = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert dev["driver"] == "nvidia" and dev["capabilities"] == ["gpu"] and _expand(str(dev["count"])) == "1"
    for name in ("build-cpu", "triton-cpu", "loadtest-cpu", "loadtest-gpu"):
        assert "deploy" not in services[name]


# ---- the entrypoint, outside Docker -------------------------------------------------------------------------------


def _entry(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    e = {**os.environ, "EAGLE_DEPLOY_PYTHON": sys.executable, **(env or {})}
    return _run(["bash", str(DOCKER / "entrypoint.sh"), *args], env=e)


def test_entrypoint_usage_and_errors(tmp_path: Path) -> None:
    ok = _entry("help")
    assert ok.returncode == 0 and "build CONFIG" in ok.stdout and "serve BUILD_DIR" in ok.stdout
    bad = _entry("deploy")
    assert bad.returncode == 2 and "unknown command 'deploy'" in bad.stderr
    assert _entry("build").returncode == 2 and "build needs a config" in _entry("build").stderr
    none = _entry("serve", str(tmp_path))
    assert none.returncode == 2 and "config.resolved.yaml not found" in none.stderr


def _http_ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.mark.server
@pytest.mark.slow  # ~1-3 min on 2 busy cores (the CPU server loads five python models); run by `make test`
def test_entrypoint_build_serve_loadtest(tmp_path: Path, tiny_target: Path, eagle_head: Path) -> None:
    """What the compose CPU profile runs, outside Docker: entrypoint build -> serve (real CPU tritonserver) ->
    loadtest, then SIGTERM stops the server cleanly."""
    from triton_repo.launch import free_port

    build_dir = tmp_path / "build"
    cfg = {
        "name": "docker-e2e", "trtllm_version": "1.1", "output_dir": str(build_dir),
        "target": {"model": str(tiny_target), "dtype": "float32"},
        "draft": {"type": "eagle", "model": str(eagle_head)},
        "tree": {"choices": "chain-2"},
        "engine": {"backend": "reference", "device": "cpu", "max_batch_size": 2, "max_input_len": 64,
                   "max_seq_len": 128},
    }
    config = tmp_path / "e2e.yaml"
    config.write_text(yaml.safe_dump(cfg))
    built = _entry("build", str(config), env={"HF_HUB_OFFLINE": "1"})
    assert built.returncode == 0, built.stdout + built.stderr
    stage = serve.repository_stage_name()
    assert (build_dir / "config.resolved.yaml").is_file() and (build_dir / stage / "manifest.json").is_file()

    http, grpc, metrics = free_port(), free_port(), free_port()
    log = tmp_path / "triton.log"
    env = {**os.environ, "EAGLE_DEPLOY_PYTHON": sys.executable, "TRITON_HOST": "127.0.0.1",
           "TRITON_HTTP_PORT": str(http), "TRITON_GRPC_PORT": str(grpc), "TRITON_METRICS_PORT": str(metrics),
           "TRITON_LOG": str(log), "TRITON_READY_TIMEOUT": "240"}
    # bash execs serve.py, which execs launch.py: one PID all along, so SIGTERM below reaches the launcher.
    server = subprocess.Popen(
        ["bash", str(DOCKER / "entrypoint.sh"), "serve", str(build_dir)], cwd=REPO, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while not _http_ready(http):
            assert server.poll() is None, f"serve exited {server.returncode}:\n{server.communicate()[0]}"
            assert time.monotonic() < deadline, f"not ready in 240 s; log:\n{log.read_text()[-3000:]}"
            time.sleep(0.5)
        out = tmp_path / "loadtest"
        lt = _entry("loadtest", f"127.0.0.1:{grpc}", "--repo", str(build_dir / "triton_repo"),
                    "--prompts", str(DOCKER / "prompts.jsonl"), "--out", str(out),
                    "--concurrency", "2", "--requests", "4", "--max-tokens", "8", "--no-progress")
        assert lt.returncode == 0, lt.stdout + lt.stderr
        report = json.loads((out / "report.json").read_text())
        levels = [(lv["level"], lv["requests_sent"], lv["requests_ok"], lv["errors"]) for lv in report["levels"]]
        assert levels == [(2, 4, 4, {})]
        assert all(lv["output_tokens"] > 0 for lv in report["levels"])
        # The series the rendered HPA scales on (via the adapter rule) is really exported for this backend.
        series = render.in_flight_series(load_config(config))
        name, labels = series[: series.index("{")], series[series.index("{") + 1 : -1].split(",")
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=10) as r:
            lines = [ln for ln in r.read().decode().splitlines() if ln.startswith(name + "{")]
        assert any(all(lb in ln for lb in labels) for ln in lines), (series, lines)
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=90)
    assert code == 0, server.communicate()[0]
    assert not _http_ready(http)


def test_cpu_image_python_has_a_pytriton_stub() -> None:
    """The bundled tritonserver's python backend needs a stub built for the image's Python."""
    from importlib import metadata

    (base,) = [ln.split()[1] for ln in (DOCKER / "Dockerfile.cpu").read_text().splitlines() if ln.startswith("FROM ")]
    version = re.fullmatch(r"python:(\d+\.\d+)-slim-\w+", base).group(1)
    dist = metadata.distribution("nvidia-pytriton")
    stubs = Path(str(dist.locate_file("pytriton/tritonserver/python_backend_stubs")))
    assert (stubs / version / "triton_python_backend_stub").is_file(), sorted(p.name for p in stubs.iterdir())


def test_gpu_requirements_leave_nvidia_builds_alone() -> None:
    names = {re.split(r"[<>=\[ ;]", ln.strip(), maxsplit=1)[0].lower()
             for ln in (DOCKER / "requirements-gpu.txt").read_text().splitlines() if ln.strip() and ln[0] != "#"}
    nvidia_builds = {"torch", "transformers", "tensorrt_llm", "tensorrt-llm", "nvidia-modelopt", "tensorrt"}
    assert names and not names & nvidia_builds
    assert "numpy" in names  # and numpy is held < 2 like the image's TensorRT-LLM needs


# ---- the current-line image proves its own install ---------------------------------------------------------------


def test_current_image_follows_upstreams_install_recipe() -> None:
    """TensorRT-LLM's pip recipe (installation-guide.md): Open MPI, the PyTorch CUDA 13.0 build first, then the wheel
    with torch held by a constraints file; the build check runs last, over everything installed."""
    text = (DOCKER / "Dockerfile.current").read_text()
    mpi = text.index("apt-get install -y --no-install-recommends libopenmpi-dev")
    torch = text.index('"torch==${TORCH_VERSION}"')
    wheel = text.index('-c /tmp/torch-constraint.txt \\\n        "tensorrt_llm==${TRTLLM_VERSION}"')
    check = text.index("current_image_problems")
    assert mpi < torch < wheel < check and text.index("COPY --chown") < check
    assert re.search(r'--index-url "\$\{TORCH_INDEX_URL\}"', text[torch - 200:torch])
    (index_url,) = re.findall(r"^ARG TORCH_INDEX_URL=(\S+)$", text, re.M)
    assert index_url.endswith("/" + versions.CURRENT_TORCH_CUDA)
    assert "print('torch==' + m.version('torch'))\" > /tmp/torch-constraint.txt" in text
    # Before the wheel, as the guide says: remove any previous CUTLASS DSL, then pip / "setuptools<80" / wheel.
    uninstall = text.index("pip uninstall -y " + " ".join(versions.CUTLASS_DSL_PACKAGES[:2]))
    assert " ".join(text[uninstall:wheel].replace("\\\n", " ").split()).startswith(
        "pip uninstall -y " + " ".join(versions.CUTLASS_DSL_PACKAGES) + " &&")
    bootstrap = text.index('pip install --no-cache-dir --ignore-installed pip "setuptools<80" wheel')
    assert versions.PIP_BOOTSTRAP == ("pip", "setuptools<80", "wheel")
    assert torch < uninstall < bootstrap < wheel


def _dist(site: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    d = site / f"{name}-{version}.dist-info"
    d.mkdir(parents=True)
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {name}",
        f"Version: {version}",
        *(f"Requires-Dist: {r}" for r in requires),
    ]
    (d / "METADATA").write_text("\n".join(lines) + "\n")


TRTLLM_REQUIRES = ("torch<=2.12.0,>=2.12.0a0", "mpi4py", "transformers>=5.3.0", "pytest; extra == \"dev\"")


def _image_site(root: Path, trtllm: str = versions.CURRENT_TRTLLM_VERSION, torch: str = "2.12.0+cu130",
                mpi4py: bool = True, setuptools: str = "79.0.1") -> Path:
    site = root / "site"
    _dist(site, "tensorrt_llm", trtllm, TRTLLM_REQUIRES)
    _dist(site, "torch", torch)
    _dist(site, "transformers", "5.3.0")
    for name, version in (("pip", "25.3"), ("setuptools", setuptools), ("wheel", "0.45.1")):
        _dist(site, name, version)
    if mpi4py:
        _dist(site, "mpi4py", "4.1.1")
    return site


@pytest.mark.parametrize(("site_kw", "expect"), [
    ({}, []),
    ({"torch": "2.12.0"}, ["torch 2.12.0 is not the cu130 build"]),
    ({"torch": "2.11.0+cu130"}, ["requires torch<=2.12.0,>=2.12.0a0 but torch 2.11.0+cu130 is installed"]),
    ({"mpi4py": False}, ["requires mpi4py but mpi4py is not installed", "mpi4py is not installed (TensorRT-LLM's"]),
    ({"trtllm": "1.4.0rc3"}, ["the image holds TensorRT-LLM 1.4.0rc3, builders/versions.py records 1.4.0rc4"]),
    ({"setuptools": "80.9.0"}, ['setuptools 80.9.0 installed, TensorRT-LLM\'s install guide wants setuptools<80: run '
                                '`pip3 install --ignore-installed pip "setuptools<80" wheel`']),
])
def test_current_image_build_check_reads_the_installed_metadata(
    tmp_path: Path, site_kw: dict, expect: list[str]
) -> None:
    """What docker/Dockerfile.current's RUN check says about an installed set of wheels (their metadata: the build has
    no GPU, so nothing is imported). The model-file and MPI-library lines depend on the machine, not the wheels."""
    site = _image_site(tmp_path, **site_kw)
    p = [x for x in versions.current_image_problems([str(site)])
         if "/app/all_models" not in x and "no MPI library" not in x]
    assert len(p) == len(expect) and all(e in x for e, x in zip(expect, p)), p


def test_current_image_build_check_fails_the_docker_run_line(tmp_path: Path) -> None:
    """The Dockerfile's own RUN command, on wheels that do not fit: exit status non-zero, every problem named."""
    text = (DOCKER / "Dockerfile.current").read_text()
    (code,) = re.findall(r'RUN python3 -c "(from builders\.versions import current_image_problems[^"]*)"', text)
    site = _image_site(tmp_path, torch="2.12.0", mpi4py=False)
    proc = _run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{REPO}"})
    assert proc.returncode == 1
    assert "torch 2.12.0 is not the cu130 build" in proc.stderr and "mpi4py is not installed" in proc.stderr


def _fake_trtllm(site: Path, body: str) -> None:
    """An importable `tensorrt_llm` whose import does what a real image's might (fail, or report a version)."""
    (site / "tensorrt_llm").mkdir(parents=True, exist_ok=True)
    (site / "tensorrt_llm" / "__init__.py").write_text(body)


def test_serve_imports_trtllm_before_triton_starts(tmp_path: Path) -> None:
    """docker/serve.py (the container's `serve`) imports TensorRT-LLM in a fresh interpreter before it starts Triton:
    an image where the import fails, or reports another release, does not start."""
    from builders.build import main as build_main
    from testkit import tiny_models as tm
    from tests.engine_cases import write_build_yaml

    target = tm.make_target(tmp_path / "target", layers=8)
    head = tm.make_eagle3_head(tmp_path / "eagle3", target)
    f = write_build_yaml(tmp_path / "c.yaml", output_dir=tmp_path / "build", target=target, head=head, draft="eagle3",
                         backend="pytorch", tree="chain-2", name="serve-import", version="1.4")
    assert build_main([str(f)]) == 0
    site = tmp_path / "site"
    _dist(site, "tensorrt_llm", versions.CURRENT_TRTLLM_VERSION)  # the metadata matches: only the import can tell
    upstream = tmp_path / "llmapi"
    upstream.mkdir()
    for name in ("model.py", "helpers.py"):
        (upstream / name).write_text("# upstream's file\n")
    # the image's PYTHONPATH names the project (docker/Dockerfile*); the fake wheels come first
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{REPO}", serve.UPSTREAM_LLMAPI_ENV: str(upstream)}
    argv = [sys.executable, "docker/serve.py", str(tmp_path / "build"), "--print-argv"]
    _fake_trtllm(site, 'raise ImportError("libcuda.so.1: cannot open shared object file")\n')
    proc = _run(argv, env=env)
    assert proc.returncode == 2 and "launch.py" not in proc.stdout
    assert "`import tensorrt_llm` fails in this image: ImportError: libcuda.so.1" in proc.stderr
    _fake_trtllm(site, '__version__ = "1.4.0rc3"\n')
    proc = _run(argv, env=env)
    assert proc.returncode == 2 and "the imported TensorRT-LLM reports '1.4.0rc3'" in proc.stderr
    _fake_trtllm(site, f'__version__ = "{versions.CURRENT_TRTLLM_VERSION}"\n')
    proc = _run(argv, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "launch.py" in proc.stdout
