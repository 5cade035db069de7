"""Debian's `prometheus` server for the tests: started on a free loopback port with a scrape config and rule file,
queried through its own HTTP API (/api/v1/query, /api/v1/alerts)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from triton_repo.launch import free_port

INSTALL = ("sudo apt-get install prometheus (Debian's package: the prometheus server and promtool; "
           "scripts/setup_prometheus.sh does it where it runs as root), or put the prometheus and promtool binaries "
           "of a Prometheus release on PATH")


def binary(name: str) -> str:
    """The binary's path. Missing: the test skips, saying how to install it; in CI (CI set, where .ci/run's set-up
    installs it as root) it fails instead, so CI never passes without running it."""
    path = shutil.which(name)
    if path is None:
        msg = f"{name} not found on PATH; install it: {INSTALL}"
        if os.environ.get("CI"):
            raise RuntimeError(msg)
        pytest.skip(msg)
    return path


class Prometheus:
    def __init__(self, root: Path, targets: list[str], rules: Path, interval_s: int = 1) -> None:
        self.root, self.port = root, free_port()
        cfg = {"global": {"scrape_interval": f"{interval_s}s", "evaluation_interval": f"{interval_s}s"},
               "rule_files": [str(rules)],
               "scrape_configs": [{"job_name": "triton", "static_configs": [{"targets": targets}]}]}
        (root / "prometheus.yml").write_text(yaml.safe_dump(cfg))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60) -> Prometheus:
        log = (self.root / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [binary("prometheus"), f"--config.file={self.root / 'prometheus.yml'}",
             f"--storage.tsdb.path={self.root / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{self.url}/-/ready", timeout=2)
                return self
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.3)
        raise RuntimeError(f"prometheus did not become ready; see {self.root / 'prometheus.log'}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)

    def _get(self, path: str, **params: str) -> Any:
        q = f"?{urllib.parse.urlencode(params)}" if params else ""
        doc = json.loads(urllib.request.urlopen(f"{self.url}{path}{q}", timeout=10).read())
        assert doc["status"] == "success", doc
        return doc["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self._get("/api/v1/query", query=expr)["result"]

    def alerts(self) -> list[dict[str, Any]]:
        """Active alerts (pending or firing) with their labels and state."""
        return self._get("/api/v1/alerts")["alerts"]
