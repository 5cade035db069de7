"""Cost of the production metrics: requests/s of the same tiny build served with and without them.

    python bench/bench_metrics.py [--work DIR] [--seconds 20] [--concurrency 4] [--rounds 2] [--max-tokens 16]

Builds a tiny target + EAGLE-3 head (testkit/tiny_models.py) into the `llmapi` layout on the reference engine
(trtllm_version 1.4, engine.backend reference, chain-3). "with" serves the Triton repository as rendered. The
product has no switch that turns the metrics off, so "without" serves a copy this script makes of that repository
(build/triton_repo_without, next to the original: the repository's paths are relative to it): the same current
code, with the LLM model's `SpecMetrics` (triton_repo/models/spec_metrics.py) replaced by a no-op when the model
loads. In the copy, the rendered `tensorrt_llm/1/model.py` is renamed `rendered_model.py`, and a new `model.py`
subclasses its TritonPythonModel, swaps `spec_metrics.SpecMetrics` for the no-op, then runs the rendered
`initialize`. Nothing in the product changes.
What the baseline removes: registering the eagle_llm_* metric families with Triton, every increment and set on them
(per streamed step, per admission and completion, per finished request's counters and draft positions), and their
lines in /metrics. What it keeps: everything else, including the calls into the metrics object (they reach no-op
methods) and Triton's own nv_* metrics. Each run checks that its server's /metrics has the eagle_llm_* families
("with") or none of them ("without"), so a baseline that no longer removes them fails instead of measuring.
Each round starts a fresh tritonserver per variant (ABBA order: load drifts and going first hit both), sends
4 warm-up requests, then runs `concurrency` closed-loop HTTP clients (POST /v2/models/tensorrt_llm/generate, greedy,
max_tokens) for `seconds` while a scraper reads /metrics every second, as Prometheus would. Reported: completed
requests/s per variant and round, each variant's spread (max - min over its rounds), and the ratio with/without of
the per-variant means.

Inputs:  none (tiny random models)
Outputs: the figures on stdout
Guide:   docs/benchmarks.md ("Cost of the production metrics")
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent

if TYPE_CHECKING:
    from triton_repo.launch import TritonServer

PROMPTS = ["the quick brown fox", "hello world how are you", "one two three four", "a story about a cat"]


# The "without" variant's model.py (see the module docstring). The rendered model imports `spec_metrics` inside
# initialize() and calls `spec_metrics.SpecMetrics(...)` there, so replacing the module's attribute first is enough;
# each python model runs in its own stub process, so nothing else sees the swap.
METRICS_OFF_MODEL = '''"""bench/bench_metrics.py's baseline: the rendered model with SpecMetrics a no-op."""

from typing import Any

import rendered_model
from eagle_bootstrap import project_on_path


class _Off:
    def increment(self, value: float) -> None:
        pass

    def set(self, value: float) -> None:
        pass


class NoMetrics:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from triton_repo.models.spec_metrics import REQUEST_SPECS, SPEC_SPECS

        for attr, *_ in REQUEST_SPECS + SPEC_SPECS:
            setattr(self, attr, _Off())

    def counts(self, in_flight: int, queued: int) -> None:
        pass

    def add(self, *args: Any) -> None:
        pass

    def finished(self, job: Any) -> None:
        pass


class TritonPythonModel(rendered_model.TritonPythonModel):
    def initialize(self, args: dict[str, Any]) -> None:
        project_on_path(args)
        from triton_repo.models import spec_metrics

        spec_metrics.SpecMetrics = NoMetrics
        super().initialize(args)
'''
METRIC_PREFIX = "eagle_llm_"


def metrics_off_copy(repo: Path, dest: Path) -> Path:
    """A copy of the rendered repository whose LLM model loads with the metrics replaced by a no-op. Its paths are
    relative to the repository (build_dir ".."), so the copy goes next to the original, inside the build."""
    shutil.copytree(repo, dest)
    version = dest / "tensorrt_llm" / "1"
    (version / "model.py").rename(version / "rendered_model.py")
    (version / "model.py").write_text(METRICS_OFF_MODEL)
    return dest


def check_metrics(srv: TritonServer, expected: bool) -> None:
    """Refuse to report a run whose server exports the speculative metrics when it should not, or the reverse."""
    text = urllib.request.urlopen(srv.metrics_url, timeout=10).read().decode()
    found = sorted({line.split("{")[0] for line in text.splitlines() if line.startswith(METRIC_PREFIX)})
    if expected and f"{METRIC_PREFIX}generated_tokens_total" not in found:
        raise SystemExit(f"the 'with' server on {srv.repo} exports no {METRIC_PREFIX}generated_tokens_total")
    if not expected and found:
        raise SystemExit(f"the 'without' server on {srv.repo} still exports {', '.join(found)}: the baseline no "
                         "longer removes the metrics (see METRICS_OFF_MODEL)")


def build(work: Path) -> Path:
    from builders.build import main as build_main
    from testkit import tiny_models as tm

    target = tm.make_target(work / "target", layers=4)
    head = tm.make_eagle3_head(work / "eagle3", target)
    cfg_h = json.loads((head / "config.json").read_text())
    cfg_h["eagle_aux_hidden_state_layer_ids"] = [1, 2, 3]
    (head / "config.json").write_text(json.dumps(cfg_h))
    cfg = work / "bench.yaml"
    cfg.write_text(
        f"name: bench-metrics\ntrtllm_version: '1.4'\noutput_dir: {work / 'build'}\n"
        f"target: {{model: {target}, dtype: float32}}\ndraft: {{type: eagle3, model: {head}}}\n"
        "tree: {choices: chain-3}\n"
        "engine: {backend: reference, device: cpu, max_batch_size: 4, max_input_len: 48, max_seq_len: 128}\n"
    )
    if build_main([str(cfg)]) != 0:
        raise SystemExit("build failed")
    return work / "build" / "triton_repo"


def run_level(srv: TritonServer, seconds: float, concurrency: int, max_tokens: int) -> float:
    """Closed-loop HTTP clients (POST /v2/models/tensorrt_llm/generate, greedy, max_tokens): requests/s."""
    from testkit.triton_servers import closed_loop_rps

    url = f"http://{srv.http_url}/v2/models/tensorrt_llm/generate"

    def post(prompt: str) -> None:
        body = json.dumps({"text_input": prompt, "sampling_param_max_tokens": max_tokens}).encode()
        req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=120).read()

    return closed_loop_rps(srv, seconds, concurrency, PROMPTS, lambda: (post, lambda: None))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Inputs:  the demo target and head (built into --work)\n"
               "Outputs: requests/s with and without the production metrics, printed\nGuide:   docs/benchmarks.md")
    ap.add_argument("--work", type=Path, default=None, help="working directory (default: a temporary one)")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=16)
    args = ap.parse_args(argv)
    from testkit.triton_servers import with_without_rounds

    import statistics

    work = args.work or Path(tempfile.mkdtemp(prefix="bench_metrics_"))
    repo = build(work)
    bare = metrics_off_copy(repo, repo.parent / "triton_repo_without")
    runs: dict[Path, list[float]] = {repo.resolve(): [], bare.resolve(): []}

    def measure(srv: TritonServer) -> float:
        rps = run_level(srv, args.seconds, args.concurrency, args.max_tokens)
        check_metrics(srv, expected=srv.repo == repo.resolve())
        runs[srv.repo].append(rps)
        return rps

    w, wo = with_without_rounds(bare, repo, work, args.rounds, measure)
    for name, path in (("without", bare), ("with", repo)):
        r = runs[path.resolve()]
        print(f"{name:>7}: mean {statistics.mean(r):.2f}, min {min(r):.2f}, max {max(r):.2f}, "
              f"spread {max(r) - min(r):.2f} requests/s over {len(r)} runs")
    print(f"mean: with {w:.2f} / without {wo:.2f} requests/s = {w / wo:.3f}x "
          f"(concurrency {args.concurrency}, {args.max_tokens} tokens, {args.seconds:.0f} s per run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
