"""Every command a user runs answers `--help` (exit 0) naming its inputs, its outputs and the guide that explains it,
and the guide exists. A new entry point (a module with a `__main__` block) must be added here, with its help; a
user-facing one also gets an installed command ([project.scripts] in pyproject.toml), whose --help is run the way the
installed wrapper runs it. No module outside tests/ edits sys.path: the project is installed (`make setup`), and a
package module run as a file reruns itself as `python -m` (checked below)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent
ENTRY_DIRS = ("adaptive", "doctor", "ledger", "builders", "clients", "core", "engines", "measure", "sources",
              "training", "scripts", "triton_repo", "docker", "bench", "devtools", "testkit", "dynamo_serve")
# Where python files live outside tests/ (the sys.path check reads them all).
CODE_DIRS = (*ENTRY_DIRS,)
COMMANDS: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]

# How users run each entry point: a script path, or `-m module` where the docs say `python -m ...`.
ENTRY_POINTS = {
    "builders/build.py": ["builders/build.py"],
    "training/train_head.py": ["training/train_head.py"],
    "adaptive/refresh.py": ["adaptive/refresh.py"],
    "builders/k8s/render.py": ["-m", "builders.k8s.render"],
    "measure/tune_tree.py": ["measure/tune_tree.py"],
    "sources/targets.py": ["-m", "sources.targets"],
    "ledger/check.py": ["-m", "ledger.check"],
    "doctor/__main__.py": ["-m", "doctor"],
    "doctor/eagle_check.py": ["-m", "doctor.eagle_check"],
    "builders/monitoring/dashboard.py": ["-m", "builders.monitoring.dashboard"],
    "builders/monitoring/rules.py": ["-m", "builders.monitoring.rules"],
    "ledger/docs.py": ["-m", "ledger.docs"],
    "clients/generate.py": ["clients/generate.py"],
    "clients/loadtest.py": ["clients/loadtest.py"],
    "clients/genai_perf.py": ["-m", "clients.genai_perf"],
    "measure/verify.py": ["-m", "measure.verify"],
    "measure/draft_vocab.py": ["-m", "measure.draft_vocab"],
    "triton_repo/launch.py": ["triton_repo/launch.py"],
    "docker/serve.py": ["docker/serve.py"],
    "docker/k8s/render.py": ["docker/k8s/render.py"],
    "scripts/demo.py": ["scripts/demo.py"],
    "scripts/tiny_model.py": ["scripts/tiny_model.py"],
    "devtools/gen_config_docs.py": ["devtools/gen_config_docs.py"],
    "bench/bench_client.py": ["bench/bench_client.py"],
    "bench/bench_convert.py": ["bench/bench_convert.py"],
    "bench/bench_engine.py": ["bench/bench_engine.py"],
    "bench/bench_families.py": ["bench/bench_families.py"],
    "bench/bench_head.py": ["bench/bench_head.py"],
    "bench/bench_kernel.py": ["bench/bench_kernel.py"],
    "bench/bench_metrics.py": ["bench/bench_metrics.py"],
    "bench/bench_postprocessing.py": ["bench/bench_postprocessing.py"],
    "bench/bench_perf_bridge.py": ["bench/bench_perf_bridge.py"],
    "bench/bench_train.py": ["bench/bench_train.py"],
    "bench/bench_triton.py": ["bench/bench_triton.py"],
    "bench/bench_fp8_drafter.py": ["bench/bench_fp8_drafter.py"],
    "bench/bench_build_outputs.py": ["bench/bench_build_outputs.py"],
    "bench/bench_quant_tau.py": ["bench/bench_quant_tau.py"],
    "scripts/reliability.py": ["scripts/reliability.py"],
    "scripts/hardening.py": ["scripts/hardening.py"],
    "bench/bench_train_curve.py": ["bench/bench_train_curve.py"],
    "scripts/spec_sweep.py": ["scripts/spec_sweep.py"],
    "bench/bench_served.py": ["bench/bench_served.py"],
    "scripts/genai_perf_check.py": ["scripts/genai_perf_check.py"],
    "scripts/gpu_bench.py": ["scripts/gpu_bench.py"],
    "devtools/mutation.py": ["devtools/mutation.py"],
    "bench/bench_adaptive.py": ["bench/bench_adaptive.py"],
    "bench/bench_refresh_threads.py": ["bench/bench_refresh_threads.py"],
    "bench/bench_switch.py": ["bench/bench_switch.py"],
    "dynamo_serve/serve.py": ["-m", "dynamo_serve.serve"],
    "bench/bench_dynamo.py": ["bench/bench_dynamo.py"],
    "bench/bench_dynamo_loadtest.py": ["bench/bench_dynamo_loadtest.py"],
    "bench/bench_abandon.py": ["bench/bench_abandon.py"],
    "bench/bench_capture_writers.py": ["bench/bench_capture_writers.py"],
    "bench/bench_step.py": ["bench/bench_step.py"],
    "bench/bench_stub_death.py": ["bench/bench_stub_death.py"],
    "bench/bench_vllm_peer.py": ["bench/bench_vllm_peer.py"],
    "bench/bench_metric_series.py": ["bench/bench_metric_series.py"],
    "dynamo_serve/worker.py": ["-m", "dynamo_serve.worker"],
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


# Entry points that are not installed commands, and why: benchmarks (bench/, `bench_*.py`) and developer tools
# (devtools/) run from a checkout; the container's own programs run inside the image (docker/entrypoint.sh).
NOT_COMMANDS = {
    "ledger/docs.py": "developer tool: regenerates docs/contracts.md",
    "docker/serve.py": "the image's `serve` command (docker/entrypoint.sh)",
    "docker/k8s/render.py": "eagle-k8s (builders/k8s/render.py) run from a checkout",
    "devtools/gen_config_docs.py": "developer tool: regenerates docs/config.md and the schemas",
    "devtools/mutation.py": "developer tool: mutation score",
    "dynamo_serve/worker.py": "the Dynamo worker process `eagle-dynamo serve` starts under the Dynamo venv",
}


def _module_of(path: str) -> str:
    mod = path.removesuffix(".py").replace("/", ".")
    return mod.removesuffix(".__main__") if mod.endswith(".__main__") else mod


def _is_benchmark(path: str) -> bool:
    return Path(path).name.startswith("bench_")


def test_every_user_facing_entry_point_is_an_installed_command() -> None:
    targets = {spec.split(":")[0].removesuffix(".__main__") for spec in COMMANDS.values()}
    missing = sorted(p for p in ENTRY_POINTS
                     if _module_of(p) not in targets and p not in NOT_COMMANDS and not _is_benchmark(p))
    assert not missing, (f"user-facing entry points without a [project.scripts] command: {missing}; add one to "
                         "pyproject.toml, or say in NOT_COMMANDS why it is not one")
    for name, spec in COMMANDS.items():
        assert name.startswith("eagle-") and spec.endswith(":main"), (name, spec)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_installed_command_help(name: str) -> None:
    """What the wrapper pip writes does: import the module, call main() with sys.argv = [command, --help]. The usage
    line names the command the user typed, and the help answers without loading torch (seconds on a cold start)."""
    module, func = COMMANDS[name].split(":")
    code = (f"import sys\nsys.argv = [{name!r}, '--help']\nfrom {module} import {func}\ntry:\n    {func}()\n"
            "except SystemExit as e:\n    code = e.code\nprint('torch loaded' if 'torch' in sys.modules else '', "
            "file=sys.stderr)\nsys.exit(code)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith(f"usage: {name} "), r.stdout[:200]
    assert "torch loaded" not in r.stderr, f"{name} --help imports torch (python -X importtime shows from where)"
    _check_help(name, r.stdout)


@pytest.mark.parametrize(("argv", "usage"), [(["gate", "--help"], "usage: eagle-doctor gate "),
                                             (["export", "--help"], "usage: eagle-doctor export ")])
def test_doctor_subcommands_are_listed_and_named(argv: list[str], usage: str) -> None:
    r = subprocess.run([sys.executable, "-m", "doctor", *argv], cwd=ROOT, capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0 and r.stdout.startswith(usage), r.stdout[:300] + r.stderr[-1000:]
    top = subprocess.run([sys.executable, "-m", "doctor", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=180).stdout
    assert f"       {usage.removeprefix('usage: ')}" in top  # the top-level usage lists every subcommand


def _python_files() -> list[Path]:
    return sorted(p for d in CODE_DIRS for p in (ROOT / d).rglob("*.py") if "__pycache__" not in p.parts)


SYS_PATH_EDIT = re.compile(r"sys\.path(\.(insert|append|extend|remove|pop|clear)\(|\[[^\]]*\]\s*=|\s*[+]?=)")
# The one edit left: Triton's python backend starts its own interpreter on a rendered model file, so the models find
# the project through $EAGLE_DEPLOY_HOME there (triton_repo/models/bootstrap.py says how).
SYS_PATH_ALLOWED = {"triton_repo/models/bootstrap.py"}


def test_no_module_outside_tests_edits_sys_path() -> None:
    edits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in _python_files()
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if SYS_PATH_EDIT.search(line) and p.relative_to(ROOT).as_posix() not in SYS_PATH_ALLOWED]
    assert not edits, "modules that edit sys.path (install the project, or run it as `python -m`):\n" + "\n".join(edits)


def test_the_sys_path_check_sees_an_edit() -> None:
    for line in ("sys.path.insert(0, str(REPO))", "sys.path[0] = str(ROOT)", "sys.path.append(x)", "sys.path += [x]"):
        assert SYS_PATH_EDIT.search(line), line
    assert not SYS_PATH_EDIT.search("if home not in sys.path:")


RERUN = re.compile(r'^if __name__ == "__main__" and not __package__:\n'
                   r'    os\.execv\(sys\.executable, \[sys\.executable, "-m", "([\w.]+)", \*sys\.argv\[1:\]\]\)$', re.M)


def test_package_modules_run_as_files_rerun_as_their_own_module() -> None:
    """A documented `python builders/build.py` must run builders.build, not another module (a copied block). The
    product packages' directories hold modules named like installed packages (builders/triton); scripts/ and bench/
    hold programs only, run as files with the project installed."""
    file_run = [p for p, argv in ENTRY_POINTS.items()
                if argv[0] != "-m" and p.split("/")[0] not in ("scripts", "bench", "devtools", "docker")]
    assert "builders/build.py" in file_run
    for p in file_run:
        m = RERUN.search((ROOT / p).read_text())
        assert m, f"{p} is run as a file but does not rerun itself as a module"
        assert m.group(1) == _module_of(p), (p, m.group(1))
