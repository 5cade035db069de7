"""What a served model repository exposes and accepts, one home for both rules the launcher applies.

Admin endpoints: Triton's logging, model-repository (index, load, unload), trace and shared-memory APIs answer only
requests carrying the admin key, in the HTTP header `eagle-admin-key` or the gRPC metadata
`triton-grpc-protocol-eagle-admin-key` (Triton prefixes gRPC keys). tritonserver 2.51 spells the flags
`--grpc-restricted-protocol=<apis>:<key>=<value>` and `--http-restricted-api=<apis>:<key>=<value>` (server
src/command_line_parser.cc; `tritonserver --help`). Inference, health, metadata, model config and statistics stay
open (clients read the model config).

Paths: the python backend cannot start its stub under some paths (`SHELL_UNSAFE`, non-ASCII); the build refuses
such an output_dir and the launcher such a repository, with the reason, instead of a model that never loads.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

ADMIN_HEADER = "eagle-admin-key"  # the HTTP header; gRPC metadata keys must be lower case
# gRPC: Triton prefixes the key (server src/grpc/grpc_server.h kRestrictedProtocolHeaderTemplate; the 2.51 server asks
# for it by name).
ADMIN_GRPC_HEADER = f"triton-grpc-protocol-{ADMIN_HEADER}"
ADMIN_KEY_ENV = "TRITON_ADMIN_KEY"
RESTRICTED_APIS = ("logging", "model-repository", "trace", "shared-memory")
# The per-start secret that lets the internal models tell the server's own models from clients (models/guard.py):
# the launcher sets it in tritonserver's environment, which the python-backend stubs inherit.
INTERNAL_KEY_ENV = "EAGLE_INTERNAL_KEY"
# The python backend starts each model's stub with `bash -c " exec <stub> <model_path> <shm name> <sizes> ..."`,
# paths unquoted (triton-inference-server/python_backend src/stub_launcher.cc, StubLauncher::Launch; r24.10 as in
# tritonserver 2.51). bash splits that string into words: a space moves the shm byte size into the argument the
# stub parses with std::stol ("std::invalid_argument what(): stol", the model never loads); quotes, `$`,
# backquote, `\`, `;&|<>()` are shell syntax, and glob characters `*?[]` and braces `{}` may expand. Non-ASCII
# characters fail too (tritonserver 2.51 on CPU, even with LANG=C.UTF-8): the stub's embedded Python encodes the
# model path as ASCII ("UnicodeEncodeError: 'ascii' codec can't encode character").
SHELL_UNSAFE = frozenset(" \t\n\r\f\v'\"`$\\;&|<>()*?[]{}")


def unsafe_chars(path: Path | str) -> list[str]:
    """The characters of `path` that the python backend's stub mishandles: SHELL_UNSAFE, non-ASCII, control."""
    return sorted({c for c in str(path) if c in SHELL_UNSAFE or not (c.isascii() and c.isprintable())})


def unsafe_path_problem(path: Path | str, what: str) -> str | None:
    """Why the python backend cannot start a stub under `path` (None when it can)."""
    bad = unsafe_chars(path)
    if not bad:
        return None
    shown = ", ".join(repr(c) for c in bad)
    return (f"{what} {str(path)!r} contains {shown}: Triton's python backend starts its stub through `bash -c` with "
            "this path unquoted and reads it as ASCII, so every python model would fail to load (stub error "
            "`std::invalid_argument stol` for a space); use a path of ASCII letters, digits and - _ . / + , : @ = %")


# Model names: the python backend puts <repository>/<model>/<version>/model.py unquoted on that bash command line, so a
# name is a shell word: an allow-list, not a deny-list (`bls$(id>f)` ran `id` as root at launch before).
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
MODEL_NAME_RULE = "1 to 64 ASCII letters, digits, _ and -, starting with a letter or digit"


def model_name_problem(name: object, what: str) -> str | None:
    """Why `name` may not name a served model (None when it may)."""
    if isinstance(name, str) and MODEL_NAME.fullmatch(name):
        return None
    shown = repr(name) if len(repr(name)) <= 80 else repr(name)[:80] + "..."
    return f"{what} {shown} is not a model name this server accepts: use {MODEL_NAME_RULE}"


def repository_problems(repo: Path, limit: int = 5) -> list[str]:
    """Every model directory of `repo` must have an allowed name, and no path under it may hold characters the
    stub's command line mishandles (a version directory, a model file named by default_model_filename)."""
    problems = []
    for entry in sorted(repo.iterdir()):
        if entry.is_dir() and (p := model_name_problem(entry.name, f"model directory {entry}:")) is not None:
            problems.append(p)
    for root, dirs, files in os.walk(repo):  # links to directories are listed, not followed
        for name in dirs + files:
            bad = unsafe_chars(name)
            if bad:
                problems.append(unsafe_path_problem(Path(root, name), "model repository path") or "")
    return problems[:limit] + ([f"... and {len(problems) - limit} more"] if len(problems) > limit else [])


def restricted_api_argv(admin_key: str) -> list[str]:
    """The admin endpoints behind `ADMIN_HEADER: admin_key`, for both protocols (tritonserver 2.51 flag names)."""
    if not admin_key or any(c in admin_key for c in ",:= \t\n"):
        raise ValueError("the admin key must be non-empty, without , : = or whitespace (Triton's flag syntax)")
    group = f"{','.join(RESTRICTED_APIS)}:{ADMIN_HEADER}={admin_key}"
    return [f"--grpc-restricted-protocol={group}", f"--http-restricted-api={group}"]
