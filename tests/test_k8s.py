"""The Kubernetes manifests docker/k8s ships: every one validated offline by kubernetes-validate against K8S_VERSION
(strict: unknown fields fail; the two CRDs have no schema there and get the checks stated at CRD_CHECKS), a fresh
render of their config (docker/k8s/render.py --check) that agrees with it, monitoring wiring and the LeaderWorkerSet."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from builders import versions
from builders.config import load_config
from tests.deploy_files import K8S, REPO, _cfg, _containers, _manifests, _run, render, serve

K8S_VERSION = "1.33.0"  # the Kubernetes version every manifest is validated against (kubernetes-validate ships it)
# The config the committed manifests are rendered from (their header records the same command).
# tp=2 across 1-GPU nodes, so the LeaderWorkerSet example really spans two pods.
K8S_CONFIG = "configs/llama31-8b-eagle-fp8.yaml"
K8S_SETS = ["parallel.tp=2"]
K8S_SETS_ALL = [*K8S_SETS, "deploy.gpus_per_node=1"]
K8S_ARGS = [x for o in K8S_SETS_ALL for x in ("--set", o)]
RENDER = [sys.executable, "-m", "builders.k8s.render"]  # the installed command eagle-k8s
CURRENT_ARGS = ["--set", "capture.enabled=true", "--set", "capture.dir=/capture/llama31-8b-eagle3-current", "--set",
                'deploy.downloads={"/models/Llama-3.1-8B-Instruct": "meta-llama/Llama-3.1-8B-Instruct", '
                '"/models/EAGLE3-LLaMA3.1-Instruct-8B": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}']


# Kinds kubernetes-validate has no schema for (CRDs) and what is checked instead.
CRD_CHECKS = {
    # leaderworkerset.x-k8s.io/v1 (kubernetes-sigs/lws): its leader and worker templates are core PodTemplateSpecs
    # and are validated as such; the LWS fields themselves are checked in test_leaderworkerset.
    "LeaderWorkerSet": "pod templates validated as core v1 PodTemplate",
    # monitoring.coreos.com/v1 (Prometheus Operator): no schema shipped; test_monitoring_wiring checks that its
    # selector and endpoint port match the Service.
    "ServiceMonitor": "selector / port consistency with the Service",
    # monitoring.coreos.com/v1 PrometheusRule: its groups are checked by promtool in test_prometheus_rule.
    "PrometheusRule": "spec.groups checked by `promtool check rules`",
}


def test_manifests_validate_offline() -> None:
    import kubernetes_validate

    docs = _manifests()
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "ConfigMap", "Job",
            "PersistentVolumeClaim", "ServiceMonitor", "LeaderWorkerSet", "PrometheusRule"} <= kinds
    for d in docs:
        if d["kind"] in CRD_CHECKS:
            with pytest.raises(kubernetes_validate.SchemaNotFoundError):
                kubernetes_validate.validate(d, K8S_VERSION, strict=True)
            continue
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)
    lws = next(d for d in docs if d["kind"] == "LeaderWorkerSet")
    for role in ("leaderTemplate", "workerTemplate"):
        tmpl = lws["spec"]["leaderWorkerTemplate"][role]
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": role.lower()},
                                      "template": tmpl}, K8S_VERSION, strict=True)


def test_validator_rejects_unknown_field() -> None:
    """Control: strict validation catches a misspelt field (so the pass above means something)."""
    import kubernetes_validate

    dep = next(d for d in _manifests() if d["kind"] == "Deployment")
    bad = json.loads(json.dumps(dep))
    bad["spec"]["template"]["spec"]["containers"][0]["readynessProbe"] = {"tcpSocket": {"port": 8000}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_manifests_are_a_fresh_render() -> None:
    import shlex

    proc = _run([*RENDER, K8S_CONFIG, *K8S_ARGS, "--out", str(K8S), "--check"])
    assert proc.returncode == 0, proc.stderr
    for f in K8S.glob("*.yaml"):  # every file records the command that regenerates it
        first = f.read_text().splitlines()[0]
        assert first.endswith(shlex.join(["eagle-k8s", K8S_CONFIG, *K8S_ARGS])), f.name
    proc = _run([sys.executable, "docker/k8s/render.py", K8S_CONFIG, *K8S_ARGS, "--out", str(K8S), "--check"])
    assert proc.returncode == 0, proc.stderr  # the checkout's wrapper is the same command


def test_current_line_manifests_are_a_fresh_render() -> None:
    """docker/k8s/current/: the Llama-3.1-8B EAGLE-3 config of the current line, on the current-line image."""
    cfg = "configs/llama31-8b-eagle3-current.yaml"
    proc = _run([*RENDER, cfg, *CURRENT_ARGS, "--out", str(K8S / "current"), "--check"])
    assert proc.returncode == 0, proc.stderr
    docs = [d for f in sorted((K8S / "current").glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    images = {c["image"] for doc in docs for c in _containers(doc)}
    assert images == {versions.CURRENT_GPU_IMAGE}


def test_render_check_detects_drift(tmp_path: Path) -> None:
    """Control: --check fails when a committed file differs from the render (e.g. the config's tp changed)."""
    out = tmp_path / "k8s"
    assert _run([*RENDER, K8S_CONFIG, *K8S_ARGS, "--out", str(out)]).returncode == 0
    proc = _run([*RENDER, K8S_CONFIG, "--set", "parallel.tp=4", "--set", "deploy.gpus_per_node=1", "--out", str(out),
                 "--check"])
    assert proc.returncode == 1 and "deployment.yaml differs" in proc.stderr


def test_manifests_agree_with_config() -> None:
    cfg = load_config(REPO / K8S_CONFIG, K8S_SETS)
    docs = {d["kind"]: d for d in _manifests()}
    name = render.dns_name(cfg.name)
    (server,) = _containers(docs["Deployment"])
    build_dir = f"/build/{name}"
    assert server["args"] == ["serve", build_dir]
    (builder,) = _containers(docs["Job"])  # the config shipped as a ConfigMap, with the renderer's overrides
    sets = [x for o in K8S_SETS_ALL for x in ("--set", o)]
    assert builder["args"] == ["build", "/etc/eagle-deploy/config.yaml", *sets, "--set", f"output_dir={build_dir}"]
    shipped = next(d for d in _manifests() if d["metadata"]["name"] == f"{name}-config")
    assert shipped["data"]["config.yaml"] == (REPO / K8S_CONFIG).read_text()
    for c in (server, builder):  # GPU count = tp * pp, from the config
        assert c["resources"]["limits"]["nvidia.com/gpu"] == str(cfg.parallel.tp * cfg.parallel.pp) == "2"
    assert {p["name"]: p["containerPort"] for p in server["ports"]} == serve.TRITON_PORTS
    assert server["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert server["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    startup = server["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] == render.READY_TIMEOUT_S
    hpa = docs["HorizontalPodAutoscaler"]["spec"]
    assert hpa["scaleTargetRef"]["name"] == docs["Deployment"]["metadata"]["name"]
    mbs = cfg.engine.max_batch_size  # a full batch in flight plus half a batch waiting
    assert hpa["metrics"][0]["pods"]["target"]["averageValue"] == str(mbs + max(1, mbs // 2))
    assert hpa["minReplicas"] >= 2  # so maxUnavailable 1 in the PDB never takes the last replica


def test_monitoring_wiring() -> None:
    """Prometheus scrapes the Service's metrics port; the adapter publishes the in-flight series under the name the
    HPA reads; the PDB and Service select the Deployment's pods."""
    cfg = load_config(REPO / K8S_CONFIG, K8S_SETS)
    docs = {d["kind"]: d for d in _manifests()}
    pod_labels = docs["Deployment"]["spec"]["template"]["metadata"]["labels"]
    svc = next(d for d in _manifests() if d["kind"] == "Service" and d["spec"].get("clusterIP") != "None")
    assert svc["spec"]["selector"] == pod_labels
    headless = next(d for d in _manifests() if d["kind"] == "Service" and d["spec"].get("clusterIP") == "None")
    assert headless["spec"]["selector"] == pod_labels  # a publish resolves every ready pod under its name
    assert docs["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"] == pod_labels
    sm = docs["ServiceMonitor"]["spec"]
    assert sm["selector"]["matchLabels"] == svc["metadata"]["labels"]
    port = sm["endpoints"][0]["port"]
    assert port == "metrics" and port in {p["name"] for p in svc["spec"]["ports"]}
    adapter = next(d for d in _manifests() if d["metadata"]["name"].endswith("-prometheus-adapter"))
    rules = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    (rule,) = rules
    assert rule["name"]["as"] == docs["HorizontalPodAutoscaler"]["spec"]["metrics"][0]["pods"]["metric"]["name"]
    assert rule["seriesQuery"].startswith("nv_trt_llm_request_metrics{")  # tensorrt backend: the batch manager's
    assert (
        'request_type=~"active|waiting"' in rule["seriesQuery"]
        and f'model="{cfg.triton.llm_model}"' in rule["seriesQuery"]
    )
    assert "<<.Series>>" in rule["metricsQuery"] and "<<.GroupBy>>" in rule["metricsQuery"]


def test_in_flight_series_follows_backend(tmp_path: Path, tiny_target: Path, eagle_head: Path) -> None:
    """Python models (decoupled: Triton's pending count stays 0) scale on their own in-flight gauge."""
    ref = _cfg(tmp_path, tiny_target, eagle_head, "reference", 1)
    assert render.in_flight_series(ref) == f'eagle_llm_requests_in_flight{{model="{ref.triton.llm_model}"}}'
    current = load_config(REPO / "configs" / "llama31-8b-eagle3-current.yaml")
    adapter = yaml.safe_load((K8S / "current" / "prometheus-adapter-rules.yaml").read_text())
    (rule,) = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    assert rule["seriesQuery"].startswith(render.in_flight_series(current)[:-1])


@pytest.mark.parametrize("sub", ["", "current"])
def test_prometheus_rule(sub: str, tmp_path: Path) -> None:
    """The PrometheusRule carries the generator's groups for the config's thresholds, and promtool accepts them."""
    import subprocess

    from builders.monitoring.rules import rule_groups
    from tests.prometheus_server import binary

    docs = [d for f in sorted((K8S / sub).glob("*.yaml")) for d in yaml.safe_load_all(f.read_text())]
    (rule,) = [d for d in docs if d and d["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    config = K8S_CONFIG if not sub else "configs/llama31-8b-eagle3-current.yaml"
    assert rule["spec"]["groups"] == rule_groups(load_config(REPO / config).monitoring)
    f = tmp_path / "rules.yml"
    f.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    r = subprocess.run(
        [binary("promtool"), "check", "rules", str(f)], capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_leaderworkerset() -> None:
    lws = next(d for d in _manifests() if d["kind"] == "LeaderWorkerSet")
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    t = lws["spec"]["leaderWorkerTemplate"]
    assert set(t) == {"size", "restartPolicy", "leaderTemplate", "workerTemplate"}
    assert t["restartPolicy"] == "RecreateGroupOnPodRestart"
    per_pod = [int(c["resources"]["limits"]["nvidia.com/gpu"])
               for role in ("leaderTemplate", "workerTemplate") for c in t[role]["spec"]["containers"]]
    assert per_pod == [1, 1] and t["size"] == 2  # tp=2 on 1-GPU nodes: a group of two pods holds both ranks
    vols = {v["name"]: v for v in t["workerTemplate"]["spec"]["volumes"]}
    assert vols["builds"]["persistentVolumeClaim"]["claimName"].endswith("-builds")  # every rank reads its engine
