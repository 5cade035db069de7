"""`python docker/k8s/render.py CONFIG [--set a.b=v ...] [--out DIR] [--check]`

Renders the Kubernetes manifests for one build config, so the values they share with the build come from that
config and nowhere else: GPUs per pod = tp * pp, the build directory and model repository path (the Triton stage's
output under the build root), the Triton model name whose requests in flight drive the autoscaler, the engine's
batch size.
Ports are Triton's, from docker/serve.py. `--check` compares with the files in DIR instead of writing
(tests/test_docker.py runs it, so committed manifests can't drift from the config).

Files written (one concern each): storage.yaml (PVCs), build-job.yaml, deployment.yaml, service.yaml, hpa.yaml,
pdb.yaml, prometheus-adapter-rules.yaml (ConfigMap), servicemonitor.yaml and prometheusrule.yaml (Prometheus
Operator CRDs), leaderworkerset.yaml (LWS CRD: multi-node tensor parallelism, see docs/deploy.md).

Inputs:  CONFIG, a build config
Outputs: the Kubernetes manifests in --out (--check: compare only)
Guide:   docs/deploy.md
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]

from builders.config import BuildConfig, ConfigError, load_config
from builders.versions import CURRENT_GPU_IMAGE, GPU_IMAGE
from triton_repo.launch import TRITON_PORTS

Manifest = dict[str, Any]
IMAGE_HOME = "/opt/eagle-deploy"  # WORKDIR of docker/Dockerfile: configs/ live under it
READY_TIMEOUT_S = 1800  # entrypoint TRITON_READY_TIMEOUT; the startup probe allows the same time
STARTUP_PERIOD_S = 10
# Custom metric exposed by the Prometheus adapter rule and consumed by the HPA (one name, rendered into both).
IN_FLIGHT_METRIC = "eagle_requests_in_flight"
IMAGE_UID = 1000  # docker/Dockerfile USER: NGC's `triton-server` user (uid/gid 1000 in every tritonserver image)
CACHE_DIR = f"{IMAGE_HOME}/.cache"  # EAGLE_DEPLOY_CACHE and HOME of the images: an emptyDir (read-only root)
ADMIN_KEY_ENV = "TRITON_ADMIN_KEY"  # triton_repo/launch.py: the key of Triton's restricted admin endpoints


@dataclass(frozen=True)
class RenderOptions:
    config_path: str  # config path relative to the project root (it is inside the image at IMAGE_HOME)
    image: str = GPU_IMAGE
    build_root: str = "/build"  # where the builds PVC is mounted, for the build Job and the servers alike
    models_root: str = "/models"  # where the models PVC (HF targets and heads) is mounted
    builds_pvc_size: str = "500Gi"
    models_pvc_size: str = "500Gi"
    shm_size: str = "2Gi"  # python-backend / NCCL shared memory; compose uses the same (shm_size 2gb)
    min_replicas: int = 2  # >= 2 so the PodDisruptionBudget can let one pod go during a node drain
    max_replicas: int = 8
    queue_target: int | None = None  # None = max(1, max_batch_size // 2), see queue_target()
    gpus_per_node: int = 8


def dns_name(name: str) -> str:
    """DNS-1123 label from the build name (Kubernetes object names)."""
    out = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:50].strip("-")
    if not out:
        raise ValueError(f"build name {name!r} gives an empty Kubernetes name; use letters or digits in `name`")
    return out


def gpus(cfg: BuildConfig) -> int:
    """GPUs one server needs: every rank of a tp x pp engine (and the LLM API's tp workers) has its own GPU."""
    return cfg.parallel.tp * cfg.parallel.pp


def queue_target(cfg: BuildConfig, opts: RenderOptions) -> int:
    """Requests per pod waiting for a slot that the HPA tolerates on average. Requests wait only once the in-flight
    batch (engine.max_batch_size slots) is full; half a batch waiting means a newcomer waits about half a generation
    for a slot, the point where another replica is worth its GPUs. Override with --queue-target."""
    return opts.queue_target if opts.queue_target is not None else max(1, cfg.request_limits().max_batch_size // 2)


def in_flight_target(cfg: BuildConfig, opts: RenderOptions) -> int:
    """Average requests in flight per pod the HPA holds: a full batch plus queue_target() waiting."""
    return cfg.request_limits().max_batch_size + queue_target(cfg, opts)


def in_flight_series(cfg: BuildConfig) -> str:
    """The Prometheus series that counts a pod's requests in flight (running + waiting) for this backend.

    Triton's own `nv_inference_pending_request_count` cannot serve: a decoupled python model (reference, the LLM
    API, the `llmapi` model) returns from execute() at once and holds its requests itself, so it stays 0.
    tensorrt: the C++ backend's batch manager gauges, active + waiting (`nv_trt_llm_request_metrics`,
    triton_backend/inflight_batcher_llm/src/custom_metrics_reporter/custom_metrics_reporter.cc request_labels_).
    Python models: `eagle_llm_requests_in_flight` (triton_repo/models/spec_metrics.py; for upstream's `llmapi`
    model, the bridge triton_repo/models/llmapi_bridge.py)."""
    model = cfg.triton.llm_model
    if cfg.engine.kind.cpp_triton_model:
        return f'nv_trt_llm_request_metrics{{request_type=~"active|waiting",model="{model}"}}'
    return f'eagle_llm_requests_in_flight{{model="{model}"}}'


def _labels(name: str, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "eagle-deploy", "app.kubernetes.io/instance": name,
            "app.kubernetes.io/component": component}


def _meta(obj: str, instance: str, component: str) -> dict[str, Any]:
    return {"name": obj, "labels": _labels(instance, component)}


def _obj(api: str, kind: str, obj: str, instance: str, component: str, **body: Any) -> Manifest:
    return {"apiVersion": api, "kind": kind, "metadata": _meta(obj, instance, component), **body}


def build_dir(cfg: BuildConfig, opts: RenderOptions) -> str:
    return f"{opts.build_root}/{dns_name(cfg.name)}"


def _volumes(name: str, opts: RenderOptions, *, models: bool) -> list[dict[str, Any]]:
    vols: list[dict[str, Any]] = [
        {"name": "builds", "persistentVolumeClaim": {"claimName": f"{name}-builds"}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": opts.shm_size}},
        # The root filesystem is read-only: scratch space (TensorRT-LLM, Python) and caches live here.
        {"name": "tmp", "emptyDir": {}},
        {"name": "cache", "emptyDir": {}},
    ]
    if models:
        vols.append({"name": "models", "persistentVolumeClaim": {"claimName": f"{name}-models", "readOnly": True}})
    return vols


def _writable_mounts() -> list[dict[str, Any]]:
    return [{"name": "dshm", "mountPath": "/dev/shm"}, {"name": "tmp", "mountPath": "/tmp"},
            {"name": "cache", "mountPath": CACHE_DIR}]


def _container_security() -> dict[str, Any]:
    """No root, no new privileges, no capabilities, nothing written outside the mounted volumes."""
    return {"runAsNonRoot": True, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]}}


def _pod_security() -> dict[str, Any]:
    # fsGroup: the volumes (build PVC included) are writable by the image's user.
    return {"runAsNonRoot": True, "runAsUser": IMAGE_UID, "runAsGroup": IMAGE_UID, "fsGroup": IMAGE_UID,
            "seccompProfile": {"type": "RuntimeDefault"}}


def _server_container(cfg: BuildConfig, opts: RenderOptions, args: list[str]) -> dict[str, Any]:
    ports = [{"name": k, "containerPort": v, "protocol": "TCP"} for k, v in TRITON_PORTS.items()]

    def probe(path: str, period: int, failures: int) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period, "failureThreshold": failures,
                "timeoutSeconds": 5}

    return {
        "name": "triton",
        "image": opts.image,
        "imagePullPolicy": "IfNotPresent",
        "args": args,
        "env": [
            {"name": "TRITON_READY_TIMEOUT", "value": str(READY_TIMEOUT_S)},
            {"name": "HF_HUB_OFFLINE", "value": "1"},
            # Opens Triton's admin endpoints to holders of the key; without the Secret they stay closed.
            {"name": ADMIN_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": f"{dns_name(cfg.name)}-triton-admin",
                                                                   "key": "key", "optional": True}}},
        ],
        "ports": ports,
        # Engines take minutes to load: the startup probe gives the launcher's whole ready timeout, then
        # readiness (take out of the Service) and liveness (restart) apply. Triton's endpoints:
        # /v2/health/ready = every model loaded, /v2/health/live = the server process answers.
        "startupProbe": probe("/v2/health/ready", STARTUP_PERIOD_S, READY_TIMEOUT_S // STARTUP_PERIOD_S),
        "readinessProbe": probe("/v2/health/ready", 5, 3),
        "livenessProbe": probe("/v2/health/live", 10, 6),
        "resources": {"limits": {"nvidia.com/gpu": str(gpus(cfg))}},
        "securityContext": _container_security(),
        "volumeMounts": [{"name": "builds", "mountPath": opts.build_root, "readOnly": True}, *_writable_mounts()],
    }


def storage(cfg: BuildConfig, opts: RenderOptions, name: str) -> list[Manifest]:
    def pvc(suffix: str, mode: str, size: str) -> Manifest:
        spec = {"accessModes": [mode], "resources": {"requests": {"storage": size}}}
        return _obj("v1", "PersistentVolumeClaim", f"{name}-{suffix}", name, "storage", spec=spec)

    # Builds: written once by the Job, read by every replica -> ReadWriteMany. Models: read-only inputs.
    return [pvc("builds", "ReadWriteMany", opts.builds_pvc_size), pvc("models", "ReadOnlyMany", opts.models_pvc_size)]


def build_job(cfg: BuildConfig, opts: RenderOptions, name: str) -> list[Manifest]:
    container = {
        "name": "build",
        "image": opts.image,
        "imagePullPolicy": "IfNotPresent",
        # The build writes where the servers will read it (the same volume; the build records paths relative to itself).
        "args": ["build", f"{IMAGE_HOME}/{opts.config_path}", "--set", f"output_dir={build_dir(cfg, opts)}"],
        "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}],
        "resources": {"limits": {"nvidia.com/gpu": str(gpus(cfg))}},
        "securityContext": _container_security(),
        "volumeMounts": [
            {"name": "builds", "mountPath": opts.build_root},
            {"name": "models", "mountPath": opts.models_root, "readOnly": True},
            *_writable_mounts(),
        ],
    }
    pod = {"restartPolicy": "Never", "securityContext": _pod_security(), "containers": [container],
           "volumes": _volumes(name, opts, models=True)}
    job = {"backoffLimit": 0, "template": {"metadata": {"labels": _labels(name, "build")}, "spec": pod}}
    return [_obj("batch/v1", "Job", f"{name}-build", name, "build", spec=job)]


def deployment(cfg: BuildConfig, opts: RenderOptions, name: str) -> list[Manifest]:
    pod = {
        "securityContext": _pod_security(),
        "containers": [_server_container(cfg, opts, ["serve", build_dir(cfg, opts)])],
        "volumes": _volumes(name, opts, models=False),
        "terminationGracePeriodSeconds": 60,  # launch.py stops tritonserver within --drain-s + 15 s (20 s by default)
    }
    spec = {
        "selector": {"matchLabels": _labels(name, "server")},
        # New pods must be ready before an old one goes: no capacity dip while engines load.
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
        "template": {"metadata": {"labels": _labels(name, "server")}, "spec": pod},
    }  # no `replicas`: the HorizontalPodAutoscaler owns it
    return [_obj("apps/v1", "Deployment", name, name, "server", spec=spec)]


def service(cfg: BuildConfig, opts: RenderOptions, name: str) -> list[Manifest]:
    ports = [{"name": k, "port": v, "targetPort": k, "protocol": "TCP"} for k, v in TRITON_PORTS.items()]
    spec = {"type": "ClusterIP", "selector": _labels(name, "server"), "ports": ports}
    return [_obj("v1", "Service", name, name, "server", spec=spec)]


def hpa(cfg: BuildConfig, opts: RenderOptions, name: str) -> list[Manifest]:
    metric = {
        "type": "Pods",
        "pods": {
            "metric": {"name": IN_FLIGHT_METRIC},
            "target": {"type": "AverageValue", "averageValue": str(in_flight_target(cfg, opts))},
        },
    }
    behavior = {
        "scaleUp": {"stabilizationWindowSeconds": 60, "policies": [{"type": "Pods", "value": 1, "periodSeconds": 120}]},
        # A new replica costs an engine load (minutes): scale down slowly so bursts don't thrash.
        "scaleDown": {"stabilizationWindowSeconds": 600,
                      "policies": [{"type": "Pods", "value": 1, "periodSeconds": 300}]},
    }
    spec = {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
        "minReplicas": opts.min_replicas,
        "maxReplicas": opts.max_replicas,
        "metrics": [metric],
        "behavior": behavior,
    }
    return [_obj("autoscaling/v2", "HorizontalPodAutoscaler", name, name, "server", spec=spec)]


def pdb(cfg: BuildConfig, opts: RenderOptions, name: str) -> list[Manifest]:
    spec = {"maxUnavailable": 1, "selector": {"matchLabels": _labels(name, "server")}}
    return [_obj("policy/v1", "PodDisruptionBudget", name, name, "server", spec=spec)]


def adapter_rules(cfg: BuildConfig, opts: RenderOptions, name: str) -> list[Manifest]:
    """prometheus-adapter rule (docs: kubernetes-sigs/prometheus-adapter docs/config.md): the in-flight series,
    per pod, published as the custom metric the HPA reads. Merge `rules` into the adapter's config."""
    series = in_flight_series(cfg)
    selector = series[series.index("{") + 1 : -1]
    rule = {
        # Only series Prometheus attached to a pod (ServiceMonitor target labels) can be served per pod.
        "seriesQuery": series[:-1] + ',namespace!="",pod!=""}',
        "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
        "name": {"matches": f"^{series[: series.index('{')]}$", "as": IN_FLIGHT_METRIC},
        # Sum over the model's series in each pod (TP ranks > 0 serve no metrics, so one rank reports).
        "metricsQuery": f"sum(<<.Series>>{{<<.LabelMatchers>>,{selector}}}) by (<<.GroupBy>>)",
    }
    text = yaml.safe_dump({"rules": [rule]}, sort_keys=False)
    return [_obj("v1", "ConfigMap", f"{name}-prometheus-adapter", name, "autoscaling", data={"config.yaml": text})]


def service_monitor(cfg: BuildConfig, opts: RenderOptions, name: str) -> list[Manifest]:
    spec = {
        "selector": {"matchLabels": _labels(name, "server")},
        "endpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s"}],
    }
    return [_obj("monitoring.coreos.com/v1", "ServiceMonitor", name, name, "server", spec=spec)]


def prometheus_rule(cfg: BuildConfig, opts: RenderOptions, name: str) -> list[Manifest]:
    """Prometheus Operator PrometheusRule: the recording and alerting rules of builders/monitoring/rules.py with the
    config's `monitoring` thresholds (docs/production-metrics.md)."""
    from builders.monitoring.rules import rule_groups

    return [_obj("monitoring.coreos.com/v1", "PrometheusRule", name, name, "monitoring",
                 spec={"groups": rule_groups(cfg.monitoring)})]


def leader_worker_set(cfg: BuildConfig, opts: RenderOptions, name: str) -> list[Manifest]:
    """Multi-node TP: one LWS group = ceil(gpus / gpus_per_node) pods gang-scheduled together, the leader runs
    the MPI launch over the group (pattern of kubernetes-sigs/lws docs/examples/tensorrt-llm). Example only."""
    nodes = -(-gpus(cfg) // opts.gpus_per_node)
    per_pod = min(gpus(cfg), opts.gpus_per_node)
    leader = _server_container(cfg, opts, ["serve", build_dir(cfg, opts)])
    leader["name"] = "leader"
    leader["resources"] = {"limits": {"nvidia.com/gpu": str(per_pod)}}
    leader["env"] = leader["env"] + [
        {"name": "LWS_GROUP_SIZE", "value": str(nodes)},
        {"name": "GPUS_PER_NODE", "value": str(per_pod)},
    ]
    worker = {
        "name": "worker",
        "image": opts.image,
        "imagePullPolicy": "IfNotPresent",
        # Workers only host MPI ranks started by the leader's mpirun (through a kubectl-exec rsh agent).
        "command": ["sleep", "infinity"],
        "resources": {"limits": {"nvidia.com/gpu": str(per_pod)}},
        "securityContext": _container_security(),
        "volumeMounts": leader["volumeMounts"],
    }
    vols = _volumes(name, opts, models=False)
    spec = {
        "replicas": 1,
        "leaderWorkerTemplate": {
            "size": nodes,
            "restartPolicy": "RecreateGroupOnPodRestart",  # one lost rank breaks the MPI world: restart all
            "leaderTemplate": {"metadata": {"labels": _labels(name, "leader")},
                               "spec": {"securityContext": _pod_security(), "containers": [leader], "volumes": vols}},
            "workerTemplate": {"metadata": {"labels": _labels(name, "worker")},
                               "spec": {"securityContext": _pod_security(), "containers": [worker], "volumes": vols}},
        },
    }
    return [_obj("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", f"{name}-multinode", name, "server", spec=spec)]


RENDERERS = {
    "storage.yaml": storage,
    "build-job.yaml": build_job,
    "deployment.yaml": deployment,
    "service.yaml": service,
    "hpa.yaml": hpa,
    "pdb.yaml": pdb,
    "prometheus-adapter-rules.yaml": adapter_rules,
    "servicemonitor.yaml": service_monitor,
    "prometheusrule.yaml": prometheus_rule,
    "leaderworkerset.yaml": leader_worker_set,
}


def render(cfg: BuildConfig, opts: RenderOptions) -> dict[str, list[Manifest]]:
    name = dns_name(cfg.name)
    return {fname: fn(cfg, opts, name) for fname, fn in RENDERERS.items()}


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the adapter config) as readable literal blocks."""


_Dumper.add_representer(
    str, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)
)


def to_text(docs: list[Manifest], header: str) -> str:
    body = "---\n".join(yaml.dump(d, Dumper=_Dumper, sort_keys=False, width=120) for d in docs)
    return header + body


def header(opts: RenderOptions, args: list[str]) -> str:
    cmd = " ".join(["python docker/k8s/render.py", opts.config_path, *args])
    return (f"# Rendered from {opts.config_path} by: {cmd}\n"
            "# Do not edit by hand; regenerate with the same command (add --out DIR to write elsewhere).\n")


def default_image(cfg: BuildConfig) -> str:
    """The image that serves the config's TensorRT-LLM version: the pinned NGC one, or the current-line image."""
    from builders.trtllm import registry

    return CURRENT_GPU_IMAGE if registry.get(cfg.trtllm_version).triton_layout == "llmapi" else GPU_IMAGE


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="render.py", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("config", help="build config, relative to the project root (it is baked into the image)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="config override, as for builders/build.py")
    ap.add_argument("--out", type=Path, default=REPO / "docker" / "k8s", help="output directory")
    ap.add_argument(
        "--image",
        default=None,
        help=f"server image (default {GPU_IMAGE}; {CURRENT_GPU_IMAGE} for a config of the current TensorRT-LLM line)",
    )
    ap.add_argument("--queue-target", type=int, default=None,
                    help="waiting requests per pod the HPA tolerates: it holds engine.max_batch_size + this in flight "
                    "(default max(1, engine.max_batch_size // 2))")
    ap.add_argument("--gpus-per-node", type=int, default=RenderOptions.gpus_per_node,
                    help="GPUs per node: the LeaderWorkerSet group has ceil(tp*pp / this) pods")
    ap.add_argument("--check", action="store_true", help="compare with the files in --out; exit 1 on a difference")
    args = ap.parse_args(argv)
    rel = Path(args.config)
    if rel.is_absolute():
        ap.error(f"config {rel}: give it relative to the project root ({REPO}); the image holds it at {IMAGE_HOME}")
    try:
        cfg = load_config(REPO / rel, args.overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    image = args.image or default_image(cfg)
    opts = RenderOptions(config_path=rel.as_posix(), image=image, queue_target=args.queue_target,
                         gpus_per_node=args.gpus_per_node)
    # Record every option that shaped the files (not --out/--check), so the header regenerates them exactly.
    shaping = [x for o in args.overrides for x in ("--set", o)]
    if image != default_image(cfg):
        shaping += ["--image", image]
    if args.queue_target is not None:
        shaping += ["--queue-target", str(args.queue_target)]
    if args.gpus_per_node != RenderOptions.gpus_per_node:
        shaping += ["--gpus-per-node", str(args.gpus_per_node)]
    texts = {f: to_text(docs, header(opts, shaping)) for f, docs in render(cfg, opts).items()}
    if args.check:
        stale = [f for f, t in texts.items() if not (args.out / f).is_file() or (args.out / f).read_text() != t]
        for f in stale:
            print(f"stale: {args.out / f} differs from a fresh render; rerun without --check", file=sys.stderr)
        return 1 if stale else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for f, t in texts.items():
        (args.out / f).write_text(t)
        print(f"wrote {args.out / f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
