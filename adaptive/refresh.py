"""`python adaptive/refresh.py --build BUILD [--run NAME]`                   refresh: fine-tune and gate a candidate
`python adaptive/refresh.py --build BUILD --publish BUILD/refresh/RUN [--server HOST:PORT ...]`   serve it, no restart
`python adaptive/refresh.py --build BUILD --rollback [--server HOST:PORT ...]`  serve the version before the newest
`python adaptive/refresh.py --build BUILD --purge-capture`                   delete everything the store captured

The head learns from the traffic it serves (docs/adaptive.md). A refresh reads the build's capture store (the
newest refresh.max_requests requests), splits it by content into train and held-out (near-duplicate prompts stay on
one side; one prompt group is at most refresh.max_group_share of the training requests), computes the target's
features of the captured sequences (the outputs are the target's own: one forward each, no generation), mixes in
refresh.original_share of the head's original training conversations, fine-tunes a candidate from the served head
(early stop on held-out chain acceptance, at most refresh.epochs, within refresh.train_seconds), and gates it: both
heads' tau and per-position acceptance on the held-out requests, replayed from their features (refresh.gate:
replay) or decoded on the engine (engine: python -m doctor gate), lossless vs the target alone, better by
refresh.gate_margin, and no worse on reference prompts never captured (refresh.reference_prompts). The gate records
the content digest of the candidate's files; --publish installs only those files. Rerunning the same command resumes
an unfinished run (its split, features and checkpoints are kept).

--publish and --rollback are transactions over every server named (adaptive/servers.py): the report, the
head's digest, every server's reachability, admin key and model control are checked first, and nothing changes
unless all pass; a load that fails undoes the change on every server. Each outcome is recorded in
BUILD/refresh/published.json. Retention: refresh.keep_versions published versions, refresh.keep_runs run
directories. What a refresh writes is private (directories 0700, files 0600); --purge-capture deletes the store
and the runs' copies of captured data (train.jsonl, held_out.jsonl, feature shards).

Exit status: 0 the candidate passed the gate (or the publish / rollback / purge was done); 1 the gate refused it (or
a server refused the change; nothing changed); 2 unusable input (no store, too few requests, not an EAGLE-3
reference build, a malformed report.json).

Inputs:  BUILD, a finished build with capture.enabled (config.resolved.yaml, checkpoint/, engine/, triton_repo/)
Outputs: BUILD/refresh/<run>/head/ (the candidate, draft.model layout), report.json, train.jsonl, held_out.jsonl;
         --publish: triton_repo/<llm_model>/<N>/ and BUILD/refresh/published.json
Guide:   docs/adaptive.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

# Run as a file (`python adaptive/refresh.py`), Python would put adaptive/ first on sys.path and not the repository
# (where `adaptive` and `builders` are): run as the module, as its command does.
if __name__ == "__main__" and not __package__:
    os.execv(sys.executable, [sys.executable, "-m", "adaptive.refresh", *sys.argv[1:]])

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from adaptive.publish import PublishError, RefreshInputError
from builders.config import BuildConfig

EXIT_OK, EXIT_REFUSED, EXIT_UNUSABLE = 0, 1, 2
REPORT = "report.json"


def load_build(build_dir: Path) -> BuildConfig:
    from builders.resolved import load_resolved, resolved_file

    if not resolved_file(build_dir).is_file():
        raise RefreshInputError(f"{resolved_file(build_dir)} not found: {build_dir} is not a finished build "
                                "(python builders/build.py CONFIG)")
    return load_resolved(build_dir)


def run_dir_for(build_dir: Path, name: str | None) -> Path:
    """--run NAME, else the newest unfinished run (no report.json: resumed), else a new one named by the time."""
    root = build_dir / "refresh"
    if name:
        return root / name
    runs = sorted(p for p in root.glob("run-*") if p.is_dir()) if root.is_dir() else []
    if runs and not (runs[-1] / REPORT).is_file():
        return runs[-1]
    return root / time.strftime("run-%Y%m%d-%H%M%S")


def write_report(run: Path, report: dict[str, Any]) -> None:
    from core.records import relative_record

    tmp = run / f".{REPORT}.tmp"  # paths relative to the build (BUILD/refresh/<run>): no directory of this machine
    tmp.write_text(json.dumps(relative_record(report, run.parent.parent), indent=2) + "\n")
    tmp.replace(run / REPORT)


def engine_build(build_dir: Path, cfg: BuildConfig, twin: Path | None) -> Path:
    """The build whose reference engine computes the features and runs the gates: the build itself
    (engine.backend reference), or for a current-line PyTorch-backend build its reference twin, a build of the same
    config with engine.backend reference (the served build's store, head versions and repository stay the ones
    refreshed and published)."""
    if not cfg.draft.kind.eagle3 or not (cfg.engine.kind.reference_engine or cfg.engine.kind.llmapi_model):
        raise RefreshInputError(f"draft.type={cfg.draft.type}, engine.backend={cfg.engine.backend}: a refresh "
                                "fine-tunes an EAGLE-3 head of an engine.backend=reference or pytorch build "
                                "(docs/adaptive.md)")
    if twin is None:
        if cfg.engine.kind.reference_engine:
            return build_dir
        raise RefreshInputError(f"engine.backend={cfg.engine.backend}: give --twin TWIN, a reference build of the "
                                "same config (python builders/build.py CONFIG --set engine.backend=reference --set "
                                "output_dir=TWIN): the refresh computes the target's features and gates on its "
                                "reference engine (docs/adaptive.md, 'On a GPU')")
    tw = load_build(twin)
    wrong = [f"{k}: {a!r} here, {b!r} in the twin" for k, a, b in (
        ("engine.backend", "reference", tw.engine.backend), ("target.model", cfg.target.model, tw.target.model),
        ("draft.model", cfg.draft.model, tw.draft.model), ("tree", cfg.tree, tw.tree)) if a != b]
    if wrong:
        raise RefreshInputError(f"--twin {twin} is not a reference build of this config ({'; '.join(wrong)}); "
                                "build it from the same config with --set engine.backend=reference")
    return twin


def refresh(build_dir: Path, cfg: BuildConfig, run: Path, twin: Path | None = None) -> dict[str, Any]:
    """One refresh run (module doc); returns the report."""
    from builders import layout
    from adaptive import dataset as D
    from adaptive import finetune as F
    from adaptive.publish import head_digest, served_head
    from adaptive.replay import replay_gate
    from builders.capture_settings import store_dir
    from doctor.gate import gate
    from core.spec import read_spec
    from training.compute import apply_compute, resolve_compute
    from training.features import FeatureSpec

    t0, c0, rc = time.monotonic(), time.process_time(), cfg.refresh
    eng = engine_build(build_dir, cfg, twin)
    spec = read_spec(eng)
    private(build_dir / "refresh")
    private(run)
    if (run / "train.jsonl").is_file() and (run / "held_out.jsonl").is_file():  # a resumed run keeps its split
        train, held = D.read_jsonl(run / "train.jsonl"), D.read_jsonl(run / "held_out.jsonl")
    else:
        train, held = D.split(D.load_captured(store_dir(cfg), rc.max_requests), rc.held_out_fraction, rc.seed,
                              rc.max_group_share)
        D.write_jsonl(run / "held_out.jsonl", held)
        D.write_jsonl(run / "train.jsonl", train)
    prune_runs(build_dir, rc.keep_runs, run)  # retention, once this run has its data
    served = F.read_served(served_head(build_dir, cfg.triton.llm_model))
    compute = resolve_compute(F.compute_config(rc.threads))
    apply_compute(compute, False)
    model, tok, target_dir = F.load_target(layout.hf_target_dir(eng), compute)
    ref_file = Path(rc.reference_prompts) if rc.reference_prompts else D.REFERENCE_PROMPTS
    ref = D.reference_records(ref_file, tok, cfg.request_limits().max_input_len)
    fspec = FeatureSpec(tuple(served.layer_ids), F.FEATURE_DTYPE)
    n_orig = round(rc.original_share * len(train))
    orig = D.original_sequences(Path(cfg.draft.model) / "recipe.yaml", tok, n_orig, rc.max_seq_len)
    work = run / "work"
    seqs = [D.captured_sequence(c, rc.max_seq_len) for c in train] + orig
    train_s = D.feature_samples(model, seqs, fspec, work / "features", "train", F.FEATURES.batch_tokens)
    held_s = D.feature_samples(model, [D.captured_sequence(c, rc.max_seq_len) for c in held], fspec,
                               work / "features", "held_out", F.FEATURES.batch_tokens)
    t_features, c_features = time.monotonic() - t0, time.process_time() - c0
    head, lm_sub = F.load_head(served, model)
    tcfg = F.train_config(rc, served, target_dir, work, run / "head", len(train_s), spec.tree.depth)
    head, lm_sub = head.to(compute.device), lm_sub.to(compute.device, compute.target_dtype)
    fit = F.finetune(tcfg, head, lm_sub, train_s, held_s, compute, rc.patience, rc.train_seconds)
    F.export(head.cpu(), tcfg, json.loads((target_dir / "config.json").read_text()), run / "head", fit["log"])
    t_train, c_train = time.monotonic() - t0 - t_features, time.process_time() - c0 - c_features
    del model, head
    digest = head_digest(run / "head")  # what the gate measures is what --publish installs (checked there)
    if rc.gate == "replay":
        g = replay_gate(eng, served.dir, run / "head", held, D.aux_of(held_s),
                        margin=rc.gate_margin, max_new_tokens=rc.gate_max_new_tokens,
                        engine_requests=rc.gate_engine_requests)
    else:
        g = gate(eng, served.dir, run / "head", [c.raw for c in held], margin=rc.gate_margin,
                 max_new_tokens=rc.gate_max_new_tokens)
    g["reference"] = reference_gate(eng, served.dir, run, rc, ref)
    g["publishable"] = bool(g["publishable"] and g["reference"]["passed"])
    if head_digest(run / "head") != digest:
        raise RefreshInputError(f"{run / 'head'} changed while the gate measured it: rerun the refresh")
    g["head_digest"] = digest
    return {
        "run": run.name, "build": str(build_dir), "store": str(store_dir(cfg)), "served_head": str(served.dir),
        "candidate": str(run / "head"), "published": None, "publishable": g["publishable"],
        "tau_before": g["current"]["tau"], "tau_after": g["candidate"]["tau"], "lossless": g["lossless"],
        "sizes": {"captured_train": len(train), "held_out": len(held), "original": len(orig),
                  "train_tokens": int(sum(int(s.loss_mask.sum()) for s in train_s))},
        "chain_tau": {"before": fit["before"], "by_epoch": fit["by_epoch"], "best_epoch": fit["best_epoch"],
                      "stopped": fit["stopped"], "epoch_seconds": fit["epoch_seconds"]},
        "threads": compute.threads,
        "seconds": {"features": round(t_features, 1), "train": round(t_train, 1),
                    "gate": round(time.monotonic() - t0 - t_features - t_train, 1),
                    "total": round(time.monotonic() - t0, 1)},
        # CPU time of this process (all its threads): the wall time it would take on free cores
        "cpu_seconds": {"features": round(c_features, 1), "train": round(c_train, 1),
                        "gate": round(time.process_time() - c0 - c_features - c_train, 1),
                        "total": round(time.process_time() - c0, 1)},
        "twin": None if twin is None else str(twin),
        "gate": g, "gate_command": f"python -m doctor gate --build {eng} --current {served.dir} "
        f"--candidate {run / 'head'} --requests {run / 'held_out.jsonl'} --margin {rc.gate_margin} "
        f"--max-new-tokens {rc.gate_max_new_tokens}",
    }


def reference_gate(build_dir: Path, current: Path, run: Path, rc: Any, ref: list[dict[str, Any]]) -> dict[str, Any]:
    """Both heads on prompts never captured (refresh.reference_prompts), decoded on the engine: the candidate must be
    lossless there and lose at most refresh.reference_tolerance of tau."""
    from adaptive import dataset as D
    from doctor.gate import gate

    D.write_jsonl(run / "reference.jsonl", [D.Captured(str(r["id"]), r["prompt_ids"], [], True, r) for r in ref])
    g = gate(build_dir, current, run / "head", ref, margin=0.0, max_new_tokens=rc.gate_max_new_tokens)
    cur, cand = g["current"]["tau"], g["candidate"]["tau"]
    return {"prompts": len(ref), "current_tau": cur, "candidate_tau": cand, "lossless": g["lossless"],
            "tolerance": rc.reference_tolerance,
            "passed": bool(g["lossless"] and cand >= cur - rc.reference_tolerance)}


def read_report(run: Path) -> dict[str, Any]:
    """The run's report.json, checked for what a publish relies on (a malformed one: RefreshInputError, exit 2)."""
    f = run / REPORT
    if not f.is_file():
        raise RefreshInputError(f"{f} not found: --publish takes a finished refresh run (BUILD/refresh/<run>)")
    fix = f"rerun the refresh for this run (python adaptive/refresh.py --build BUILD --run {run.name})"
    try:
        report = json.loads(f.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise RefreshInputError(f"{f} is not JSON ({e}); {fix}") from None
    gate = report.get("gate") if isinstance(report, dict) else None
    if not isinstance(gate, dict):
        raise RefreshInputError(f"{f} has no gate figures (a JSON object with `gate`); {fix}")
    wrong = [k for k, ok in (("run", isinstance(report.get("run"), str)),
                             ("tau_before", isinstance(report.get("tau_before"), (int, float))),
                             ("tau_after", isinstance(report.get("tau_after"), (int, float))),
                             ("gate.publishable", isinstance(gate.get("publishable"), bool)),
                             ("gate.head_digest", isinstance(gate.get("head_digest"), str)),
                             ("gate.candidate", isinstance(gate.get("candidate"), dict))) if not ok]
    if wrong:
        raise RefreshInputError(f"{f}: {', '.join(wrong)} missing or of the wrong type; {fix}")
    if report["run"] != run.name:
        raise RefreshInputError(f"{f} is the report of run {report['run']!r}, not of {run.name!r}: a report "
                                f"belongs to the run that made it; {fix}")
    return dict(report)


def _run_in_build(build_dir: Path, run: Path) -> Path:
    root = (build_dir / "refresh").resolve()
    if run.is_symlink() or run.resolve().parent != root:
        raise RefreshInputError(f"{run}: --publish takes a run directory of this build ({root}/<run>), not a link "
                                "or a directory elsewhere")
    return root / run.name


def publish(build_dir: Path, cfg: BuildConfig, run: Path, servers: list[str]) -> int:
    """A transaction: every precondition first (the report, the head's digest, every server reachable, the admin
    key accepted, loads allowed); then install and load on every server; a failure undoes what was done. Every
    outcome is recorded in published.json."""
    from adaptive import publish as P
    from adaptive import servers as S

    run = _run_in_build(build_dir, run)
    report = read_report(run)
    if not report["gate"]["publishable"]:
        print(f"refused: the gate did not pass {run.name} (tau {report['tau_before']:.3f} -> "
              f"{report['tau_after']:.3f}); nothing installed", file=sys.stderr)
        return EXIT_REFUSED
    if P.head_digest(run / "head") != report["gate"]["head_digest"]:
        raise PublishError(f"{run / 'head'} is not the head the gate measured (its files' digest differs from the "
                           "one in report.json); nothing installed: rerun the refresh, then publish its run")
    model = cfg.triton.llm_model
    eps, key = _preflight(servers, model)
    version = P.install(build_dir, model, run, report["gate"])
    print(f"installed {run.name} as {model} version {version}", flush=True)
    try:
        seconds = S.load_all(eps, key, model, version) if eps else {}
    except S.LoadFailed as e:
        P.withdraw(build_dir, model, version)
        stuck = S.restore(e.loaded, key, model, version - 1)
        P.record(build_dir, {"action": "publish-failed", "run": run.name, "version": version, "servers": eps,
                             "error": str(e), "undone_on": e.loaded, "restore_failed_on": stuck})
        raise PublishError(f"{e}; version {version} withdrawn" + (f", restart {', '.join(stuck)}" if stuck else
                                                                  ", every server serves the version before")) from None
    _served(eps, model, version, seconds)
    report["published"] = {"version": version, "loaded": bool(eps), "servers": eps, "load_seconds": seconds}
    write_report(run, report)
    pruned = P.prune(build_dir, model, cfg.refresh.keep_versions) + prune_runs(build_dir, cfg.refresh.keep_runs, run)
    P.record(build_dir, {"action": "publish", "run": run.name, "version": version, "tau": report["tau_after"],
                         "head_digest": report["gate"]["head_digest"], "servers": eps, "load_seconds": seconds,
                         "pruned": pruned})
    return EXIT_OK


def _preflight(servers: list[str], model: str) -> tuple[list[str], str]:
    from adaptive import servers as S

    if not servers:
        print("no --server: the next server start serves it (or load it: --server HOST:PORT)", flush=True)
        return [], ""
    eps, key = S.endpoints(servers), S.admin_key()
    if problems := S.preflight(eps, key, model):
        raise PublishError("nothing was changed:\n" + "\n".join(f"  - {p}" for p in problems))
    return eps, key


def _served(eps: list[str], model: str, version: int, seconds: dict[str, float]) -> None:
    for s in eps:
        print(f"{model} version {version} serving on {s} (ready after {seconds[s]:.1f} s)", flush=True)


def rollback(build_dir: Path, cfg: BuildConfig, servers: list[str]) -> int:
    from adaptive import publish as P
    from adaptive import servers as S

    model = cfg.triton.llm_model
    P.retirable(build_dir, model)  # nothing to roll back: refused before any server is touched
    eps, key = _preflight(servers, model)
    retired, served, kept = P.retire(build_dir, model)
    try:
        seconds = S.load_all(eps, key, model, served) if eps else {}
    except S.LoadFailed as e:
        P.unretire(build_dir, model, retired, kept)
        stuck = S.restore(e.loaded, key, model, retired)
        P.record(build_dir, {"action": "rollback-failed", "retired": retired, "version": served, "servers": eps,
                             "error": str(e), "undone_on": e.loaded, "restore_failed_on": stuck})
        raise PublishError(f"{e}; version {retired} put back" + (f", restart {', '.join(stuck)}" if stuck else
                                                                 ", every server serves it again")) from None
    print(f"retired version {retired} (kept under {kept.parent}); serving version {served}", flush=True)
    _served(eps, model, served, seconds)
    P.record(build_dir, {"action": "rollback", "retired": retired, "version": served, "servers": eps,
                         "load_seconds": seconds})
    return EXIT_OK


PRIVATE_RUN_FILES = ("train.jsonl", "held_out.jsonl", "reference.jsonl")  # token ids of captured prompts


def prune_runs(build_dir: Path, keep: int, current: Path | None = None) -> list[str]:
    """Retention: delete refresh run directories beyond the newest `keep` (never `current`); returns what went."""
    import shutil

    root = build_dir / "refresh"
    runs = sorted((p for p in root.iterdir() if p.is_dir() and not p.is_symlink() and (p / REPORT).is_file()),
                  key=lambda p: p.stat().st_mtime) if root.is_dir() else []
    gone = [p for p in runs[:-keep] if current is None or p.resolve() != current.resolve()] if len(runs) > keep else []
    for p in gone:
        shutil.rmtree(p)
    return [p.relative_to(build_dir).as_posix() for p in gone]


def purge_runs(build_dir: Path) -> int:
    """--purge-capture: every copy of captured data the refresh made (the split's records, the feature shards);
    returns how many files and directories went. Heads and reports stay (no prompt in them)."""
    import shutil

    root, n = build_dir / "refresh", 0
    for run in (p for p in root.iterdir() if p.is_dir() and not p.is_symlink()) if root.is_dir() else []:
        for name in PRIVATE_RUN_FILES:
            for f in (run / name, run / f"{name}.tmp"):
                if f.is_file() or f.is_symlink():
                    f.unlink()
                    n += 1
        if (run / "work").is_dir():
            shutil.rmtree(run / "work")
            n += 1
    return n


def private(path: Path) -> Path:
    """A refresh directory only the owner reads (0700); files written under the process umask 0077 are 0600."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="eagle-refresh", description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--build", type=Path, required=True, help="the build directory (output_dir of the config)")
    ap.add_argument("--run", help="refresh run name under BUILD/refresh/ (default: resume the newest unfinished run, "
                    "else a new one)")
    act = ap.add_mutually_exclusive_group()
    act.add_argument("--publish", type=Path, metavar="RUN_DIR", help="install a gated run's head as the next version")
    act.add_argument("--rollback", action="store_true", help="retire the newest published version")
    act.add_argument("--purge-capture", action="store_true", help="delete every captured request of the build and "
                     "every copy the refresh runs made of them")
    ap.add_argument("--twin", type=Path, metavar="TWIN", help="engine.backend pytorch: a reference build of the same "
                    "config, whose engine computes the features and runs the gates")
    ap.add_argument("--server", dest="servers", action="append", default=[], metavar="HOST:PORT",
                    help="a running server's HTTP endpoint: load the change now (needs --model-control explicit and "
                    "$TRITON_ADMIN_KEY); repeat for every replica, or dns:NAME:PORT for every address of a "
                    "Kubernetes headless Service")
    args = ap.parse_args(argv)
    umask = os.umask(0o077)  # what a refresh writes holds captured prompts: private to this user (0600 / 0700)
    try:
        return _run(args)
    finally:
        os.umask(umask)


def _run(args: argparse.Namespace) -> int:
    try:
        cfg = load_build(args.build)
        if args.purge_capture:
            from builders.capture_settings import store_dir
            from triton_repo.models.capture import purge

            print(f"purged {purge(store_dir(cfg))} segment(s) from {store_dir(cfg)} and "
                  f"{purge_runs(args.build)} refresh file(s) and feature directories under {args.build / 'refresh'}")
            return EXIT_OK
        if args.publish is not None:
            return publish(args.build, cfg, args.publish, args.servers)
        if args.rollback:
            return rollback(args.build, cfg, args.servers)
        run = run_dir_for(args.build, args.run)
        report = refresh(args.build, cfg, run, args.twin)
    except (RefreshInputError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_UNUSABLE
    except PublishError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_REFUSED
    write_report(run, report)
    from doctor.gate import verdict_text

    print(verdict_text(report["gate"]))
    r = report["gate"]["reference"]
    print(f"reference prompts ({r['prompts']}, never captured): tau {r['current_tau']:.3f} -> {r['candidate_tau']:.3f}"
          f", lossless {r['lossless']}: {'passed' if r['passed'] else 'REFUSED'} (tolerance {r['tolerance']})")
    print(f"refresh {run.name}: {report['sizes']}, {report['seconds']['total']:.0f} s; report {run / REPORT}")
    if report["publishable"]:
        print(f"publish it: python adaptive/refresh.py --build {args.build} --publish {run}")
    return EXIT_OK if report["publishable"] else EXIT_REFUSED


if __name__ == "__main__":
    sys.exit(main())
