"""What docker/ ships, read by the deployment test modules: paths, docker/k8s/render.py and docker/serve.py as
modules, the Kubernetes manifests and their pod specs, the compose file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from builders.config import load_config

REPO = Path(__file__).resolve().parent.parent
DOCKER = REPO / "docker"
K8S = DOCKER / "k8s"

sys.path.insert(0, str(DOCKER))
sys.path.insert(0, str(K8S))
import render  # noqa: F401  (docker/k8s/render.py, for the tests that import it from here)
import serve  # noqa: F401  (docker/serve.py, likewise)


def _run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, cwd=REPO, timeout=300, **kw
    )


def _manifests() -> list[dict]:
    docs = []
    for f in sorted(K8S.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(f.read_text()) if d]
    return docs


def _pod_specs(doc: dict) -> list[dict]:
    kind, spec = doc["kind"], doc.get("spec")  # ConfigMaps have no spec
    if kind in ("Deployment", "Job"):
        return [spec["template"]["spec"]]
    if kind == "LeaderWorkerSet":
        t = spec["leaderWorkerTemplate"]
        return [t["leaderTemplate"]["spec"], t["workerTemplate"]["spec"]]
    return []


def _containers(doc: dict) -> list[dict]:
    return [c for s in _pod_specs(doc) for c in s["containers"]]


def _compose() -> dict:
    return yaml.safe_load((DOCKER / "docker-compose.yml").read_text())


def _tensorrt_config(tmp: Path, target: Path, head: Path) -> Path:
    cfg = {
        "name": "trt-check", "trtllm_version": "1.1", "output_dir": str(tmp / "out"),
        "target": {"model": str(target), "dtype": "float16"},
        "draft": {"type": "eagle", "model": str(head)},
        "tree": {"choices": "chain-2"},
        "engine": {"backend": "tensorrt", "max_batch_size": 2, "max_input_len": 32, "max_seq_len": 64},
    }
    path = tmp / "trt.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _cfg(tmp: Path, target: Path, head: Path, backend: str, tp: int) -> object:
    path = _tensorrt_config(tmp, target, head)
    kind = ["draft.type=eagle3"] if backend == "pytorch" else []  # the PyTorch backend runs EAGLE-3 heads only
    return load_config(path, [f"engine.backend={backend}", f"parallel.tp={tp}", *kind])
