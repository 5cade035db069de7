"""The start-up check build.py and docker/serve.py run before anything is written or started.

It joins the container pin (builders/versions.py: the engine flow exists in the installed TensorRT-LLM) and the
version registry (core/trtllm_versions.py: the installed series is the one the config's outputs are written for);
living above both keeps the pin's checks and the version table apart.
"""

from __future__ import annotations

import subprocess
import sys

from builders import versions
from core.kinds import BACKENDS
from core.trtllm_versions import get, installed_mismatch

IMPORT_TIMEOUT_S = 600.0  # importing TensorRT-LLM loads CUDA, TensorRT and its kernels: slow on a cold start


def startup_problems(backend: str, trtllm_version: str | None = None) -> list[str]:
    """The check build.py and the serve entrypoint run before anything is written or started: the engine flow exists
    in the installed TensorRT-LLM, and (TensorRT-LLM backends) it is the series the config's outputs are written for."""
    installed = versions.installed_trtllm()
    problems = versions.engine_flow_problems(backend, installed)
    if trtllm_version is not None and BACKENDS[backend].runs_trtllm and not problems:
        problems += installed_mismatch(trtllm_version, installed.version if installed else None)
    return problems


def same_release(got: str, want: str) -> bool:
    """Whether an installed TensorRT-LLM `__version__` is the release `want` (major.minor.patch and pre-release;
    a local or dev suffix does not count)."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(got).release[:3] == Version(want).release[:3] and Version(got).pre == Version(want).pre
    except InvalidVersion:
        return False


def trtllm_import_problems(trtllm_version: str, python: str = sys.executable) -> list[str]:
    """The container-start half of the image check (docker/serve.py runs it before Triton starts; the build half,
    builders/versions.py current_image_problems, cannot import without a GPU): `import tensorrt_llm` succeeds in a
    fresh interpreter and its `__version__` is the release the config's outputs are written for."""
    want = get(trtllm_version).release
    code = "import tensorrt_llm; print(tensorrt_llm.__version__)"
    try:
        proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=IMPORT_TIMEOUT_S,
                              check=False)
    except subprocess.TimeoutExpired:
        return [f"`import tensorrt_llm` did not finish in {IMPORT_TIMEOUT_S:.0f} s; check the GPU and driver "
                "(nvidia-smi) in this container"]
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return [f"`import tensorrt_llm` fails in this image: {last}. Run the container with the GPU (--gpus / the "
                "NVIDIA runtime), or rebuild the image (docker/Dockerfile.current checks the install)"]
    got = (proc.stdout.strip().splitlines() or [""])[-1]
    if not same_release(got, want):
        return [f"the imported TensorRT-LLM reports {got!r}, the outputs are written for {want} "
                f"(trtllm_version '{trtllm_version}'); rebuild the image with that release or the build with the "
                "trtllm_version of this one"]
    return []
