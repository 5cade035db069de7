"""The Kubernetes objects of one build config, one function per file (builders/k8s/render.py writes them).

Every value the manifests share with the build comes from the config: GPUs per server pod = tp * pp, the build
directory (deploy.build_root/<name>) and model repository, the Triton model whose requests in flight drive the
autoscaler, the engine's batch size; sizes, replica bounds, node selection, mount points and model downloads from
its `deploy` section (builders/deploy_config.py). Ports are Triton's (triton_repo/launch.py).

The builds volume is mounted read-only by the servers (a build serves read-only: docker/serve.py writes nothing into
it); the build Job, the models Job and the refresh Job are the writers. The config reaches the cluster as a
ConfigMap (<name>-config), so it can live anywhere on the machine that renders.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any

import yaml

from builders.config import BuildConfig
from triton_repo.launch import TRITON_PORTS

Manifest = dict[str, Any]
IMAGE_HOME = "/opt/eagle-deploy"  # WORKDIR of the images
CONFIG_MOUNT = "/etc/eagle-deploy"  # where the config ConfigMap is mounted in the Jobs
CONFIG_KEY = "config.yaml"
READY_TIMEOUT_S = 1800  # entrypoint TRITON_READY_TIMEOUT; the startup probe allows the same time
STARTUP_PERIOD_S = 10
IN_FLIGHT_METRIC = "eagle_requests_in_flight"  # the adapter's custom metric, read by the HPA
IMAGE_UID = 1000  # the images' USER: NGC's `triton-server` user (uid/gid 1000 in every tritonserver image)
CACHE_DIR = f"{IMAGE_HOME}/.cache"  # EAGLE_DEPLOY_CACHE and HOME of the images: an emptyDir (read-only root)
ADMIN_KEY_ENV = "TRITON_ADMIN_KEY"  # triton_repo/launch.py: the key of Triton's restricted admin endpoints
GPU = "nvidia.com/gpu"


SHM_SIZE = "2Gi"  # /dev/shm of the serving pods: the python backend's shared memory (compose: shm_size 2gb)


@dataclass(frozen=True)
class RenderOptions:
    image: str
    config_text: str  # the config file as given (shipped as the ConfigMap)
    overrides: tuple[str, ...] = ()  # --set KEY=VALUE given to the renderer: the build Job applies the same


def dns_name(name: str) -> str:
    """DNS-1123 label from the build name (Kubernetes object names)."""
    out = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:50].strip("-")
    if not out:
        raise ValueError(f"build name {name!r} gives an empty Kubernetes name; use letters or digits in `name`")
    return out


def gpus(cfg: BuildConfig) -> int:
    """GPUs one server needs: every rank of a tp x pp engine (and the LLM API's tp workers) has its own GPU."""
    return cfg.parallel.tp * cfg.parallel.pp


def build_gpus(cfg: BuildConfig) -> int:
    """GPUs the build Job asks for: the engine flow (trtllm-build) and ModelOpt calibration (quantization.weights or
    kv_cache set) run on GPUs; a PyTorch-backend or reference build writes options and copies files (none)."""
    q = cfg.quantization
    return gpus(cfg) if cfg.engine.kind.engine_flow or q.weights != "none" or q.kv_cache != "none" else 0


def queue_target(cfg: BuildConfig) -> int:
    """Requests per pod waiting for a slot that the HPA tolerates on average: deploy.queue_target, else half a batch
    (a newcomer then waits about half a generation for a slot, the point where another replica pays off)."""
    q = cfg.deploy.queue_target
    return q if q is not None else max(1, cfg.request_limits().max_batch_size // 2)


def in_flight_target(cfg: BuildConfig) -> int:
    """Average requests in flight per pod the HPA holds: a full batch plus queue_target() waiting."""
    return cfg.request_limits().max_batch_size + queue_target(cfg)


def in_flight_series(cfg: BuildConfig) -> str:
    """The Prometheus series that counts a pod's requests in flight (running + waiting) for this backend.

    Triton's own `nv_inference_pending_request_count` cannot serve: a decoupled python model returns from execute()
    at once and holds its requests itself, so it stays 0. tensorrt: the C++ backend's batch manager gauges
    (`nv_trt_llm_request_metrics`, triton_backend/inflight_batcher_llm/src/custom_metrics_reporter/
    custom_metrics_reporter.cc request_labels_). Python models: `eagle_llm_requests_in_flight`
    (triton_repo/models/spec_metrics.py; for upstream's `llmapi` model, triton_repo/models/llmapi_bridge.py)."""
    model = cfg.triton.llm_model
    if cfg.engine.kind.cpp_triton_model:
        return f'nv_trt_llm_request_metrics{{request_type=~"active|waiting",model="{model}"}}'
    return f'eagle_llm_requests_in_flight{{model="{model}"}}'


def _labels(name: str, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "eagle-deploy", "app.kubernetes.io/instance": name,
            "app.kubernetes.io/component": component}


def _obj(api: str, kind: str, obj: str, instance: str, component: str, **body: Any) -> Manifest:
    return {"apiVersion": api, "kind": kind, "metadata": {"name": obj, "labels": _labels(instance, component)},
            **body}


def build_dir(cfg: BuildConfig) -> str:
    return f"{cfg.deploy.build_root}/{dns_name(cfg.name)}"


def _volumes(cfg: BuildConfig, name: str, *, models: bool, config: bool = False,
             capture: bool = False) -> list[dict[str, Any]]:
    vols: list[dict[str, Any]] = [
        {"name": "builds", "persistentVolumeClaim": {"claimName": f"{name}-builds"}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}},  # python backend / NCCL shm
        # The root filesystem is read-only: scratch space (TensorRT-LLM, Python) and caches live here.
        {"name": "tmp", "emptyDir": {}},
        {"name": "cache", "emptyDir": {}},
    ]
    if models:
        vols.append({"name": "models", "persistentVolumeClaim": {"claimName": f"{name}-models"}})
    if config:
        vols.append({"name": "config", "configMap": {"name": f"{name}-config"}})
    if capture:
        vols.append({"name": "capture", "persistentVolumeClaim": {"claimName": f"{name}-capture"}})
    return vols


def _mounts(cfg: BuildConfig, *, builds_ro: bool, models: str | None = "ro", config: bool = False,
            capture: bool = False) -> list[dict[str, Any]]:
    d = cfg.deploy
    out: list[dict[str, Any]] = [{"name": "builds", "mountPath": d.build_root, "readOnly": builds_ro}]
    if models is not None:
        out.append({"name": "models", "mountPath": d.models_root, "readOnly": models == "ro"})
    if config:
        out.append({"name": "config", "mountPath": CONFIG_MOUNT, "readOnly": True})
    if capture:
        out.append({"name": "capture", "mountPath": d.capture_root})
    return out + [{"name": "dshm", "mountPath": "/dev/shm"}, {"name": "tmp", "mountPath": "/tmp"},
                  {"name": "cache", "mountPath": CACHE_DIR}]


def _container_security() -> dict[str, Any]:
    """No root, no new privileges, no capabilities, nothing written outside the mounted volumes."""
    return {"runAsNonRoot": True, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]}}


def _pod_security() -> dict[str, Any]:
    # fsGroup: the volumes are writable by the image's user where they are mounted read-write.
    return {"runAsNonRoot": True, "runAsUser": IMAGE_UID, "runAsGroup": IMAGE_UID, "fsGroup": IMAGE_UID,
            "seccompProfile": {"type": "RuntimeDefault"}}


def _admin_key_env(name: str) -> dict[str, Any]:
    # Opens Triton's admin endpoints to holders of the key; without the Secret they stay closed.
    return {"name": ADMIN_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": f"{name}-triton-admin", "key": "key",
                                                                   "optional": True}}}


def _gpu_resources(n: int) -> dict[str, Any]:
    return {"limits": {GPU: str(n)}} if n > 0 else {}


def _pod(cfg: BuildConfig, containers: list[dict[str, Any]], volumes: list[dict[str, Any]], *, gpu: bool,
         **extra: Any) -> dict[str, Any]:
    pod: dict[str, Any] = {"securityContext": _pod_security(), **extra, "containers": containers, "volumes": volumes}
    if gpu and cfg.deploy.node_selector:
        pod["nodeSelector"] = dict(cfg.deploy.node_selector)
    return pod


def server_container(cfg: BuildConfig, opts: RenderOptions, name: str) -> dict[str, Any]:
    ports = [{"name": k, "containerPort": v, "protocol": "TCP"} for k, v in TRITON_PORTS.items()]

    def probe(path: str, period: int, failures: int) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period, "failureThreshold": failures,
                "timeoutSeconds": 5}

    env = [{"name": "TRITON_READY_TIMEOUT", "value": str(READY_TIMEOUT_S)}, {"name": "HF_HUB_OFFLINE", "value": "1"},
           _admin_key_env(name)]
    if cfg.capture.enabled:  # the refresh Job publishes through model control on every pod
        env.append({"name": "TRITON_MODEL_CONTROL", "value": "explicit"})
    return {
        "name": "triton",
        "image": opts.image,
        "imagePullPolicy": "IfNotPresent",
        "args": ["serve", build_dir(cfg)],
        "env": env,
        "ports": ports,
        # Engines take minutes to load: the startup probe gives the launcher's whole ready timeout, then
        # readiness (take out of the Service) and liveness (restart) apply.
        "startupProbe": probe("/v2/health/ready", STARTUP_PERIOD_S, READY_TIMEOUT_S // STARTUP_PERIOD_S),
        "readinessProbe": probe("/v2/health/ready", 5, 3),
        "livenessProbe": probe("/v2/health/live", 10, 6),
        "resources": _gpu_resources(gpus(cfg)),
        "securityContext": _container_security(),
        "volumeMounts": _mounts(cfg, builds_ro=True, models=None, capture=cfg.capture.enabled),
    }


def storage(cfg: BuildConfig, opts: RenderOptions, name: str) -> list[Manifest]:
    d = cfg.deploy

    def pvc(suffix: str, size: str) -> Manifest:
        spec: dict[str, Any] = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": size}}}
        if d.storage_class:
            spec["storageClassName"] = d.storage_class
        return _obj("v1", "PersistentVolumeClaim", f"{name}-{suffix}", name, "storage", spec=spec)

    # Builds: written by the Jobs, read by every replica. Models: written once (the models Job), read by the build.
    out = [pvc("builds", d.builds_storage), pvc("models", d.models_storage)]
    return out + ([pvc("capture", d.capture_storage)] if cfg.capture.enabled else [])


def config_map(cfg: BuildConfig, opts: RenderOptions, name: str) -> list[Manifest]:
    return [_obj("v1", "ConfigMap", f"{name}-config", name, "build", data={CONFIG_KEY: opts.config_text})]


def _job(cfg: BuildConfig, name: str, component: str, container: dict[str, Any], volumes: list[dict[str, Any]],
         *, gpu: bool) -> Manifest:
    pod = _pod(cfg, [container], volumes, gpu=gpu, restartPolicy="Never")
    job = {"backoffLimit": 0, "template": {"metadata": {"labels": _labels(name, component)}, "spec": pod}}
    return _obj("batch/v1", "Job", f"{name}-{component}", name, component, spec=job)


def build_args(cfg: BuildConfig, opts: RenderOptions) -> list[str]:
    sets = [x for o in opts.overrides for x in ("--set", o)]
    return ["build", f"{CONFIG_MOUNT}/{CONFIG_KEY}", *sets, "--set", f"output_dir={build_dir(cfg)}"]


def build_job(cfg: BuildConfig, opts: RenderOptions, name: str) -> list[Manifest]:
    n = build_gpus(cfg)
    container = {
        "name": "build",
        "image": opts.image,
        "imagePullPolicy": "IfNotPresent",
        # The build writes where the servers will read it (the build records paths relative to itself).
        "args": build_args(cfg, opts),
        "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}],
        "resources": _gpu_resources(n),
        "securityContext": _container_security(),
        "volumeMounts": _mounts(cfg, builds_ro=False, config=True),
    }
    return [_job(cfg, name, "build", container, _volumes(cfg, name, models=True, config=True), gpu=n > 0)]


def models_job(cfg: BuildConfig, opts: RenderOptions, name: str) -> list[Manifest]:
    """deploy.downloads onto the models volume (huggingface-cli download, the token from the optional Secret
    <name>-hf-token). No downloads: nothing (fill the volume yourself, docs/deploy.md)."""
    d = cfg.deploy
    if not d.downloads:
        return []
    script = " && ".join(shlex.join(["huggingface-cli", "download", repo, "--local-dir", path])
                         for path, repo in sorted(d.downloads.items()))
    container = {
        "name": "download",
        "image": opts.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", script],
        "env": [{"name": "HF_HUB_OFFLINE", "value": "0"}, {"name": "HF_HOME", "value": "/tmp/hf"},
                {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": f"{name}-hf-token", "key": "token",
                                                                    "optional": True}}}],
        "securityContext": _container_security(),
        "volumeMounts": [m for m in _mounts(cfg, builds_ro=True, models="rw") if m["name"] != "builds"],
    }
    vols = [v for v in _volumes(cfg, name, models=True) if v["name"] != "builds"]
    return [_job(cfg, name, "models", container, vols, gpu=False)]


def refresh_job(cfg: BuildConfig, opts: RenderOptions, name: str) -> list[Manifest]:
    """capture.enabled: refresh the head on the capture volume (adaptive/refresh.py), then publish the candidate if
    the gate passed it to every ready replica through the headless Service (model control on each pod)."""
    if not cfg.capture.enabled:
        return []
    b, http = shlex.quote(build_dir(cfg)), TRITON_PORTS["http"]
    twin = ""
    if cfg.engine.kind.llmapi_model:  # the PyTorch backend: features and gates on a reference twin of the config
        t = f"{build_dir(cfg)}-twin"
        sets = [x for o in (*opts.overrides, "engine.backend=reference", "capture.enabled=false", f"output_dir={t}")
                for x in ("--set", o)]
        twin = f" --twin {shlex.quote(t)}"
        prefix = shlex.join(["python3", "-m", "builders.build", f"{CONFIG_MOUNT}/{CONFIG_KEY}", *sets]) + " && "
    else:
        prefix = ""
    script = (f'{prefix}python3 -m adaptive.refresh --build {b}{twin} --run "$RUN" && python3 -m adaptive.refresh '
              f'--build {b} --publish {b}/refresh/"$RUN" --server dns:{name}-replicas:{http}')
    container = {
        "name": "refresh",
        "image": opts.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", script],
        "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}, {"name": "TQDM_DISABLE", "value": "1"},
                {"name": "RUN", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}, _admin_key_env(name)],
        "securityContext": _container_security(),
        "volumeMounts": _mounts(cfg, builds_ro=False, config=True, capture=True),
    }
    vols = _volumes(cfg, name, models=True, config=True, capture=True)
    return [_job(cfg, name, "refresh", container, vols, gpu=False)]


def deployment(cfg: BuildConfig, opts: RenderOptions, name: str) -> list[Manifest]:
    pod = _pod(cfg, [server_container(cfg, opts, name)],
               _volumes(cfg, name, models=False, capture=cfg.capture.enabled), gpu=True,
               # launch.py stops tritonserver within --drain-s + 15 s (20 s by default)
               terminationGracePeriodSeconds=60)
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
    # Headless: its name resolves to every ready pod (what a publish reaches: refresh --server dns:NAME:PORT).
    headless = {"clusterIP": "None", "selector": _labels(name, "server"), "ports": ports}
    return [_obj("v1", "Service", name, name, "server", spec=spec),  # its labels: what the ServiceMonitor scrapes
            _obj("v1", "Service", f"{name}-replicas", name, "replicas", spec=headless)]


def hpa(cfg: BuildConfig, opts: RenderOptions, name: str) -> list[Manifest]:
    metric = {"type": "Pods", "pods": {"metric": {"name": IN_FLIGHT_METRIC},
                                       "target": {"type": "AverageValue", "averageValue": str(in_flight_target(cfg))}}}
    behavior = {
        "scaleUp": {"stabilizationWindowSeconds": 60, "policies": [{"type": "Pods", "value": 1, "periodSeconds": 120}]},
        # A new replica costs an engine load (minutes): scale down slowly so bursts don't thrash.
        "scaleDown": {"stabilizationWindowSeconds": 600,
                      "policies": [{"type": "Pods", "value": 1, "periodSeconds": 300}]},
    }
    spec = {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": cfg.deploy.min_replicas, "maxReplicas": cfg.deploy.max_replicas, "metrics": [metric],
            "behavior": behavior}
    return [_obj("autoscaling/v2", "HorizontalPodAutoscaler", name, name, "server", spec=spec)]


def pdb(cfg: BuildConfig, opts: RenderOptions, name: str) -> list[Manifest]:
    spec = {"maxUnavailable": 1, "selector": {"matchLabels": _labels(name, "server")}}
    return [_obj("policy/v1", "PodDisruptionBudget", name, name, "server", spec=spec)]


def adapter_rules(cfg: BuildConfig, opts: RenderOptions, name: str) -> list[Manifest]:
    """prometheus-adapter rule (kubernetes-sigs/prometheus-adapter docs/config.md): the in-flight series, per pod,
    published as the custom metric the HPA reads. Merge `rules` into the adapter's config."""
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
    spec = {"selector": {"matchLabels": _labels(name, "server")},
            "endpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s"}]}
    return [_obj("monitoring.coreos.com/v1", "ServiceMonitor", name, name, "server", spec=spec)]


def prometheus_rule(cfg: BuildConfig, opts: RenderOptions, name: str) -> list[Manifest]:
    """Prometheus Operator PrometheusRule: the rules of builders/monitoring/rules.py with the config's thresholds."""
    from builders.monitoring.rules import rule_groups

    return [_obj("monitoring.coreos.com/v1", "PrometheusRule", name, name, "monitoring",
                 spec={"groups": rule_groups(cfg.monitoring)})]


def leader_worker_set(cfg: BuildConfig, opts: RenderOptions, name: str) -> list[Manifest]:
    """Multi-node TP: one LWS group = ceil(gpus / gpus_per_node) pods gang-scheduled together, the leader runs
    the MPI launch over the group (pattern of kubernetes-sigs/lws docs/examples/tensorrt-llm). Example only."""
    per_node = cfg.deploy.gpus_per_node
    nodes, per_pod = -(-gpus(cfg) // per_node), min(gpus(cfg), per_node)
    leader = server_container(cfg, opts, name)
    leader["name"] = "leader"
    leader["resources"] = _gpu_resources(per_pod)
    leader["env"] = leader["env"] + [{"name": "LWS_GROUP_SIZE", "value": str(nodes)},
                                     {"name": "GPUS_PER_NODE", "value": str(per_pod)}]
    worker = {
        "name": "worker",
        "image": opts.image,
        "imagePullPolicy": "IfNotPresent",
        # Workers only host MPI ranks started by the leader's mpirun (through a kubectl-exec rsh agent).
        "command": ["sleep", "infinity"],
        "resources": _gpu_resources(per_pod),
        "securityContext": _container_security(),
        "volumeMounts": leader["volumeMounts"],
    }
    vols = _volumes(cfg, name, models=False, capture=cfg.capture.enabled)
    spec = {
        "replicas": 1,
        "leaderWorkerTemplate": {
            "size": nodes,
            "restartPolicy": "RecreateGroupOnPodRestart",  # one lost rank breaks the MPI world: restart all
            "leaderTemplate": {"metadata": {"labels": _labels(name, "leader")},
                               "spec": _pod(cfg, [leader], vols, gpu=True)},
            "workerTemplate": {"metadata": {"labels": _labels(name, "worker")},
                               "spec": _pod(cfg, [worker], vols, gpu=True)},
        },
    }
    return [_obj("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", f"{name}-multinode", name, "server", spec=spec)]


RENDERERS = {
    "storage.yaml": storage,
    "config.yaml": config_map,
    "models-job.yaml": models_job,
    "build-job.yaml": build_job,
    "deployment.yaml": deployment,
    "service.yaml": service,
    "hpa.yaml": hpa,
    "pdb.yaml": pdb,
    "refresh-job.yaml": refresh_job,
    "prometheus-adapter-rules.yaml": adapter_rules,
    "servicemonitor.yaml": service_monitor,
    "prometheusrule.yaml": prometheus_rule,
    "leaderworkerset.yaml": leader_worker_set,
}


def render(cfg: BuildConfig, opts: RenderOptions) -> dict[str, list[Manifest]]:
    name = dns_name(cfg.name)
    return {fname: fn(cfg, opts, name) for fname, fn in RENDERERS.items()}
