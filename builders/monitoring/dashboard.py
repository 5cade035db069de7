"""The Grafana dashboard of docs/production-metrics.md: `python -m builders.monitoring.dashboard [--out FILE]` writes
docker/grafana/eagle-dashboard.json (tests check the committed file is this output, and run every panel's query
on a real Prometheus).

Panels: live tau against the build's baseline, acceptance by draft position against its baseline, acceptance rate,
speculation on/off, requests in flight and queued (ours: they move for decoupled models), and from Triton's own
metrics time to first token (nv_inference_first_response_histogram_ms: tritonserver --metrics-config
histogram_latencies=true) and the mean time per output token (request duration over generated tokens).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

UID = "eagle-speculative"
RATE = "$__rate_interval"
DS = {"type": "prometheus", "uid": "${datasource}"}

# title, unit, [(PromQL, legend)]
PANELS: list[tuple[str, str, list[tuple[str, str]]]] = [
    (
        "Tau (tokens per target forward): live vs baseline",
        "none",
        [
            ("eagle:llm_tau:window", "live {{model}} {{instance}}"),
            ("max by (instance, model) (eagle_llm_baseline_tau)", "baseline {{model}} {{instance}}"),
        ],
    ),
    (
        "Acceptance by draft position: live vs baseline",
        "percentunit",
        [
            ("eagle:llm_position_acceptance:window", "live pos {{position}} {{instance}}"),
            (
                "max by (instance, model, position) (eagle_llm_baseline_position_acceptance_ratio)",
                "baseline pos {{position}} {{instance}}",
            ),
        ],
    ),
    (
        "Draft tokens accepted / proposed",
        "percentunit",
        [("eagle:llm_acceptance_ratio:window", "{{model}} {{instance}}")],
    ),
    (
        "Speculation on (1) / off (0)",
        "none",
        [("max by (instance, model) (eagle_llm_speculation_enabled)", "{{model}} {{instance}}")],
    ),
    (
        "Requests in flight and queued",
        "none",
        [
            ("sum by (instance, model) (eagle_llm_requests_in_flight)", "in flight {{model}} {{instance}}"),
            ("sum by (instance, model) (eagle_llm_requests_queued)", "queued {{model}} {{instance}}"),
        ],
    ),
    (
        "Tokens per second",
        "none",
        [(f"sum by (instance, model) (rate(eagle_llm_generated_tokens_total[{RATE}]))", "{{model}} {{instance}}")],
    ),
    (
        "Time to first token (p50 / p95)",
        "ms",
        [
            (
                "histogram_quantile(0.5, sum by (le, model) "
                f"(rate(nv_inference_first_response_histogram_ms_bucket[{RATE}])))",
                "p50 {{model}}",
            ),
            (
                "histogram_quantile(0.95, sum by (le, model) "
                f"(rate(nv_inference_first_response_histogram_ms_bucket[{RATE}])))",
                "p95 {{model}}",
            ),
        ],
    ),
    (
        "Mean time per output token (request duration / tokens)",
        "µs",
        [
            (
                f'sum by (instance) (rate(nv_inference_request_duration_us{{model=~"$llm_model"}}[{RATE}])) / '
                f'sum by (instance) (rate(eagle_llm_generated_tokens_total{{model=~"$llm_model"}}[{RATE}]))',
                "{{instance}}",
            )
        ],
    ),
]


def _panel(i: int, title: str, unit: str, targets: list[tuple[str, str]]) -> dict[str, Any]:
    return {
        "id": i + 1, "type": "timeseries", "title": title, "datasource": DS,
        "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [{"refId": chr(65 + j), "datasource": DS, "expr": e, "legendFormat": lg}
                    for j, (e, lg) in enumerate(targets)],
    }


def dashboard() -> dict[str, Any]:
    return {
        "uid": UID, "title": "EAGLE speculative decoding", "schemaVersion": 39, "version": 1, "editable": True,
        "tags": ["eagle", "triton", "speculative-decoding"], "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
            {"name": "llm_model", "type": "custom", "query": "tensorrt_llm", "current": {"text": "tensorrt_llm",
             "value": "tensorrt_llm"}, "label": "LLM model (triton.llm_model)"},
        ]},
        "panels": [_panel(i, *p) for i, p in enumerate(PANELS)],
    }


def queries() -> list[str]:
    return [e for _t, _u, targets in PANELS for e, _lg in targets]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="eagle-dashboard", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Inputs:  none (the panels are fixed)\nOutputs: the Grafana dashboard JSON (stdout or --out)\n"
               "Guide:   docs/production-metrics.md")
    ap.add_argument("--out", type=Path, help="write here instead of stdout")
    args = ap.parse_args(argv)
    text = json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
