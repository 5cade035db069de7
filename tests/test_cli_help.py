"""Every command a user runs answers `--help` (exit 0) naming its inputs, its outputs and the guide that explains it,
and the guide exists. A new entry point (a module with a `__main__` block) must be added here, with its help."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENTRY_DIRS = ("builders", "clients", "core", "engines", "measure", "scripts", "triton_repo", "docker")

# How users run each entry point: a script path, or `-m module` where the docs say `python -m ...`.
ENTRY_POINTS = {
    "builders/build.py": ["builders/build.py"],
    "builders/train_head.py": ["builders/train_head.py"],
    "builders/refresh.py": ["builders/refresh.py"],
    "builders/tune_tree.py": ["builders/tune_tree.py"],
    "measure/model_source.py": ["-m", "measure.model_source"],
    "builders/ledger_check.py": ["-m", "builders.ledger_check"],
    "builders/doctor/__main__.py": ["-m", "builders.doctor"],
    "builders/monitoring/dashboard.py": ["-m", "builders.monitoring.dashboard"],
    "builders/monitoring/rules.py": ["-m", "builders.monitoring.rules"],
    "builders/trtllm/ledger_docs.py": ["-m", "builders.trtllm.ledger_docs"],
    "clients/generate.py": ["clients/generate.py"],
    "clients/loadtest.py": ["clients/loadtest.py"],
    "clients/genai_perf.py": ["-m", "clients.genai_perf"],
    "measure/verify.py": ["-m", "measure.verify"],
    "measure/draft_vocab.py": ["-m", "measure.draft_vocab"],
    "triton_repo/launch.py": ["triton_repo/launch.py"],
    "docker/serve.py": ["docker/serve.py"],
    "docker/k8s/render.py": ["docker/k8s/render.py"],
    "scripts/demo.py": ["scripts/demo.py"],
    "scripts/gen_config_docs.py": ["scripts/gen_config_docs.py"],
    "scripts/bench_client.py": ["scripts/bench_client.py"],
    "scripts/bench_convert.py": ["scripts/bench_convert.py"],
    "scripts/bench_engine.py": ["scripts/bench_engine.py"],
    "scripts/bench_families.py": ["scripts/bench_families.py"],
    "scripts/bench_head.py": ["scripts/bench_head.py"],
    "scripts/bench_kernel.py": ["scripts/bench_kernel.py"],
    "scripts/bench_metrics.py": ["scripts/bench_metrics.py"],
    "scripts/bench_postprocessing.py": ["scripts/bench_postprocessing.py"],
    "scripts/bench_perf_bridge.py": ["scripts/bench_perf_bridge.py"],
    "scripts/bench_train.py": ["scripts/bench_train.py"],
    "scripts/bench_triton.py": ["scripts/bench_triton.py"],
    "scripts/bench_fp8_drafter.py": ["scripts/bench_fp8_drafter.py"],
    "scripts/bench_build_outputs.py": ["scripts/bench_build_outputs.py"],
    "scripts/bench_quant_tau.py": ["scripts/bench_quant_tau.py"],
    "scripts/reliability.py": ["scripts/reliability.py"],
    "scripts/hardening.py": ["scripts/hardening.py"],
    "scripts/bench_train_curve.py": ["scripts/bench_train_curve.py"],
    "scripts/spec_sweep.py": ["scripts/spec_sweep.py"],
    "scripts/bench_served.py": ["scripts/bench_served.py"],
    "scripts/genai_perf_check.py": ["scripts/genai_perf_check.py"],
    "scripts/gpu_bench.py": ["scripts/gpu_bench.py"],
    "scripts/mutation.py": ["scripts/mutation.py"],
    "scripts/bench_adaptive.py": ["scripts/bench_adaptive.py"],
    "scripts/bench_refresh_threads.py": ["scripts/bench_refresh_threads.py"],
}


def _entry_modules() -> set[str]:
    found = set()
    for d in ENTRY_DIRS:
        for path in (ROOT / d).rglob("*.py"):
            if "__pycache__" in path.parts or path.name.startswith("test_"):
                continue
            if re.search(r'^if __name__ == "__main__":', path.read_text(), flags=re.M):
                found.add(path.relative_to(ROOT).as_posix())
    return found


def test_every_entry_point_is_listed() -> None:
    missing = sorted(_entry_modules() - set(ENTRY_POINTS))
    assert not missing, (f"entry points without a --help check: {missing}; give each an argparse help ending with "
                         "Inputs:/Outputs:/Guide: lines and add it to ENTRY_POINTS in tests/test_cli_help.py")
    gone = sorted(set(ENTRY_POINTS) - _entry_modules())
    assert not gone, f"listed entry points that no longer exist or have no __main__ block: {gone}"


def _check_help(name: str, out: str) -> None:
    for label in ("Inputs:", "Outputs:"):
        assert re.search(rf"^{label} +\S", out, flags=re.M), f"{name} --help does not say `{label}`"
    m = re.search(r"^Guide: +((?:docs/[\w.-]+|README)\.md)", out, flags=re.M)
    assert m, f"{name} --help names no guide (a `Guide: docs/....md` line)"
    assert (ROOT / m.group(1)).is_file(), f"{name} --help points at {m.group(1)}, which does not exist"


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_help_names_inputs_outputs_and_guide(name: str) -> None:
    r = subprocess.run([sys.executable, *ENTRY_POINTS[name], "--help"], cwd=ROOT, capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("usage: "), r.stdout[:200]
    _check_help(name, r.stdout)


def test_container_entrypoint_help() -> None:
    env = {**os.environ, "EAGLE_DEPLOY_PYTHON": sys.executable}
    r = subprocess.run(["bash", "docker/entrypoint.sh", "--help"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert "build CONFIG" in r.stdout and "serve BUILD_DIR" in r.stdout
    _check_help("docker/entrypoint.sh", r.stdout)
