"""The commands the documentation shows for the project's own scripts (README.md and docs/*.md, their fenced code
blocks: the commands a reader copies; inline code in prose names a script or a flag, not a whole command), as argv
lists, and a harness that checks each one's arguments against the script's current argparse parser without running
it (tests/test_docs_commands.py)."""

from __future__ import annotations

import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SCRIPT = re.compile(r"^(?:scripts|bench|devtools|adaptive|doctor|ledger|builders|clients|measure|training|triton_repo)/"
                    r"[A-Za-z0-9_/]+\.py$")
COMMANDS: dict[str, str] = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
FENCE = re.compile(r"^```.*?$(.*?)^```", re.S | re.M)
SHELL_ENDS = {"&&", "||", "|", ";", ">", ">>", "2>&1", "&"}


@dataclass(frozen=True)
class Command:
    page: str
    script: str
    args: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.page}: {self.script} {' '.join(self.args)}"


def _commands_in(line: str) -> list[tuple[str, list[str]]]:
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return []
    out = []
    for i, w in enumerate(words):
        if re.fullmatch(r"(?:\S*/)?python3?", w) and i + 1 < len(words) and SCRIPT.match(words[i + 1]):
            script, first = words[i + 1], i + 2
        elif w.rsplit("/", 1)[-1] in COMMANDS and (i == 0 or words[i - 1] in SHELL_ENDS or "=" in words[i - 1]):
            script, first = w.rsplit("/", 1)[-1], i + 1  # an installed command, bare or as .venv/bin/eagle-...
        else:
            continue
        args: list[str] = []
        for a in words[first:]:
            if a in SHELL_ENDS:
                break
            args.append(a)
        out.append((script, args))
    return out



def documented_commands() -> list[Command]:
    found: list[Command] = []
    for page in PAGES:
        text = page.read_text()
        name = str(page.relative_to(REPO))
        blocks = [m.group(1).replace("\\\n", " ") for m in FENCE.finditer(text)]
        lines = [line for b in blocks for line in b.splitlines()]
        for line in lines:
            for script, args in _commands_in(line):
                c = Command(name, script, tuple(args))
                if c not in found:
                    found.append(c)
    return found


# Runs in a subprocess: every command's argv through its script's parser, stopping right after a successful parse. An
# installed command (`eagle-build`) runs its main() as pip's wrapper does; a module of a package run as a file
# (`python builders/build.py`) runs as that module, as the file itself would rerun it (`python -m builders.build`).
HARNESS = r'''
import argparse, importlib, io, json, os, runpy, sys, tomllib
orig = argparse.ArgumentParser.parse_args
class Parsed(BaseException):
    pass
def parse_args(self, args=None, namespace=None):
    ns = orig(self, args, namespace)
    raise Parsed()
argparse.ArgumentParser.parse_args = parse_args
commands = tomllib.load(open("pyproject.toml", "rb"))["project"]["scripts"]
results = []
for script, args in json.load(sys.stdin):
    sys.argv = [script, *args]
    err = sys.stderr
    sys.stderr = buf = io.StringIO()
    try:
        if script in commands:
            module, func = commands[script].split(":")
            getattr(importlib.import_module(module), func)()
        elif os.path.isfile(os.path.join(os.path.dirname(script), "__init__.py")):
            runpy.run_module(script[:-3].replace("/", "."), run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(script, run_name="__main__")
        outcome = "ran to the end without parsing arguments"
    except Parsed:
        outcome = "ok"
    except SystemExit as e:
        outcome = f"exit {e.code}: {buf.getvalue().strip()[-600:]}"
    except Exception as e:
        outcome = f"{type(e).__name__}: {e}"
    finally:
        sys.stderr = err
    results.append(outcome)
print(json.dumps(results))
'''
