"""Whether this machine can serve a current-line PyTorch-backend repository (its model file needs TensorRT-LLM's own
llmapi model): eagle-launch refuses at once, naming what to run instead, rather than letting Triton fail to load."""

from __future__ import annotations

import os
from pathlib import Path

from core.kinds import BACKENDS

# TensorRT-LLM's own llmapi model, which a current-line PyTorch-backend repository's model.py subclasses, found where
# triton_repo/models/llmapi_bridge.py `_upstream_model` looks: a copy next to the model file, else
# $TRTLLM_LLMAPI_MODEL_DIR, else the TensorRT-LLM image's directory (the bridge's UPSTREAM_ENV / UPSTREAM_DIR).
UPSTREAM_LLMAPI_MODEL = "upstream_model.py"
UPSTREAM_ENV = "TRTLLM_LLMAPI_MODEL_DIR"
UPSTREAM_DIR = "/app/all_models/llmapi/tensorrt_llm/1"


def upstream_model_missing(repo: Path) -> str | None:
    """Why this launcher cannot serve `repo` here, or None: a current-line build for TensorRT-LLM's PyTorch backend
    (client.json: layout llmapi, backend pytorch) whose model file still needs TensorRT-LLM's llmapi model.py, which
    only the TensorRT-LLM image carries."""
    import json

    f = repo / "client.json"
    try:
        desc = json.loads(f.read_text()) if f.is_file() else {}
    except (OSError, ValueError):
        return None  # the server reports what it cannot load
    backend = BACKENDS.get(str(desc.get("backend")))
    if desc.get("layout") != "llmapi" or backend is None or not backend.llmapi_model:
        return None
    model_dir = repo / str(desc.get("model", "tensorrt_llm")) / "1"
    if (model_dir / UPSTREAM_LLMAPI_MODEL).is_file():
        return None
    if (Path(os.environ.get(UPSTREAM_ENV) or UPSTREAM_DIR) / "model.py").is_file():
        return None
    return (f"{repo} is a current-line build for TensorRT-LLM's PyTorch backend (engine.backend: pytorch): its "
            f"{model_dir / 'model.py'} subclasses TensorRT-LLM's own llmapi Triton model, which ships in the "
            "TensorRT-LLM image (/app/all_models/llmapi) and needs TensorRT-LLM and a GPU. Serve it in the "
            "current-line image, which points Triton at that model and checks TensorRT-LLM before starting it: "
            "`docker run --gpus 1 --shm-size 2g -p 127.0.0.1:8000-8002:8000-8002 -v $PWD/build:/build "
            "-v /data/models:/models:ro eagle-deploy:trtllm1.4.0rc4 serve /build/<name>` (docker/serve.py; "
            "docs/deploy.md). On a machine without TensorRT-LLM, build the same config with "
            "`--set engine.backend=reference --set target.dtype=float32` and launch that repository.")
