"""A finished build moved to another directory serves: its Triton repository holds no path of where it was built
nor of the checkout (python models resolve their paths against the repository at start-up, and import the project
named by $EAGLE_DEPLOY_HOME or installed), on the real CPU tritonserver."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

tritonclient_grpc = pytest.importorskip("tritonclient.grpc")

from testkit.triton_requests import PROMPT, inputs, stream_call, text_of
from testkit.triton_servers import STOP_TIMEOUT_S, server_on, tiny_reference_repo
from triton_repo.models import bootstrap

REPO_ROOT = Path(__file__).resolve().parent.parent


def _served_files(d: Path) -> dict[Path, str]:
    """What the server and the models read (manifest.json is the build's record of how it was made: not read)."""
    out = {}
    for f in d.rglob("*"):
        if f.is_file() and f.suffix in (".pbtxt", ".json", ".yaml", ".py") and f.name != "manifest.json":
            out[f] = f.read_text()
    return out


@pytest.mark.server
def test_a_build_moved_elsewhere_serves_the_same_tokens(tmp_path: Path, tiny_target: Path, eagle_head: Path) -> None:
    from engines.api import GenerationRequest, ReferenceEngine, SamplingParams

    (tmp_path / "first").mkdir()
    built = tiny_reference_repo(tmp_path / "first", "tiny-moved", tiny_target, eagle_head, max_seq_len=128).parent
    moved = tmp_path / "elsewhere" / "volume" / "build"
    moved.parent.mkdir(parents=True)
    shutil.move(str(built), str(moved))
    assert not built.exists()
    for f, text in _served_files(moved / "triton_repo").items():
        assert str(built) not in text and str(tmp_path / "first") not in text, f
        assert str(REPO_ROOT) not in text, f  # nothing of the checkout either

    engine = ReferenceEngine.from_build(moved, device="cpu")
    tok = engine.tokenizer
    ids = tok.encode(PROMPT, add_special_tokens=True)
    [want] = engine.generate([GenerationRequest(ids, 12, SamplingParams(), [tok.eos_token_id])])

    srv = server_on(moved / "triton_repo", tmp_path / "tritonserver.log").start(timeout_s=240)
    try:
        # the server runs in the repository directory: the C++ backend resolves the relative gpt_model_path there
        assert Path(f"/proc/{srv.pid}/cwd").resolve() == (moved / "triton_repo").resolve()
        client = tritonclient_grpc.InferenceServerClient(srv.grpc_url)
        for model in ("ensemble", "tensorrt_llm_bls"):
            got = text_of(stream_call(client, model, inputs(PROMPT, 12)))
            assert got == tok.decode(ids + want.output_ids, skip_special_tokens=True), model
    finally:
        srv.stop(timeout_s=STOP_TIMEOUT_S)


def test_the_models_import_the_project_named_by_eagle_deploy_home(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    """$EAGLE_DEPLOY_HOME must be a checkout; unset, the installed project is used (here: importable), and a model
    process where neither holds is told what to set."""
    monkeypatch.setenv(bootstrap.HOME_ENV, str(tmp_path))
    with pytest.raises(ImportError, match=rf"model m: EAGLE_DEPLOY_HOME={tmp_path} is not an eagle-deploy checkout"):
        bootstrap.project_on_path({"model_name": "m"})
    monkeypatch.setenv(bootstrap.HOME_ENV, str(REPO_ROOT))
    bootstrap.project_on_path({"model_name": "m"})
    assert str(REPO_ROOT) in sys.path
    monkeypatch.delenv(bootstrap.HOME_ENV)
    bootstrap.project_on_path({"model_name": "m"})  # importable here: nothing to do
    monkeypatch.setattr(bootstrap.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(
        ImportError, match="set EAGLE_DEPLOY_HOME to the project root for tritonserver, or `pip install"
    ):
        bootstrap.project_on_path({"model_name": "m"})


def test_relative_path_parameters_resolve_against_the_repository(tmp_path: Path) -> None:
    from triton_repo.models import common

    cfg = {"name": "pre", "parameters": {"tokenizer_dir": {"string_value": "../checkpoint/tokenizer"},
                                         "abs": {"string_value": "/data/tok"}}}
    args: dict[str, Any] = {"model_config": json.dumps(cfg),
                            "model_repository": str(tmp_path / "vol" / "build" / "triton_repo" / "pre")}
    p = common.Params.of(args)
    assert p.path("tokenizer_dir") == str(tmp_path / "vol" / "build" / "checkpoint" / "tokenizer")
    assert p.path("abs") == "/data/tok"
    with pytest.raises(ValueError, match="parameter tokenizer_dir='../checkpoint/tokenizer' is relative"):
        common.Params(cfg).path("tokenizer_dir")
