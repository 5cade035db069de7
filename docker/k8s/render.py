"""`python docker/k8s/render.py CONFIG [--set a.b=v ...] [--out DIR] [--check]`: the installed command `eagle-k8s`
(builders/k8s/render.py) run from a checkout; the renderers are builders/k8s/manifests.py.

Inputs:  CONFIG, a build config with its `deploy` section
Outputs: the Kubernetes manifests in --out (--check: compare only)
Guide:   docs/deploy.md
"""

from __future__ import annotations

import sys

from builders.k8s.manifests import (  # noqa: F401  (re-exported for the tests that read the renderers from here)
    CACHE_DIR,
    IMAGE_UID,
    READY_TIMEOUT_S,
    SHM_SIZE,
    build_gpus,
    dns_name,
    gpus,
    in_flight_series,
)
from builders.k8s.render import main

if __name__ == "__main__":
    sys.exit(main())
