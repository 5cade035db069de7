"""Health that tells the truth: the launcher watches the python-backend stubs of the server it started.

A python model runs in a stub process of its own (`triton_python_backend_stub`, started by tritonserver). When one is
killed (SIGKILL: the OOM killer), Triton 2.51 keeps answering 200 on /v2/health/ready, /v2/health/live and the
model's ready endpoint while every request to that model fails. So the launcher (triton_repo/launch.py) polls the
stubs of its server every POLL_S: a stub that is gone (or a zombie) while the server still says its model version is
ready means a dead model behind a ready server; the launcher then stops the server (it turns unready at once) and
exits 1, so whatever runs it (Kubernetes, systemd, docker --restart) restarts it. A stub that ends because its model
was unloaded (an explicit-mode unload or a new version replacing it: adaptive/refresh.py --publish) is not a death:
its model version is no longer ready by then.

Linux only (/proc); elsewhere no stub is seen and nothing is watched.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

STUB = "triton_python_backend_stub"
POLL_S = 0.5  # how often the launcher looks (a /proc scan; the server is not asked anything unless a stub is gone)


@dataclass(frozen=True)
class Stub:
    pid: int
    model: str
    version: str


def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat fields after the command name (state first), or None when the process is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw.rsplit(")", 1)[1].split()


def alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def stubs_of(group: int) -> dict[int, Stub]:
    """The live python-backend stubs of process group `group` (the launcher starts tritonserver as a group leader),
    with the model and version each serves (its first argument: <repo>/<model>/<version>/model.py)."""
    found: dict[int, Stub] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return found
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        fields = _stat(int(d.name))
        if fields is None or fields[0] in ("Z", "X") or len(fields) < 3 or fields[2] != str(group):
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(argv) > 1 and Path(argv[0].decode(errors="replace")).name == STUB:
            model_py = Path(argv[1].decode(errors="replace"))
            found[int(d.name)] = Stub(int(d.name), model_py.parent.parent.name, model_py.parent.name)
    return found


class StubWatch:
    """`poll()` returns what died (a message) or None; `ready(model, version)` asks the server whether that version
    is ready (its /v2/models/<model>/versions/<version>/ready)."""

    def __init__(self, group: int, ready: Callable[[str, str], bool]) -> None:
        self.group, self.ready = group, ready
        self.known: dict[int, Stub] = {}

    def poll(self) -> str | None:
        for pid, stub in stubs_of(self.group).items():
            self.known.setdefault(pid, stub)
        for pid, stub in list(self.known.items()):
            if alive(pid):
                continue
            del self.known[pid]
            if self.ready(stub.model, stub.version):
                return (f"model {stub.model!r} version {stub.version}: its python-backend stub (pid {pid}) died while "
                        "the server still reports the model ready (killed by the OOM killer? see the kernel log); "
                        "stopping tritonserver so that it is restarted")
        return None


def ports_taken(host: str, ports: dict[str, int]) -> list[str]:
    """The ports (name -> number) that cannot be listened on at `host`, each with what to do; one port given twice
    is named too. Checked before the server starts, so that a restart whose predecessor still holds a port (a
    server still stopping, or started by someone else) says so instead of leaving the reason in the server's log.
    SO_REUSEADDR as the servers set it: a port in TIME_WAIT after a stop is free, one a process listens on is not."""
    taken = [f"--{name}-port {port} is also the --{other}-port; give each its own port"
             for i, (name, port) in enumerate(ports.items()) for other, p in list(ports.items())[:i] if p == port]
    for name, port in ports.items():
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError as e:
                taken.append(f"{name} port {port} on {host} is not free ({e.strerror}): another process listens "
                             f"on it (a previous tritonserver still stopping? `ss -ltnp 'sport = :{port}'` names it); "
                             f"stop it or give another --{name}-port")
    return taken
