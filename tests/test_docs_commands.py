"""Every command the documentation shows for the project's scripts (tests/docs_commands.py) parses with the script's
current arguments, so renaming or removing a flag cannot silently break a documented command. The commands whose
whole run matters are also run end to end on tiny builds by their own tests (scripts/spec_sweep.py:
tests/test_spec_sweep.py; bench/bench_served.py: tests/test_bench_served.py; ...)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.docs_commands import HARNESS, REPO, Command, documented_commands


def _check(commands: list[Command]) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    p = subprocess.run([sys.executable, "-c", HARNESS], input=json.dumps([[c.script, list(c.args)] for c in commands]),
                       capture_output=True, text=True, cwd=REPO, env=env, check=False, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return list(json.loads(p.stdout.strip().splitlines()[-1]))


def test_the_documented_commands_are_found() -> None:
    cs = documented_commands()
    scripts = {c.script for c in cs}
    assert {"scripts/spec_sweep.py", "bench/bench_served.py", "builders/build.py", "clients/loadtest.py",
            "adaptive/refresh.py"} <= scripts
    sweep = [c for c in cs if c.script == "scripts/spec_sweep.py" and c.page == "docs/load-test.md"]
    assert sweep and sweep[0].args[:2] == ("--build", "build/demo")  # continuation lines joined
    assert {"eagle-build", "eagle-loadtest", "eagle-verify", "eagle-check"} <= scripts  # installed commands too


def test_every_documented_command_parses() -> None:
    cs = documented_commands()
    failed = [f"{c}\n    -> {r}" for c, r in zip(cs, _check(cs), strict=True) if r != "ok"]
    assert not failed, "documented commands that no longer parse:\n" + "\n".join(failed)


def test_a_command_with_a_flag_the_script_does_not_have_is_caught() -> None:
    bad = Command("x.md", "scripts/spec_sweep.py", ("--build", "b", "--prompts", "p", "--out", "o", "--rouns", "2"))
    [outcome] = _check([bad])
    assert outcome.startswith("exit 2:") and "unrecognized arguments: --rouns 2" in outcome
