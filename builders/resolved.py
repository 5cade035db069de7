"""`<build>/config.resolved.yaml`: the validated config a build was made with, written by the build and read back by
the tools that work on a finished build (docker/serve.py, adaptive/refresh.py).

Its paths are recorded relative to the build directory (`output_dir: .`), so the record names no directory of the
machine that ran the build, and a build read from another place (a moved or mounted volume) is read where it is:
the reader resolves them against the directory the file is in, as the config loader resolves a config's paths
against the config's directory. Paths outside the build read as `../...`; `pip:NAME` and `random` stay as written.
Older records with absolute paths read unchanged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from builders.config import BuildConfig
from builders.layout import RESOLVED_CONFIG
from core.config_input import MAX_READ_BYTES, PATH_FIELDS, resolve_paths
from core.files import read_text
from core.records import record_path

RECORD_ONLY = ("derived", "defaults")  # written for the reader of the file; BuildConfig derives them again


def resolved_file(build_dir: Path) -> Path:
    return build_dir / RESOLVED_CONFIG


def dump_resolved(cfg: BuildConfig) -> str:
    """The resolved config as YAML, paths relative to the build directory, with the derived limits and the filled-in
    defaults written out for the record."""
    build_dir = Path(cfg.output_dir)
    data: dict[str, Any] = cfg.model_dump(mode="json")
    for section, key in PATH_FIELDS:
        holder = data if section is None else data.get(section)
        if isinstance(holder, dict) and isinstance(holder.get(key), str):
            holder[key] = record_path(holder[key], build_dir)
    data["derived"] = cfg.limits().model_dump()
    if cfg.defaults_applied:
        data["defaults"] = cfg.defaults_applied  # fields the config left out: the value used and why
    return yaml.safe_dump(data, sort_keys=False)


def load_resolved(build_dir: Path) -> BuildConfig:
    """The config of the finished build in `build_dir`, its paths resolved against `build_dir` (FileNotFoundError
    when the build never wrote one; callers say what to run)."""
    path = resolved_file(build_dir)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found")
    try:  # a bounded regular file (a FIFO would block the reader), YAML that parses
        data = yaml.safe_load(read_text(path, "the build's config", MAX_READ_BYTES))
    except (yaml.YAMLError, RecursionError) as e:
        raise ValueError(f"{path}: not a build's resolved config (unreadable YAML: {str(e)[:300]}); rerun the "
                         "build") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a build's resolved config (top level is {type(data).__name__}); rerun the build")
    for record_only in RECORD_ONLY:
        data.pop(record_only, None)
    problems = resolve_paths(data, build_dir.resolve())
    if problems:
        raise ValueError(f"{path}: {'; '.join(problems)}; rerun the build")
    return BuildConfig.model_validate(data)
