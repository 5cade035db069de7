r"""Records lost when two capture writers share one store from different PID namespaces (replicas on one volume).

    sudo .venv/bin/python bench/bench_capture_writers.py [--records 10] [--module triton_repo/models/capture.py]

Two scenarios, each run as separate processes in fresh PID namespaces (`unshare -p -f --mount-proc`, root only):
1. "live open segment": writer A (this host's namespace) writes 3 records and keeps its segment open; writer B starts in
   another namespace (its start-up removes open segments it believes dead) and writes --records; then A writes the
   rest of its --records and closes.
2. "same pid": two writers, each pid 1 in its own namespace, write --records each at the same time.
Prints, per scenario, the records written and the records the store holds (lost = the difference). `--module` runs
another copy of the capture module (e.g. an older one, to compare).

Inputs:  --records, --module
Outputs: one line per scenario on stdout
Guide:   docs/deploy.md ("Capture store")
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WRITER = r"""
import importlib.util, sys, time
from pathlib import Path
spec = importlib.util.spec_from_file_location("cap", {module!r}); C = importlib.util.module_from_spec(spec)
sys.modules["cap"] = C
spec.loader.exec_module(C)
s = C.Settings(dir="s", max_bytes=1 << 30, sample_rate=1.0, segment_records=1000, segment_seconds=600.0,
               queue_size=1000)
w = C.Writer(Path({store!r}), s)
first, rest = {first}, {rest}
for i in range(first):
    w.offer({{"id": "{tag}%d" % i}})
time.sleep(0.5)
Path({store!r}, "{tag}.ready").write_text("")
while not Path({store!r}, "go").exists():
    time.sleep(0.05)
for i in range(first, first + rest):
    w.offer({{"id": "{tag}%d" % i}})
w.close()
"""


def namespaced(code: str, own_namespace: bool = True) -> subprocess.Popen[bytes]:
    unshare = ["unshare", "-p", "-f", "--mount-proc"] if own_namespace else []
    return subprocess.Popen([*unshare, sys.executable, "-c", code], cwd=ROOT)


def wait_for(p: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not p.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"{p} never appeared")
        time.sleep(0.05)


def scenario(module: Path, store: Path, same_pid: bool, records: int) -> tuple[int, int]:
    """(written, held) for one scenario."""
    store.mkdir(mode=0o700)
    a = namespaced(WRITER.format(module=str(module), store=str(store), first=3, rest=records - 3, tag="a"), same_pid)
    wait_for(store / "a.ready")
    if same_pid:
        b = namespaced(WRITER.format(module=str(module), store=str(store), first=0, rest=records, tag="b"))
    else:  # B starts while A's segment is open, then writes everything at once
        b = namespaced(WRITER.format(module=str(module), store=str(store), first=records, rest=0, tag="b"))
    wait_for(store / "b.ready")
    (store / "go").write_text("")
    for p in (a, b):
        p.wait(timeout=120)
    spec = importlib.util.spec_from_file_location("cap_reader", module)
    assert spec is not None and spec.loader is not None
    cap = importlib.util.module_from_spec(spec)
    sys.modules["cap_reader"] = cap
    spec.loader.exec_module(cap)
    return 2 * records, len(list(cap.read_records(store)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--records", type=int, default=10, help="records per writer (>= 4)")
    ap.add_argument("--module", type=Path, default=ROOT / "triton_repo/models/capture.py",
                    help="the capture module to run (default: this checkout's)")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("error: run as root: each writer needs its own PID namespace (unshare -p)", file=sys.stderr)
        return 2
    if args.records < 4:
        print("error: --records must be >= 4", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, same) in enumerate((("live open segment", False), ("same pid", True))):
            written, held = scenario(args.module.resolve(), Path(tmp) / f"s{i}", same, args.records)
            print(f"{name}: {written} records written, {held} in the store, {written - held} lost")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
