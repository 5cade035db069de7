"""What the served-build suites share (scripts/reliability.py, scripts/hardening.py, bench/bench_abandon.py): gRPC
inputs from (name, array, datatype) triples, the --runs check, and one real tritonserver on the repository running the
chosen runs in order, the load average at start and end written beside the results."""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

from triton_repo.launch import TritonServer, free_port


def grpc_inputs(triples: Iterable[tuple[str, np.ndarray, str]]) -> list[Any]:
    """One InferInput per (input name, array, Triton datatype), its data set from the array."""
    out = []
    for name, arr, datatype in triples:
        i = grpcclient.InferInput(name, list(arr.shape), datatype)
        i.set_data_from_numpy(arr)
        out.append(i)
    return out


def ensemble_stream(text: str | bytes, max_tokens: int) -> list[Any]:
    """A streamed ensemble request that never ends early (end_id -1): it runs for all `max_tokens`."""
    return grpc_inputs([("text_input", np.array([[text]], dtype=object), "BYTES"),
                        ("max_tokens", np.array([[max_tokens]], np.int32), "INT32"),
                        ("stream", np.array([[True]]), "BOOL"), ("end_id", np.array([[-1]], np.int32), "INT32")])


def llm_stop() -> list[Any]:
    """Upstream's stop request to the tensorrt_llm model (stop=true on a one-token request); the request id names
    which request to stop."""
    one = np.ones((1, 1), np.int32)
    return grpc_inputs([("input_ids", one, "INT32"), ("input_lengths", one, "INT32"),
                        ("request_output_len", one, "INT32"), ("stop", np.ones((1, 1), bool), "BOOL")])


def chosen_runs(ap: argparse.ArgumentParser, runs: str, known: Iterable[str]) -> list[str]:
    """--runs as a list, every name one of `known` (else the parser's usage error)."""
    names, known = runs.split(","), list(known)
    if not set(names) <= set(known):
        ap.error(f"--runs {runs}: choose from {', '.join(known)}")
    return names


def run_suite(repo: Path, out: Path, runs: list[str], run: Callable[[TritonServer, str], Any], report: str) -> int:
    """Serve `repo` with tritonserver, call run(server, name) for each of `runs` in order, write every result (and
    the load average at start and end) to <out>/<report>, and print where it went."""
    out.mkdir(parents=True, exist_ok=True)
    srv = TritonServer(repo.resolve(), grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(),
                       log_path=out / "tritonserver.log")
    srv.start(timeout_s=600)
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                               "load_average": os.getloadavg(), "cpus": os.cpu_count()}
    try:
        for name in runs:
            results[name] = run(srv, name)
    finally:
        results["load_average_end"] = os.getloadavg()
        srv.stop(timeout_s=10)
        (out / report).write_text(json.dumps(results, indent=2) + "\n")
    print(f"load average {results['load_average'][0]:.1f} at start, {results['load_average_end'][0]:.1f} at end "
          f"({results['cpus']} CPUs); {out / report}")
    return 0
