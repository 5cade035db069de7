"""Makes the project importable in a Triton python-backend model process, before a model imports anything of ours.

The renderer copies this file next to every python model as `<model>/1/eagle_bootstrap.py`; the python backend's
stub appends that version directory to sys.path before it imports `model.py` (triton-inference-server/python_backend
src/pb_stub.cc, ModelContext::StubSetup), so `from eagle_bootstrap import project_on_path` works there.

Nothing here comes from the rendered repository, so a finished build can be copied or mounted anywhere: the project
is the one named by $EAGLE_DEPLOY_HOME (the images set it; triton_repo/launch.py sets it to its own checkout when it
is unset), else the one installed in the environment the python backend runs (`pip install .`).
"""

import importlib.util
import os
import sys
from typing import Any

BOOTSTRAP_MODULE = "eagle_bootstrap"  # the file name the renderer gives this module (without .py)
HOME_ENV = "EAGLE_DEPLOY_HOME"


def project_on_path(args: dict[str, Any]) -> None:
    """Put $EAGLE_DEPLOY_HOME first on sys.path, or check that the project is installed (TritonPythonModel.initialize's
    args name the model in the error)."""
    home = os.environ.get(HOME_ENV)
    if home:
        if not os.path.isfile(os.path.join(home, "triton_repo", "contract.py")):
            raise ImportError(f"model {args.get('model_name')}: {HOME_ENV}={home} is not an eagle-deploy checkout "
                              "(no triton_repo/contract.py there); point it at the project root")
        if home not in sys.path:
            sys.path.insert(0, home)
    elif importlib.util.find_spec("triton_repo") is None:
        raise ImportError(f"model {args.get('model_name')}: the eagle-deploy packages are not importable; set "
                          f"{HOME_ENV} to the project root for tritonserver, or `pip install .` the project into the "
                          "environment its python backend runs")
