"""The capture section as the served models read it: `<repo>/capture.json` (triton_repo/models/capture.py), written
by the triton stage when `capture.enabled`, and the rules between capture and the rest of the config."""

from __future__ import annotations

import os
from pathlib import Path

from builders.config import BuildConfig
from triton_repo.models.capture import SETTINGS_FILE, Settings

DEFAULT_DIR = "capture"  # inside output_dir


def store_dir(cfg: BuildConfig) -> Path:
    """capture.dir, or <output_dir>/capture."""
    return Path(cfg.capture.dir) if cfg.capture.dir else Path(cfg.output_dir) / DEFAULT_DIR


def settings(cfg: BuildConfig, repo_final: Path) -> Settings:
    """The served models' settings; the store path relative to the repository when it lies in the build, so a build
    that moves keeps its store."""
    c = cfg.capture
    d = Path(os.path.abspath(store_dir(cfg)))  # not resolve(): a link is refused (triton stage), never followed
    rel = os.path.relpath(d, os.path.abspath(repo_final))
    inside = d.is_relative_to(Path(os.path.abspath(cfg.output_dir)))
    return Settings(dir=rel if inside else str(d), max_bytes=c.max_bytes, sample_rate=c.sample_rate,
                    segment_records=c.segment_records, segment_seconds=c.segment_seconds, queue_size=c.queue_size)


def write_settings(cfg: BuildConfig, repo_final: Path, out: Path) -> Path:
    f = out / SETTINGS_FILE
    f.write_text(settings(cfg, repo_final).to_json())
    return f
