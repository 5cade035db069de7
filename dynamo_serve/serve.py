"""`eagle-dynamo serve BUILD`: a build's NVIDIA Dynamo deployment on this machine, the reference engine as the
worker: Dynamo's OpenAI frontend (with its KV-aware router) and N reference-engine workers, aggregated or as
prefill/decode pairs, all on loopback. Prints `ready: <OpenAI base URL> ...` once a request has been served through
the frontend; SIGTERM or Ctrl-C stops everything.

No etcd or NATS: discovery goes through files (Dynamo's `file` backend, in a fresh directory per run), requests over
TCP, events over ZMQ, every listener Dynamo lets us place on 127.0.0.1. The workers publish no KV events (the
reference engine keeps no prefix cache), so the router runs in Dynamo's approximate mode: it remembers which worker
it sent each prefix to. Dynamo itself runs from the Python that has it (scripts/setup_dynamo.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from dynamo_serve import layout

HOST = "127.0.0.1"
READY_ENV = "EAGLE_DYNAMO_READY_FILE"  # a worker touches this file once it is registered (dynamo_serve/worker.py)
REPO_ROOT = Path(__file__).resolve().parents[1]
EPILOG = """\
Inputs:  a build directory whose dynamo/ the build wrote (every trtllm_version '1.4' build)
Outputs: an OpenAI-compatible endpoint at http://127.0.0.1:PORT/v1 until SIGTERM or Ctrl-C; the processes' logs
Guide:   docs/deploy.md (section "NVIDIA Dynamo")"""


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    ready_file: Path | None


def dynamo_python(explicit: str | None) -> str:
    """The interpreter Dynamo runs from: --dynamo-python, else $EAGLE_DYNAMO_PYTHON, else the project's
    .venv-dynamo (scripts/setup_dynamo.sh)."""
    path = explicit or os.environ.get("EAGLE_DYNAMO_PYTHON") or str(REPO_ROOT / ".venv-dynamo" / "bin" / "python")
    if not Path(path).is_file():
        raise SystemExit(f"eagle-dynamo: no Dynamo Python at {path}: run scripts/setup_dynamo.sh (it creates "
                         ".venv-dynamo with ai-dynamo 1.6.1), or pass --dynamo-python PATH")
    return path


def plane_env(state_dir: Path) -> dict[str, str]:
    """Dynamo's planes without etcd or NATS, and its listeners on loopback."""
    return {"DYN_DISCOVERY_BACKEND": "file", "DYN_FILE_KV": str(state_dir / "kv"), "DYN_REQUEST_PLANE": "tcp",
            "DYN_EVENT_PLANE": "zmq", "DYN_TCP_RPC_HOST": HOST, "DYN_EVENT_PLANE_HOST": HOST,
            "DYN_SYSTEM_HOST": HOST, "DYN_HTTP_HOST": HOST}


def frontend_argv(python: str, port: int, router_mode: str) -> list[str]:
    return [python, "-m", "dynamo.frontend", "--http-host", HOST, "--http-port", str(port), "--router-mode",
            router_mode, "--no-router-kv-events", "--discovery-backend", "file", "--request-plane", "tcp",
            "--event-plane", "zmq"]


def worker_argv(python: str, build_dir: Path, role: str, namespace: str, threads: int) -> list[str]:
    return [python, "-m", "dynamo_serve.worker", str(build_dir), "--role", role, "--namespace", namespace,
            "--threads", str(threads)]


def roles(workers: int, disaggregated: bool) -> list[str]:
    """The worker roles to start: N aggregated workers, or N prefill and N decode workers."""
    if workers < 1:
        raise SystemExit(f"eagle-dynamo: --workers {workers} must be at least 1")
    return ["prefill", "decode"] * workers if disaggregated else ["aggregated"] * workers


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="eagle-dynamo", description=__doc__.split("\n\n")[0], epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the build's Dynamo deployment (frontend + reference-engine workers)",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("build_dir", type=Path, help="a build directory with dynamo/ (trtllm_version '1.4')")
    s.add_argument("--workers", type=int, default=1, help="workers (disaggregated: prefill/decode pairs)")
    s.add_argument("--disaggregated", action="store_true", help="separate prefill and decode workers")
    s.add_argument("--http-port", type=int, default=8000, help="the frontend's port on 127.0.0.1")
    s.add_argument("--router-mode", default="kv", choices=["kv", "round-robin", "random"],
                   help="how the frontend picks a worker")
    s.add_argument("--threads", type=int, default=1, help="torch CPU threads per worker")
    s.add_argument("--metrics-port", type=int, default=None, help="worker i serves Dynamo's /metrics (with the "
                   "eagle_* speculative counters) on 127.0.0.1:METRICS_PORT+i (default: no metrics endpoint)")
    s.add_argument("--dynamo-python", default=None, help="the Python with ai-dynamo installed (default: "
                   "$EAGLE_DYNAMO_PYTHON, else .venv-dynamo/bin/python)")
    s.add_argument("--log-dir", type=Path, default=None, help="where the processes' logs go (default: a new "
                   "temporary directory, printed)")
    s.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the deployment to serve")
    return p.parse_args(argv)


def probe(base: str, model: str) -> bool:
    """One token through the frontend: the deployment serves requests."""
    body = json.dumps({"model": model, "prompt": "Hi", "max_tokens": 1, "temperature": 0}).encode()
    req = urllib.request.Request(f"{base}/completions", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return bool(json.loads(r.read()).get("choices"))
    except (urllib.error.URLError, OSError, ValueError):
        return False


class Deployment:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.card = layout.read_card(args.build_dir)
        self.python = dynamo_python(args.dynamo_python)
        self.state = Path(tempfile.mkdtemp(prefix="eagle-dynamo-"))
        self.logs = args.log_dir or self.state / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.env = {k: v for k, v in os.environ.items() if k != "DYN_SYSTEM_PORT"} | plane_env(self.state)
        self.children: list[Child] = []
        self.base = f"http://{HOST}:{args.http_port}/v1"

    def start(self, name: str, argv: list[str], ready: bool, extra_env: dict[str, str] | None = None) -> None:
        ready_file = self.state / f"{name}.ready" if ready else None
        env = dict(self.env, **({READY_ENV: str(ready_file)} if ready_file else {}), **(extra_env or {}))
        log = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 (the child owns it for its lifetime)
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.children.append(Child(name, proc, ready_file))
        print(f"started {name} pid {proc.pid} (log {self.logs / (name + '.log')})", flush=True)

    def launch(self) -> None:
        a = self.args
        self.start("frontend", frontend_argv(self.python, a.http_port, a.router_mode), ready=False)
        build = a.build_dir.resolve()
        for i, role in enumerate(roles(a.workers, a.disaggregated)):
            metrics = {} if a.metrics_port is None else {"DYN_SYSTEM_PORT": str(a.metrics_port + i)}
            self.start(f"{role}-{i}", worker_argv(self.python, build, role, self.card.namespace, a.threads), True,
                       metrics)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.args.timeout
        while time.monotonic() < deadline:
            self.check_alive()
            if all(c.ready_file is None or c.ready_file.exists() for c in self.children) and probe(
                    self.base, self.card.served_model_name):
                mode = "disaggregated" if self.args.disaggregated else "aggregated"
                print(f"ready: {self.base} (model {self.card.served_model_name}, {self.args.workers} "
                      f"{mode} worker{'s' if self.args.workers > 1 else ''})", flush=True)
                return
            time.sleep(0.5)
        raise SystemExit(f"eagle-dynamo: the deployment did not serve within {self.args.timeout:g} s; see the logs "
                         f"in {self.logs}")

    def check_alive(self) -> None:
        """The frontend's death ends the deployment; a worker's is reported once and the rest go on."""
        for c in list(self.children):
            rc = c.proc.poll()
            if rc is None:
                continue
            if c.name == "frontend":
                raise SystemExit(f"eagle-dynamo: the frontend exited ({rc}); see {self.logs / 'frontend.log'}")
            print(f"{c.name} exited ({rc}); the others go on (log {self.logs / (c.name + '.log')})", flush=True)
            self.children.remove(c)

    def stop(self) -> None:
        for c in reversed(self.children):
            if c.proc.poll() is None:
                c.proc.terminate()
        end = time.monotonic() + 15
        for c in self.children:
            try:
                c.proc.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                c.proc.kill()
                c.proc.wait()
        shutil.rmtree(self.state / "kv", ignore_errors=True)
        print("stopped", flush=True)


def serve(args: argparse.Namespace) -> int:
    try:
        dep = Deployment(args)
    except layout.DeploymentMissing as e:
        raise SystemExit(f"eagle-dynamo: {e}") from None

    def on_signal(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        dep.launch()
        dep.wait_ready()
        while True:
            dep.check_alive()
            time.sleep(0.5)
    except KeyboardInterrupt:
        return 0
    finally:
        dep.stop()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    sys.exit(serve(args))


if __name__ == "__main__":
    main()
