"""`eagle-k8s CONFIG [--set a.b=v ...] [--out DIR] [--check]`  (also `python docker/k8s/render.py ...`)

Renders the Kubernetes manifests of one build config (builders/k8s/manifests.py; docs/deploy.md "Kubernetes").
CONFIG can be anywhere: it is checked as the build checks it, then shipped to the cluster inside the manifests (a
ConfigMap the build Job reads), with the same --set overrides. Paths in it are paths on the cluster: the target and
the head under deploy.models_root (the models volume), capture.dir under deploy.capture_root. Where those are not
on this machine, `--models-dir DIR` names a local copy of the models volume to check against (the paths under
deploy.models_root are read under DIR instead); without it, the checks that need the model files are reported.

Files written (one concern each): storage.yaml (PVCs), config.yaml (the config's ConfigMap), models-job.yaml
(deploy.downloads onto the models volume), build-job.yaml, deployment.yaml, service.yaml (the Service and the
headless one every replica resolves under), hpa.yaml, pdb.yaml, refresh-job.yaml (capture.enabled: refresh and
publish to every replica), prometheus-adapter-rules.yaml, servicemonitor.yaml and prometheusrule.yaml (Prometheus
Operator CRDs), leaderworkerset.yaml (LWS CRD: multi-node tensor parallelism). `--check` compares with the files
in DIR instead of writing (exit 1 on a difference).

Exit status: 0 written (or current), 1 --check found a difference, 2 the config is refused (every problem named).

Inputs:  CONFIG, a build config with its `deploy` section
Outputs: the Kubernetes manifests in --out (--check: compare only)
Guide:   docs/deploy.md
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from builders.config import BuildConfig, ConfigError, load_config
from builders.k8s.manifests import Manifest, RenderOptions, render
from builders.versions import CURRENT_GPU_IMAGE, GPU_IMAGE

REPO = Path(__file__).resolve().parents[2]
EXIT_STALE, EXIT_REFUSED = 1, 2


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the adapter config, the shipped config) as readable literal blocks."""


_Dumper.add_representer(
    str, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)
)


def to_text(docs: list[Manifest], header: str) -> str:
    body = "---\n".join(yaml.dump(d, Dumper=_Dumper, sort_keys=False, width=120) for d in docs)
    return header + body


def header(config: str, args: list[str]) -> str:
    cmd = shlex.join(["eagle-k8s", config, *args])
    return (f"# Rendered from {config} by: {cmd}\n"
            "# Do not edit by hand; change the config (its `deploy` section) and regenerate with the same command.\n")


def default_image(cfg: BuildConfig) -> str:
    """deploy.image, else the image that serves the config's TensorRT-LLM line."""

    if cfg.deploy.image:
        return cfg.deploy.image
    return CURRENT_GPU_IMAGE if cfg.version.triton_layout == "llmapi" else GPU_IMAGE


def _relocated(config: Path, models_dir: Path) -> Path:
    """A copy of the config whose paths under deploy.models_root point into `models_dir` (checks only)."""
    from core.config_input import PATH_FIELDS

    data: dict[str, Any] = yaml.safe_load(config.read_text()) or {}
    root = str((data.get("deploy") or {}).get("models_root", "/models")).rstrip("/")
    for section, key in PATH_FIELDS:
        sec = data if section is None else data.get(section)
        if isinstance(sec, dict) and isinstance(sec.get(key), str):
            v = sec[key]
            if v == root or v.startswith(root + "/"):
                sec[key] = str(models_dir.resolve()) + v[len(root):]
            elif not v.startswith(("/", "pip:")):
                sec[key] = str((config.resolve().parent / v).resolve())
    tmp = Path(tempfile.mkdtemp(prefix="eagle-k8s-")) / config.name
    tmp.write_text(yaml.safe_dump(data, sort_keys=False))
    return tmp


def cluster_problems(data: dict[str, Any], cfg: BuildConfig) -> list[str]:
    """What the cluster would refuse that the build's checks cannot see: paths off the volumes (`data`: the config
    as written, with the overrides)."""
    d, problems = cfg.deploy, []
    for section in ("target", "draft"):
        path = str((data.get(section) or {}).get("model", ""))
        if not path.startswith("pip:") and not path.startswith(d.models_root + "/"):
            problems.append(f"{section}.model={path!r} is not on the models volume: give {d.models_root}/<dir> (put "
                            "it there with deploy.downloads and models-job.yaml, docs/deploy.md) or "
                            "pip:<distribution>")
    cap = str((data.get("capture") or {}).get("dir") or "")
    if cfg.capture.enabled and not cap.startswith(d.capture_root + "/"):
        problems.append(f"capture.dir={cap or None!r}: the servers mount the builds volume read-only; set capture.dir "
                        f"to {d.capture_root}/<name> (the capture volume every replica writes)")
    return problems


def load(config: Path, overrides: list[str], models_dir: Path | None) -> BuildConfig:
    """The config after the build's own checks (against `models_dir` for paths under deploy.models_root) and the
    cluster's (ConfigError naming every problem)."""
    from core.config_input import read_config

    cfg = load_config(_relocated(config, models_dir) if models_dir is not None else config, overrides)
    if problems := cluster_problems(read_config(config, overrides), cfg):
        raise ConfigError(problems, str(config))
    return cfg


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="eagle-k8s", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("config", type=Path, help="build config (any path; shipped to the cluster as a ConfigMap)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="config override, as for builders/build.py (the build Job applies it too)")
    ap.add_argument("--models-dir", type=Path, default=None,
                    help="a local copy of the models volume: the config's paths under deploy.models_root are "
                    "checked there")
    ap.add_argument("--out", type=Path, default=Path("k8s"), help="output directory (default ./k8s)")
    ap.add_argument("--check", action="store_true", help="compare with the files in --out; exit 1 on a difference")
    args = ap.parse_args(argv)
    if not args.config.is_file():
        print(f"error: config {args.config} not found", file=sys.stderr)
        return EXIT_REFUSED
    try:
        cfg = load(args.config, args.overrides, args.models_dir)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_REFUSED
    opts = RenderOptions(image=default_image(cfg), config_text=args.config.read_text(),
                         overrides=tuple(args.overrides))
    shown = args.config.as_posix()
    shaping = [x for o in args.overrides for x in ("--set", o)]  # what shaped the files (not --out/--check)
    rendered = render(cfg, opts)
    texts = {f: to_text(docs, header(shown, shaping)) for f, docs in rendered.items() if docs}
    if args.check:
        stale = [f for f, t in texts.items() if not (args.out / f).is_file() or (args.out / f).read_text() != t]
        stale += [f for f, docs in rendered.items() if not docs and (args.out / f).exists()]  # nothing to apply
        for f in stale:
            print(f"stale: {args.out / f} differs from a fresh render; rerun without --check", file=sys.stderr)
        return EXIT_STALE if stale else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for f in (f for f, docs in rendered.items() if not docs and (args.out / f).is_file()):
        (args.out / f).unlink()  # this config has none of these objects (no downloads, capture off)
        print(f"removed {args.out / f}")
    for f, t in texts.items():
        (args.out / f).write_text(t)
        print(f"wrote {args.out / f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
