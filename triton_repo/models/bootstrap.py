"""Puts the project on sys.path in a Triton python-backend model process, before a model imports anything of ours.

The renderer copies this file next to every python model as `<model>/1/eagle_bootstrap.py`; the python backend's
stub appends that version directory to sys.path before it imports `model.py` (triton-inference-server/python_backend
src/pb_stub.cc, ModelContext::StubSetup), so `from eagle_bootstrap import project_on_path` works there. The project
root comes from the model's `project_root` parameter, written by the renderer.
"""

import json
import sys
from typing import Any

BOOTSTRAP_MODULE = "eagle_bootstrap"  # the file name the renderer gives this module (without .py)


def project_on_path(args: dict[str, Any]) -> None:
    """Prepend the rendered `project_root` parameter to sys.path (TritonPythonModel.initialize's args)."""
    cfg = json.loads(args["model_config"])
    try:
        root = cfg["parameters"]["project_root"]["string_value"]
    except KeyError:
        raise KeyError(
            f"model {cfg['name']}: parameter project_root missing; render the repository with builders/triton/render.py"
        ) from None
    if root not in sys.path:
        sys.path.insert(0, root)
