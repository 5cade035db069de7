"""First contact: the set-up needs no root. scripts/setup_prometheus.sh installs promtool / prometheus only where it
runs as root with apt-get and otherwise says how to install them and succeeds; the tests that need them then skip with
that command as the reason, except in CI (CI set), where they fail instead of passing unrun."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests import prometheus_server

ROOT = Path(__file__).resolve().parents[1]


def _bin(tmp: Path, uid: int, with_prometheus: bool) -> Path:
    """A PATH with only what the script may call: a fake `id` (uid), and fake prometheus / promtool when asked."""
    b = tmp / "bin"
    b.mkdir()
    (b / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    names = ("id", "prometheus", "promtool") if with_prometheus else ("id",)
    for n in names[1:]:
        (b / n).write_text("#!/bin/sh\nexit 0\n")
    for n in names:
        (b / n).chmod(0o755)
    return b


def _run(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([shutil.which("bash") or "/bin/bash", str(ROOT / "scripts" / "setup_prometheus.sh")],
                          env={"PATH": str(path)}, capture_output=True, text=True, timeout=60, check=False)


def test_without_root_it_says_how_to_install_and_succeeds(tmp_path: Path) -> None:
    proc = _run(_bin(tmp_path, 1000, with_prometheus=False))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr
    assert "ERROR" not in out and "sudo apt-get install prometheus" in out and "will skip" in out


def test_present_binaries_are_used_as_they_are(tmp_path: Path) -> None:
    b = _bin(tmp_path, 1000, with_prometheus=True)
    proc = _run(b)
    assert proc.returncode == 0 and proc.stdout.strip() == f"prometheus ready: {b / 'prometheus'}, {b / 'promtool'}"


def test_setup_never_asks_for_sudo() -> None:
    for name in ("setup_env.sh", "setup_env_speculators.sh", "setup_prometheus.sh"):
        text = (ROOT / "scripts" / name).read_text()
        assert not [ln for ln in text.splitlines() if "sudo" in ln and not ln.lstrip().startswith(("#", "echo", '"'))]


def test_missing_binary_skips_with_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="promtool not found on PATH; install it: sudo apt-get install "
                                                    "prometheus"):
        prometheus_server.binary("promtool")


def test_missing_binary_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(RuntimeError, match="prometheus not found on PATH"):
        prometheus_server.binary("prometheus")


def test_data_packages_install_last_and_without_dependencies() -> None:
    """pip checks an installed package's requirements whenever a later install touches what it depends on and prints
    the gaps as `ERROR: pip's dependency resolver ...`: the --no-deps packages (requirements-data.txt, speculators)
    are the last pip installs of their venv."""
    main = [ln for ln in (ROOT / "scripts" / "setup_env.sh").read_text().splitlines() if '"${PIP[@]}" install' in ln]
    assert main[-2:] == ['"${PIP[@]}" install --no-deps -r requirements-data.txt', '"${PIP[@]}" install --no-deps -e .']
    spec = [ln for ln in (ROOT / "scripts" / "setup_env_speculators.sh").read_text().splitlines()
            if '"${PIP[@]}" install' in ln]
    assert spec[-1] == '"${PIP[@]}" install --no-deps "speculators==0.9.0"' and len(spec) == 2
    assert os.access(ROOT / "scripts" / "setup_prometheus.sh", os.X_OK)
