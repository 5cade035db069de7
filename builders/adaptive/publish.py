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
"""

from __future__ import annotations

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


def install(build_dir: Path, llm_model: str, run_dir: Path, gate: dict[str, Any]) -> int:
    """Write the candidate of `run_dir` as the next version; returns its number (not loaded yet)."""
    from builders.doctor.gate import normalize

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
        got = normalize(run_dir / "head", build_dir, stage / HEAD_DIR)
        if got != stage / HEAD_DIR:  # a head already in the normalized layout: copied as it is
            shutil.copytree(got, stage / HEAD_DIR)
        if (src / "model.yaml").is_file():
            (stage / "model.yaml").write_text(_model_yaml(yaml.safe_load((src / "model.yaml").read_text()), new,
                                                          llm_model))
        base = {k: gate["candidate"][k] for k in ("tau", "position_acceptance", "target_forwards",
                                                   "accepted_draft_tokens", "draft_tokens")}
        base.update(source="refresh gate", run=run_dir.name, requests=gate["requests"])
        (stage / BASELINE_FILE).write_text(json.dumps(base, indent=2) + "\n")
        os.replace(stage, d / str(new)) if _same_fs(stage, d) else shutil.move(str(stage), d / str(new))
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return new


def _same_fs(a: Path, b: Path) -> bool:
    return a.stat().st_dev == b.stat().st_dev


def retire(build_dir: Path, llm_model: str) -> tuple[int, int]:
    """Move the newest version out of the repository: (the version retired, the version served after it)."""
    d = model_dir(build_dir, llm_model)
    have = versions(d)
    if len(have) < 2 or not (d / str(have[-1]) / HEAD_DIR).is_dir():
        raise PublishError(f"{d} serves version {have[-1]}, the build's own head: nothing published to roll back")
    dest = build_dir / "refresh" / RETIRED / f"{have[-1]}-{time.strftime('%Y%m%d-%H%M%S')}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(d / str(have[-1])), dest)
    return have[-1], have[-2]


def _post(url: str, admin_key: str, timeout: float) -> tuple[int, str]:
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
    code, body = _post(f"http://{server}/v2/repository/models/{llm_model}/load", admin_key, timeout)
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
