"""Publish a gated candidate as the next version of the served LLM model, and roll back (docs/adaptive.md).

Install: version N+1 is written beside the served version N in a staging directory and renamed into the model's
directory whole (triton_repo/models/versions.py has its layout): the version's files copied from version N, the
candidate normalized as `draft_head/`, the gate's figures as its `acceptance_baseline.json` and, for the llmapi layout,
model.yaml with `speculative_config.speculative_model_dir` naming that head (what TensorRT-LLM's llmapi model loads on
a GPU). Load: Triton's model-repository API (`POST /v2/repository/models/<model>/load`, the admin key in the
`eagle-admin-key` header: triton_repo/exposure.py) on a server started with `--model-control explicit`. Triton serves
the newest version (version policy latest 1): it loads N+1 while N keeps serving, routes new requests to N+1 once it
is ready, and unloads N when the requests N holds are done. Rollback: the newest version directory moves out of the
repository (kept under BUILD/refresh/retired/) and the same load makes the version before it the served one.

The published head is the gated head: the refresh records the content digest of the candidate's files in the gate's
figures (`head_digest()`), and install checks the files against it (a head with links is refused). Retention
(`prune()`): the build's own version 1 and the newest refresh.keep_versions published versions stay in the
repository, as many retired versions under BUILD/refresh/retired/; older ones are deleted.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from builders import layout
from triton_repo.exposure import ADMIN_HEADER
from triton_repo.models.spec_metrics import BASELINE_FILE
from triton_repo.models.versions import HEAD_DIR

HISTORY = "published.json"  # BUILD/refresh/published.json: every publish and rollback
RETIRED = "retired"
LOAD_TIMEOUT_S = 600.0


class RefreshInputError(ValueError):
    """The build, its store or its head cannot be refreshed (exit 2); the message says what to do."""


class PublishError(RuntimeError):
    """The candidate cannot be published (or rolled back) as asked; the message says what to do."""


def versions(model_dir: Path) -> list[int]:
    return sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit() and int(p.name) > 0)


def model_dir(build_dir: Path, llm_model: str) -> Path:
    d = build_dir / layout.TRITON_REPO / llm_model
    if not d.is_dir():
        raise PublishError(f"{d} not found: build the Triton repository first (python builders/build.py CONFIG)")
    return d


def served_head(build_dir: Path, llm_model: str) -> Path:
    """The head the newest version serves (normalized): its draft_head/, else the build's checkpoint/eagle3/."""
    d = model_dir(build_dir, llm_model)
    newest = d / str(versions(d)[-1])
    return newest / HEAD_DIR if (newest / HEAD_DIR).is_dir() else build_dir / layout.CHECKPOINT / layout.EAGLE3_HEAD


def _model_yaml(source: dict[str, Any], version: int, llm_model: str) -> str:
    """The served version's model.yaml with its speculative model directory moved to this version's head (relative
    to the repository, as the build writes it: builders/triton/render_llmapi.py yaml_paths_relative)."""
    doc = dict(source)
    spec = dict(doc.get("speculative_config") or {})
    key = next((k for k in ("speculative_model_dir", "speculative_model") if k in spec), "speculative_model_dir")
    spec[key] = f"./{llm_model}/{version}/{HEAD_DIR}"
    doc["speculative_config"] = spec
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=120)


def head_digest(head: Path) -> str:
    """sha256 over a head's files (each relative path and its bytes, in name order). A link anywhere (the head
    itself, a file, a directory) is refused: what is published must be the files themselves."""
    if head.is_symlink():
        raise PublishError(f"{head} is a symbolic link: a published head must be the files the gate measured; "
                           "rerun the refresh to make a candidate")
    if not head.is_dir():
        raise PublishError(f"{head} not found: rerun the refresh to make a candidate")
    h = hashlib.sha256()
    for f in sorted(head.rglob("*")):
        if f.is_symlink():
            raise PublishError(f"{f} is a symbolic link: a published head must be the files the gate measured; "
                               "rerun the refresh to make a candidate")
        if f.is_file():
            rel = f.relative_to(head).as_posix()
            h.update(f"{rel}\0{f.stat().st_size}\0".encode())
            with f.open("rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
    return h.hexdigest()


def install(build_dir: Path, llm_model: str, run_dir: Path, gate: dict[str, Any]) -> int:
    """Write the candidate of `run_dir` as the next version; returns its number (not loaded yet). The candidate's
    files must have the digest the gate recorded (`gate["head_digest"]`, when given), checked on the copy."""
    from doctor.gate import normalize

    d = model_dir(build_dir, llm_model)
    have = versions(d)
    src, new = d / str(have[-1]), have[-1] + 1
    stage = run_dir / f".staging-{new}-{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    try:
        for f in src.iterdir():  # the model's own files (model.py, bootstrap, upstream's files on a GPU image)
            if f.is_file() and f.name not in ("model.yaml", BASELINE_FILE):
                shutil.copy2(f, stage / f.name)
        if "head_digest" in gate:
            shutil.copytree(run_dir / "head", stage / "gated", symlinks=True)
            if head_digest(stage / "gated") != gate["head_digest"]:
                raise PublishError(f"{run_dir / 'head'} is not the head the gate measured (its files' digest "
                                   "differs from the one in report.json); rerun the refresh, then publish its run")
        src_head = stage / "gated" if "head_digest" in gate else run_dir / "head"
        got = normalize(src_head, build_dir, stage / HEAD_DIR)
        if got != stage / HEAD_DIR:  # a head already in the normalized layout: copied as it is
            shutil.copytree(got, stage / HEAD_DIR)
        if (src / "model.yaml").is_file():
            (stage / "model.yaml").write_text(_model_yaml(yaml.safe_load((src / "model.yaml").read_text()), new,
                                                          llm_model))
        base = {k: gate["candidate"][k] for k in ("tau", "position_acceptance", "target_forwards",
                                                   "accepted_draft_tokens", "draft_tokens")}
        base.update(source="refresh gate", run=run_dir.name, requests=gate["requests"])
        (stage / BASELINE_FILE).write_text(json.dumps(base, indent=2) + "\n")
        shutil.rmtree(stage / "gated", ignore_errors=True)
        os.replace(stage, d / str(new)) if _same_fs(stage, d) else shutil.move(str(stage), d / str(new))
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return new


def _same_fs(a: Path, b: Path) -> bool:
    return a.stat().st_dev == b.stat().st_dev


def retirable(build_dir: Path, llm_model: str) -> tuple[int, int]:
    """(the newest version, the version served once it goes); refused when the newest is the build's own."""
    d = model_dir(build_dir, llm_model)
    have = versions(d)
    if len(have) < 2 or not (d / str(have[-1]) / HEAD_DIR).is_dir():
        raise PublishError(f"{d} serves version {have[-1]}, the build's own head: nothing published to roll back")
    return have[-1], have[-2]


def retire(build_dir: Path, llm_model: str) -> tuple[int, int, Path]:
    """Move the newest version out of the repository: (the version retired, the version served after it, where it
    went)."""
    newest, served = retirable(build_dir, llm_model)
    d = model_dir(build_dir, llm_model)
    dest = build_dir / "refresh" / RETIRED / f"{newest}-{time.strftime('%Y%m%d-%H%M%S')}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(d / str(newest)), dest)
    return newest, served, dest


def unretire(build_dir: Path, llm_model: str, version: int, kept: Path) -> None:
    """Undo retire(): the version back in the repository."""
    shutil.move(str(kept), model_dir(build_dir, llm_model) / str(version))


def withdraw(build_dir: Path, llm_model: str, version: int) -> None:
    """Undo install(): the version that never served leaves the repository."""
    shutil.rmtree(model_dir(build_dir, llm_model) / str(version))


def prune(build_dir: Path, llm_model: str, keep: int) -> list[str]:
    """Retention: delete published versions older than the newest `keep` (version 1, the build's own, stays) and
    retired versions beyond the newest `keep`; returns what went (relative to the build)."""
    d = model_dir(build_dir, llm_model)
    published = [v for v in versions(d) if v > 1]
    gone = [d / str(v) for v in published[:-keep]] if len(published) > keep else []
    retired_root = build_dir / "refresh" / RETIRED
    if retired_root.is_dir():
        kept = sorted((p for p in retired_root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
        gone += kept[:-keep] if len(kept) > keep else []
    for p in gone:
        shutil.rmtree(p)
    return [p.relative_to(build_dir).as_posix() for p in gone]


def post(url: str, admin_key: str, timeout: float) -> tuple[int, str]:
    req = urllib.request.Request(url, data=b"{}", method="POST", headers={ADMIN_HEADER: admin_key})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def load(server: str, admin_key: str, llm_model: str, version: int, timeout: float = LOAD_TIMEOUT_S) -> float:
    """Have the running server load the model's versions again and wait until `version` is ready; returns the
    seconds it took. `server` is the HTTP endpoint host:port."""
    t0 = time.monotonic()
    code, body = post(f"http://{server}/v2/repository/models/{llm_model}/load", admin_key, timeout)
    if code != 200:
        hint = (" (start the server with `python triton_repo/launch.py --model-control explicit`)"
                if "explicit" in body or "polling" in body or "not allowed" in body else "")
        if code in (401, 403) or "restricted" in body.lower():
            hint = f" (set $TRITON_ADMIN_KEY to the key the server was started with; header {ADMIN_HEADER})"
        raise PublishError(f"the server refused to load {llm_model}: HTTP {code} {body.strip()[:300]}{hint}")
    ready = f"http://{server}/v2/models/{llm_model}/versions/{version}/ready"
    while time.monotonic() - t0 < timeout:
        try:
            with urllib.request.urlopen(ready, timeout=5) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.25)
    raise PublishError(f"{llm_model} version {version} not ready after {timeout:.0f} s; see the server log")


def record(build_dir: Path, entry: dict[str, Any]) -> None:
    f = build_dir / "refresh" / HISTORY
    f.parent.mkdir(parents=True, exist_ok=True)
    history = json.loads(f.read_text()) if f.is_file() else []
    history.append(dict(entry, time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())))
    tmp = f.with_name(f.name + ".tmp")
    tmp.write_text(json.dumps(history, indent=2) + "\n")
    tmp.replace(f)
