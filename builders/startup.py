"""The start-up check build.py and docker/serve.py run before anything is written or started.

It joins the container pin (builders/versions.py: the engine flow exists in the installed TensorRT-LLM) and the
version registry (builders/trtllm/registry.py: the installed series is the one the config's outputs are written for);
living above both keeps the registry free to read the pin without the pin reading the registry back.
"""

from __future__ import annotations

from builders import versions
from builders.trtllm.registry import installed_mismatch


def startup_problems(backend: str, trtllm_version: str | None = None) -> list[str]:
    """The check build.py and the serve entrypoint run before anything is written or started: the engine flow exists
    in the installed TensorRT-LLM, and (TensorRT-LLM backends) it is the series the config's outputs are written for."""
    installed = versions.installed_trtllm()
    problems = versions.engine_flow_problems(backend, installed)
    if trtllm_version is not None and backend != "reference" and not problems:
        problems += installed_mismatch(trtllm_version, installed.version if installed else None)
    return problems
