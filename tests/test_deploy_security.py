"""Production defaults of the images and manifests: no root, no privilege escalation, no capabilities, a read-only
root filesystem in Kubernetes, the admin key from a Secret, Open MPI's root override only for root."""

from __future__ import annotations

import re
from pathlib import Path

from tests.deploy_files import DOCKER, _compose, _manifests, _pod_specs, render  # render: docker/k8s/render.py
from triton_repo import launch


def _final_user(dockerfile: Path) -> str:
    users = re.findall(r"^USER\s+(\S+)", dockerfile.read_text(), re.M)
    assert users, f"{dockerfile.name} has no USER"
    return users[-1]


def test_images_run_as_uid_1000() -> None:
    for name in ("Dockerfile", "Dockerfile.cpu"):
        assert _final_user(DOCKER / name) == "1000:1000", name
    gpu = (DOCKER / "Dockerfile").read_text()
    assert "COPY --chown=1000:1000 . ." in gpu and "HOME=/opt/eagle-deploy/.cache" in gpu
    assert render.IMAGE_UID == 1000 and render.CACHE_DIR == "/opt/eagle-deploy/.cache"


def test_every_pod_and_container_is_locked_down() -> None:
    pods = [s for d in _manifests() for s in _pod_specs(d)]
    assert len(pods) == 4  # build Job, Deployment, LWS leader + worker
    for pod in pods:
        assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000,
                                          "fsGroup": 1000, "seccompProfile": {"type": "RuntimeDefault"}}
        vols = {v["name"]: v for v in pod["volumes"]}
        for c in pod["containers"]:
            assert c["securityContext"] == {"runAsNonRoot": True, "allowPrivilegeEscalation": False,
                                            "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}
            mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
            # The only writable places: /tmp, the cache (HOME), /dev/shm, and the build volume for the build Job.
            assert {"/tmp": "tmp", "/dev/shm": "dshm", render.CACHE_DIR: "cache"}.items() <= mounts.items()
            assert "emptyDir" in vols["tmp"] and "emptyDir" in vols["cache"]


def test_servers_take_the_admin_key_from_an_optional_secret() -> None:
    servers = [
        c for d in _manifests() for s in _pod_specs(d) for c in s["containers"] if c.get("args", [None])[0] == "serve"
    ]
    assert len(servers) == 2  # Deployment + LWS leader
    for c in servers:
        [env] = [e for e in c["env"] if e["name"] == launch.ADMIN_KEY_ENV]
        assert env["valueFrom"]["secretKeyRef"] == {"name": "llama31-8b-eagle-fp8-triton-admin", "key": "key",
                                                    "optional": True}


def test_compose_publishes_on_loopback_unless_told() -> None:
    for name in ("triton-gpu", "triton-cpu"):
        ports = _compose()["services"][name]["ports"]
        assert all(p.startswith("${PUBLISH_ADDR:-127.0.0.1}:") for p in ports), ports
    assert "PUBLISH_ADDR=0.0.0.0" in (DOCKER / "docker-compose.yml").read_text()


def test_mpirun_root_override_only_as_root() -> None:
    ranks = [["t", "--a"], ["t", "--b"]]
    assert launch.mpirun_argv(2, ranks) == ["mpirun", "-n", "1", "t", "--a", ":", "-n", "1", "t", "--b"]
    assert launch.mpirun_argv(2, ranks, as_root=True)[:2] == ["mpirun", "--allow-run-as-root"]
