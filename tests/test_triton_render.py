"""Rendering the Triton model repository (no server): every config.pbtxt parses as tritonclient's ModelConfig, the
ensemble I/O equals tensorrtllm_backend's all_models/inflight_batcher_llm/ensemble/config.pbtxt for the tensors we
serve, golden renders for tensorrt and pytorch, strict errors (request helpers and the batcher: test_triton_models.py;
launching the server: test_triton_launch.py).

`UPDATE_GOLDEN=1 pytest tests/test_triton_render.py` rewrites tests/golden/triton/ (review the diff)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from builders.build import main as build_main
from builders.config import load_config
from builders.triton import render
from core.trees import DraftTree, preset
from tests.engine_cases import write_build_yaml
from triton_repo import contract as C

GOLDEN = Path(__file__).resolve().parent / "golden" / "triton"
REPO_ROOT = Path(__file__).resolve().parent.parent
MODELS = ("preprocessing", "tensorrt_llm", "postprocessing", "ensemble", "tensorrt_llm_bls")

# tensorrtllm_backend all_models/inflight_batcher_llm/ensemble/config.pbtxt (commit 6a749f5^, May 2025):
# (name, data_type, dims, optional) of the inputs/outputs we serve.
UPSTREAM_ENSEMBLE_INPUTS = {
    "text_input": ("TYPE_STRING", [1], False), "max_tokens": ("TYPE_INT32", [1], False),
    "stop_words": ("TYPE_STRING", [-1], True), "exclude_input_in_output": ("TYPE_BOOL", [1], True),
    "end_id": ("TYPE_INT32", [1], True), "pad_id": ("TYPE_INT32", [1], True), "top_k": ("TYPE_INT32", [1], True),
    "top_p": ("TYPE_FP32", [1], True), "temperature": ("TYPE_FP32", [1], True), "seed": ("TYPE_UINT64", [1], True),
    "beam_width": ("TYPE_INT32", [1], True), "return_perf_metrics": ("TYPE_BOOL", [1], True),
    "stream": ("TYPE_BOOL", [1], True),
}
UPSTREAM_ENSEMBLE_OUTPUTS = {
    "text_output": ("TYPE_STRING", [-1]), "acceptance_rate": ("TYPE_FP32", [1]),
    "total_accepted_draft_tokens": ("TYPE_INT32", [1]), "total_draft_tokens": ("TYPE_INT32", [1]),
}


def _yaml(root: Path, target: Path, head: Path, draft_type: str, backend: str, tree: str,
          version: str = "1.1") -> Path:
    return write_build_yaml(root / f"{backend}.yaml", output_dir=root / "build", target=target, head=head,
                            draft=draft_type, backend=backend, tree=tree, name=f"render-{backend}", version=version)


@pytest.fixture(scope="module")
def reference_repo(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path, eagle_head: Path) -> Path:
    root = tmp_path_factory.mktemp("render_ref")
    assert build_main([str(_yaml(root, tiny_target, eagle_head, "eagle", "reference", "topk-2-2"))]) == 0
    return root / "build" / "triton_repo"


@pytest.fixture(scope="module")
def tensorrt_build(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path, eagle_head: Path) -> tuple[Any, Path]:
    """TensorRT-LLM cannot build engines here: the checkpoint stage runs, the repository renders from the config
    (the engine path is only referenced)."""
    root = tmp_path_factory.mktemp("render_trt")
    cfg_file = _yaml(root, tiny_target, eagle_head, "eagle", "tensorrt", "trtllm-default")
    assert build_main([str(cfg_file), "--only", "checkpoint"]) == 0
    return load_config(cfg_file), root / "build"


@pytest.fixture(scope="module")
def target4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4-layer target: TensorRT-LLM's EAGLE-3 needs 3 distinct captured layers in 1..L-1 (builders/engine/llmapi.py)."""
    from testkit import tiny_models as tm

    return tm.make_target(tmp_path_factory.mktemp("target4") / "target", layers=4)


@pytest.fixture(scope="module")
def pytorch_build(tmp_path_factory: pytest.TempPathFactory, target4: Path) -> tuple[Any, Path]:
    from testkit import tiny_models as tm

    root = tmp_path_factory.mktemp("render_pt")
    head = tm.make_eagle3_head(root / "eagle3", target4)
    # Three distinct input-indexed layers (the fixture repeats one, which TensorRT-LLM's set cannot express).
    head_cfg = json.loads((head / "config.json").read_text())
    head_cfg["eagle_aux_hidden_state_layer_ids"] = [1, 2, 3]
    (head / "config.json").write_text(json.dumps(head_cfg))
    # a 4-layer target has no three distinct default capture layers: TensorRT-LLM 1.2 writes eagle3_layers_to_capture
    cfg_file = _yaml(root, target4, head, "eagle3", "pytorch", "chain-3", version="1.2")
    assert build_main([str(cfg_file), "--only", "checkpoint", "--only", "engine"]) == 0
    return load_config(cfg_file), root / "build"


def parse(repo: Path, model: str) -> mc.ModelConfig:
    return text_format.Parse((repo / model / "config.pbtxt").read_text(), mc.ModelConfig())


def normalized(text: str, build: Path, target: Path | None = None, repo: Path | None = None) -> str:
    if repo is not None:  # the python models' paths, relative to the repository's directory
        rel = os.path.relpath(build.resolve(), repo.resolve())
        text = text.replace(f'"{rel}/', '"<BUILD>/').replace(f'"{rel}"', '"<BUILD>"')
        text = text.replace(f": {rel}/", ": <BUILD>/")  # model.yaml's directories (YAML, unquoted)
    text = text.replace(str(build.resolve()), "<BUILD>").replace(str(REPO_ROOT), "<PROJECT>")
    return text if target is None else text.replace(str(target.resolve()), "<TARGET>")


def check_golden(rel: str, text: str) -> None:
    f = GOLDEN / rel
    if os.environ.get("UPDATE_GOLDEN") == "1":
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    assert f.is_file(), f"golden file {f} missing; run with UPDATE_GOLDEN=1 and review it"
    assert text == f.read_text(), f"{rel} differs from the golden file (UPDATE_GOLDEN=1 to accept after review)"


# ---- contract and rendered configs -------------------------------------------------------------------------------


def test_contract_wiring_is_consistent() -> None:
    assert C.check_wiring() == []


def test_every_config_parses_and_no_placeholder_survives(reference_repo: Path) -> None:
    for m in MODELS:
        text = (reference_repo / m / "config.pbtxt").read_text()
        assert "${" not in text
        cfg = parse(reference_repo, m)
        assert cfg.name == m and cfg.max_batch_size == 8
    for f in reference_repo.rglob("*"):
        if f.is_file() and f.suffix in (".pbtxt", ".json", ".yaml"):
            assert "${" not in f.read_text(), f
    assert {p.name for p in reference_repo.iterdir()} == {
        *MODELS,
        "client.json",
        "manifest.json",
        "prometheus-rules.yml",
    }


def test_ensemble_io_matches_tensorrtllm_backend(reference_repo: Path) -> None:
    ens = parse(reference_repo, "ensemble")
    got_in = {i.name: (mc.DataType.Name(i.data_type), list(i.dims), i.optional) for i in ens.input}
    got_out = {o.name: (mc.DataType.Name(o.data_type), list(o.dims)) for o in ens.output}
    # text_input / max_tokens: required, but declared optional so that preprocessing can refuse a request missing
    # one (render.ensemble_config says why); the BLS model keeps upstream's attributes.
    required = {n: (*UPSTREAM_ENSEMBLE_INPUTS[n][:2], True) for n in C.REQUIRED_HELP}
    assert set(required) == {"text_input", "max_tokens"}
    assert got_in == {**UPSTREAM_ENSEMBLE_INPUTS, **required}
    assert got_out == UPSTREAM_ENSEMBLE_OUTPUTS
    assert [s.model_name for s in ens.ensemble_scheduling.step] == ["preprocessing", "tensorrt_llm", "postprocessing"]
    bls = parse(reference_repo, "tensorrt_llm_bls")
    assert {i.name: (mc.DataType.Name(i.data_type), list(i.dims), i.optional) for i in bls.input} == (
        UPSTREAM_ENSEMBLE_INPUTS
    )
    pre = {i.name: i.optional for i in parse(reference_repo, "preprocessing").input}
    assert pre["QUERY"] and pre["REQUEST_OUTPUT_LEN"]  # refused by the model itself when absent


def test_reference_llm_model_is_decoupled_python_with_queue_limit(reference_repo: Path) -> None:
    llm = parse(reference_repo, "tensorrt_llm")
    assert llm.backend == "python" and llm.model_transaction_policy.decoupled
    assert llm.dynamic_batching.default_queue_policy.max_queue_size == 64  # TritonConfig default
    params = {k: v.string_value for k, v in llm.parameters.items()}
    assert params["llm_kind"] == "reference"
    # The model takes its limits from the engine's reference.json, the one source; config.pbtxt carries only the
    # batch size Triton itself needs, equal to it.
    assert not {"max_batch_size", "max_input_len", "max_seq_len"} & set(params)
    spec = json.loads((reference_repo.parent / "engine" / "reference.json").read_text())
    assert (llm.max_batch_size, spec["max_seq_len"], spec["max_input_len"]) == (spec["max_batch_size"], 512, 256)
    # Paths relative to the repository's directory (the build moves as a whole); no path of the checkout.
    assert params["build_dir"] == ".." and params["tokenizer_dir"] == "../checkpoint/tokenizer"
    assert "project_root" not in params
    assert (reference_repo / "tensorrt_llm" / "1" / "model.py").read_text() == (
        REPO_ROOT / "triton_repo" / "models" / "reference_llm.py"
    ).read_text()


def test_triton_stage_refuses_limits_that_disagree_with_the_engine_spec(reference_repo: Path) -> None:
    from builders.triton.stage import limits_problems

    build = reference_repo.parent
    cfg = load_config(build.parent / "reference.yaml")
    assert limits_problems(cfg, build) == []
    stale = cfg.model_copy(
        update={"engine": cfg.engine.model_copy(update={"max_batch_size": cfg.engine.max_batch_size + 1})}
    )
    (msg,) = limits_problems(stale, build)
    assert f"engine.max_batch_size={cfg.engine.max_batch_size + 1} but the engine stage's reference.json has " \
        f"{cfg.engine.max_batch_size}: rebuild the engine stage" in msg


def test_client_json_is_generated_from_the_ensemble_config(reference_repo: Path) -> None:
    desc = json.loads((reference_repo / "client.json").read_text())
    ens = parse(reference_repo, "ensemble")
    wire = {"TYPE_STRING": "BYTES", "TYPE_INT32": "INT32", "TYPE_UINT64": "UINT64", "TYPE_FP32": "FP32",
            "TYPE_BOOL": "BOOL"}
    assert desc["model"] == ens.name and desc["streaming"] is True and desc["backend"] == "reference"
    assert [(i["name"], i["datatype"], i["dims"], i["optional"]) for i in desc["inputs"]] == [
        (i.name, wire[mc.DataType.Name(i.data_type)], list(i.dims), i.optional and i.name not in C.REQUIRED_HELP)
        for i in ens.input
    ]  # client.json says what a client must send: text_input and max_tokens are required
    assert [o["name"] for o in desc["outputs"]] == [o.name for o in ens.output]
    defaults = {i["name"]: i["default"] for i in desc["inputs"]}
    assert defaults["temperature"] == 1.0 and defaults["stream"] is False and defaults["end_id"] is None
    assert desc["max_seq_len"] == 512 and desc["perf_outputs"] == [t.name for t in C.PERF_OUTPUTS]


def test_streaming_false_renders_non_decoupled_models(tensorrt_build: tuple[Any, Path], tmp_path: Path) -> None:
    cfg, build = tensorrt_build
    cfg = cfg.model_copy(update={"triton": cfg.triton.model_copy(update={"streaming": False})})
    render.render(cfg, build, tmp_path / "repo")
    assert not parse(tmp_path / "repo", "tensorrt_llm").model_transaction_policy.decoupled
    assert not parse(tmp_path / "repo", "tensorrt_llm_bls").model_transaction_policy.decoupled
    assert json.loads((tmp_path / "repo" / "client.json").read_text())["streaming"] is False


# ---- golden renders -----------------------------------------------------------------------------------------------


def test_tensorrt_render_golden(tensorrt_build: tuple[Any, Path], tmp_path: Path) -> None:
    cfg, build = tensorrt_build
    repo = tmp_path / "repo"
    render.render(cfg, build, repo)
    llm = parse(repo, "tensorrt_llm")
    params = {k: v.string_value for k, v in llm.parameters.items()}
    assert llm.backend == "tensorrtllm" and llm.model_transaction_policy.decoupled
    assert params["eagle_choices"] == render.triton_eagle_choices(DraftTree.from_choices(preset("trtllm-default")))
    assert params["eagle_choices"].startswith("{0}, {1}, {2}") and params["eagle_choices"].count("{") == 63
    assert params["decoding_mode"] == "eagle" and params["gpt_model_type"] == "inflight_fused_batching"
    assert params["gpt_model_path"] == os.path.relpath(build / "engine", repo)
    assert not (repo / "tensorrt_llm" / "1" / "model.py").exists()  # the C++ backend needs no model.py
    for m in MODELS:
        check_golden(
            f"tensorrt/{m}/config.pbtxt", normalized((repo / m / "config.pbtxt").read_text(), build, repo=repo)
        )
    desc = json.loads((repo / "client.json").read_text())
    assert desc.pop("config_hash") == cfg.config_hash()  # depends on the tmp paths: not golden
    check_golden("tensorrt/client.json", json.dumps(desc, indent=2) + "\n")


def test_engine_flow_repository_holds_no_absolute_path_and_moves_with_its_build(
        tensorrt_build: tuple[Any, Path], tmp_path: Path) -> None:
    """Every path parameter of every model, the C++ tensorrtllm one included, is relative to the repository, so a
    build copied elsewhere resolves to its new engine and tokenizer (the launcher starts tritonserver in the
    repository directory, against which the C++ backend resolves gpt_model_path: tests/test_triton_moved_build.py)."""
    import shutil

    cfg, build = tensorrt_build
    origin = tmp_path / "origin"
    shutil.copytree(build, origin, ignore=shutil.ignore_patterns("triton_repo*"))
    (origin / "engine").mkdir(exist_ok=True)  # TensorRT-LLM cannot build engines here: the directory stands for it
    render.render(cfg, origin, origin / "triton_repo")
    moved = tmp_path / "volume" / "models" / "build"
    moved.parent.mkdir(parents=True)
    shutil.move(str(origin), str(moved))
    repo = moved / "triton_repo"
    for f in repo.rglob("*"):
        if f.is_file():
            assert str(origin) not in f.read_text() and str(tmp_path) not in f.read_text(), f
    resolved = {}
    for m in MODELS:
        for key, v in parse(repo, m).parameters.items():
            assert not os.path.isabs(v.string_value), (m, key, v.string_value)
            if key in render.REPOSITORY_RELATIVE:
                resolved[(m, key)] = (repo / v.string_value).resolve()
    assert resolved[("tensorrt_llm", "gpt_model_path")] == (moved / "engine").resolve()
    assert (resolved[("tensorrt_llm", "tokenizer_dir")] / "tokenizer_config.json").is_file()
    assert resolved[("preprocessing", "tokenizer_dir")] == resolved[("tensorrt_llm", "tokenizer_dir")]


def test_pytorch_render_golden(pytorch_build: tuple[Any, Path], target4: Path, tmp_path: Path) -> None:
    import yaml

    cfg, build = pytorch_build
    repo = tmp_path / "repo"
    render.render(cfg, build, repo)
    doc = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
    options = yaml.safe_load((build / "engine" / render.LLMAPI_OPTIONS_FILE).read_text())
    # 1.2 reads with transformers 4: the model is the convert stage's transformers-4 copy of the target
    assert doc["backend"] == "pytorch" and doc["model"].startswith("../")  # relative to the repository: it moves
    assert (repo / doc["model"]).resolve() == (build / "checkpoint" / "hf_model").resolve()
    spec = doc["speculative_config"]
    head = spec.get("speculative_model_dir") or spec["speculative_model"]
    assert not Path(head).is_absolute() and (repo / head).resolve() == Path(options["speculative_config"][
        "speculative_model_dir" if "speculative_model_dir" in spec else "speculative_model"]).resolve()
    assert {k: v for k, v in doc.items() if k not in ("model", "backend", "triton_config", "speculative_config")} == {
        k: v for k, v in options.items() if k != "speculative_config"}
    assert doc["triton_config"] == {"max_batch_size": 8, "decoupled": True}
    assert parse(repo, "tensorrt_llm").parameters["llm_kind"].string_value == "pytorch"
    for m in MODELS:
        check_golden(f"pytorch/{m}/config.pbtxt", normalized((repo / m / "config.pbtxt").read_text(), build, repo=repo))
    model_yaml = (repo / "tensorrt_llm" / "1" / "model.yaml").read_text()
    check_golden("pytorch/model.yaml", normalized(model_yaml, build, target4, repo=repo))


# ---- strictness ---------------------------------------------------------------------------------------------------


def test_missing_tokenizer_is_an_error_naming_the_fix(tensorrt_build: tuple[Any, Path], tmp_path: Path) -> None:
    cfg, _ = tensorrt_build
    with pytest.raises(render.RenderError, match=r"tokenizer not found at .*run the checkpoint stage first"):
        render.render(cfg, tmp_path / "empty_build", tmp_path / "repo")


def test_render_refuses_a_non_empty_directory(tensorrt_build: tuple[Any, Path], tmp_path: Path) -> None:
    cfg, build = tensorrt_build
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "old").write_text("x")
    with pytest.raises(render.RenderError, match="is not empty"):
        render.render(cfg, build, tmp_path / "repo")


def test_duplicate_model_names_are_refused(tensorrt_build: tuple[Any, Path]) -> None:
    cfg, _ = tensorrt_build
    bad = cfg.model_copy(update={"triton": cfg.triton.model_copy(update={"bls_model": "ensemble"})})
    assert render.config_problems(bad) == [
        "triton.bls_model='ensemble' is also triton.ensemble_model; every Triton model needs its own name"
    ]


def test_pytorch_render_needs_the_engine_stage(pytorch_build: tuple[Any, Path], tmp_path: Path) -> None:
    cfg, build = pytorch_build
    fake = tmp_path / "b"
    (fake / "checkpoint").mkdir(parents=True)
    (fake / "checkpoint" / "tokenizer").symlink_to(build / "checkpoint" / "tokenizer")
    with pytest.raises(render.RenderError, match="llm_api_options.yaml not found: run the engine stage"):
        render.render(cfg, fake, tmp_path / "repo")


@pytest.mark.parametrize("layout", ["ensemble", "llmapi"])
def test_pytorch_repositories_hold_no_absolute_path_and_move_with_their_build(
        pytorch_build: tuple[Any, Path], target4: Path, tmp_path: Path, layout: str) -> None:
    """model.yaml's directories (the target and the EAGLE-3 head) are written relative to the repository, starting
    with ./ or ../ (never a Hugging Face repo id), for both layouts that hand them to the LLM API; after the build
    is moved they resolve to the moved checkpoint, as our llmapi model resolves them (common.yaml_paths_resolved)
    and as upstream's resolves them from the server's working directory (the repository: triton_repo/launch.py)."""
    import shutil

    import yaml

    from triton_repo.models.common import yaml_paths_resolved

    _, fixture_build = pytorch_build  # its head, built in place here: a build records where it was made
    cfg_file = _yaml(tmp_path, target4, fixture_build.parent / "eagle3", "eagle3", "pytorch", "chain-3", version="1.2")
    assert build_main([str(cfg_file), "--only", "checkpoint", "--only", "engine"]) == 0
    cfg, origin = load_config(cfg_file), tmp_path / "build"
    if layout == "llmapi":
        render.render_llmapi(cfg, origin, origin / "triton_repo")
    else:
        render.render(cfg, origin, origin / "triton_repo")
    moved = tmp_path / "volume" / "models" / "build"
    moved.parent.mkdir(parents=True)
    shutil.move(str(origin), str(moved))
    repo = moved / "triton_repo"
    doc = yaml.safe_load((repo / cfg.triton.llm_model / "1" / "model.yaml").read_text())
    spec = doc["speculative_config"]
    key = "speculative_model_dir" if "speculative_model_dir" in spec else "speculative_model"
    for value in (doc["model"], spec[key]):
        assert value.startswith(("./", "../")), value
    resolved = yaml_paths_resolved(doc, str(repo))
    assert Path(resolved["model"]) == (moved / "checkpoint" / "hf_model").resolve()
    assert Path(resolved["speculative_config"][key]) == (moved / "checkpoint" / "eagle3").resolve()
    assert (repo / doc["model"]).resolve() == Path(resolved["model"])  # the server's cwd reading agrees
    for f in repo.rglob("*"):
        if f.is_file() and f.name != "manifest.json":
            assert str(origin) not in f.read_text() and str(tmp_path) not in f.read_text(), f


def _guard_wiring(repo: Path) -> dict[str, Any]:
    """Where INTERNAL_TOKEN appears and each python model's internal_guard parameter."""
    cfgs = {m: parse(repo, m) for m in MODELS}
    steps = {s.model_name: s for s in cfgs["ensemble"].ensemble_scheduling.step}
    return {
        "guard": {m: c.parameters["internal_guard"].string_value for m, c in cfgs.items()
                  if "internal_guard" in c.parameters},
        "pre_out": "INTERNAL_TOKEN" in {o.name for o in cfgs["preprocessing"].output},
        "llm_in": "INTERNAL_TOKEN" in {i.name for i in cfgs["tensorrt_llm"].input},
        "wired": ("INTERNAL_TOKEN" in steps["preprocessing"].output_map,
                  "INTERNAL_TOKEN" in steps["tensorrt_llm"].input_map),
        "ensemble_out": {o.name for o in cfgs["ensemble"].output},
    }


@pytest.mark.parametrize("expose", [False, True])
def test_internal_guard_wiring_follows_expose_internal_models(
    pytorch_build: tuple[Any, Path], tmp_path: Path, expose: bool
) -> None:
    """Guarded (default): preprocessing emits the token, the ensemble carries it to the LLM model only (never an
    ensemble output); exposed: no token anywhere and every python model is told so."""
    cfg, build = pytorch_build
    cfg = cfg.model_copy(update={"triton": cfg.triton.model_copy(update={"expose_internal_models": expose})})
    render.render(cfg, build, tmp_path / "repo")
    got = _guard_wiring(tmp_path / "repo")
    flag = "false" if expose else "true"
    assert got["guard"] == {"preprocessing": flag, "tensorrt_llm": flag, "tensorrt_llm_bls": flag}
    assert (got["pre_out"], got["llm_in"], got["wired"]) == ((not expose), (not expose), (not expose, not expose))
    assert "INTERNAL_TOKEN" not in got["ensemble_out"] and "_INTERNAL_TOKEN" not in got["ensemble_out"]


def test_cpp_backend_is_never_guarded(tensorrt_build: tuple[Any, Path], tmp_path: Path) -> None:
    """The C++ tensorrtllm backend cannot check a token: nothing is wired, the python models do not guard."""
    cfg, build = tensorrt_build
    render.render(cfg, build, tmp_path / "repo")
    got = _guard_wiring(tmp_path / "repo")
    assert got["guard"] == {"preprocessing": "false", "tensorrt_llm_bls": "false"}
    assert (got["pre_out"], got["llm_in"], got["wired"]) == (False, False, (False, False))
