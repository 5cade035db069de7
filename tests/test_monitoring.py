"""Production monitoring offline: the Prometheus rules (generated, committed, `promtool test rules` unit tests), the
baseline arithmetic and its config checks, the metric names' conventions (docs/production-metrics.md)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from builders.monitoring import baseline, rules
from builders.monitoring_config import MonitoringConfig
from tests.engine_cases import make_cfg
from tests.prometheus_server import binary
from triton_repo.models import spec_metrics as SM

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "docker" / "prometheus" / "eagle-rules.yml"
DOC = ROOT / "docs" / "production-metrics.md"


def test_committed_rules_are_the_generators_defaults() -> None:
    assert RULES.read_text() == rules.rules_yaml(MonitoringConfig()), (
        "docker/prometheus/eagle-rules.yml is stale: python -m builders.monitoring.rules --out "
        "docker/prometheus/eagle-rules.yml")


def test_promtool_checks_and_unit_tests_the_rules() -> None:
    promtool = binary("promtool")
    r = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == 0 and "SUCCESS: 7 rules found" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([promtool, "test", "rules", "eagle-rules.test.yml"], cwd=ROOT / "tests" / "prometheus",
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize(("drop", "window", "alert_for"), [(0.1, "30s", "1m"), (0.35, "2h", "15m")])
def test_rules_carry_the_configured_thresholds(tmp_path: Path, drop: float, window: str, alert_for: str) -> None:
    m = MonitoringConfig(tau_drop_fraction=drop, window=window, alert_for=alert_for)
    f = tmp_path / "r.yml"
    f.write_text(rules.rules_yaml(m))
    r = subprocess.run(
        [binary("promtool"), "check", "rules", str(f)], capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == 0, r.stdout + r.stderr
    text = f.read_text()
    assert f"[{window}]" in text and f"for: {alert_for}" in text
    assert (f"< on (instance, model, version) ({round(1 - drop, 6)} * max by (instance, model, version) "
            "(eagle_llm_baseline_tau))") in text


@pytest.mark.parametrize("bad", ["10 minutes", "5", "1d", ""])
def test_a_window_prometheus_cannot_read_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="window"):
        MonitoringConfig(window=bad)


@pytest.mark.parametrize(("forwards", "by_depth"), [(10, [6, 3, 1]), (7, [0, 0]), (5, [5, 5, 5, 5]), (3, [])])
def test_position_counts_sum_to_the_accepted_tokens(forwards: int, by_depth: list[int]) -> None:
    attempts, accepted = SM.position_counts(forwards, by_depth)
    assert sum(accepted) == sum(by_depth) and len(attempts) == len(by_depth)
    if by_depth:
        assert attempts[0] == forwards and attempts[1:] == by_depth[:-1]
    s = baseline.summary(forwards, sum(by_depth), 4 * forwards, by_depth)
    assert s["tau"] == pytest.approx(1 + sum(by_depth) / forwards)
    assert all(0 <= a <= 1 for a in s["position_acceptance"])


def test_baseline_problems_name_the_field_and_the_fix(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.jsonl")
    p = baseline.config_problems(make_cfg(f"monitoring.calibration_prompts={missing}", "engine.backend=tensorrt"))
    assert any("engine.backend='tensorrt'" in x and "acceptance_baseline.json" in x for x in p)
    assert any(f"monitoring.calibration_prompts={missing!r} does not exist" in x for x in p)
    assert baseline.config_problems(make_cfg()) == []


def test_metric_names_follow_prometheus_conventions_and_are_documented() -> None:
    doc = DOC.read_text()
    for _attr, name, _desc, kind in SM.REQUEST_SPECS + SM.SPEC_SPECS + SM.POSITION_SPECS:
        assert re.fullmatch(r"[a-z_]+", name) and name.startswith("eagle_llm_")
        assert name.endswith("_total") == (kind == "COUNTER"), name
        assert f"`{name}`" in doc, f"{name} is not documented in docs/production-metrics.md"
    for rule in rules.rule_groups(MonitoringConfig())[0]["rules"]:
        assert f"`{rule.get('record') or rule['alert']}`" in doc


def test_committed_dashboard_is_the_generators() -> None:
    from builders.monitoring import dashboard

    f = ROOT / "docker" / "grafana" / "eagle-dashboard.json"
    assert json.loads(f.read_text()) == dashboard.dashboard(), "python -m builders.monitoring.dashboard --out " + str(f)


def test_dashboard_reads_only_exported_series_and_recorded_rules() -> None:
    from builders.monitoring import dashboard

    ours = {name for _a, name, _d, _k in SM.REQUEST_SPECS + SM.SPEC_SPECS + SM.POSITION_SPECS}
    recorded = {r["record"] for r in rules.recording_rules(MonitoringConfig())}
    triton = {"nv_inference_first_response_histogram_ms_bucket", "nv_inference_request_duration_us"}
    for expr in dashboard.queries():
        names = set(re.findall(r"\b(eagle[:_][a-z_:]+|nv_[a-z_]+)\b", expr))
        assert names and names <= ours | recorded | triton, (expr, names - ours - recorded - triton)


def test_llmapi_iteration_stats_count_like_upstreams_acceptance_length() -> None:
    """The bridge's reading of LLM.get_stats() entries (dicts, or JSON text): forwards = requests with drafts."""
    stat = {"iter": 7, "numActiveRequests": 3, "numQueuedRequests": 2,
            "specDecodingStats": {"numDraftTokens": 12, "numAcceptedTokens": 5, "numRequestsWithDraftTokens": 3,
                                  "acceptanceLength": 8 / 3, "iterLatencyMS": 1.0, "draftOverhead": 0.1}}
    for entry in (stat, json.dumps(stat)):
        forwards, accepted, drafted, queued, active = SM.iteration_counts(entry)
        assert (forwards, accepted, drafted, queued, active) == (3, 5, 12, 2, 3)
        assert 1 + accepted / forwards == pytest.approx(stat["specDecodingStats"]["acceptanceLength"])
    assert SM.iteration_counts({"iter": 1, "numActiveRequests": 1}) == (0, 0, 0, 0, 1)  # no speculative stats


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_attention_dp_rows_count_one_iteration_once(ranks: int) -> None:
    """With attention data parallelism upstream reports each iteration once per rank (tensorrt_llm/executor/
    iteration_stats.py `_materialize_frame`: every row a copy of the iteration's statistics, specDecodingStats
    included, with its attentionDpRank; queue counts zeroed outside rank 0): the rows count as one iteration."""
    base = {"iter": 3, "numActiveRequests": 8, "numQueuedRequests": 5, "numCompletedRequests": 1,
            "specDecodingStats": {"numDraftTokens": 24, "numAcceptedTokens": 9, "numRequestsWithDraftTokens": 8,
                                  "acceptanceLength": 17 / 8, "iterLatencyMS": 2.0, "draftOverhead": 0.2}}
    rows = [dict(base, attentionDpRank=r, **({} if r == 0 else {"numQueuedRequests": 0, "numCompletedRequests": 0}))
            for r in range(ranks)]
    counted = [c for c in (SM.iteration_counts(json.dumps(row) if r % 2 else row) for r, row in enumerate(rows))
               if c is not None]
    assert counted == [(8, 9, 24, 5, 8)]
    no_rank = {k: v for k, v in base.items()}  # without rank payloads upstream writes attentionDpRank 0 (or none)
    assert SM.iteration_counts(no_rank) == (8, 9, 24, 5, 8)


@pytest.mark.parametrize(("tokens", "accepted", "forwards"), [(17, 6, 10), (1, 0, 0), (9, 8, 0)])
def test_llmapi_request_counts(tokens: int, accepted: int, forwards: int) -> None:
    """One LLM API request: the context step gives one token, each generation step its accepted drafts plus one."""
    from types import SimpleNamespace

    spec = SimpleNamespace(total_accepted_draft_tokens=accepted, total_draft_tokens=3 * tokens)
    assert SM.llmapi_counts(tokens, spec) == (forwards, accepted, 3 * tokens)


def test_serve_installs_upstreams_llmapi_model_unmodified_under_the_bridge(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The current line with engine.backend pytorch: the rendered model.py is the metrics bridge; serve copies
    TensorRT-LLM's model.py byte for byte as upstream_model.py (what the bridge imports) and its helpers.py."""
    from tests.deploy_files import serve

    cfg = make_cfg(
        "trtllm_version=1.4",
        "draft.type=eagle3",
        "draft.model=/models/eagle3",
        "engine.max_num_tokens=null",
        "engine.backend=pytorch",
        "tree.choices=chain-3",
    )
    upstream = tmp_path / "upstream"
    upstream.mkdir()
    (upstream / "model.py").write_bytes(b"class TritonPythonModel:\n    pass  # upstream\n")
    repo = tmp_path / "repo"
    (repo / "tensorrt_llm" / "1").mkdir(parents=True)
    (repo / "tensorrt_llm" / "1" / "model.py").write_text("bridge")
    monkeypatch.setenv(serve.UPSTREAM_LLMAPI_ENV, str(upstream))
    [problem] = serve.upstream_llmapi_problems(cfg, repo)
    assert "(helpers.py) not found in" in problem and serve.UPSTREAM_LLMAPI_ENV in problem
    (upstream / "helpers.py").write_text("# upstream helpers\n")
    assert serve.upstream_llmapi_problems(cfg, repo) == []
    serve.install_upstream_llmapi_model(cfg, repo)
    d = repo / "tensorrt_llm" / "1"
    assert (d / "upstream_model.py").read_bytes() == (upstream / "model.py").read_bytes()
    assert (d / "helpers.py").read_text() == "# upstream helpers\n" and (d / "model.py").read_text() == "bridge"
