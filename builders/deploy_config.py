"""The `deploy` section of the build config: what the Kubernetes manifests take from it (builders/k8s/,
`eagle-k8s CONFIG`, docs/deploy.md "Kubernetes"): volume sizes, replica bounds, node selection, where the volumes
are mounted and which downloads put the models on the models volume. GPUs per pod are not here: they follow from
parallel.tp * parallel.pp (one source), and the build Job asks for them only when its backend needs a GPU
(builders/k8s/manifests.py build_gpus). Its own module, as builders/adaptive_config.py, so the renderer can import it
without a cycle."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")  # a Kubernetes storage quantity
LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
HF_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, strict=True, allow_inf_nan=False)


def _quantity(v: str, field: str) -> str:
    if not QUANTITY.match(v):
        raise ValueError(f"deploy.{field}={v!r}: give a Kubernetes storage quantity such as 500Gi or 1Ti")
    return v


def _abs(v: str, field: str) -> str:
    if not v.startswith("/") or v.rstrip("/") == "" or "//" in v or "/../" in f"{v}/":
        raise ValueError(f"deploy.{field}={v!r}: give an absolute mount path such as /models")
    return v.rstrip("/")


class DeployConfig(_Strict):
    builds_storage: str = Field(
        default="500Gi", description="Size of the builds volume (ReadWriteMany): every build's checkpoint, engines or "
        "LLM-API options and model repository, plus published head versions and refresh runs.")
    models_storage: str = Field(
        default="500Gi", description="Size of the models volume (the HF target and the head; read-only to the "
        "servers). Give at least the target's size on disk (a 671B target in FP8 is about 700 GB).")
    capture_storage: str = Field(
        default="20Gi", description="Size of the capture volume (ReadWriteMany), rendered when capture.enabled: "
        "the store every replica writes and the refresh Job reads (at least capture.max_bytes).")
    storage_class: str | None = Field(
        default=None, description="storageClassName of the volumes; unset: the cluster's default class. The builds "
        "and capture volumes need a class that offers ReadWriteMany.")
    min_replicas: int = Field(default=2, ge=1, le=10_000, description="Fewest server pods the autoscaler keeps (2 or "
                              "more lets the PodDisruptionBudget move one pod during a node drain).")
    max_replicas: int = Field(default=8, ge=1, le=10_000, description="Most server pods the autoscaler starts.")
    queue_target: int | None = Field(
        default=None, ge=1, le=1 << 20, description="Waiting requests per pod the autoscaler tolerates: it holds "
        "engine.max_batch_size + this in flight per pod. Unset: max(1, engine.max_batch_size // 2).")
    gpus_per_node: int = Field(default=8, ge=1, le=1024, description="GPUs per node: the multi-node LeaderWorkerSet "
                               "group has ceil(tp * pp / this) pods.")
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="nodeSelector of the server pods and of the Jobs that need GPUs (e.g. "
        "{nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}).")
    image: str | None = Field(default=None, description="Container image of every pod. Unset: the pinned image of "
                              "the config's TensorRT-LLM line (builders/versions.py).")
    build_root: str = Field(default="/build", description="Where the builds volume is mounted (the build is written "
                            "and served at the same path).")
    models_root: str = Field(default="/models", description="Where the models volume is mounted: the config's "
                             "target.model and draft.model must lie under it (or be pip:<distribution>).")
    capture_root: str = Field(default="/capture", description="Where the capture volume is mounted: capture.dir "
                              "must lie under it (the builds volume is read-only to the servers).")
    downloads: dict[str, str] = Field(
        default_factory=dict, description="What the models Job (models-job.yaml) puts on the models volume: "
        "{path under models_root: Hugging Face repository id}, downloaded with `huggingface-cli download` (token "
        "from the optional Secret <name>-hf-token, key `token`). Empty: fill the volume yourself (docs/deploy.md).")

    @field_validator("builds_storage", "models_storage", "capture_storage")
    @classmethod
    def _sizes(cls, v: str, info: Any) -> str:
        return _quantity(v, info.field_name)

    @field_validator("build_root", "models_root", "capture_root")
    @classmethod
    def _roots(cls, v: str, info: Any) -> str:
        return _abs(v, info.field_name)

    @field_validator("node_selector")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [f"{k}={x}" for k, x in v.items() if not LABEL_KEY.match(k) or not LABEL_VALUE.match(x)]
        if bad:
            raise ValueError(f"deploy.node_selector: {', '.join(bad)} not a Kubernetes label key=value (keys "
                             "[prefix/]name of letters, digits, - _ . up to 63 characters; values likewise)")
        return v

    @model_validator(mode="after")
    def _bounds(self) -> DeployConfig:
        problems = []
        if self.max_replicas < self.min_replicas:
            problems.append(f"deploy.max_replicas={self.max_replicas} < deploy.min_replicas={self.min_replicas}: "
                            "give max_replicas >= min_replicas")
        for path, repo in self.downloads.items():
            if not path.startswith(self.models_root + "/") or "/../" in f"{path}/":
                problems.append(f"deploy.downloads: {path!r} is not under deploy.models_root ({self.models_root}); "
                                f"give {self.models_root}/<name>")
            if not HF_REPO.match(repo):
                problems.append(f"deploy.downloads[{path!r}]={repo!r}: give a Hugging Face repository id "
                                "(owner/name)")
        if problems:
            raise ValueError("\n".join(problems))
        return self
