"""Start a real `tritonserver` on a model repository: a Python API (`TritonServer`) and a CLI.

    python triton_repo/launch.py --repo DIR [--grpc-port 8001] [--http-port 8000] [--metrics-port 8002]
                                 [--world-size N] [--host 127.0.0.1]

Admin APIs (logging, model-repository, trace, shared-memory) are restricted (triton_repo/exposure.py): they answer
only requests carrying $TRITON_ADMIN_KEY; when the variable is unset the key is random: they are closed.

Which binary: the system `tritonserver` when installed (NGC container: /opt/tritonserver), otherwise the CPU server
bundled in the `nvidia-pytriton` wheel (tritonserver 2.51 + python backend). The bundled server needs three things
pytriton itself sets up (pytriton/server/triton_server.py `_get_env`): its private shared libraries on
LD_LIBRARY_PATH (`nvidia_pytriton.libs`), the venv's `bin` first on PATH (the python-backend stub runs the venv's
interpreter environment), and a backend directory holding `python/` = libtriton_python.so + the stub built for this
Python version. We prepare that directory once under the user cache.

`--world-size N` gives the mpirun form of tensorrtllm_backend's scripts/launch_triton_server.py: one `-n 1
tritonserver ...` block per rank, joined by `:`, each rank with its own python-backend shm prefix; ranks > 0 load
only the LLM model (`--model-control-mode=explicit --load-model=tensorrt_llm`), as upstream.

Python API (used by the clients and the load tester):

    with TritonServer(repo, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port()) as srv:
        client = tritonclient.grpc.InferenceServerClient(srv.grpc_url)   # "127.0.0.1:PORT"
        ...                                                                # srv.http_url "127.0.0.1:PORT"
                                                                           # srv.metrics_url "http://.../metrics"
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

# Run as a file (`python triton_repo/launch.py`), Python would put triton_repo/ first on sys.path, where a
# module can shadow an installed package (builders/triton: `triton`): run as the module, as its command does.
if __name__ == "__main__" and not __package__:
    os.execv(sys.executable, [sys.executable, "-m", "triton_repo.launch", *sys.argv[1:]])

from triton_repo import shm, supervise
from triton_repo.upstream_llmapi import UPSTREAM_LLMAPI_MODEL as UPSTREAM_LLMAPI_MODEL  # re-exported
from triton_repo.upstream_llmapi import upstream_model_missing
from triton_repo.server_binary import (  # `name as name`: re-exported, where launch.py's users look
    LaunchError,
    ServerBinary,
    _libpython_dir as _libpython_dir,
    bundled_binary as bundled_binary,
    find_binary,
    prepare_bundled_backends as prepare_bundled_backends,
    system_binary as system_binary,
)
from triton_repo.exposure import (  # re-exported: the launcher's public names
    ADMIN_GRPC_HEADER,
    ADMIN_HEADER,
    ADMIN_KEY_ENV,
    INTERNAL_KEY_ENV,
    RESTRICTED_APIS,
    SHELL_UNSAFE,
    model_name_problem,
    repository_problems,
    restricted_api_argv,
    unsafe_chars,
    unsafe_path_problem,
)
from triton_repo.models.bootstrap import HOME_ENV

# Triton's default ports; docker/serve.py, the compose file, the Kubernetes manifests (docker/k8s/render.py) and the
# entrypoint's defaults use the same ones (tests/test_docker.py checks the files that cannot import this).
TRITON_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}
PROJECT_HOME = Path(__file__).resolve().parent.parent  # the checkout (or installation) the served models import

__all__ = ["ADMIN_GRPC_HEADER", "ADMIN_HEADER", "ADMIN_KEY_ENV", "RESTRICTED_APIS", "SHELL_UNSAFE", "LaunchError",
           "LaunchInterrupted", "TritonServer", "free_port", "launch_argv", "mpirun_argv", "restricted_api_argv",
           "server_argv", "unsafe_chars", "unsafe_path_problem"]

READY_POLL_S = 0.25
# Stopping: tritonserver's --exit-timeout-secs (its default 30 s) bounds its wait for in-flight requests AND the
# unloading of its models, one countdown for both (its log counts it down: "Timeout N: Found ... live models"): a
# request that never ends, such as a stream whose client went away, held every stop for the whole 30 s. DRAIN_S
# leaves room for the unload on a loaded machine (~10 s for the python models on 2 busy cores); after it the server
# exits anyway (exit code 1, "Exit timeout expired"), and the launcher kills the process group STOP_GRACE_S later
# if it has not exited by then.
DRAIN_S = 10
MAX_DRAIN_S = 600
STOP_GRACE_S = 15.0


class LaunchInterrupted(LaunchError):
    """A stop was requested (SIGTERM/SIGINT) before the server became ready; the server has been stopped."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now on `host` (the OS picks it; another process could take it before we bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# ---- argv (pure) --------------------------------------------------------------------------------------------------


def server_argv(
    exe: Path,
    repo: Path,
    *,
    backend_dir: Path,
    grpc_port: int,
    http_port: int,
    metrics_port: int,
    host: str,
    shm_prefix: str,
    admin_key: str,
    load_only: str | None = None,
    explicit: bool = False,
    drain_s: int = DRAIN_S,
) -> list[str]:
    """One tritonserver invocation. `shm_prefix` keeps the python-backend shared-memory regions of servers running
    side by side (tests, MPI ranks) apart. `load_only` = model name for ranks > 0 of a multi-GPU TensorRT-LLM
    engine: as upstream, they load only the LLM model (explicit model control), whose backend instance then serves
    as an MPI worker of rank 0."""
    argv = [
        str(exe),
        f"--model-repository={repo}",
        f"--backend-directory={backend_dir}",
        f"--grpc-address={host}", f"--grpc-port={grpc_port}",
        f"--http-address={host}", f"--http-port={http_port}",
        f"--metrics-address={host}", f"--metrics-port={metrics_port}",
        "--allow-metrics=true",
        "--disable-auto-complete-config",  # configs are rendered complete; never let the server guess
        "--exit-on-error=true",
        "--strict-readiness=true",
        # the in-flight requests' time to finish when stopping (tritonserver --help: "Timeout (in seconds) when
        # exiting to wait for in-flight inferences to finish"; server src/command_line_parser.cc exit-timeout-secs)
        f"--exit-timeout-secs={drain_s}",
        f"--backend-config=python,shm-region-prefix-name={shm_prefix}",
        *restricted_api_argv(admin_key),
    ]
    if load_only is not None:
        argv += ["--model-control-mode=explicit", f"--load-model={load_only}"]
    elif explicit:
        argv += ["--model-control-mode=explicit", "--load-model=*"]
    return argv


def mpirun_argv(world_size: int, rank_argv: list[list[str]], as_root: bool = False) -> list[str]:
    """`mpirun [--allow-run-as-root] -n 1 <rank0> : -n 1 <rank1> ...` (tensorrtllm_backend
    scripts/launch_triton_server.py `get_cmd`, which always passes the flag; Open MPI refuses to start as root
    without it, so it is added only when running as root)."""
    if world_size < 1 or len(rank_argv) != world_size:
        raise ValueError(f"world_size={world_size} needs exactly {world_size} rank commands, got {len(rank_argv)}")
    argv = ["mpirun", *(["--allow-run-as-root"] if as_root else [])]
    for i, a in enumerate(rank_argv):
        if i:
            argv.append(":")
        argv += ["-n", "1", *a]
    return argv


def launch_argv(
    binary: ServerBinary,
    repo: Path,
    *,
    grpc_port: int,
    http_port: int,
    metrics_port: int,
    host: str,
    world_size: int = 1,
    shm_tag: str = "",
    llm_model: str = "tensorrt_llm",
    admin_key: str,
    as_root: bool = False,
    explicit: bool = False,
    drain_s: int = DRAIN_S,
) -> list[str]:
    """The full command: one server, or the mpirun form for `world_size` > 1 (tensorrtllm_backend
    scripts/launch_triton_server.py: rank 0 loads the whole repository, ranks > 0 only `llm_model`)."""
    ranks = [
        server_argv(
            binary.executable, repo, backend_dir=binary.backend_dir, grpc_port=grpc_port, http_port=http_port,
            metrics_port=metrics_port, host=host, shm_prefix=shm.prefix(shm_tag, r), admin_key=admin_key,
            load_only=None if r == 0 else llm_model, explicit=explicit, drain_s=drain_s,
        )
        for r in range(world_size)
    ]
    return ranks[0] if world_size == 1 else mpirun_argv(world_size, ranks, as_root=as_root)


# ---- the running server -------------------------------------------------------------------------------------------


class TritonServer:
    """A tritonserver process on `repo`; a context manager (`start()` on enter, `stop()` on exit).

    `grpc_url` and `http_url` are `host:port`, the form tritonclient's grpc/http `InferenceServerClient(url)` take;
    `metrics_url` is the full Prometheus URL `http://host:port/metrics`. The server's output goes to `log_path`
    (a temporary file when not given)."""

    def __init__(
        self,
        repo: Path,
        *,
        grpc_port: int,
        http_port: int,
        metrics_port: int,
        host: str = "127.0.0.1",
        log_path: Path | None = None,
        world_size: int = 1,
        binary: ServerBinary | None = None,
        llm_model: str = "tensorrt_llm",
        admin_key: str | None = None,
        explicit: bool = False,
        drain_s: int = DRAIN_S,
    ) -> None:
        if not 0 <= drain_s <= MAX_DRAIN_S:
            raise LaunchError(f"drain_s={drain_s}: give whole seconds in [0, {MAX_DRAIN_S}]")
        self.drain_s = drain_s  # how long a stop waits for in-flight requests (server_argv --exit-timeout-secs)
        self.repo = Path(repo).resolve()
        self.explicit = explicit  # model control: load/unload through the model-repository API (server_argv)
        # No key given: a random one nobody is told, so the admin endpoints are closed (tests read it from here).
        self.admin_key = admin_key or secrets.token_urlsafe(24)
        self.grpc_port, self.http_port, self.metrics_port = grpc_port, http_port, metrics_port
        self.host = host
        self.world_size = world_size
        self.llm_model = llm_model
        self._binary = binary
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="tritonserver-", suffix=".log")
            os.close(fd)
            log_path = Path(name)
        self.log_path = Path(log_path)
        self._proc: subprocess.Popen[bytes] | None = None
        self.shm_tag = f"{os.getpid()}_{grpc_port}"  # names its python-backend shm regions (triton_repo/shm.py)

    # -- endpoints
    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    @property
    def admin_headers(self) -> dict[str, str]:
        """Headers that open the restricted admin endpoints over HTTP and gRPC (tritonclient: `headers=`)."""
        return {ADMIN_HEADER: self.admin_key, ADMIN_GRPC_HEADER: self.admin_key}

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def argv(self) -> list[str]:
        binary = self._binary or find_binary()
        self._binary = binary
        return launch_argv(
            binary, self.repo, grpc_port=self.grpc_port, http_port=self.http_port, metrics_port=self.metrics_port,
            host=self.host, world_size=self.world_size, shm_tag=self.shm_tag,
            llm_model=self.llm_model, admin_key=self.admin_key, as_root=os.geteuid() == 0, explicit=self.explicit,
            drain_s=self.drain_s,
        )

    def shown_argv(self) -> str:
        """The command for logs and --print-argv, the admin key masked."""
        return " ".join(self.argv()).replace(self.admin_key, "***")

    def path_problems(self) -> list[str]:
        """Paths the python backend would put unquoted on its stub's bash command line (see SHELL_UNSAFE), and model
        names outside the allow-list (triton_repo/exposure.py MODEL_NAME)."""
        binary = self._binary or find_binary()
        self._binary = binary
        checks = ((self.repo, "model repository"), (binary.backend_dir, "backend directory"))
        problems = [p for path, what in checks if (p := unsafe_path_problem(path, what)) is not None]
        if (p := model_name_problem(self.llm_model, "--llm-model")) is not None:
            problems.append(p)
        return problems + (repository_problems(self.repo) if self.repo.is_dir() else [])

    def log_tail(self, n_chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n_chars:]
        except OSError:
            return ""

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout_s: float = 180.0, stop_requested: Callable[[], bool] | None = None) -> TritonServer:
        """Start the server and wait until `/v2/health/ready` answers 200 (every model loaded). `stop_requested` is
        polled while waiting (a signal handler's flag): when it turns true the server is stopped and
        `LaunchInterrupted` raised, so SIGTERM during a long model load is not ignored."""
        if not self.repo.is_dir():
            raise LaunchError(f"model repository {self.repo} is not a directory; render it first (triton stage)")
        if self.is_running():
            raise LaunchError(f"server already running (pid {self.pid})")
        ports = {"grpc": self.grpc_port, "http": self.http_port, "metrics": self.metrics_port}
        problems = self.path_problems() + supervise.ports_taken(self.host, ports)
        if problems:
            raise LaunchError("; ".join(problems))
        argv = self.argv()
        assert self._binary is not None
        shm.remove(shm.stale_regions())  # left by earlier servers that were killed; none is in use
        env = {**os.environ, **self._binary.env}
        # The rendered python models import the project named here (triton_repo/models/bootstrap.py): this checkout,
        # unless the caller names another one.
        env.setdefault(HOME_ENV, str(PROJECT_HOME))
        # A fresh secret at every start, never written anywhere: the internal models answer only requests proven by
        # it (models/guard.py), so a client cannot call them directly unless the build exposes them.
        env[INTERNAL_KEY_ENV] = secrets.token_hex(32)
        with self.log_path.open("ab") as log:
            log.write(f"$ {self.shown_argv()}\n".encode())
            log.flush()
            # Own process group: stop() can signal the server and its python-backend stubs together. Working directory:
            # the repository, against which the C++ tensorrtllm backend resolves the relative gpt_model_path the
            # render writes (builders/triton/render.py REPOSITORY_RELATIVE); mpirun gives its ranks the same one.
            self._proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                          cwd=self.repo)
        try:
            return self._wait_ready(timeout_s, stop_requested)
        except BaseException:  # whatever ends the wait (not ready, exited, interrupted): stopped and cleaned up
            self.stop()
            raise

    def _wait_ready(self, timeout_s: float, stop_requested: Callable[[], bool] | None) -> TritonServer:
        assert self._proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if stop_requested is not None and stop_requested():
                raise LaunchInterrupted("stop requested while waiting for the server to become ready")
            code = self._proc.poll()
            if code is not None:
                raise LaunchError(f"tritonserver exited with code {code} while starting; log {self.log_path}:\n"
                                  f"{self.log_tail()}")
            if self._ready():
                return self
            time.sleep(READY_POLL_S)
        raise LaunchError(f"tritonserver not ready after {timeout_s:.0f}s; log {self.log_path}:\n{self.log_tail()}")

    def model_ready(self, model: str, version: str) -> bool:
        """Whether the server says this model version is ready (the stub watch asks: triton_repo/supervise.py)."""
        return self._ready(f"/v2/models/{model}/versions/{version}/ready")

    def _ready(self, path: str = "/v2/health/ready") -> bool:
        url = f"http://{self.host}:{self.http_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                return r.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def stop(self, timeout_s: float | None = None) -> int | None:
        """SIGINT (tritonserver waits up to drain_s for in-flight requests, unloads models and exits), then SIGKILL
        of its process group after `timeout_s` (default drain_s + STOP_GRACE_S). Returns the exit code (None when
        it was not started)."""
        proc = self._proc
        if proc is None:
            return None
        if timeout_s is None:
            timeout_s = self.drain_s + STOP_GRACE_S
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        # Stubs normally exit with the server; make sure none of this group outlives it, then free its shm regions.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        shm.remove(shm.own_regions(self.shm_tag))
        return proc.returncode

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# ---- CLI ----------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="eagle-launch", description="Start tritonserver on a rendered model repository.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Inputs:  --repo, a rendered model repository (<output_dir>/triton_repo)\n"
        "Outputs: a running tritonserver on --host and the given ports until SIGTERM / Ctrl-C; its log in --log\n"
        "Guide:   docs/deploy.md",
    )
    ap.add_argument("--repo", required=True, type=Path, help="model repository (<build>/triton_repo)")
    ap.add_argument("--grpc-port", type=int, default=TRITON_PORTS["grpc"],
                    help=f"gRPC port (default {TRITON_PORTS['grpc']})")
    ap.add_argument("--http-port", type=int, default=TRITON_PORTS["http"],
                    help=f"HTTP port (default {TRITON_PORTS['http']})")
    ap.add_argument("--metrics-port", type=int, default=TRITON_PORTS["metrics"],
                    help=f"Prometheus metrics port (default {TRITON_PORTS['metrics']})")
    ap.add_argument("--world-size", type=int, default=1, help="ranks (TP*PP) of a TensorRT-LLM engine: mpirun form")
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only)")
    ap.add_argument("--llm-model", default="tensorrt_llm", help="LLM model that ranks > 0 load (--world-size > 1)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds to wait until ready")
    ap.add_argument("--log", type=Path, default=None, help="server log file (default: a temporary file)")
    ap.add_argument("--print-argv", action="store_true", help="print the command and exit without starting")
    ap.add_argument("--drain-s", type=int, default=DRAIN_S,
                    help=f"on SIGTERM/SIGINT, seconds tritonserver gets to finish in-flight requests and unload its "
                    f"models before it exits anyway (default {DRAIN_S}, at most {MAX_DRAIN_S}); it is killed "
                    f"{STOP_GRACE_S:g} s after that if still running")
    ap.add_argument("--model-control", choices=("none", "explicit"), default="none",
                    help="explicit: accept model load requests (the admin API), so `adaptive/refresh.py --publish` "
                    "can serve a new head version without a restart (docs/adaptive.md)")
    args = ap.parse_args(argv)
    if args.world_size < 1:
        ap.error(f"--world-size {args.world_size}: must be >= 1")
    if not 0 <= args.drain_s <= MAX_DRAIN_S:
        ap.error(f"--drain-s {args.drain_s}: give whole seconds in [0, {MAX_DRAIN_S}]")
    if (name_problem := model_name_problem(args.llm_model, "--llm-model")) is not None:
        ap.error(name_problem)
    if (why := upstream_model_missing(args.repo)) is not None:
        print(f"error: {why}", file=sys.stderr)
        return 2
    stopping, stopped_by = {"flag": False}, {"signal": ""}

    def _on_signal(signum: int, _frame: object) -> None:
        stopping["flag"], stopped_by["signal"] = True, signal.Signals(signum).name

    # Installed first: a SIGTERM at any moment (even while waiting for readiness) stops the launcher promptly; SIGHUP
    # (the terminal or session went away) too, so that the server is stopped and the launcher says why it ended.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    admin_key = os.environ.get(ADMIN_KEY_ENV) or None
    try:
        restricted_api_argv(admin_key or "unset")
    except ValueError as e:
        ap.error(f"{ADMIN_KEY_ENV}: {e}")
    srv = TritonServer(
        args.repo, grpc_port=args.grpc_port, http_port=args.http_port, metrics_port=args.metrics_port,
        host=args.host, world_size=args.world_size, log_path=args.log, llm_model=args.llm_model, admin_key=admin_key,
        explicit=args.model_control == "explicit", drain_s=args.drain_s,
    )
    if args.print_argv:
        print(srv.shown_argv())
        return 0
    if admin_key is None:
        print(f"admin APIs ({', '.join(RESTRICTED_APIS)}) closed: set {ADMIN_KEY_ENV} to use them with the header "
              f"{ADMIN_HEADER} (HTTP) or {ADMIN_GRPC_HEADER} (gRPC)", file=sys.stderr, flush=True)
    try:
        srv.start(args.timeout, stop_requested=lambda: stopping["flag"])
    except LaunchInterrupted:
        print(f"stopped before the server was ready ({stopped_by['signal']} received)", flush=True)
        print(f"launcher stopped by {stopped_by['signal']} while the server was loading", file=sys.stderr, flush=True)
        return 0
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    # the stubs are known before anyone hears the server is ready: one killed from then on is seen
    watch = supervise.StubWatch(srv.pid, srv.model_ready) if srv.pid is not None else None
    if watch is not None:
        watch.poll()
    print(f"tritonserver ready (pid {srv.pid}, log {srv.log_path})", flush=True)
    print(f"  grpc     {srv.grpc_url}\n  http     http://{srv.http_url}\n  metrics  {srv.metrics_url}", flush=True)
    dead = _supervise(srv, watch, lambda: stopping["flag"])
    died = dead or not srv.is_running()
    code = srv.stop()
    print(f"tritonserver stopped (exit code {code})", flush=True)
    return 1 if died and not stopping["flag"] else 0


def _supervise(srv: TritonServer, watch: supervise.StubWatch | None, stop_requested: Callable[[], bool]) -> bool:
    """Wait until a stop is requested, the server exits, or a model's stub dies behind a ready server (True: the
    launcher stops the server and exits 1, triton_repo/supervise.py)."""
    while not stop_requested() and srv.is_running():
        if watch is not None and (dead := watch.poll()) is not None:
            print(f"error: {dead}", file=sys.stderr, flush=True)
            return True
        time.sleep(supervise.POLL_S)
    return False


if __name__ == "__main__":
    sys.exit(main())
