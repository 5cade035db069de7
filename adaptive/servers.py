"""The servers a publish or rollback reaches: every replica of the deployment, each through Triton's
model-repository API (triton_repo/exposure.py: the admin key in the `eagle-admin-key` header), on servers started
with `--model-control explicit` (docs/adaptive.md, "Every replica").

`--server HOST:PORT` names one server and may be repeated; `--server dns:NAME:PORT` names every address the name
resolves to: a Kubernetes headless Service (clusterIP: None) resolves to the ready pods behind it, so one flag
reaches every replica. A change is a transaction over the set (adaptive/refresh.py): `preflight()` checks every
server first (reachable, the admin key accepted, model control explicit) and nothing is installed unless all pass;
a load that fails on one server undoes the change on the servers that had taken it.
"""

from __future__ import annotations

import os
import secrets
import socket
import urllib.error
import urllib.request

from adaptive.publish import PublishError, load, post
from triton_repo.exposure import ADMIN_HEADER, ADMIN_KEY_ENV

DNS_PREFIX = "dns:"
PROBE_TIMEOUT_S = 10.0
PROBE_MODEL = "eagle-refresh-preflight-probe"  # the server log shows this name for every preflight


class LoadFailed(PublishError):
    """A load failed on one server; `loaded` are the servers that had taken the change before it."""

    def __init__(self, message: str, loaded: list[str]) -> None:
        super().__init__(message)
        self.loaded = loaded


def endpoints(servers: list[str]) -> list[str]:
    """host:port of every server named (dns:NAME:PORT expanded to each address NAME resolves to), in order, once."""
    out: list[str] = []
    for s in servers:
        if s.startswith(DNS_PREFIX):
            name, _, port = s[len(DNS_PREFIX):].rpartition(":")
            if not name or not port.isdigit():
                raise PublishError(f"--server {s!r}: write dns:NAME:PORT (a headless Service and Triton's HTTP port)")
            try:
                infos = socket.getaddrinfo(name, int(port), type=socket.SOCK_STREAM)
            except OSError as e:
                raise PublishError(f"--server {s!r}: {name} does not resolve ({e}); name the headless Service of "
                                   "the deployment (clusterIP: None) in the namespace of the pods") from None
            hosts = sorted({str(i[4][0]) for i in infos})
            out += [f"[{h}]:{port}" if ":" in h else f"{h}:{port}" for h in hosts]
        else:
            host, _, port = s.rpartition(":")
            if not host or not port.isdigit():
                raise PublishError(f"--server {s!r}: write HOST:PORT (Triton's HTTP endpoint) or dns:NAME:PORT")
            out.append(s)
    return list(dict.fromkeys(out))


def admin_key() -> str:
    key = os.environ.get(ADMIN_KEY_ENV)
    if not key:
        raise PublishError(f"${ADMIN_KEY_ENV} is unset: the model-repository API needs the servers' admin key; "
                           "nothing was changed")
    return key


def _reachable(server: str) -> str | None:
    try:
        with urllib.request.urlopen(f"http://{server}/v2/health/live", timeout=PROBE_TIMEOUT_S) as r:
            return None if r.status == 200 else f"{server}: /v2/health/live answered HTTP {r.status}"
    except urllib.error.HTTPError as e:
        return f"{server}: /v2/health/live answered HTTP {e.code}"
    except OSError as e:
        return f"{server}: not reachable ({e}); give Triton's HTTP endpoint HOST:PORT"


def preflight(servers: list[str], key: str, llm_model: str) -> list[str]:
    """Every reason the change could not be loaded on every server, all servers checked (empty: go)."""
    problems = []
    for s in servers:
        if (p := _reachable(s)) is not None:
            problems.append(p)
            continue
        code, body = post(f"http://{s}/v2/repository/index", key, PROBE_TIMEOUT_S)
        if code != 200:
            problems.append(f"{s}: the admin key was refused (HTTP {code} {body.strip()[:200]}); set "
                            f"${ADMIN_KEY_ENV} to the key the server was started with (header {ADMIN_HEADER})")
            continue
        if (p := _loads_on_request(s, key)) is not None:
            problems.append(p)
    return problems


def _loads_on_request(server: str, key: str) -> str | None:
    """Whether the server takes load requests (model control explicit), asked without reloading anything: a load
    of a name no repository holds fails as "failed to load ... failed to poll" where loads are allowed and "not
    allowed" where they are not. Loading the served model itself would reload it whenever its files' times moved
    (the Python backend writes __pycache__ beside model.py), and on Triton 2.51 a reload that starts while the
    previous one's ensemble still drains streamed requests can abort the server (heap corruption)."""
    probe = f"{PROBE_MODEL}-{secrets.token_hex(4)}"
    code, body = post(f"http://{server}/v2/repository/models/{probe}/load", key, PROBE_TIMEOUT_S)
    if code == 503 or "not allowed" in body:
        return (f"{server}: the server does not load models on request (HTTP {code} {body.strip()[:200]}); "
                "start it with `triton_repo/launch.py --model-control explicit`")
    if code in (400, 404, 500) and probe in body:
        return None
    return f"{server}: a load request was answered HTTP {code} {body.strip()[:200]}; see the server log"


def load_all(servers: list[str], key: str, llm_model: str, version: int) -> dict[str, float]:
    """Load on each server in turn and wait until `version` is ready there: {server: seconds}."""
    done: dict[str, float] = {}
    for s in servers:
        try:
            done[s] = load(s, key, llm_model, version)
        except PublishError as e:
            raise LoadFailed(f"{s}: {e}", list(done)) from None
    return done


def restore(servers: list[str], key: str, llm_model: str, version: int) -> list[str]:
    """After an undo: load on each server that had taken the change, so it serves `version` again; the servers
    where that failed (they need a restart)."""
    failed = []
    for s in servers:
        try:
            load(s, key, llm_model, version)
        except PublishError:
            failed.append(s)
    return failed
