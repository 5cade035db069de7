"""The ONE record of the container this toolkit is pinned to, and the engine-flow checks against it (builders/startup.py
 runs them at start-up).

Everything that names the GPU container (docker/Dockerfile, docker/docker-compose.yml, docker/k8s/*, docs/deploy.md)
is checked against these constants by tests/test_docker.py, so changing the pin is a one-line edit here plus the
places the tests point at.

Sources (verified, not guessed):
- NGC tag -> TensorRT-LLM version: Triton's release compatibility matrix, "Container Name: trtllm-python-py3",
  https://docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/introduction/compatibility.html
  (25.12 -> TensorRT-LLM 1.1.0, Python 3.12.3, CUDA 13.0.2, driver 580.95.05), consistent with
  triton-inference-server/tensorrtllm_backend PR #830 "TensorRT-LLM Backend v1.1.0 release".
- Removal of the engine flow: NVIDIA/TensorRT-LLM docs/source/legacy/tensorrt-backend-removal.md
  ("`trtllm-build` / `trtllm-refit` / `trtllm-prune` ... No engine-build step", `LLM(backend="tensorrt")` raises)
  and PRs #15918 (remove the TensorRT python modules) and #15907 (remove the TensorRT-engine Triton C++ backend),
  merged on main in July 2026, after the 1.2 release branch (whose multimodal path is marked "End of Life:
  TensorRT-LLM-V1.2"). So 1.2.x is the last series with `trtllm-build`; anything from 1.3 on has no engine flow.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata

from packaging.version import InvalidVersion, Version

from core.trtllm_versions import TRITON_IMAGE, TRITON_RELEASE, TRTLLM_VERSION

# ---- the pin ------------------------------------------------------------------------------------------------------
# TRITON_RELEASE, TRTLLM_VERSION (compatibility matrix above), TRITON_IMAGE: core/trtllm_versions.py, where the
# version table reads them

# Names of the images docker/ builds (compose, Kubernetes manifests and docs use these; tests check they agree).
GPU_IMAGE = f"eagle-deploy:triton{TRITON_RELEASE}-trtllm{TRTLLM_VERSION}"
CPU_IMAGE = "eagle-deploy:cpu"

# ---- the current line ---------------------------------------------------------------------------------------------
# No NGC tritonserver image carries TensorRT-LLM >= 1.3 (the compatibility matrix stops at 26.07 -> 1.2.1), so
# docker/Dockerfile.current installs the wheel into a Triton image and adds TensorRT-LLM's llmapi Triton model from
# the same tag, where tensorrtllm_backend's Dockerfile puts it (/app/all_models/llmapi). Not built on a GPU here.
CURRENT_TRTLLM_VERSION = "1.4.0rc4"  # core/trtllm_versions.py VERSIONS["1.4"].release
CURRENT_TRTLLM_TAG = "v1.4.0rc4"
CURRENT_TRITON_BASE = "nvcr.io/nvidia/tritonserver:26.07-py3"  # the newest Triton in the matrix (CUDA 13.1)
CURRENT_GPU_IMAGE = f"eagle-deploy:trtllm{CURRENT_TRTLLM_VERSION}"
# TensorRT-LLM's pip recipe (docs/source/installation/installation-guide.md at commit 0360df4c, "Install on Linux via
# pip"): the PyTorch CUDA 13.0 build first ("to align with the CUDA version used for building TensorRT LLM wheels";
# pip's default torch is a CUDA 12.8 build), Open MPI (`apt-get install libopenmpi-dev`), then "uninstall any previous
# CUTLASS DSL installation" (CUTLASS_DSL_PACKAGES), `pip3 install --ignore-installed pip "setuptools<80" wheel`
# (PIP_BOOTSTRAP) and the wheel with torch held by a constraints file. docker/Dockerfile.current follows it in that
# order (tests/test_docker.py); the build checks the result (current_image_problems).
CURRENT_TORCH_CUDA = "cu130"  # the local version tag of that torch build (torch==X+cu130)
CUTLASS_DSL_PACKAGES = ("nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-base", "nvidia-cutlass-dsl-libs-core",
                        "nvidia-cutlass-dsl-libs-cu12", "nvidia-cutlass-dsl-libs-cu13")
PIP_BOOTSTRAP = ("pip", "setuptools<80", "wheel")  # installed with --ignore-installed right before the wheel
LLMAPI_MODEL_FILES = (
    "/app/all_models/llmapi/tensorrt_llm/1/model.py",
    "/app/all_models/llmapi/tensorrt_llm/1/helpers.py",
)

# ---- the engine flow ----------------------------------------------------------------------------------------------
# Last TensorRT-LLM (major, minor) series that still ships convert_checkpoint + trtllm-build + the TRT engine runtime.
LAST_ENGINE_FLOW_SERIES = (1, 2)
TRTLLM_DISTRIBUTIONS = ("tensorrt_llm", "tensorrt-llm")  # wheel names seen on NVIDIA's index and NGC images


@dataclass(frozen=True)
class InstalledTrtllm:
    distribution: str
    version: str


def installed_trtllm() -> InstalledTrtllm | None:
    """TensorRT-LLM as recorded by the installed wheel's metadata (importing it would initialise CUDA)."""
    for name in TRTLLM_DISTRIBUTIONS:
        try:
            return InstalledTrtllm(name, metadata.version(name))
        except metadata.PackageNotFoundError:
            continue
    return None


def has_engine_flow(trtllm_version: str) -> bool:
    """True when this TensorRT-LLM version still has the TensorRT engine flow (<= 1.2.x).

    Compares the release tuple only, so pre-releases of a later series count as that series
    (1.3.0rc1 -> (1, 3): no engine flow), and NGC's build suffixes parse (1.0.3.2510 -> (1, 0)).
    """
    try:
        release = Version(trtllm_version).release
    except InvalidVersion:
        raise ValueError(
            f"cannot parse the installed TensorRT-LLM version {trtllm_version!r}; reinstall TensorRT-LLM or use the "
            f"pinned image {TRITON_IMAGE}"
        ) from None
    return tuple(release[:2]) <= LAST_ENGINE_FLOW_SERIES


def engine_flow_problems(backend: str, installed: InstalledTrtllm | None) -> list[str]:
    """Start-up check: problems (one line each, with the fix) for this backend and this TensorRT-LLM install.

    Only `engine.backend: tensorrt` depends on the engine flow. A missing TensorRT-LLM is not reported here: the
    engine stage's own preflight names the missing `trtllm-build` / GPU (and --dry-run still prints the plan).
    """
    from core.kinds import BACKENDS

    if not BACKENDS[backend].engine_flow or installed is None:
        return []
    try:
        ok = has_engine_flow(installed.version)
    except ValueError as e:
        return [f"engine.backend=tensorrt: {e}"]
    if ok:
        return []
    last = ".".join(map(str, LAST_ENGINE_FLOW_SERIES))
    return [
        f"engine.backend=tensorrt needs the TensorRT engine flow (convert_checkpoint + trtllm-build), but the "
        f"installed TensorRT-LLM is {installed.version} ({installed.distribution}); the engine flow was removed after "
        f"{last}.x. Fix: run in the pinned image {TRITON_IMAGE} (TensorRT-LLM {TRTLLM_VERSION}; docker/Dockerfile), "
        f"install tensorrt_llm<={last}.*, or set engine.backend=pytorch (LLM API, no engine build)"
    ]


def image_pin_problems() -> list[str]:
    """Run by docker/Dockerfile while building the GPU image: the base image must hold the recorded TensorRT-LLM
    (same major.minor.patch; NGC may append a build number, e.g. 1.0.3.2510)."""
    got = installed_trtllm()
    if got is None:
        return [f"{TRITON_IMAGE} should contain TensorRT-LLM {TRTLLM_VERSION} but none is installed"]
    if Version(got.version).release[:3] != Version(TRTLLM_VERSION).release[:3]:
        return [
            f"the base image holds TensorRT-LLM {got.version}, builders/versions.py records {TRTLLM_VERSION} for "
            f"{TRITON_IMAGE}; update TRTLLM_VERSION from the Triton compatibility matrix (and the FROM line)"
        ]
    return []


def _dist(name: str, path: list[str] | None) -> metadata.Distribution | None:
    """The installed distribution `name` (any spelling: tensorrt_llm / tensorrt-llm) on `path` (None: sys.path)."""
    from packaging.utils import canonicalize_name

    want = canonicalize_name(name)
    found = metadata.distributions() if path is None else metadata.distributions(path=path)
    return next((d for d in found if canonicalize_name(d.metadata["Name"] or "") == want), None)


def requirement_problems(dist_name: str, path: list[str] | None = None) -> list[str]:
    """What `pip check` would say about one wheel: each requirement it declares (for this platform, no extras) is
    installed at a version it accepts. A base image's other packages are not this image's concern."""
    from packaging.requirements import Requirement

    dist = _dist(dist_name, path)
    if dist is None:
        return [f"{dist_name} is not installed"]
    who = f"{dist.metadata['Name']} {dist.version}"
    p: list[str] = []
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        have = _dist(req.name, path)
        if have is None:
            p.append(f"{who} requires {req} but {req.name} is not installed")
        elif not req.specifier.contains(have.version, prereleases=True):
            p.append(f"{who} requires {req} but {req.name} {have.version} is installed")
    return p


def torch_cuda_problems(path: list[str] | None = None) -> list[str]:
    """The torch TensorRT-LLM's wheels are built against: the CUDA build recorded in CURRENT_TORCH_CUDA."""
    torch = _dist("torch", path)
    if torch is None:
        return ["torch is not installed: install the PyTorch CUDA build first (docker/Dockerfile.current)"]
    local = torch.version.partition("+")[2]
    if local != CURRENT_TORCH_CUDA:
        return [f"torch {torch.version} is not the {CURRENT_TORCH_CUDA} build TensorRT-LLM {CURRENT_TRTLLM_VERSION}'s "
                f"wheel needs (pip's default torch is a CUDA 12.8 build): install torch from the {CURRENT_TORCH_CUDA} "
                "index before tensorrt_llm and hold it with a constraints file (docker/Dockerfile.current)"]
    return []


def mpi_problems(path: list[str] | None = None) -> list[str]:
    """mpi4py (TensorRT-LLM's LLM API and Triton model spawn their workers with it) and the Open MPI library it
    loads, which the Triton base image does not carry."""
    import ctypes.util

    p = [] if _dist("mpi4py", path) else ["mpi4py is not installed (TensorRT-LLM's LLM API needs it)"]
    if ctypes.util.find_library("mpi") is None:
        p.append("no MPI library (libmpi) found: install the distribution's Open MPI (`apt-get install "
                 "libopenmpi-dev`, as TensorRT-LLM's install guide does)")
    return p


def bootstrap_problems(path: list[str] | None = None) -> list[str]:
    """The packaging tools the install guide puts in place before the wheel (PIP_BOOTSTRAP: setuptools below 80)."""
    from packaging.requirements import Requirement

    p = []
    cmd = " ".join(f'"{s}"' if "<" in s else s for s in PIP_BOOTSTRAP)
    for spec in PIP_BOOTSTRAP:
        req = Requirement(spec)
        have = _dist(req.name, path)
        if have is None or not req.specifier.contains(have.version, prereleases=True):
            got = f"{req.name} {have.version} installed" if have is not None else f"{req.name} is not installed"
            p.append(f"{got}, TensorRT-LLM's install guide wants {spec}: run `pip3 install --ignore-installed {cmd}` "
                     "before the wheel (docker/Dockerfile.current)")
    return p


def current_image_problems(path: list[str] | None = None) -> list[str]:
    """Run by docker/Dockerfile.current while building (no GPU there: nothing is imported): the wheel is the recorded
    current release with everything it requires, torch is the CUDA build it needs, MPI and the packaging tools of the
    install guide (setuptools<80) are there, and the llmapi
    Triton model files are where docker/serve.py takes them from. The import itself is checked when the container
    starts (builders/startup.py trtllm_import_problems)."""
    from pathlib import Path

    dist = _dist("tensorrt_llm", path)
    got = None if dist is None else InstalledTrtllm(dist.metadata["Name"], dist.version)
    p = []
    if got is None or Version(got.version).release[:3] != Version(CURRENT_TRTLLM_VERSION).release[:3] or (
            Version(got.version).pre != Version(CURRENT_TRTLLM_VERSION).pre):
        p.append(f"the image holds TensorRT-LLM {got.version if got else 'none'}, builders/versions.py records "
                 f"{CURRENT_TRTLLM_VERSION} (CURRENT_TRTLLM_VERSION); build with --build-arg "
                 f"TRTLLM_VERSION={CURRENT_TRTLLM_VERSION} or update the record and the registry")
    if got is not None:
        p += requirement_problems(got.distribution, path)
    p += torch_cuda_problems(path) + mpi_problems(path) + bootstrap_problems(path)
    p += [f"{f} missing: copy TensorRT-LLM {CURRENT_TRTLLM_TAG}'s triton_backend/all_models into /app/all_models"
          for f in LLMAPI_MODEL_FILES if not Path(f).is_file()]
    return p
