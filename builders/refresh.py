"""`python builders/refresh.py --build BUILD [--run NAME]`                   refresh: fine-tune and gate a candidate
`python builders/refresh.py --build BUILD --publish BUILD/refresh/RUN [--server HOST:PORT]`    serve it, no restart
`python builders/refresh.py --build BUILD --rollback [--server HOST:PORT]`    serve the version before the newest
`python builders/refresh.py --build BUILD --purge-capture`                   delete everything the store captured

The head learns from the traffic it serves (docs/adaptive.md). A refresh reads the build's capture store (the
newest refresh.max_requests requests), splits it by request into train and held-out, computes the target's features
of the captured sequences (the outputs are the target's own: one forward each, no generation), mixes in
refresh.original_share of the head's original training conversations, fine-tunes a candidate from the served head
(early stop on held-out chain acceptance, at most refresh.epochs, within refresh.train_seconds), and gates it: both
heads' tau and per-position acceptance on the held-out requests, replayed from their features (refresh.gate:
replay) or decoded on the engine (engine: python -m builders.doctor gate), lossless vs the target alone, better by
refresh.gate_margin. Rerunning the same command resumes an unfinished run (its split, features and checkpoints are
kept).

Exit status: 0 the candidate passed the gate (or the publish / rollback / purge was done); 1 the gate refused it (or
the server refused the load); 2 unusable input (no store, too few requests, not an EAGLE-3 reference build).

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

# Run as a file (`python builders/refresh.py`), Python would put builders/ first on sys.path, where a
# module can shadow an installed package (builders/triton: `triton`): run as the module, as its command does.
if __name__ == "__main__" and not __package__:
    os.execv(sys.executable, [sys.executable, "-m", "builders.refresh", *sys.argv[1:]])

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from builders.adaptive.publish import PublishError
from builders.config import BuildConfig


def _input_error(message: str) -> ValueError:
    """The refresh's input error (builders/adaptive/dataset.py, which loads torch: imported when raised, so
    `--help` answers at once)."""
    from builders.adaptive.dataset import RefreshInputError

    return RefreshInputError(message)

EXIT_OK, EXIT_REFUSED, EXIT_UNUSABLE = 0, 1, 2
REPORT = "report.json"


def load_build(build_dir: Path) -> BuildConfig:
    from builders.resolved import load_resolved, resolved_file

    if not resolved_file(build_dir).is_file():
        raise _input_error(f"{resolved_file(build_dir)} not found: {build_dir} is not a finished build "
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


def refresh(build_dir: Path, cfg: BuildConfig, run: Path) -> dict[str, Any]:
    """One refresh run (module doc); returns the report."""
    from builders import layout
    from builders.adaptive import dataset as D
    from builders.adaptive import finetune as F
    from builders.adaptive.publish import served_head
    from builders.adaptive.replay import replay_gate
    from builders.adaptive.settings import store_dir
    from builders.doctor.gate import gate
    from core.spec import read_spec
    from training.compute import apply_compute, resolve_compute
    from training.features import FeatureSpec

    t0, c0, rc = time.monotonic(), time.process_time(), cfg.refresh
    if not cfg.draft.kind.eagle3 or not cfg.engine.kind.reference_engine:
        raise _input_error(f"draft.type={cfg.draft.type}, engine.backend={cfg.engine.backend}: a refresh "
                                "fine-tunes an EAGLE-3 head of an engine.backend=reference build (docs/adaptive.md)")
    spec = read_spec(build_dir)
    run.mkdir(parents=True, exist_ok=True)
    if (run / "train.jsonl").is_file() and (run / "held_out.jsonl").is_file():  # a resumed run keeps its split
        train, held = D.read_jsonl(run / "train.jsonl"), D.read_jsonl(run / "held_out.jsonl")
    else:
        train, held = D.split(D.load_captured(store_dir(cfg), rc.max_requests), rc.held_out_fraction, rc.seed)
        D.write_jsonl(run / "held_out.jsonl", held)
        D.write_jsonl(run / "train.jsonl", train)
    served = F.read_served(served_head(build_dir, cfg.triton.llm_model))
    compute = resolve_compute(F.compute_config(rc.threads))
    apply_compute(compute, False)
    model, tok, target_dir = F.load_target(layout.hf_target_dir(build_dir), compute)
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
    if rc.gate == "replay":
        g = replay_gate(build_dir, served.dir, run / "head", held, D.aux_of(held_s),
                        margin=rc.gate_margin, max_new_tokens=rc.gate_max_new_tokens,
                        engine_requests=rc.gate_engine_requests)
    else:
        g = gate(build_dir, served.dir, run / "head", [c.raw for c in held], margin=rc.gate_margin,
                 max_new_tokens=rc.gate_max_new_tokens)
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
        "gate": g, "gate_command": f"python -m builders.doctor gate --build {build_dir} --current {served.dir} "
        f"--candidate {run / 'head'} --requests {run / 'held_out.jsonl'} --margin {rc.gate_margin} "
        f"--max-new-tokens {rc.gate_max_new_tokens}",
    }


def publish(build_dir: Path, cfg: BuildConfig, run: Path, server: str | None) -> int:
    from builders.adaptive import publish as P

    f = run / REPORT
    if not f.is_file():
        raise _input_error(f"{f} not found: --publish takes a finished refresh run (BUILD/refresh/<run>)")
    report = json.loads(f.read_text())
    if not report["gate"]["publishable"]:
        print(f"refused: the gate did not pass {run.name} (tau {report['tau_before']:.3f} -> "
              f"{report['tau_after']:.3f}); nothing installed", file=sys.stderr)
        return EXIT_REFUSED
    version = P.install(build_dir, cfg.triton.llm_model, run, report["gate"])
    print(f"installed {run.name} as {cfg.triton.llm_model} version {version}", flush=True)
    seconds = _load(server, cfg.triton.llm_model, version)
    report["published"] = {"version": version, "loaded": server is not None, "load_seconds": seconds}
    write_report(run, report)
    P.record(build_dir, {"action": "publish", "run": run.name, "version": version, "tau": report["tau_after"]})
    return EXIT_OK


def _load(server: str | None, llm_model: str, version: int) -> float | None:
    from builders.adaptive.publish import load
    from triton_repo.exposure import ADMIN_KEY_ENV

    if server is None:
        print("no --server: the next server start serves it (or load it: --server HOST:PORT)", flush=True)
        return None
    key = os.environ.get(ADMIN_KEY_ENV)
    if not key:
        raise PublishError(f"${ADMIN_KEY_ENV} is unset: the model-repository API needs the server's admin key")
    seconds = load(server, key, llm_model, version)
    print(f"{llm_model} version {version} serving on {server} (ready after {seconds:.1f} s)", flush=True)
    return seconds


def rollback(build_dir: Path, cfg: BuildConfig, server: str | None) -> int:
    from builders.adaptive import publish as P

    retired, served = P.retire(build_dir, cfg.triton.llm_model)
    print(f"retired version {retired} (kept under {build_dir / 'refresh' / P.RETIRED}); serving version {served}",
          flush=True)
    _load(server, cfg.triton.llm_model, served)
    P.record(build_dir, {"action": "rollback", "retired": retired, "version": served})
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="eagle-refresh", description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--build", type=Path, required=True, help="the build directory (output_dir of the config)")
    ap.add_argument("--run", help="refresh run name under BUILD/refresh/ (default: resume the newest unfinished run, "
                    "else a new one)")
    act = ap.add_mutually_exclusive_group()
    act.add_argument("--publish", type=Path, metavar="RUN_DIR", help="install a gated run's head as the next version")
    act.add_argument("--rollback", action="store_true", help="retire the newest published version")
    act.add_argument("--purge-capture", action="store_true", help="delete every captured request of the build")
    ap.add_argument("--server", metavar="HOST:PORT", help="the running server's HTTP endpoint: load the change now "
                    "(needs --model-control explicit and $TRITON_ADMIN_KEY)")
    args = ap.parse_args(argv)
    try:
        cfg = load_build(args.build)
        if args.purge_capture:
            from builders.adaptive.settings import store_dir
            from triton_repo.models.capture import purge

            print(f"purged {purge(store_dir(cfg))} segment(s) from {store_dir(cfg)}")
            return EXIT_OK
        if args.publish is not None:
            return publish(args.build, cfg, args.publish, args.server)
        if args.rollback:
            return rollback(args.build, cfg, args.server)
        run = run_dir_for(args.build, args.run)
        report = refresh(args.build, cfg, run)
    except (FileNotFoundError, ValueError) as e:  # RefreshInputError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        return EXIT_UNUSABLE
    except PublishError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_REFUSED
    write_report(run, report)
    from builders.doctor.gate import verdict_text

    print(verdict_text(report["gate"]))
    print(f"refresh {run.name}: {report['sizes']}, {report['seconds']['total']:.0f} s; report {run / REPORT}")
    if report["publishable"]:
        print(f"publish it: python builders/refresh.py --build {args.build} --publish {run}")
    return EXIT_OK if report["publishable"] else EXIT_REFUSED


if __name__ == "__main__":
    sys.exit(main())
