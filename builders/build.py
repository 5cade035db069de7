"""`python builders/build.py config.yaml [--set a.b=v ...] [--dry-run] [--force] [--verify] [--only STAGE ...]`

Validates the config (all errors at once, exit 2, nothing written), runs every stage's preflight checks and the
output_dir checks (exit 2, nothing written: see builders/build_dir.py for what the build may replace), then runs the
stages in order, skipping those whose inputs and config are unchanged and whose outputs are intact.

Inputs:  CONFIG.yaml, a build config (every field: docs/config.md; examples: configs/)
Outputs: <output_dir>/checkpoint/, engine/, triton_repo/ (each with manifest.json) and config.resolved.yaml
Guide:   docs/build.md
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from pathlib import Path

# Run as a file (`python builders/build.py`), Python would put builders/ first on sys.path, where a
# module can shadow an installed package (builders/triton: `triton`): run as the module, as its command does.
if __name__ == "__main__" and not __package__:
    os.execv(sys.executable, [sys.executable, "-m", "builders.build", *sys.argv[1:]])


from builders import build_dir as owned
from builders.capacity import DEFER_CAPACITY, capacity_rule
from builders.config import BuildConfig, ConfigError, load_config
from builders.pipeline import Stage, StageError, run_stage
from builders.resolved import dump_resolved
from builders.startup import startup_problems

EXIT_CONFIG = 2
EXIT_STAGE = 1


def select_stages(cfg: BuildConfig, only: list[str] | None) -> list[Stage]:
    from builders.stages import stages_for

    stages = stages_for(cfg)
    if only:
        names = [s.name for s in stages]
        unknown = [o for o in only if o not in names]
        if unknown:
            raise ConfigError([f"--only {u}: no such stage; stages are {', '.join(names)}" for u in unknown])
        stages = [s for s in stages if s.name in only]
    return stages


def print_plan(cfg: BuildConfig, stages: list[Stage]) -> None:
    build_dir = Path(cfg.output_dir)
    print(
        f"plan for {cfg.name!r} -> {build_dir}  (config hash {cfg.config_hash()}, trtllm_version {cfg.trtllm_version})"
    )
    for field, why in cfg.defaults_applied.items():
        section, key = field.split(".", 1)
        print(f"  default {field}={getattr(getattr(cfg, section), key)} ({why})")
    from builders.plan import plan_lines

    print("\n".join(plan_lines(cfg)))
    for i, s in enumerate(stages, 1):
        print(f"  [{i}] {s.name}: {s.description}")
        for p in s.external_inputs(cfg):
            print(f"      input   {p}")
        for dep in s.depends_on:
            print(f"      input   {build_dir / dep}/ (stage {dep})")
        print(f"      output  {build_dir / s.name}/")
        for o in s.plan_outputs(cfg):
            print(f"              {o.path}: {o.what}; read by {o.read_by}")
        for argv in s.plan_commands(cfg, build_dir):
            print(f"      command {' '.join(argv)}")


def pass_through_problems(cfg: BuildConfig) -> list[str]:
    """serving.extra_llm_api_options names the contract ledger does not know for the config's version."""
    from ledger.table import rows_for
    from builders.serving_config import unknown_problems

    v = cfg.version
    known = {r.name for r in rows_for("llmapi.option", v.key)}
    return unknown_problems(cfg.serving.extra_llm_api_options, known, v.name)


def reference_warnings(cfg: BuildConfig) -> list[str]:
    """engine.backend reference: what TensorRT-LLM's PyTorch backend would refuse of this config (the reference
    engine serves it; the same config built for engine.backend pytorch would not be)."""
    from builders.trtllm.rules import tree_kind_problems

    if not cfg.engine.kind.reference_engine:
        return []
    return [f"engine.backend pytorch would refuse this config: {p}" for p in tree_kind_problems(cfg)]


def build_dir_problems(cfg: BuildConfig) -> list[str]:
    """output_dir checks and everything in it the build would replace without having written it (nothing is
    written before these pass)."""
    from builders.stages import stages_for

    build_dir = Path(cfg.output_dir)
    problems = owned.output_dir_problems(build_dir)
    if not problems:
        problems = owned.ownership_problems(build_dir, [s.name for s in stages_for(cfg)])
    return problems


# Writes that fail because of the storage, not the build: no space, over the file size limit (ulimit -f), over
# quota, read-only, I/O error. Reported as the stage's error; any other OSError is a bug and keeps its traceback.
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS, errno.EIO})


def storage_message(e: OSError) -> str:
    where = f" writing {e.filename}" if e.filename else ""
    return (f"{e.strerror or e}{where} (errno {errno.errorcode.get(e.errno or 0, e.errno)}): free space or raise the "
            "limit (df -h, ulimit -f, quota), then rerun")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="eagle-build", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("config", help="YAML build config (see configs/)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config value, e.g. --set engine.max_batch_size=8 (repeatable)")
    ap.add_argument(
        "--dry-run", action="store_true", help="print the plan (stages, inputs, outputs, commands); write nothing"
    )
    ap.add_argument("--force", action="store_true",
                    help="rerun stages even when unchanged (never replaces a directory this build did not write)")
    ap.add_argument("--verify", action="store_true",
                    help="hash every output of a stage before skipping it (always checked: files present, sizes)")
    ap.add_argument("--only", action="append", metavar="STAGE", help="run only these stages (repeatable)")
    args = ap.parse_args(argv)

    try:
        token = DEFER_CAPACITY.set(True)  # checked below with every other problem, so it hides none of them
        try:
            cfg = load_config(args.config, args.overrides)
        finally:
            DEFER_CAPACITY.reset(token)
        stages = select_stages(cfg, args.only)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    # --dry-run refuses what the real run refuses, after printing the plan (a plan needs only the target's
    # config.json, so it can be made before the weights are downloaded)
    problems = capacity_rule(cfg) + startup_problems(cfg.engine.backend, cfg.trtllm_version) + [
        f"[{s.name}] {p}" for s in stages for p in s.preflight(cfg)
    ]
    problems += build_dir_problems(cfg) + pass_through_problems(cfg)
    for warning in reference_warnings(cfg):
        print(f"warning: {warning}", file=sys.stderr)
    if args.dry_run:
        print_plan(cfg, stages)
    if problems:
        print(f"error: {ConfigError(problems, args.config)}", file=sys.stderr)
        return EXIT_CONFIG
    if args.dry_run:
        return 0

    build_dir = Path(cfg.output_dir)
    try:
        build_dir.mkdir(parents=True, exist_ok=True)
        for dead in owned.dead_resolved_temps(build_dir):
            print(f"[setup] removing {dead}: left by a build that is no longer running", flush=True)
            dead.unlink(missing_ok=True)
        owned.write_resolved(build_dir, dump_resolved(cfg))
    except OSError as e:
        if e.errno not in STORAGE_ERRNOS:
            raise
        print(f"error: [setup] {storage_message(e)}", file=sys.stderr)
        return EXIT_STAGE
    for s in stages:
        print(f"[{s.name}] {s.description} ...", flush=True)
        try:
            out, ran = run_stage(s, cfg, build_dir, force=args.force, verify=args.verify)
        except StageError as e:
            print(f"error: [{s.name}] {e}", file=sys.stderr)
            return EXIT_STAGE
        except OSError as e:  # the disk: the stage's temporary directory is gone, its previous output kept
            if e.errno not in STORAGE_ERRNOS:
                raise
            print(f"error: [{s.name}] {storage_message(e)}; the stage's previous output (if any) is kept",
                  file=sys.stderr)
            return EXIT_STAGE
        print(f"[{s.name}] {'done' if ran else 'unchanged, skipped (use --force to redo)'}: {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
