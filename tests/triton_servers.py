"""Starting the bundled CPU tritonserver in the client tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from triton_repo.launch import TritonServer, free_port


# Teardown: SIGINT, then SIGKILL after this long. The bundled 2.51 server sometimes waits its whole 30 s exit timeout
# for the python backend to unload (seen once in ~10 runs, not reproducible in isolation); the echo model's graceful
# unload is not under test, so do not pay that.
STOP_TIMEOUT_S = 8.0


def server_on(repo: Path, log: Path) -> TritonServer:
    return TritonServer(repo, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(), log_path=log)


@contextlib.contextmanager
def serve(repo: Path, log: Path) -> Iterator[TritonServer]:
    srv = server_on(repo, log).start()
    try:
        yield srv
    finally:
        srv.stop(timeout_s=STOP_TIMEOUT_S)
