"""Which `tritonserver` to run: the system one (NGC container: /opt/tritonserver) when installed, otherwise the CPU
server bundled in the `nvidia-pytriton` wheel, with the backend directory and environment it needs (launch.py's
docstring says why each is needed)."""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

SYSTEM_TRITON_DIRS = (Path("/opt/tritonserver"),)  # NGC tritonserver / trtllm containers


class LaunchError(RuntimeError):
    """The server could not be started or did not become ready; the message carries its log tail."""


@dataclass(frozen=True)
class ServerBinary:
    """A tritonserver executable, the backend directory it loads backends from, and the env it needs."""

    executable: Path
    backend_dir: Path
    env: dict[str, str] = field(default_factory=dict)  # variables to set/prepend (values are full values)
    bundled: bool = False


# ---- finding the binary -------------------------------------------------------------------------------------------


def system_binary() -> ServerBinary | None:
    """`tritonserver` on PATH or in /opt/tritonserver, with its sibling `backends/` directory."""
    found = shutil.which("tritonserver")
    candidates = [Path(found)] if found else []
    candidates += [d / "bin" / "tritonserver" for d in SYSTEM_TRITON_DIRS]
    venv_bin = Path(sys.executable).parent
    for exe in candidates:
        # A `tritonserver` console script in our own venv would be a wrapper, not the server.
        if exe.is_file() and os.access(exe, os.X_OK) and exe.resolve().parent != venv_bin.resolve():
            backends = exe.resolve().parent.parent / "backends"
            if backends.is_dir():
                return ServerBinary(executable=exe, backend_dir=backends)
    return None


def _pytriton_root() -> Path:
    try:
        import pytriton
    except ImportError as e:
        raise LaunchError(
            "no system tritonserver found and nvidia-pytriton is not installed; `pip install nvidia-pytriton` "
            "(bundles a CPU tritonserver) or run inside the NGC tritonserver container"
        ) from e
    return Path(pytriton.__file__).resolve().parent


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "eagle-deploy"


def prepare_bundled_backends(root: Path, cache: Path) -> Path:
    """Backend directory for the bundled server: `python/` with the backend library and the stub for this Python.

    Built in a temporary directory and renamed into place, so concurrent first starts never see a partial one."""
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "tritonserver" / "python_backend_stubs" / py / "triton_python_backend_stub"
    backend_src = root / "tritonserver" / "backends" / "python"
    if not stub.is_file():
        raise LaunchError(f"nvidia-pytriton has no python-backend stub for Python {py} ({stub}); use Python 3.8-3.13")
    target = cache / f"triton-backends-py{py}-{root.stat().st_mtime_ns}"
    if (target / "python" / "triton_python_backend_stub").exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".backends-", dir=cache))
    (tmp / "python").mkdir()
    for src in backend_src.iterdir():
        if src.is_file():
            (tmp / "python" / src.name).symlink_to(src)
    (tmp / "python" / "triton_python_backend_stub").symlink_to(stub)
    try:
        tmp.rename(target)
    except OSError:  # another process won the race: use its directory
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _libpython_dir() -> str | None:
    """Directory of this interpreter's shared libpython (None for a static build: the system one is used)."""
    libdir, name = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
    if libdir and name and (Path(libdir) / name).is_file():
        return str(libdir)
    return None


def bundled_binary() -> ServerBinary:
    root = _pytriton_root()
    exe = root / "tritonserver" / "bin" / "tritonserver"
    libs = root.parent / "nvidia_pytriton.libs"
    if not exe.is_file():
        raise LaunchError(f"nvidia-pytriton is installed but {exe} is missing; reinstall nvidia-pytriton")
    env_path = os.environ.get("PATH", "")
    ld = os.environ.get("LD_LIBRARY_PATH", "")
    # The stub links `libpython3.X.so.1.0` dynamically; without help the loader picks the system one, whose
    # patch level can differ from this interpreter's (extension modules then fail with undefined symbols such
    # as `_PyModule_Add`). Put this interpreter's own shared libpython first.
    lib_dirs = [d for d in (_libpython_dir(),) if d is not None] + ([ld] if ld else []) + [str(libs)]
    env = {"PATH": f"{Path(sys.executable).parent}:{env_path}", "LD_LIBRARY_PATH": ":".join(lib_dirs)}
    return ServerBinary(exe, prepare_bundled_backends(root, _cache_root()), env, bundled=True)


def find_binary() -> ServerBinary:
    """The system tritonserver when installed, else the one bundled in nvidia-pytriton."""
    return system_binary() or bundled_binary()
