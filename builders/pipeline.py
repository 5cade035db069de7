"""Stage machinery: atomic output directories, manifests, skip-if-unchanged.

A stage is a function `run(ctx) -> list[argv]` that reads its inputs and writes into `ctx.out` (a temporary
directory). The runner then writes `manifest.json` and renames the temporary directory into place, so a crash
never leaves a half artifact that a rerun would trust. A stage is skipped when its manifest records the same
config hash and the same input fingerprints.

Each stage writes only what something reads: its `plan_outputs` name every output with who reads it (a later stage,
the serving path of the config's line and backend, or a documented tool), printed by --dry-run and recorded in the
manifest (`planned_outputs`). Paths in the manifest are relative to the build directory (core/records.py).

Adding a stage = writing its `run` function and one `Stage(...)` entry in `builders/stages.py`.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from builders import build_dir as owned
from core.atomic import atomic_dir
from core.records import relative_record
from builders.config import BuildConfig
from builders.layout import MANIFEST, STAGE_DIRS

TRACKED_PACKAGES = ("eagle-deploy", "torch", "transformers", "safetensors", "nvidia-modelopt", "tensorrt_llm")


class StageError(RuntimeError):
    """A stage failed in a way the user can fix; the message says how."""


@dataclass
class StageContext:
    cfg: BuildConfig
    build_dir: Path
    out: Path  # temporary output directory of this stage
    final: Path  # where `out` will be renamed to
    log_path: Path
    commands: list[list[str]] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)  # free-form facts recorded in the manifest

    def stage_dir(self, name: str) -> Path:
        """Final directory of an earlier stage (its output is complete: stages run in order)."""
        return self.build_dir / name

    def run_command(self, argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        """Run an external command, logging its output to the stage log; the argv goes into the manifest."""
        self.commands.append(argv)
        with self.log_path.open("a") as log:
            log.write(f"$ {' '.join(argv)}\n")
            log.flush()
            proc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        if proc.returncode != 0:
            raise StageError(
                f"command failed with exit code {proc.returncode}: {' '.join(argv)} (log: {self.log_path})"
            )


@dataclass(frozen=True)
class Output:
    """One thing a stage writes inside its directory, what it is, and who reads it."""

    path: str
    what: str
    read_by: str

    def record(self) -> dict[str, str]:
        return {"path": self.path, "what": self.what, "read_by": self.read_by}


@dataclass(frozen=True)
class Stage:
    name: str
    description: str
    # The user's inputs outside the build dir (model files...) and earlier stages whose outputs this stage reads.
    external_inputs: Callable[[BuildConfig], list[Path]]
    depends_on: tuple[str, ...]
    run: Callable[[StageContext], None]
    # Commands this stage would run, for --dry-run (pure: computed from the config only).
    plan_commands: Callable[[BuildConfig, Path], list[list[str]]] = lambda cfg, build_dir: []
    # Checks run for every stage BEFORE anything is written (bad weights, mismatched head...): problems, not raises.
    preflight: Callable[[BuildConfig], list[str]] = lambda cfg: []
    # What this stage writes inside its directory and who reads each (--dry-run, the manifest).
    plan_outputs: Callable[[BuildConfig], list[Output]] = lambda cfg: []
    # The project's own files the output is made from (templates, copied model code): a change reruns the stage, but
    # they are no input of the user's, so --dry-run does not list them.
    source_files: Callable[[BuildConfig], list[Path]] = lambda cfg: []


# ---- fingerprints -------------------------------------------------------------------------------------------------


def file_fingerprint(path: Path, full_hash_limit: int = 64 << 20) -> dict[str, Any]:
    """Size + sha256 for small files; size + mtime + sha256 of the first/last MiB for large ones (hashing GBs of
    weights on every rerun would cost more than the skip saves)."""
    st = path.stat()
    h = hashlib.sha256()
    with path.open("rb") as f:
        if st.st_size <= full_hash_limit:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
            kind = "sha256"
        else:
            h.update(f.read(1 << 20))
            f.seek(-(1 << 20), os.SEEK_END)
            h.update(f.read(1 << 20))
            h.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
            kind = "sha256-head-tail-mtime"
    return {"path": str(path), "size": st.st_size, kind: h.hexdigest()}


def tree_fingerprint(root: Path) -> list[dict[str, Any]]:
    if root.is_file():
        return [file_fingerprint(root)]
    if not root.exists():
        return [{"path": str(root), "missing": True}]
    return [file_fingerprint(p) for p in sorted(root.rglob("*")) if p.is_file()]


def package_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in TRACKED_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def _inputs_of(stage: Stage, cfg: BuildConfig, build_dir: Path) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for p in [*stage.external_inputs(cfg), *stage.source_files(cfg)]:
        items.extend(tree_fingerprint(p))
    for dep in stage.depends_on:
        man = build_dir / dep / MANIFEST
        items.append({"stage": dep, "manifest_sha256": hashlib.sha256(man.read_bytes()).hexdigest()})
    return relative_record(items, build_dir)


# ---- running ------------------------------------------------------------------------------------------------------


def _skip_reason(stage: Stage, cfg: BuildConfig, final: Path, inputs: list[dict[str, Any]], verify: bool) -> str | None:
    """Why the existing output can be kept ("unchanged") or None when the stage must run. Outputs damaged since
    the build (missing or resized files; with `verify` changed contents) are rebuilt, with the reason printed."""
    old = owned.read_manifest(final)
    if old is None or old.get("config_hash") != cfg.config_hash() or old.get("inputs") != inputs:
        return None
    damage = owned.output_damage(final, old, verify)
    if damage:
        more = f" (+{len(damage) - 3} more)" if len(damage) > 3 else ""
        print(f"[{stage.name}] outputs changed since the build, rebuilding: {'; '.join(damage[:3])}{more}", flush=True)
        return None
    return "unchanged"


def run_stage(
    stage: Stage, cfg: BuildConfig, build_dir: Path, force: bool = False, verify: bool = False
) -> tuple[Path, bool]:
    """Run one stage atomically. Returns (output dir, whether it ran). Never replaces a directory this build did
    not write (builders/build_dir.py), whatever `force` says."""
    final = build_dir / stage.name
    foreign = owned.foreign_problem(build_dir, stage.name)
    if foreign is not None:
        raise StageError(foreign)
    for dead in owned.dead_temp_dirs(build_dir, list(STAGE_DIRS)):
        print(f"[{stage.name}] removing {dead}: left by a build that is no longer running", flush=True)
        shutil.rmtree(dead, ignore_errors=True)
    inputs = _inputs_of(stage, cfg, build_dir)
    if not force and _skip_reason(stage, cfg, final, inputs, verify) is not None:
        return final, False
    log_path = owned.fresh_log(build_dir, stage.name)
    with atomic_dir(final) as tmp:
        ctx = StageContext(cfg=cfg, build_dir=build_dir, out=tmp, final=final, log_path=log_path)
        t0 = time.time()
        stage.run(ctx)
        manifest = {
            "stage": stage.name,
            "description": stage.description,
            "config_name": cfg.name,
            "config_hash": cfg.config_hash(),
            "inputs": inputs,
            "outputs": owned.output_records(tmp),
            "planned_outputs": [o.record() for o in stage.plan_outputs(cfg)],
            "commands": relative_record(ctx.commands, build_dir),
            "notes": relative_record(ctx.notes, build_dir),
            "versions": package_versions(),
            "argv": relative_record(sys.argv, build_dir),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)),
            "seconds": round(time.time() - t0, 3),
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return final, True
