"""Prometheus recording and alerting rules for the speculative metrics (triton_repo/models/spec_metrics.py).

`python -m builders.monitoring.rules [CONFIG] [--out FILE]` prints the rule file with the thresholds of the config's
`monitoring` section (without CONFIG: the defaults, which is docker/prometheus/eagle-rules.yml). The build writes the
same file into the Triton repository (prometheus-rules.yml), and docker/k8s/render.py wraps the groups in a
PrometheusRule. Unit tests: tests/prometheus/eagle-rules.test.yml (`promtool test rules`).

Recording rules (per instance and model; names level:metric:operation):
  eagle:llm_tau:window                   1 + rate(accepted draft tokens) / rate(target forwards)
  eagle:llm_acceptance_ratio:window      rate(accepted draft tokens) / rate(draft tokens)
  eagle:llm_position_acceptance:window   rate(position accepted) / rate(position attempts), per position
Alerts: EagleTauBelowBaseline, EaglePositionAcceptanceCollapsed, EagleSpeculationOff, EagleQueueGrowing (what each
means and what to do: docs/production-metrics.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from builders.monitoring_config import MonitoringConfig

GROUP = "eagle-speculative-decoding"
BY = "instance, model, version"  # version: a published head (adaptive/refresh.py) is judged by its own baseline
RULES_FILE = "prometheus-rules.yml"  # in the Triton repository, next to acceptance_baseline.json
DOCS = "docs/production-metrics.md"


def _sum_rate(metric: str, window: str, by: str = BY) -> str:
    return f"sum by ({by}) (rate({metric}[{window}]))"


def recording_rules(m: MonitoringConfig) -> list[dict[str, Any]]:
    w, pos = m.window, f"{BY}, position"
    return [
        {"record": "eagle:llm_tau:window",
         "expr": f"1 + {_sum_rate('eagle_llm_accepted_draft_tokens_total', w)} / "
                 f"{_sum_rate('eagle_llm_target_forwards_total', w)}"},
        {"record": "eagle:llm_acceptance_ratio:window",
         "expr": f"{_sum_rate('eagle_llm_accepted_draft_tokens_total', w)} / "
                 f"{_sum_rate('eagle_llm_draft_tokens_total', w)}"},
        {"record": "eagle:llm_position_acceptance:window",
         "expr": f"{_sum_rate('eagle_llm_position_accepted_total', w, pos)} / "
                 f"{_sum_rate('eagle_llm_position_attempts_total', w, pos)}"},
    ]


def _alert(name: str, expr: str, m: MonitoringConfig, summary: str, action: str, anchor: str) -> dict[str, Any]:
    return {"alert": name, "expr": expr, "for": m.alert_for, "labels": {"severity": "warning"},
            "annotations": {"summary": summary, "description": action, "runbook": f"{DOCS}#{anchor}"}}


def alerting_rules(m: MonitoringConfig) -> list[dict[str, Any]]:
    keep_tau, keep_pos = round(1 - m.tau_drop_fraction, 6), round(1 - m.position_collapse_fraction, 6)
    w = m.window
    return [
        _alert("EagleTauBelowBaseline",
               f"eagle:llm_tau:window < on ({BY}) ({keep_tau} * max by ({BY}) (eagle_llm_baseline_tau))", m,
               "{{ $labels.model }} on {{ $labels.instance }}: tau {{ $value | printf \"%.2f\" }} is more than "
               f"{m.tau_drop_fraction:.0%} below the build's baseline",
               "Live traffic accepts fewer drafts than the calibration prompts did: compare the per-position "
               "panel; a drop at every position means the head no longer fits the traffic (retrain it on this "
               "traffic), a drop only deep in the tree means the tree is too deep for it (retune the tree).",
               "tau-below-baseline"),
        _alert("EaglePositionAcceptanceCollapsed",
               f"eagle:llm_position_acceptance:window < on ({BY}, position) "
               f"({keep_pos} * max by ({BY}, position) (eagle_llm_baseline_position_acceptance_ratio))", m,
               "{{ $labels.model }} on {{ $labels.instance }}: acceptance at draft position {{ $labels.position }} "
               f"fell more than {m.position_collapse_fraction:.0%} below its baseline",
               "One depth of the tree stopped paying: retune the tree (measure/tune_tree.py) on prompts like the "
               "current traffic; if position 1 collapsed, the head itself no longer fits (retrain it).",
               "position-acceptance-collapsed"),
        _alert("EagleSpeculationOff",
               f"max by ({BY}) (eagle_llm_speculation_enabled) == 0 or "
               f"({_sum_rate('eagle_llm_draft_tokens_total', w)} == 0 and "
               f"{_sum_rate('eagle_llm_target_forwards_total', w)} > 0)", m,
               "{{ $labels.model }} on {{ $labels.instance }} decodes without drafting",
               "The server serves at target-only speed: check the deployment's speculative config and, on "
               "TensorRT-LLM, whether the batch size exceeded the speculative config's max_concurrency.",
               "speculation-off"),
        _alert("EagleQueueGrowing",
               f"min_over_time(eagle_llm_requests_queued[{w}]) > 0 and deriv(eagle_llm_requests_queued[{w}]) > 0", m,
               "{{ $labels.model }} on {{ $labels.instance }}: requests wait for a slot and the queue grows",
               "Every sequence slot is busy and arrivals outpace completions: add replicas (the autoscaler scales "
               "on eagle_llm_requests_in_flight) or raise engine.max_batch_size.",
               "queue-growing"),
    ]


def rule_groups(m: MonitoringConfig) -> list[dict[str, Any]]:
    return [{"name": GROUP, "rules": recording_rules(m) + alerting_rules(m)}]


def rules_yaml(m: MonitoringConfig) -> str:
    head = ("# Prometheus rules for EAGLE deployments (builders/monitoring/rules.py); docs/production-metrics.md.\n"
            "# Regenerate: python -m builders.monitoring.rules [CONFIG] --out FILE\n")
    return head + yaml.safe_dump({"groups": rule_groups(m)}, sort_keys=False, width=1000)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="eagle-alert-rules",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Inputs:  a build config (its `monitoring` section), or none for the defaults\n"
        "Outputs: Prometheus recording and alerting rules (stdout or --out)\nGuide:   docs/production-metrics.md",
    )
    ap.add_argument("config", nargs="?", help="build config whose `monitoring` thresholds to use (default: defaults)")
    ap.add_argument("--out", type=Path, help="write here instead of stdout")
    args = ap.parse_args(argv)
    m = MonitoringConfig()
    if args.config:
        from builders.config import ConfigError, load_config

        try:
            m = load_config(Path(args.config)).monitoring
        except ConfigError as e:
            print(e, file=sys.stderr)
            return 2
    text = rules_yaml(m)
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
