"""What a second reading of upstream found, one test per fact (docs/contracts.md, "Sources", cites each):
float32 on the PyTorch backend, static EAGLE-3 trees on 1.2 (two-model only), the transformers major of each
version, the shared-embedding exemption of PretrainedModel.load, and the drift report of the ledger's readings."""

from __future__ import annotations

from pathlib import Path

import pytest

from builders.config import ConfigError, load_config
from builders.engine import llmapi
from core import trtllm_versions
from ledger import table as ledger, rows as ledger_rows
from builders.trtllm.rules import PYTORCH_FLOAT32, trtllm_problems
from tests.engine_cases import make_cfg

REPO = Path(__file__).resolve().parent.parent
HEAD = Path("/builds/golden/checkpoint/eagle3")
CAPTURE = [1, 15, 28]  # the default capture of a 32-layer target: every version can write it


def _eagle3(version: str, *ov: str) -> list[str]:
    return [f"trtllm_version={version}", "draft.type=eagle3", "draft.model=/models/eagle3", "engine.backend=pytorch",
            "engine.max_num_tokens=null", "tree.choices=chain-3", *ov]


# ---- float32 never reaches TensorRT-LLM's PyTorch backend ----------------------------------------------------------


@pytest.mark.parametrize("version", list(trtllm_versions.VERSIONS))
def test_pytorch_backend_refuses_float32_with_the_fix(version: str) -> None:
    with pytest.raises(ValueError) as e:
        make_cfg(*_eagle3(version, "target.dtype=float32"))
    assert "target.dtype=float32 with engine.backend=pytorch" in str(e.value)
    assert "set target.dtype to bfloat16 or float16" in str(e.value) and "#5260" in str(e.value)
    for dtype in ("bfloat16", "float16"):
        assert PYTORCH_FLOAT32 not in trtllm_problems(make_cfg(*_eagle3(version, f"target.dtype={dtype}")))
    # the reference engine runs float32 (the CPU demos do)
    assert PYTORCH_FLOAT32 not in trtllm_problems(make_cfg(*_eagle3(version, "target.dtype=float32",
                                                                    "engine.backend=reference")))


def test_the_current_line_demo_switched_to_pytorch_is_refused_until_its_dtype_is() -> None:
    """configs/smollm2-eagle3-current.yaml tells GPU users to switch to engine.backend pytorch: its float32 target
    must then be refused (not written into the LLM API options), and bfloat16 accepted."""
    config = REPO / "configs" / "smollm2-eagle3-current.yaml"
    with pytest.raises(ConfigError, match="target.dtype=float32 with engine.backend=pytorch"):
        load_config(config, ["engine.backend=pytorch"])
    assert load_config(config, ["engine.backend=pytorch", "target.dtype=bfloat16"]).target.dtype == "bfloat16"
    assert "target.dtype: bfloat16" in config.read_text()  # the comment that sends users to the GPU says it too


# ---- 1.2: static trees run on the two-model path ---------------------------------------------------------------------


@pytest.mark.parametrize(("tree", "one_model"), [("topk-2-2", False), ("trtllm-default", False), ("chain-3", True),
                                                 ("chain-1", True)])
def test_1_2_static_tree_selects_the_two_model_path(tree: str, one_model: bool) -> None:
    """tensorrt_llm/_torch/speculative/eagle3.py at 1.2: the one-model worker drafts a chain whatever eagle_choices
    says (Eagle3OneModelSpecMetadata: is_spec_dec_tree = False); only Eagle3SpecMetadata builds the tree."""
    cfg = make_cfg(*_eagle3("1.2", f"tree.choices={tree}"))
    spec = llmapi.speculative_config(cfg, HEAD, CAPTURE, 32)
    assert spec["eagle3_one_model"] is one_model
    assert ("eagle_choices" in spec) is (not one_model)


def test_1_2_tree_without_the_two_model_switch_is_a_ledger_problem() -> None:
    emitted = {"speculative_config", "speculative_config.decoding_type", "speculative_config.max_draft_len",
               "speculative_config.speculative_model_dir", "speculative_config.eagle_choices",
               "speculative_config.max_total_draft_tokens"}
    (p,) = ledger.check("llmapi.option", "1.2", emitted, ledger.flags_of(tree=True))
    assert "required 'speculative_config.eagle3_one_model' is missing" in p and "_torch/speculative/eagle3.py" in p
    assert ledger.check("llmapi.option", "1.2", emitted - {"speculative_config.eagle_choices",
                                                           "speculative_config.max_total_draft_tokens"}) == []


# ---- the transformers each version reads our directories with -------------------------------------------------------


def test_1_4_reads_with_transformers_5_and_the_rows_cite_it() -> None:
    """TensorRT-LLM PR #12829 moved to transformers 5 before the 1.4 line."""
    assert trtllm_versions.get("1.4").transformers_major == 5
    assert (trtllm_versions.get("1.1").transformers_major, trtllm_versions.get("1.2").transformers_major) == (4, 4)
    for key, v in trtllm_versions.VERSIONS.items():
        assert ledger_rows.TRANSFORMERS_REF[key].startswith(f"v{v.transformers_major}."), key
        for r in ledger.all_rows():
            if key in r.versions and r.source.repo == "huggingface/transformers":
                assert f"@v{v.transformers_major}." in r.cite(key), (key, r)
                if v.transformers_major != 4:
                    assert "transformers-4" not in r.type, (key, r)


# ---- PretrainedModel.load: lm_head.weight may be left out while an embedding is shared -----------------------------


@pytest.mark.parametrize(("version", "eagle"), [(v, e) for v in ledger_rows.ENGINE_FLOW for e in (False, True)])
def test_lm_head_is_exempt_while_a_vocab_embedding_is_written(version: str, eagle: bool) -> None:
    flags = ledger.flags_of(eagle=eagle)
    required = {r.name for r in ledger.rows_for("checkpoint.tensor", version) if r.required and set(r.when) <= flags}
    heads = {"lm_head.weight"} | ({"eagle_nets.{k}.lm_head.weight"} if eagle else set())
    assert heads <= required
    assert ledger.check("checkpoint.tensor", version, required - heads, flags) == []
    # without any vocab_embedding the exemption does not apply: upstream raises "Required but not provided tensors"
    embeddings = {n for n in required if n.endswith("vocab_embedding.weight")}
    p = ledger.check("checkpoint.tensor", version, required - heads - embeddings, flags)
    assert {x.split("'")[1] for x in p} == heads | embeddings
    assert all("PretrainedModel.load" in x for x in p if x.split("'")[1].endswith("lm_head.weight"))


# ---- every directory handed to TensorRT-LLM is readable by its transformers -----------------------------------------


def _transformers5_target(root: Path) -> Path:
    """A target as transformers 5 writes it (an extracted GGUF or `pip:` source): RoPE only inside rope_parameters
    (llama3 scaling, base 500000), `dtype` without `torch_dtype`, tokenizer class TokenizersBackend."""
    import json

    from testkit import tiny_models as tm

    target = tm.make_target(root / "target", layers=8)
    cfg = json.loads((target / "config.json").read_text())
    del cfg["rope_theta"]
    cfg["dtype"] = cfg.pop("torch_dtype")
    cfg["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    (target / "config.json").write_text(json.dumps(cfg))
    assert json.loads((target / "tokenizer_config.json").read_text())["tokenizer_class"] == "TokenizersBackend"
    return target


def _handed_to_trtllm(build: Path) -> dict[str, Path]:
    """Every HF-style directory a build hands TensorRT-LLM: trtllm-serve's model and --tokenizer, model.yaml's model
    and speculative model, the Triton models' tokenizer_dir parameters."""
    import json

    import yaml
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    argv = json.loads((build / "engine" / "trtllm_serve.json").read_text())["argv"]
    dirs = {"trtllm-serve model": Path(argv[1]), "trtllm-serve --tokenizer": Path(argv[argv.index("--tokenizer") + 1])}
    for f in (build / "triton_repo").glob("*/1/model.yaml"):
        doc = yaml.safe_load(f.read_text())
        spec = doc["speculative_config"]
        repo = f.parent.parent.parent  # model.yaml's paths are relative to the repository (the server's cwd)
        dirs[f"{f.parent.parent.name} model.yaml model"] = (repo / doc["model"]).resolve()
        dirs[f"{f.parent.parent.name} speculative model"] = (repo / (spec.get("speculative_model_dir")
                                                                     or spec["speculative_model"])).resolve()
    for f in (build / "triton_repo").glob("*/config.pbtxt"):
        cfg = text_format.Parse(f.read_text(), mc.ModelConfig())
        if "tokenizer_dir" in cfg.parameters:
            dirs[f"{cfg.name} tokenizer_dir"] = Path(cfg.parameters["tokenizer_dir"].string_value)
    return dirs


@pytest.mark.parametrize("version", list(trtllm_versions.VERSIONS))
def test_every_directory_handed_to_trtllm_is_readable_by_its_transformers(version: str, tmp_path: Path) -> None:
    import json

    from ledger import check as ledger_check
    from builders.build import main as build_main
    from builders.convert.hf_compat import transformers4_problems
    from testkit import tiny_models as tm
    from tests.engine_cases import write_build_yaml

    target = _transformers5_target(tmp_path)
    head = tm.make_eagle3_head(tmp_path / "eagle3", target)
    f = write_build_yaml(tmp_path / "pt.yaml", output_dir=tmp_path / "build", target=target, head=head,
                         draft="eagle3", backend="pytorch", tree="chain-3", name="readable", version=version,
                         engine={"device": "cpu", "max_batch_size": 4, "max_input_len": 128, "max_seq_len": 256})
    assert build_main([str(f)]) == 0
    build = tmp_path / "build"
    dirs = _handed_to_trtllm(build)
    assert len(dirs) >= 4, dirs
    if trtllm_versions.get(version).transformers_major == 4:
        problems = [p for d in dirs.values() for p in transformers4_problems(d)]
        assert problems == [], dirs
        model = build / "checkpoint" / "hf_model"
        assert {dirs["trtllm-serve model"], dirs["trtllm-serve --tokenizer"]} == {model}
        cfg = json.loads((model / "config.json").read_text())
        assert cfg["rope_theta"] == 500000.0 and cfg["rope_scaling"]["rope_type"] == "llama3"
        assert cfg["torch_dtype"] == "float32" and cfg["rope_parameters"]["rope_theta"] == 500000.0
        assert (model / "model.safetensors").is_symlink()  # the weights are the target's, not a copy
        assert (model / "model.safetensors").resolve() == (target / "model.safetensors").resolve()
    else:  # transformers 5 (this venv's) reads the target as written: it is handed over unchanged
        from transformers import AutoConfig, AutoTokenizer

        assert dirs["trtllm-serve model"] == target and not (build / "checkpoint" / "hf_model").exists()
        assert AutoConfig.from_pretrained(target).rope_parameters["rope_theta"] == 500000.0
        assert AutoTokenizer.from_pretrained(dirs["trtllm-serve --tokenizer"]).encode("the quick brown fox")
    cfg_obj = load_config(f)
    emitted = ledger_check.build_names(cfg_obj, build)
    assert ledger_check.check_emitted(emitted, version, ledger_check.build_flags(cfg_obj, build / "checkpoint")) == []


def test_transformers4_problems_names_each_transformers5_spelling(tmp_path: Path) -> None:
    import json

    from builders.convert.hf_compat import transformers4_problems

    (tmp_path / "config.json").write_text(json.dumps({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6},
                                                      "dtype": "bfloat16"}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "TokenizersBackend",
                                                                "extra_special_tokens": ["<x>"]}))
    p = transformers4_problems(tmp_path)
    assert (
        len(p) == 5 and "reads the top-level key only (default 10000)" in p[0] and "'yarn' without rope_scaling" in p[1]
    )
    assert "reads torch_dtype" in p[2] and "TokenizersBackend" in p[3] and "extra_special_tokens" in p[4]
