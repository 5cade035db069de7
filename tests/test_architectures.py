"""The architecture table (builders/trtllm/architectures.py): its rows are well formed and agree with the engine's
native families and the registry; every target outside a row's paths is refused by the real build CLI before
anything is written, naming the architecture, what it supports and the way out; the LLM API options follow the
row's one- or two-model mode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builders import build
from builders.engine import llmapi
from builders.trtllm import architectures as A
from core import trtllm_versions
from ledger import docs as ledger_docs
from core import families
from tests.engine_cases import make_cfg
from tests.test_config_cli import write_cfg

HF_NAME = {"qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM",
           "qwen3_moe": "Qwen3MoeForCausalLM"}


def test_rows_are_well_formed_and_cited() -> None:
    assert len({a.name for a in A.ARCHITECTURES}) == len(A.ARCHITECTURES)
    for a in A.ARCHITECTURES:
        assert a.source.repo == "NVIDIA/TensorRT-LLM"
        assert a.source.path.startswith("tensorrt_llm/_torch/models/modeling_") and a.source.path.endswith(".py")
        assert f"register_auto_model('{a.name}')" in a.source.symbol and a.read
        for version, mode in a.pytorch:
            assert version in trtllm_versions.VERSIONS and mode in (A.ONE, A.TWO)
            # One-model needs a SpecDecOneEngineForCausalLM; two-model needs the eagle3_one_model field to exist.
            assert (mode == A.ONE) == ("SpecDecOneEngineForCausalLM" in a.source.symbol)
            assert mode == A.ONE or trtllm_versions.get(version).eagle3_one_model_field
        assert a.engine_flow == (a.name == "LlamaForCausalLM"), "EagleForCausalLM subclasses LLaMAForCausalLM"
    native = tuple(a.name for a in A.ARCHITECTURES if a.reference == "native")
    assert sorted(native) == sorted(families.NATIVE)
    assert all(a.reference in ("native", "generic", None) for a in A.ARCHITECTURES)
    # A row the reference engine cannot run says why (its note is the refusal's reason).
    assert all("reference engine" in a.note for a in A.ARCHITECTURES if a.reference is None)


def test_docs_render_every_row() -> None:
    doc = ledger_docs.DOC.read_text()
    assert doc == ledger_docs.render(), "run: python -m ledger.docs"
    for a in A.ARCHITECTURES:
        assert f"| `{a.name}` |" in doc and a.source.path in doc


def _refused(cfg: Path, out: Path, capsys: pytest.CaptureFixture, *needles: str) -> str:
    rc = build.main([str(cfg), "--only", "checkpoint"])
    err = capsys.readouterr().err
    assert rc == 2, err
    for n in needles:
        assert n in err, f"{n!r} not in:\n{err}"
    assert not out.exists(), "a refused build must write nothing"
    return err


@pytest.mark.parametrize("family", ["qwen3", "qwen2", "mistral"])
@pytest.mark.parametrize("path", ["eagle-1.1", "tensorrt-1.2"])
def test_engine_flow_refuses_every_non_llama_target(family: str, path: str, family_targets: dict[str, Path],
                                                    tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    over: dict = {"trtllm_version": path.split("-")[1], "target__dtype": "float16"}
    if path.startswith("tensorrt"):
        over.update(engine__backend="tensorrt")
    cfg = write_cfg(tmp_path / "c.yaml", family_targets[family], "random", out, **over)
    err = _refused(cfg, out, capsys, HF_NAME[family], "EagleForCausalLM subclasses LLaMAForCausalLM",
                   "serves LlamaForCausalLM targets only", "Way out: draft.type eagle3")
    assert f"{HF_NAME[family]} supports: " in err and "the reference engine (native)" in err
    # --dry-run runs the checks that need no weights: it refuses what the build refuses, with the same reason.
    assert build.main([str(cfg), "--dry-run"]) == 2
    dry = capsys.readouterr()
    assert "[checkpoint] target.model" in dry.err and "EagleForCausalLM subclasses LLaMAForCausalLM" in dry.err
    assert "plan for" in dry.out and not out.exists()  # the plan, then the refusal


@pytest.mark.parametrize("family", ["qwen2", "mistral"])
@pytest.mark.parametrize("backend", ["reference", "pytorch"])
def test_two_model_families_are_refused_on_the_current_line(family: str, backend: str, family_targets: dict[str, Path],
                                                            eagle3_head: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    # bfloat16: the PyTorch backend refuses float32 at config load, before the architecture is read
    cfg = write_cfg(tmp_path / "c.yaml", family_targets[family], eagle3_head, out, trtllm_version="1.4",
                    draft__type="eagle3", engine__backend=backend, target__dtype="bfloat16")
    err = _refused(cfg, out, capsys, f"{HF_NAME[family]} with an EAGLE-3 head is not served by TensorRT-LLM 1.4",
                   "DecoderModelForCausalLM", "EAGLE-3 on the PyTorch backend (two-model) on trtllm_version 1.1, 1.2")
    assert ("the reference engine serves only what its version serves" in err) == (backend == "reference")


def test_unlisted_architectures_are_refused(family_targets: dict[str, Path], tiny_target: Path,
                                                           eagle3_head: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture) -> None:
    other = tmp_path / "falcon"
    other.mkdir()
    for f in tiny_target.iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    cfg_json = json.loads((tiny_target / "config.json").read_text())
    (other / "config.json").write_text(json.dumps(dict(cfg_json, architectures=["FalconForCausalLM"])))
    out = tmp_path / "out"
    e3 = dict(trtllm_version="1.4", draft__type="eagle3")
    _refused(write_cfg(tmp_path / "a.yaml", other, eagle3_head, out, **e3), out, capsys,
             "architecture 'FalconForCausalLM' is not in the architecture table", "Qwen3ForCausalLM")
    assert A.problems("Qwen3MoeForCausalLM", version="1.4", backend="reference", draft_type="eagle3", where="t") == []
    err = A.problems("GptOssForCausalLM", version="1.2", backend="tensorrt", draft_type="eagle3", where="t")
    assert len(err) == 1 and "GptOssForCausalLM cannot use engine.backend=tensorrt" in err[0]
    assert "the reference engine (generic)" in err[0]


def test_problems_cover_every_row_and_path() -> None:
    """The refusal is a function of the table alone: a path is refused exactly when the row does not list it."""
    for a in A.ARCHITECTURES:
        for v in trtllm_versions.VERSIONS:
            for backend in ("tensorrt", "pytorch", "reference"):
                for draft in ("eagle", "eagle3"):
                    p = A.problems(a.name, version=v, backend=backend, draft_type=draft, where="t")
                    ok = a.engine_flow or (draft == "eagle3" and backend != "tensorrt")
                    ok = ok and (draft == "eagle" or a.pytorch_mode(v) is not None)
                    ok = ok and not (draft == "eagle3" and backend == "reference" and a.reference is None)
                    assert (p == []) == ok, (a.name, v, backend, draft, p)
                    assert all(a.name in m for m in p)


@pytest.mark.parametrize(("arch", "version", "one_model"), [("Qwen2ForCausalLM", "1.2", False),
                                                             ("MistralForCausalLM", "1.1", False),
                                                             ("Qwen3ForCausalLM", "1.2", True),
                                                             ("LlamaForCausalLM", "1.1", True)])
def test_llmapi_writes_the_rows_mode(arch: str, version: str, one_model: bool) -> None:
    cfg = make_cfg("draft.type=eagle3", "engine.backend=pytorch", f"trtllm_version={version}", "tree.choices=chain-3")
    spec = llmapi.speculative_config(cfg, Path("/h"), [1, 15, 28], 32, arch)
    assert spec["eagle3_one_model"] is one_model
    cur = make_cfg("draft.type=eagle3", "engine.backend=pytorch", "trtllm_version=1.4", "tree.choices=chain-3")
    if one_model:
        assert "eagle3_one_model" not in llmapi.speculative_config(cur, Path("/h"), [1, 15, 28], 32, arch)
    else:
        with pytest.raises(llmapi.LlmApiError, match=f"{arch} with an EAGLE-3 head is not served by TensorRT-LLM 1.4"):
            llmapi.speculative_config(cur, Path("/h"), [1, 15, 28], 32, arch)


def test_guide_table_is_rendered_from_the_table() -> None:
    guide = ledger_docs.GUIDE.read_text()
    assert ledger_docs.render_guide(guide) == guide, "run: python -m ledger.docs"
    for a in A.ARCHITECTURES:
        assert f"| `{a.name}` | {a.family} |" in guide
    with pytest.raises(ValueError, match="markers"):
        ledger_docs.render_guide("no markers here")


def test_shipped_qwen3_configs() -> None:
    from builders.config import load_config
    from training.config import load_train_config

    repo = ledger_docs.DOC.parents[1]
    cfg = load_config(repo / "configs" / "qwen3-8b-eagle3-current.yaml")
    assert (cfg.trtllm_version, cfg.engine.backend, cfg.draft.type) == ("1.4", "pytorch", "eagle3")
    assert A.problems("Qwen3ForCausalLM", version=cfg.trtllm_version, backend=cfg.engine.backend,
                      draft_type=cfg.draft.type, where="Qwen3-8B") == []
    spec = llmapi.speculative_config(cfg, Path("/h"), llmapi.layers_to_capture([2, 18, 33], 36), 36,
                                     "Qwen3ForCausalLM")
    assert spec["eagle3_layers_to_capture"] == [1, 17, 32] and spec["decoding_type"] == "Eagle3"
    train = load_train_config(repo / "configs" / "train" / "qwen3-8b-eagle3.yaml")
    assert (train.head, train.eagle3.layer_ids, train.eagle3.draft_vocab_size) == ("eagle3", [2, 18, 33], 32000)
    assert cfg.draft.eagle3.layers_to_capture == train.eagle3.layer_ids


def test_what_the_reference_engine_would_compute_wrongly_is_refused(family_targets: dict[str, Path], tmp_path: Path,
                                                                     eagle3_head: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    """Config variants of the native families: each refused before anything is written, naming the key and fix."""
    cases = {
        "qwen2": ({"use_sliding_window": True, "sliding_window": 32}, "use_sliding_window=true (window 32)"),
        "qwen3": ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
                  "rope_scaling type 'dynamic': the reference engine computes default, linear, llama3, yarn"),
        "mistral": ({"sliding_window": 100}, "sliding_window=100 but engine.max_seq_len=128"),
    }
    for family, (over, needle) in cases.items():
        t = tmp_path / family
        t.mkdir()
        for f in family_targets[family].iterdir():
            (t / f.name).write_bytes(f.read_bytes())
        cfg = json.loads((t / "config.json").read_text())
        cfg.pop("rope_parameters", None)
        (t / "config.json").write_text(json.dumps(dict(cfg, **over)))
        out = tmp_path / f"{family}-out"
        _refused(write_cfg(tmp_path / f"{family}.yaml", t, eagle3_head, out, trtllm_version="1.2",
                           draft__type="eagle3"), out, capsys, needle)
