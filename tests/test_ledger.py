"""The contract ledger (ledger/*.py) against real outputs, both ways: every name a build emits for
TensorRT-LLM or Triton has a row for its TensorRT-LLM version, and every required row is present.

Builds on the tiny models: engine flow (checkpoint, trtllm-build argv, C++ Triton repository), FP8 engine flow
(FP8 weights + FP8 KV cache: the drafter's KV scales), PyTorch backend (LLM API YAML, trtllm-serve argv, LLM-API
Triton repository) and the reference backend, for every supported version.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from builders.build import main as build_main
from builders.config import load_config
from builders.engine import crosscheck
from ledger import check as ledger_check
from core import trtllm_versions
from ledger import table as ledger, docs as ledger_docs, rows as ledger_rows
from testkit import tiny_models as tm
from tests.engine_cases import make_cfg, write_build_yaml

VERSIONS = tuple(trtllm_versions.VERSIONS)


def _config(root: Path, version: str, target: Path, head: Path, draft: str, backend: str, tree: str,
            **sections: Any) -> Path:
    return write_build_yaml(root / f"{backend}-{version}.yaml", output_dir=root / f"build-{backend}-{version}",
                            target=target, head=head, draft=draft, backend=backend, tree=tree, name=f"ledger-{backend}",
                            version=version,
                            engine={"device": "cpu", "max_batch_size": 4, "max_input_len": 128, "max_seq_len": 256},
                            **sections)


def _engine_flow_build(root: Path, version: str, target: Path, head: Path, **sections: Any) -> tuple[Any, Path]:
    """trtllm-build cannot run here: checkpoint stage + the rendered repository (what the triton stage writes)."""
    from builders.triton import render

    f = _config(root, version, target, head, "eagle", "tensorrt", "topk-2-2", **sections)
    assert build_main([str(f), "--only", "checkpoint"]) == 0
    cfg = load_config(f)
    build = Path(cfg.output_dir)
    render.render(cfg, build, build / "triton_repo")
    return cfg, build


@pytest.fixture(scope="module", params=ledger_rows.ENGINE_FLOW)
def tensorrt_build(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tiny_target: Path,
                   eagle_head: Path) -> tuple[Any, Path]:
    return _engine_flow_build(tmp_path_factory.mktemp("ledger_trt"), request.param, tiny_target, eagle_head)


@pytest.fixture(scope="module")
def fp8_build(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path, eagle_head: Path) -> tuple[Any, Path]:
    quant = {"weights": "fp8", "kv_cache": "fp8", "calibration": {"num_samples": 4, "max_length": 64}}
    return _engine_flow_build(tmp_path_factory.mktemp("ledger_fp8"), "1.1", tiny_target, eagle_head,
                              quantization=quant)


@pytest.fixture(scope="module")
def target8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 layers: the EAGLE-3 head's input ids [2, 4, 5] are TensorRT-LLM's default capture {1, 3, 4}."""
    return tm.make_target(tmp_path_factory.mktemp("target8") / "target", layers=8)


@pytest.fixture(scope="module", params=[("1.1", "chain-3"), ("1.2", "topk-2-2")])
def pytorch_build(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                  target8: Path) -> tuple[Any, Path]:
    version, tree = request.param
    root = tmp_path_factory.mktemp("ledger_pt")
    head = tm.make_eagle3_head(root / "eagle3", target8)
    f = _config(root, version, target8, head, "eagle3", "pytorch", tree)
    assert build_main([str(f)]) == 0
    cfg = load_config(f)
    return cfg, Path(cfg.output_dir)


@pytest.fixture(scope="module", params=["pytorch", "reference"])
def current_build(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                  target8: Path) -> tuple[Any, Path]:
    """The current line: EAGLE-3 head, dynamic tree, the llmapi Triton layout (upstream's model.py on a GPU, the
    reference engine's mirror on CPU)."""
    root = tmp_path_factory.mktemp("ledger_current")
    head = tm.make_eagle3_head(root / "eagle3", target8)
    f = _config(root, "1.4", target8, head, "eagle3", request.param, "chain-1")
    data = yaml.safe_load(f.read_text())
    data["tree"] = {"dynamic": {"top_k": 2, "depth": 3, "total_draft_tokens": 5}}
    f.write_text(yaml.safe_dump(data))
    assert build_main([str(f)]) == 0
    cfg = load_config(f)
    return cfg, Path(cfg.output_dir)


def test_current_line_build_is_fully_cited(current_build: tuple[Any, Path]) -> None:
    cfg, build = current_build
    emitted, problems = _check(cfg, build)
    assert problems == []
    assert not any(s.startswith("checkpoint.") for s in emitted)  # TensorRT-LLM no longer reads that format
    assert {"triton.llmapi.input", "triton.llmapi.output", "llmapi.model_yaml", "llmapi.option"} <= set(emitted)
    assert {"speculative_config.use_dynamic_tree", "speculative_config.dynamic_tree_max_topK",
            "speculative_config.max_total_draft_tokens", "speculative_config.speculative_model"} <= {
        k for k in emitted["llmapi.option"] if k.startswith("speculative_config.")}
    # No absolute project path is written (builds can move); the bridge imports the installed project.
    params = {"build_dir", "max_queue_size"} if cfg.engine.backend == "reference" else set()
    assert emitted.get("triton.llmapi.parameter", set()) == params
    # upstream's model.py / helpers.py come from the TensorRT-LLM image (docker/serve.py, model.py as
    # upstream_model.py); we write the mirror (reference) or the metrics bridge that subclasses upstream's (pytorch)
    files = sorted(p.name for p in (build / "triton_repo" / "tensorrt_llm").rglob("*") if p.is_file())
    assert files == ["config.pbtxt", "eagle_bootstrap.py", "model.py", "model.yaml"]


@pytest.fixture(scope="module")
def reference_build(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path, eagle_head: Path) -> tuple[Any, Path]:
    root = tmp_path_factory.mktemp("ledger_ref")
    f = _config(root, "1.1", tiny_target, eagle_head, "eagle", "reference", "topk-2-2")
    assert build_main([str(f)]) == 0
    cfg = load_config(f)
    return cfg, Path(cfg.output_dir)


def _check(cfg: Any, build: Path) -> tuple[dict[str, set[str]], list[str]]:
    emitted = ledger_check.build_names(cfg, build)
    return emitted, ledger_check.check_emitted(
        emitted, cfg.trtllm_version, ledger_check.build_flags(cfg, build / "checkpoint")
    )


def test_engine_flow_build_is_fully_cited(tensorrt_build: tuple[Any, Path]) -> None:
    cfg, build = tensorrt_build
    emitted, problems = _check(cfg, build)
    assert problems == []
    assert {"checkpoint.config", "checkpoint.tensor", "trtllm-build.flag", "triton.tensorrt_llm.parameter",
            "triton.tensorrt_llm.input", "triton.tensorrt_llm.output", "triton.model_config"} <= set(emitted)
    # the names that failed the first real deployment are there
    assert {"tokenizer_dir", "guided_decoding_backend", "xgrammar_tokenizer_info_path"} <= emitted[
        "triton.tensorrt_llm.parameter"]


def test_fp8_engine_flow_checkpoint_is_fully_cited(fp8_build: tuple[Any, Path]) -> None:
    cfg, build = fp8_build
    emitted, problems = _check(cfg, build)
    assert problems == []
    assert "eagle_nets.{k}.drafter.layers.{j}.attention.kv_cache_scaling_factor" in emitted["checkpoint.tensor"]


def test_pytorch_build_is_fully_cited(pytorch_build: tuple[Any, Path]) -> None:
    cfg, build = pytorch_build
    emitted, problems = _check(cfg, build)
    assert problems == []
    spec = {k for k in emitted["llmapi.option"] if k.startswith("speculative_config.")}
    if cfg.trtllm_version == "1.1":
        assert spec == {"speculative_config." + k for k in ("decoding_type", "max_draft_len", "speculative_model_dir",
                                                             "eagle3_one_model")}
    else:
        assert {"speculative_config.eagle_choices", "speculative_config.max_total_draft_tokens",
                "speculative_config.eagle3_layers_to_capture"} <= spec
    assert emitted["eagle3.config"] >= {"torch_dtype", "eagle_deploy"}  # keys the converter adds or changes
    written = json.loads((build / "checkpoint" / "eagle3" / "config.json").read_text())
    assert written["rope_theta"] == json.loads((Path(cfg.draft.model) / "config.json").read_text())["rope_theta"]


def test_reference_build_is_fully_cited(reference_build: tuple[Any, Path]) -> None:
    cfg, build = reference_build
    emitted, problems = _check(cfg, build)
    assert problems == [] and "triton.python_llm.parameter" in emitted


def test_check_refuses_uncited_names_and_missing_required_ones() -> None:
    p = ledger.check("triton.tensorrt_llm.parameter", "1.1",
                     {"gpt_model_type", "gpt_model_path", "tokenizer_dir", "guided_decoding_backend", "made_up"})
    assert p[0].startswith("triton.tensorrt_llm.parameter: 'made_up' is emitted but has no ledger row for "
                           "TensorRT-LLM 1.1.0")
    assert p[1:] == ["triton.tensorrt_llm.parameter: required 'xgrammar_tokenizer_info_path' is missing (TensorRT-LLM "
                     "1.1.0 reads it: NVIDIA/TensorRT-LLM@v1.1.0:triton_backend/inflight_batcher_llm/src/"
                     "model_instance_state.cc ModelInstanceState::getGuidedDecodingConfigFromParams (read without "
                     "try))"]
    # conditional rows: the drafter's KV scales are required only with an FP8 KV cache and an EAGLE-1 head
    pattern = "eagle_nets.{k}.drafter.layers.{j}.attention.kv_cache_scaling_factor"
    base = {r.name for r in ledger.rows_for("checkpoint.tensor", "1.1") if r.required and not r.when}
    assert not [x for x in ledger.check("checkpoint.tensor", "1.1", base, ledger.flags_of(eagle=False)) if pattern in x]
    assert any(
        pattern in x for x in ledger.check("checkpoint.tensor", "1.1", base, ledger.flags_of(eagle=True, kv_fp8=True))
    )


def test_version_specific_rows() -> None:
    # max_total_draft_tokens is not a field of TensorRT-LLM 1.1's DecodingBaseConfig
    p = ledger.check("llmapi.option", "1.1", {"speculative_config", "speculative_config.decoding_type",
                                              "speculative_config.max_draft_len",
                                              "speculative_config.speculative_model_dir",
                                              "speculative_config.max_total_draft_tokens"})
    assert p == ["llmapi.option: 'speculative_config.max_total_draft_tokens' is emitted but has no ledger row for "
                 "TensorRT-LLM 1.1.0 (cite its upstream consumer or stop writing it)"]
    assert ledger.check("llmapi.option", "1.2", {"speculative_config", "speculative_config.decoding_type",
                                                 "speculative_config.max_draft_len",
                                                 "speculative_config.speculative_model_dir",
                                                 "speculative_config.max_total_draft_tokens"}) == []


def test_crosscheck_reads_only_cited_engine_keys() -> None:
    keys = set(crosscheck.expected_values(make_cfg()))
    assert ledger.check("engine.config", "1.1", keys) == []


def test_tokenizer_class_is_one_transformers_4_has() -> None:
    from builders.convert.tokenizer import transformers4_tokenizer_config

    fixed = transformers4_tokenizer_config({"tokenizer_class": "TokenizersBackend", "extra_special_tokens": ["<x>"]},
                                           has_tokenizer_json=True)
    assert fixed == {"tokenizer_class": "PreTrainedTokenizerFast", "additional_special_tokens": ["<x>"]}
    assert transformers4_tokenizer_config({"tokenizer_class": "LlamaTokenizer"}, True) == {"tokenizer_class":
                                                                                           "LlamaTokenizer"}


def test_every_row_is_well_formed() -> None:
    rows = ledger.all_rows()
    assert len({(r.surface, r.name, r.versions) for r in rows}) == len(rows), "duplicate rows"
    for r in rows:
        assert set(r.versions) <= set(trtllm_versions.VERSIONS) and r.versions, r
        assert r.source.repo and r.source.path and r.source.symbol, r
        for v in r.versions:
            assert "@" in r.cite(v) and r.source.path in r.cite(v)
    cited = {f"{r.source.repo}:{r.source.path}" for r in rows if r.source.repo == "NVIDIA/TensorRT-LLM"}
    read = " ".join(f for f, _, _, _ in ledger_docs.SOURCES)
    unread = {c for c in cited if c.split(":", 1)[1] not in read}
    assert unread == {
        "NVIDIA/TensorRT-LLM:tensorrt_llm/_torch/models/modeling_speculative.py"
    }  # listed as not verified
    assert any("modeling_speculative.py" in u for u in ledger_docs.UNVERIFIED)


def test_docs_are_a_fresh_render() -> None:
    assert ledger_docs.DOC.read_text() == ledger_docs.render(), "run: python -m ledger.docs"


def test_ledger_check_cli(reference_build: tuple[Any, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cfg, build = reference_build
    f = tmp_path / "c.yaml"
    f.write_text(json.dumps(cfg.model_dump(mode="json")))
    assert ledger_check.main([str(f)]) == 0
    assert "all cited" in capsys.readouterr().out
    assert ledger_check.main([str(f), "--set", f"output_dir={tmp_path / 'nothing'}"]) == 2
    assert "run the build first" in capsys.readouterr().err


def test_installed_trtllm_must_match_the_configs_version() -> None:
    assert trtllm_versions.installed_mismatch("1.1", None) == []
    assert trtllm_versions.installed_mismatch("1.1", "1.1.0") == []
    assert trtllm_versions.installed_mismatch("1.2", "1.2.1") == []
    (msg,) = trtllm_versions.installed_mismatch("1.1", "1.2.1")
    assert msg == (
        "trtllm_version '1.1': the outputs are written for TensorRT-LLM 1.1.0, but the installed TensorRT-LLM "
        "is 1.2.1; set trtllm_version: '1.2' and rebuild, or install TensorRT-LLM 1.1.0"
    )
    (new,) = trtllm_versions.installed_mismatch("1.2", "1.3.0rc1")
    assert "installed TensorRT-LLM is 1.3.0rc1; run in the pinned image" in new and "Checking a new" in new


def test_every_upstream_llmapi_input_is_declared_or_refused_with_the_reason(current_build: tuple[Any, Path]) -> None:
    """Upstream's llmapi config.pbtxt (as read: docs/contracts.md, Sources) has optional lora_* and image_url inputs:
    each input is a ledger row or recorded as not declared, and the repository says the same."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    from ledger import llmapi as ledger_llmapi

    rows = {r.name for r in ledger.rows_for("triton.llmapi.input", "1.4")}
    refused = {n for entry, _, _ in ledger_llmapi.NOT_DECLARED for n in entry.split(" (")[0].split(" / ")}
    assert set(ledger_llmapi.UPSTREAM_INPUTS) <= rows | refused and "image_url" in refused - rows
    assert all(why for _, _, why in ledger_llmapi.NOT_DECLARED)
    cfg, build = current_build
    pbtxt = text_format.Parse((build / "triton_repo" / "tensorrt_llm" / "config.pbtxt").read_text(), mc.ModelConfig())
    declared = {t.name: t for t in pbtxt.input}
    lora = {"lora_id", "lora_name", "lora_path", "lora_ckpt_source"}
    assert "image_url" not in declared
    if cfg.engine.backend == "reference":  # declared only to be refused by name (models/llmapi_refusals.py)
        assert lora <= set(declared) and all(declared[n].optional for n in lora)
        assert declared["lora_id"].data_type == mc.TYPE_UINT64
    else:
        assert not lora & set(declared)


def test_upstream_report_lists_every_citation_with_its_last_reading(capsys: pytest.CaptureFixture) -> None:
    from ledger import report as ledger_report

    assert ledger_check.main(["--upstream-report"]) == 0
    out = capsys.readouterr().out
    for key, v in trtllm_versions.VERSIONS.items():
        assert f"{v.name} (trtllm_version '{key}', tag {v.tag})" in out
        cs = ledger_report.citations(key)
        assert sum(len(c.names) for c in cs) == len([r for r in ledger.all_rows() if key in r.versions])
        for c in cs:
            assert c.cite in out
        order = [c.read_on for c in cs]
        dated = [d for d in order if d not in (ledger_report.NEVER, ledger_report.OURS)]
        assert dated == sorted(dated) and order.index(dated[0]) > max(
            (i for i, d in enumerate(order) if d == ledger_report.NEVER), default=-1)
    # a citation nothing in Sources names is reported as never read; this round's readings carry their day
    (modeling,) = [c for c in ledger_report.citations("1.4") if "modeling_speculative.py" in c.cite]
    assert modeling.read_on == ledger_report.NEVER
    (workers,) = [c for c in ledger_report.citations("1.2") if "_torch/speculative/eagle3.py" in c.cite]
    assert workers.read_on == "2026-12-03" and "commit f933a608045a46426792263617475b359d568043" in workers.version_read
    assert ledger_check.main(["--upstream-report", "--version", "1.2"]) == 0
    only = capsys.readouterr().out
    assert "trtllm_version '1.2'" in only and "trtllm_version '1.4'" not in only
    with pytest.raises(SystemExit):
        ledger_check.main(["--upstream-report", "some.yaml"])
