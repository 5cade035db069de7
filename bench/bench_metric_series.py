r"""The LLM model's metric series on /metrics across published versions: do unloaded versions stop exporting?

    .venv/bin/python bench/bench_metric_series.py --build build/demo [--publishes 10] [--model tensorrt_llm]

Starts a server (explicit model control) on a scratch copy of --build's model repository (the rest of the build is
linked, not copied; the build itself is not changed), sends one request, then publishes --publishes new versions the
way adaptive/refresh.py --publish serves them (the newest version's files as version N+1, then the server's load
API: version policy latest 1 loads N+1 and unloads N), one request after each. After each publish it counts the
eagle_* series of --model on /metrics once the unload has settled (or after --settle-s).

Inputs:  --build, a build directory with a rendered triton_repo (reference backend)
Outputs: one line per publish (series, versions exported) and the first and last counts on stdout
Guide:   docs/deploy.md ("Model versions and their metric series")
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from adaptive.publish import load
from triton_repo.launch import TritonServer, free_port

SERIES = re.compile(r'^(eagle_[a-z_]+)\{([^}]*)\} \S+$')
KEY = "bench-metric-series"


def scratch_build(build: Path, into: Path) -> Path:
    """`into`/build: a copy of the model repository, every other entry of the build linked."""
    out = into / "build"
    out.mkdir()
    for entry in build.iterdir():
        if entry.name == "triton_repo":
            shutil.copytree(entry, out / entry.name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (out / entry.name).symlink_to(entry.resolve())
    return out


def exported(srv: TritonServer, model: str) -> tuple[int, list[str]]:
    """(series of `model`, the versions they carry)."""
    text = urllib.request.urlopen(srv.metrics_url, timeout=10).read().decode()
    labels = [m.group(2) for line in text.splitlines()
              if (m := SERIES.match(line)) and f'model="{model}"' in m.group(2)]
    versions = sorted({v.group(1) for lab in labels if (v := re.search(r'version="(\d+)"', lab))}, key=int)
    return len(labels), versions


def ask(srv: TritonServer) -> None:
    import tritonclient.grpc as grpcclient

    from testkit.triton_requests import inputs, stream_call

    c = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        stream_call(c, "ensemble", inputs("the quick brown fox", 4))
    finally:
        c.close()


def settled(srv: TritonServer, model: str, version: int, settle_s: float) -> tuple[int, list[str]]:
    deadline = time.monotonic() + settle_s
    got = exported(srv, model)
    while got[1] != [str(version)] and time.monotonic() < deadline:
        time.sleep(0.25)
        got = exported(srv, model)
    return got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--build", type=Path, required=True, help="the build directory (its triton_repo is copied)")
    ap.add_argument("--publishes", type=int, default=10, help="new versions published one after another")
    ap.add_argument("--model", default="tensorrt_llm", help="the LLM model whose versions are published")
    ap.add_argument("--settle-s", type=float, default=30.0, help="how long to wait for an old version's series to go")
    args = ap.parse_args(argv)
    if not (args.build / "triton_repo" / args.model / "1").is_dir():
        print(f"error: --build {args.build} has no triton_repo/{args.model}/1; build it first", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        build = scratch_build(args.build, Path(tmp))
        srv = TritonServer(build / "triton_repo", grpc_port=free_port(), http_port=free_port(),
                           metrics_port=free_port(), log_path=Path(tmp) / "tritonserver.log", admin_key=KEY,
                           explicit=True).start(timeout_s=600)
        try:
            ask(srv)
            first = exported(srv, args.model)
            print(f"version 1: {first[0]} series, versions exported {first[1]}", flush=True)
            model_dir, last = build / "triton_repo" / args.model, first
            for v in range(2, args.publishes + 2):
                shutil.copytree(model_dir / str(v - 1), model_dir / str(v),
                                ignore=shutil.ignore_patterns("__pycache__"))
                load(srv.http_url, KEY, args.model, v)
                ask(srv)
                last = settled(srv, args.model, v, args.settle_s)
                print(f"publish {v - 1} (version {v}): {last[0]} series, versions exported {last[1]}", flush=True)
        finally:
            srv.stop()
    print(f"series of {args.model}: {first[0]} with one version, {last[0]} after {args.publishes} publishes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
