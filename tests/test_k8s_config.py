"""`eagle-k8s` (builders/k8s/render.py) on configs from anywhere: the build's own checks first, then the cluster's
(paths on the volumes), every value the manifests share with the config taken from it (the `deploy` section:
sizes, replica bounds, node selection, downloads), the build Job's GPUs only where its backend needs them, and every
rendered object valid for Kubernetes (kubernetes-validate, strict; the CRDs as tests/test_k8s.py checks them)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.test_k8s import CRD_CHECKS, K8S_VERSION

ROOT = Path(__file__).resolve().parent.parent
CURRENT = (ROOT / "configs" / "llama31-8b-eagle3-current.yaml").read_text()
DEPLOY = {"builds_storage": "900Gi", "models_storage": "1500Gi", "capture_storage": "64Gi", "storage_class": "nfs-rwx",
          "min_replicas": 3, "max_replicas": 12, "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
          "downloads": {"/models/Llama-3.1-8B-Instruct": "meta-llama/Llama-3.1-8B-Instruct"}}


def _config(tmp: Path, text: str = CURRENT, **top: Any) -> Path:
    data = yaml.safe_load(text)
    data.update(top)
    f = tmp / "elsewhere" / "my-config.yaml"  # outside the repository
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(yaml.safe_dump(data, sort_keys=False))
    return f


def _render(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builders.k8s.render", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def _docs(out: Path) -> dict[str, list[dict[str, Any]]]:
    return {f.name: [d for d in yaml.safe_load_all(f.read_text()) if d] for f in sorted(out.glob("*.yaml"))}


def _validate(docs: list[dict[str, Any]]) -> None:
    import kubernetes_validate

    for d in docs:
        if d["kind"] not in CRD_CHECKS:
            kubernetes_validate.validate(d, K8S_VERSION, strict=True)


def test_a_config_from_anywhere_renders_with_its_deploy_values(tmp_path: Path) -> None:
    cfg = _config(tmp_path, deploy=DEPLOY, capture={"enabled": True, "dir": "/capture/llama"})
    out = tmp_path / "k8s"
    p = _render(cfg, "--out", out)
    assert p.returncode == 0, p.stderr
    files = _docs(out)
    _validate([d for docs in files.values() for d in docs])
    pvcs = {d["metadata"]["name"].rsplit("-", 1)[1]: d["spec"] for d in files["storage.yaml"]}
    assert {k: v["resources"]["requests"]["storage"] for k, v in pvcs.items()} == {
        "builds": "900Gi", "models": "1500Gi", "capture": "64Gi"}
    assert {v["storageClassName"] for v in pvcs.values()} == {"nfs-rwx"}
    hpa = files["hpa.yaml"][0]["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (3, 12)
    (cm,) = files["config.yaml"]
    assert cm["data"]["config.yaml"] == cfg.read_text()  # the config travels with the manifests
    server = files["deployment.yaml"][0]["spec"]["template"]["spec"]
    assert server["nodeSelector"] == DEPLOY["node_selector"]
    mounts = {m["name"]: m for m in server["containers"][0]["volumeMounts"]}
    assert mounts["builds"]["readOnly"] is True and "readOnly" not in mounts["capture"]  # builds serve read-only
    env = {e["name"]: e.get("value") for e in server["containers"][0]["env"]}
    assert env["TRITON_MODEL_CONTROL"] == "explicit"
    build = files["build-job.yaml"][0]["spec"]["template"]["spec"]
    assert "nodeSelector" not in build and build["containers"][0]["resources"] == {}  # PyTorch backend: no GPU
    (models,) = files["models-job.yaml"]
    script = models["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    assert script == ("huggingface-cli download meta-llama/Llama-3.1-8B-Instruct "
                      "--local-dir /models/Llama-3.1-8B-Instruct")
    (refresh,) = files["refresh-job.yaml"]
    script = refresh["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    assert "--twin /build/llama31-8b-eagle3-current-twin" in script and "engine.backend=reference" in script
    assert "--server dns:llama31-8b-eagle3-current-replicas:8000" in script
    assert _render(cfg, "--out", out, "--check").returncode == 0
    p = _render(_config(tmp_path, deploy=DEPLOY), "--out", out)  # capture off: no capture volume, no refresh Job
    assert p.returncode == 0 and "removed" in p.stdout and not (out / "refresh-job.yaml").exists()


@pytest.mark.parametrize(("sets", "gpus"), [
    ([], 0),  # the current line, PyTorch backend: the build writes options and copies the head
    (["parallel.tp=4"], 0),
    (["quantization.weights=fp8"], 1),  # ModelOpt calibration runs on the GPU
    (["quantization.kv_cache=fp8", "parallel.tp=2"], 2),
])
def test_the_build_job_asks_for_gpus_only_when_its_backend_needs_them(tmp_path: Path, sets: list[str],
                                                                      gpus: int) -> None:
    out = tmp_path / "k8s"
    p = _render(_config(tmp_path, deploy=DEPLOY), *[x for s in sets for x in ("--set", s)], "--out", out)
    assert p.returncode == 0, p.stderr
    job = _docs(out)["build-job.yaml"][0]["spec"]["template"]["spec"]
    limits = job["containers"][0].get("resources", {}).get("limits", {})
    assert limits == ({"nvidia.com/gpu": str(gpus)} if gpus else {})
    assert ("nodeSelector" in job) == (gpus > 0)


def test_the_engine_flow_build_job_asks_for_every_rank(tmp_path: Path) -> None:
    out = tmp_path / "k8s"
    fp8 = (ROOT / "configs" / "llama31-8b-eagle-fp8.yaml").read_text()
    for tp, quant in ((1, "none"), (2, "none"), (4, "fp8")):
        p = _render(_config(tmp_path, fp8), "--set", f"parallel.tp={tp}", "--set", f"quantization.weights={quant}",
                    "--set", "quantization.kv_cache=none", "--out", out)
        assert p.returncode == 0, p.stderr
        job = _docs(out)["build-job.yaml"][0]["spec"]["template"]["spec"]
        assert job["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": str(tp)}}


@pytest.mark.parametrize(("change", "message"), [
    ({"deploy": {"min_replicas": 5, "max_replicas": 2}}, "deploy.max_replicas=2 < deploy.min_replicas=5"),
    ({"deploy": {"builds_storage": "500GB"}}, "give a Kubernetes storage quantity such as 500Gi"),
    ({"deploy": {"node_selector": {"bad key!": "x"}}}, "not a Kubernetes label key=value"),
    ({"deploy": {"replicas": 3}}, "deploy.replicas"),  # unknown field: extra=forbid
    ({"deploy": {"models_root": "models"}}, "give an absolute mount path"),
    ({"deploy": {"downloads": {"/elsewhere/x": "a/b"}}}, "is not under deploy.models_root"),
    ({"deploy": {"downloads": {"/models/x": "not a repo"}}}, "give a Hugging Face repository id"),
    ({"target": {"model": "/data/llama", "dtype": "bfloat16"}},
     "target.model='/data/llama' is not on the models volume"),
    ({"capture": {"enabled": True}}, "capture.dir=None: the servers mount the builds volume read-only"),
    ({"capture": {"enabled": True, "dir": "/build/x"}}, "set capture.dir to /capture/<name>"),
    ({"tree": {"choices": "no-such-tree"}}, "tree.choices"),  # the build's own checks
    ({"engine": {"backend": "pytorch", "max_batch_size": 0}}, "engine.max_batch_size"),
])
def test_render_refuses_what_the_build_or_the_cluster_would(tmp_path: Path, change: dict[str, Any],
                                                            message: str) -> None:
    data = yaml.safe_load(CURRENT)
    for k, v in change.items():
        data[k] = {**data.get(k, {}), **v} if isinstance(data.get(k), dict) and k != "deploy" else v
    out = tmp_path / "k8s"
    p = _render(_config(tmp_path, yaml.safe_dump(data)), "--out", out)
    assert p.returncode == 2 and message in p.stderr and "error:" in p.stderr, p.stderr
    assert not out.exists()  # nothing written


def test_models_dir_checks_the_config_against_a_copy_of_the_volume(tmp_path: Path, tiny_target: Path,
                                                                   eagle3_head: Path) -> None:
    """A config whose limits come from the target's files: checked against --models-dir, rendered with its own
    (cluster) paths; without the copy, the check names the missing path."""
    vol = tmp_path / "volume"
    shutil.copytree(tiny_target, vol / "t")
    shutil.copytree(eagle3_head, vol / "h")
    cfg = _config(tmp_path, yaml.safe_dump({
        "name": "tiny", "trtllm_version": "1.4", "output_dir": "/build/tiny",
        "target": {"model": "/models/t", "dtype": "float16"}, "draft": {"type": "eagle3", "model": "/models/h"},
        "tree": {"choices": "chain-2"}, "engine": {"backend": "pytorch"}}))
    out = tmp_path / "k8s"
    p = _render(cfg, "--out", out)
    assert p.returncode == 2 and "/models/t" in p.stderr, p.stderr
    p = _render(cfg, "--models-dir", vol, "--out", out)
    assert p.returncode == 0, p.stderr
    (cm,) = _docs(out)["config.yaml"]
    assert "model: /models/t" in cm["data"]["config.yaml"]
    assert _render(tmp_path / "nothing.yaml", "--out", out).returncode == 2
