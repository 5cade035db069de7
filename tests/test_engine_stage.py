"""Engine stage: trtllm-build argv (golden matrix), TensorRT-LLM constraints, engine config.json cross-check,
reference.json, and the stage's behaviour without TensorRT-LLM / GPU.

Upstream: tensorrt_llm/commands/build.py (flags), examples/eagle/README.md (recipe, limits),
tensorrt_llm/builder.py (EngineConfig.to_dict layout), tensorrt_llm/models/modeling_utils.py (EAGLE = 32).
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from builders import build as build_cli
from builders import layout
from builders.engine import crosscheck, reference, stage, trtllm_build
from builders.pipeline import StageError, run_stage
from core.spec import ReferenceSpec, read_spec
from core.trees import DraftTree, DynamicTree
from tests.engine_cases import check_golden, make_cfg

CKPT, OUT = Path("BUILD/checkpoint"), Path("BUILD/engine")

MATRIX = {
    "fp16_bs4_tp1": [],
    "bf16_bs8_tp2_eagle_tree": ["target.dtype=bfloat16", "engine.max_batch_size=8", "parallel.tp=2",
                                "engine.workers=2", "tree.choices=eagle-default"],
    "fp8w_bs4": ["quantization.weights=fp8"],
    "fp8w_fp8kv_bs16": ["quantization.weights=fp8", "quantization.kv_cache=fp8", "engine.max_batch_size=16"],
    "fp8w_fp8kv_bs1_chain": ["quantization.weights=fp8", "quantization.kv_cache=fp8", "engine.max_batch_size=1",
                             "tree.choices=chain-4"],
    "fp16_bs2_topk": ["engine.max_batch_size=2", "tree.choices=topk-2-3"],
    "bf16_bs64_derived_tokens": ["target.dtype=bfloat16", "engine.max_batch_size=64", "engine.max_num_tokens=null",
                                 "tree.choices=chain-3", "engine.max_input_len=200"],
}


def test_golden_trtllm_build_matrix() -> None:
    actual = {name: trtllm_build.trtllm_build_argv(make_cfg(*ov), CKPT, OUT) for name, ov in MATRIX.items()}
    check_golden("trtllm_build_argv.json", actual)


def _flags(argv: list[str]) -> dict[str, str]:
    assert argv[0] == "trtllm-build"
    assert len(argv[1:]) % 2 == 0, "every flag takes one value"
    return dict(zip(argv[1::2], argv[2::2]))


def test_argv_values_render_from_config_and_tree() -> None:
    f = _flags(trtllm_build.trtllm_build_argv(make_cfg(), CKPT, OUT))
    assert f["--speculative_decoding_mode"] == "eagle"
    assert f["--max_draft_len"] == "63"  # trtllm-default tree size
    assert (f["--max_batch_size"], f["--max_input_len"], f["--max_seq_len"], f["--max_num_tokens"]) == (
        "4", "1024", "2048", "2048")
    assert (f["--gemm_plugin"], f["--kv_cache_type"], f["--use_paged_context_fmha"]) == ("float16", "paged", "enable")
    assert "--use_fp8_context_fmha" not in f
    assert (f["--checkpoint_dir"], f["--output_dir"], f["--workers"]) == ("BUILD/checkpoint", "BUILD/engine", "1")


def test_derived_max_num_tokens_is_batch_times_tree_plus_one() -> None:
    f = _flags(trtllm_build.trtllm_build_argv(make_cfg(*MATRIX["bf16_bs64_derived_tokens"]), CKPT, OUT))
    assert f["--max_num_tokens"] == str(64 * (3 + 1))  # 256 > max_input_len of this case


def test_derived_max_num_tokens_covers_max_input_len() -> None:
    # EAGLE engines have no chunked context: the derived value must hold one whole prompt.
    f = _flags(trtllm_build.trtllm_build_argv(make_cfg("engine.max_num_tokens=null"), CKPT, OUT))
    assert f["--max_num_tokens"] == str(max(4 * (63 + 1), 1024))


@pytest.mark.parametrize(("ov", "gemm", "fp8_fmha"), [
    (["quantization.weights=fp8"], "fp8", False),  # FP8 GEMM plugin only pays at batch <= 4
    (["quantization.weights=fp8", "engine.max_batch_size=8"], "disable", False),
    (["quantization.weights=fp8", "quantization.kv_cache=fp8"], "fp8", True),
    (["target.dtype=bfloat16"], "bfloat16", False),
])
def test_fp8_flags_only_where_valid(ov: list[str], gemm: str, fp8_fmha: bool) -> None:
    f = _flags(trtllm_build.trtllm_build_argv(make_cfg(*ov), CKPT, OUT))
    assert f["--gemm_plugin"] == gemm
    assert (f.get("--use_fp8_context_fmha") == "enable") is fp8_fmha


@pytest.mark.parametrize(("ov", "msg"), [
    (["engine.max_num_tokens=100"], r"max_num_tokens=100 < max_batch_size \* \(max_draft_len \+ 1\) = 4 \* 64"),
    (["engine.max_input_len=3000", "engine.max_seq_len=4096"], "max_num_tokens=2048 < engine.max_input_len=3000"),
    (["engine.workers=2"], "engine.workers=2 > 1 rank engine"),
    (["target.dtype=float32"], "target.dtype=float32: TensorRT-LLM's paged context FMHA"),
    (["quantization.kv_cache=fp8"], "no kernel for 16-bit queries over an FP8 KV cache"),
    (["engine.max_batch_size=513", "engine.max_num_tokens=40000"],
     "engine.max_batch_size=513 exceeds TensorRT-LLM 1.1.0's EAGLE engine limit 512"),
    (["parallel.pp=2"], "EAGLE engines do not support pipeline parallelism"),
])
def test_trtllm_limits_refuse_the_config_before_anything_is_written(ov: list[str], msg: str) -> None:
    # builders/trtllm/rules.py: TensorRT-LLM's limits, checked when the config is validated
    with pytest.raises(ValueError, match=msg):
        make_cfg(*ov)


def test_valid_configs_have_no_trtllm_problems() -> None:
    from builders.trtllm.rules import trtllm_problems

    for name, ov in MATRIX.items():
        assert trtllm_problems(make_cfg(*ov)) == [], name


def test_engine_limits_come_from_the_version_registry() -> None:
    from core import trtllm_versions

    # tensorrt_llm/builder.py build(): EAGLE asserts (both supported series)
    for v in trtllm_versions.VERSIONS.values():
        assert (v.eagle_max_batch_size, v.max_draft_len_limit) == (512, 256)


# ---- engine config.json cross-check --------------------------------------------------------------------------------


def _engine_config(cfg) -> dict:
    """A hand-made engine config.json in trtllm-build's layout (EngineConfig.to_dict), matching `cfg`."""
    lim = cfg.limits()
    return {
        "version": "1.1.0",
        "pretrained_config": {
            "architecture": "EagleForCausalLM", "dtype": cfg.target.dtype,
            "mapping": {"world_size": cfg.parallel.tp, "tp_size": cfg.parallel.tp, "pp_size": 1},
            "max_draft_len": lim.max_draft_len, "num_eagle_layers": lim.num_eagle_layers,
            "max_non_leaves_per_layer": lim.max_non_leaves_per_layer,
            "quantization": {"quant_algo": None, "kv_cache_quant_algo": None},
        },
        "build_config": {
            # trtllm-build records max_seq_len + max_draft_len + num_eagle_layers (tensorrt_llm/builder.py build())
            "max_input_len": cfg.engine.max_input_len,
            "max_seq_len": cfg.engine.max_seq_len + lim.max_draft_len + lim.num_eagle_layers,
            "max_batch_size": cfg.engine.max_batch_size, "max_num_tokens": lim.max_num_tokens,
            "max_draft_len": lim.max_draft_len, "speculative_decoding_mode": 32, "kv_cache_type": "PAGED",
            "plugin_config": {"gemm_plugin": cfg.target.dtype, "use_paged_context_fmha": True},
        },
    }


def test_crosscheck_accepts_a_matching_engine() -> None:
    cfg = make_cfg()
    assert crosscheck.mismatches(_engine_config(cfg), cfg) == []


def test_crosscheck_accepts_trtllm_builds_raised_max_seq_len() -> None:
    # vicuna-7b-eagle: 2048 requested, trtllm-build writes 2048 + max_draft_len 63 + num_eagle_layers 4 = 2115
    cfg = make_cfg("engine.max_seq_len=2048")
    data = _engine_config(cfg)
    assert data["build_config"]["max_seq_len"] == 2115
    assert crosscheck.mismatches(data, cfg) == []
    data["build_config"]["max_seq_len"] = 2048  # what the config says, but not what trtllm-build writes
    assert crosscheck.mismatches(data, cfg) == [
        "build_config.max_seq_len: engine has 2048, config expects 2115"]


@pytest.mark.parametrize(
    ("path", "value", "msg"),
    [
        (
            ("pretrained_config", "num_eagle_layers"),
            5,
            "pretrained_config.num_eagle_layers: engine has 5, config expects 4",
        ),
        (("build_config", "max_draft_len"), 25, "build_config.max_draft_len: engine has 25, config expects 63"),
        (
            ("build_config", "speculative_decoding_mode"),
            4,
            "speculative_decoding_mode: engine has 4, config expects 32",
        ),
        (
            ("pretrained_config", "dtype"),
            "bfloat16",
            "pretrained_config.dtype: engine has 'bfloat16', config expects 'float16'",
        ),
        (("pretrained_config", "mapping", "tp_size"), 2, "mapping.tp_size: engine has 2, config expects 1"),
        (
            ("pretrained_config", "quantization", "quant_algo"),
            "FP8",
            "quant_algo: engine has 'FP8', config expects None",
        ),
        (("build_config", "max_batch_size"), 8, "build_config.max_batch_size: engine has 8, config expects 4"),
    ],
)
def test_crosscheck_catches_mismatches(path: tuple[str, ...], value: object, msg: str) -> None:
    cfg = make_cfg()
    data = _engine_config(cfg)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    bad = crosscheck.mismatches(data, cfg)
    assert len(bad) == 1 and msg in bad[0], bad


def test_crosscheck_fp8_expectations_and_string_mode() -> None:
    cfg = make_cfg("quantization.weights=fp8", "quantization.kv_cache=fp8")
    data = _engine_config(cfg)
    assert {m.split(":")[0] for m in crosscheck.mismatches(data, cfg)} == {
        "pretrained_config.quantization.quant_algo", "pretrained_config.quantization.kv_cache_quant_algo"}
    data["pretrained_config"]["quantization"] = {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}
    data["build_config"]["speculative_decoding_mode"] = "SpeculativeDecodingMode.EAGLE"
    assert crosscheck.mismatches(data, cfg) == []


def test_crosscheck_missing_key_is_an_error_not_a_pass() -> None:
    cfg = make_cfg()
    data = _engine_config(cfg)
    del data["pretrained_config"]["num_eagle_layers"]
    with pytest.raises(crosscheck.EngineConfigError, match="no `pretrained_config.num_eagle_layers`"):
        crosscheck.mismatches(data, cfg)


def test_crosscheck_engine_dir_checks_rank_files(tmp_path: Path) -> None:
    cfg = make_cfg("parallel.tp=2")
    (tmp_path / "config.json").write_text(json.dumps(_engine_config(cfg)))
    (tmp_path / "rank0.engine").write_bytes(b"x")
    assert crosscheck.crosscheck_engine_dir(tmp_path, cfg) == [
        f"engine files missing in {tmp_path}: rank1.engine (expected 2 rank engines)"]
    with pytest.raises(crosscheck.EngineConfigError, match="cannot read"):
        crosscheck.crosscheck_engine_dir(tmp_path / "nope", cfg)


# ---- the stage -------------------------------------------------------------------------------------------------


def _fake_checkpoint(build_dir: Path, random_head: bool | None) -> None:
    ck = build_dir / layout.CHECKPOINT
    ck.mkdir(parents=True, exist_ok=True)
    cfg = {"architecture": "EagleForCausalLM", "num_hidden_layers": 2}
    if random_head is not None:
        cfg["eagle_deploy"] = {"random_head": random_head}
    (ck / "config.json").write_text(json.dumps(cfg))
    (ck / "manifest.json").write_text(json.dumps({"notes": {"hf_target_dir": "/models/target"}}))


def test_tensorrt_stage_without_trtllm_or_gpu_names_what_is_missing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # neither trtllm-build nor nvidia-smi
    cfg = make_cfg(f"output_dir={tmp_path}")
    _fake_checkpoint(tmp_path, random_head=False)
    with pytest.raises(StageError) as e:
        run_stage(stage.ENGINE_STAGE, cfg, tmp_path)
    msg = str(e.value)
    assert "`trtllm-build` is not on PATH" in msg and "no NVIDIA GPU found" in msg
    assert f"trtllm-build --checkpoint_dir {tmp_path}/checkpoint --output_dir {tmp_path}/engine" in msg
    assert not (tmp_path / "engine").exists() and not list(tmp_path.glob(".engine.tmp-*"))


def test_environment_problems_gpu_count_and_fp8_capability() -> None:
    cfg = make_cfg("parallel.tp=2", "quantization.weights=fp8")
    p = stage.tensorrt_environment_problems(cfg, [(8, 0)], have_trtllm_build=True)
    assert p == ["parallel.tp*pp=2 needs 2 GPUs, nvidia-smi lists 1",
                 "FP8 needs compute capability >= 8.9 (Ada/Hopper); this GPU has 8.0"]
    assert stage.tensorrt_environment_problems(cfg, [(9, 0), (9, 0)], have_trtllm_build=True) == []


def test_tensorrt_stage_runs_trtllm_build_and_crosschecks(tmp_path: Path, monkeypatch) -> None:
    """With a stand-in `trtllm-build` on PATH (a script writing an engine dir), the stage runs the exact argv and
    the cross-check rejects a wrong engine: the runner path is exercised end to end without TensorRT-LLM."""
    cfg = make_cfg(f"output_dir={tmp_path / 'b'}")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    engine_cfg = _engine_config(cfg)
    (tmp_path / "engine_config.json").write_text(json.dumps(engine_cfg))
    script = bin_dir / "trtllm-build"
    script.write_text(
        "#!/bin/sh\nout=''\nwhile [ $# -gt 0 ]; do [ \"$1\" = --output_dir ] && out=$2; shift; done\n"
        f'echo "$@" > /dev/null; cp {tmp_path}/engine_config.json "$out/config.json"; echo x > "$out/rank0.engine"\n'
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setattr(stage, "gpu_compute_capabilities", lambda: [(9, 0)])
    build_dir = tmp_path / "b"
    _fake_checkpoint(build_dir, random_head=False)
    out, ran = run_stage(stage.ENGINE_STAGE, cfg, build_dir)
    assert ran and json.loads((out / "config.json").read_text()) == engine_cfg
    manifest = json.loads((out / "manifest.json").read_text())
    # recorded relative to the build directory (core/records.py)
    assert manifest["commands"][0][:3] == ["trtllm-build", "--checkpoint_dir", "checkpoint"]
    assert manifest["notes"]["crosscheck"] == "engine config.json matches the config"
    # A stale engine (other tree depth) is refused and nothing replaces the good output.
    bad = copy.deepcopy(engine_cfg)
    bad["pretrained_config"]["num_eagle_layers"] = 5
    (tmp_path / "engine_config.json").write_text(json.dumps(bad))
    with pytest.raises(StageError, match="num_eagle_layers: engine has 5, config expects 4"):
        run_stage(stage.ENGINE_STAGE, cfg, build_dir, force=True)
    assert json.loads((out / "config.json").read_text()) == engine_cfg


def test_reference_stage_writes_spec(tmp_path: Path) -> None:
    cfg = make_cfg("engine.backend=reference", "tree.choices=eagle-default", f"output_dir={tmp_path}",
                   "engine.device=cpu")
    _fake_checkpoint(tmp_path, random_head=True)
    run_stage(stage.ENGINE_STAGE, cfg, tmp_path)
    spec = read_spec(tmp_path)
    assert spec.checkpoint_dir == "checkpoint" and spec.tokenizer_dir == "checkpoint/tokenizer"
    assert spec.random_head is True and spec.eagle3_head_dir is None and spec.tree.kind == "static"
    assert spec.tree.as_lists()[:5] == [[0], [1], [2], [3], [0, 0]] and spec.tree.size == 25
    on_disk = json.loads((tmp_path / "engine" / "reference.json").read_text())["tree"]
    assert on_disk["kind"] == "static" and on_disk["paths"][:2] == [[0], [1]]
    assert (spec.dtype, spec.device, spec.tp, spec.max_batch_size) == ("float16", "cpu", 1, 4)


def test_reference_spec_eagle3_dynamic() -> None:
    cfg = make_cfg("engine.backend=reference", "draft.type=eagle3", "tree.choices=null",
                   "tree.dynamic={top_k: 4, depth: 3, total_draft_tokens: 16}")
    spec = reference.reference_spec(cfg, random_head=False)
    assert spec.eagle3_head_dir == "checkpoint/eagle3" and spec.tree == DynamicTree(4, 3, 16)
    assert ReferenceSpec.model_validate_json(spec.model_dump_json()) == spec  # the union round-trips by its kind


@pytest.mark.parametrize(
    ("tree", "error"),
    [({"kind": "static", "paths": [[0], [0, 0, 1]]}, "tree path [0, 0, 1] has no parent [0, 0]"),
     ({"kind": "dynamic", "top_k": 2, "depth": 2, "total_draft_tokens": 99}, "total_draft_tokens=99 exceeds the 6"),
     ({"kind": "chain", "paths": [[0]]}, "does not match any of the expected tags: 'static', 'dynamic'"),
     ({"paths": [[0]]}, "Unable to extract tag using discriminator 'kind'")],
)
def test_a_spec_tree_is_validated_when_read(tree: dict, error: str) -> None:
    cfg = make_cfg("engine.backend=reference")
    doc = json.loads(reference.reference_spec(cfg, random_head=False).model_dump_json())
    with pytest.raises(ValueError, match=re.escape(error)):
        ReferenceSpec.model_validate({**doc, "tree": tree})


def test_a_spec_written_with_the_two_tree_fields_still_reads() -> None:
    cfg = make_cfg("engine.backend=reference", "tree.choices=chain-2")
    doc = json.loads(reference.reference_spec(cfg, random_head=False).model_dump_json())
    del doc["tree"]
    static = ReferenceSpec.model_validate({**doc, "tree_choices": [[0, 0], [0]], "dynamic_tree": None})
    assert static.tree == DraftTree.from_choices([[0], [0, 0]])
    dynamic = {"top_k": 4, "depth": 3, "total_draft_tokens": 16}
    assert ReferenceSpec.model_validate({**doc, "tree_choices": None, "dynamic_tree": dynamic}).tree == DynamicTree(
        4, 3, 16
    )
    with pytest.raises(ValueError, match="set exactly one of tree_choices or dynamic_tree"):
        ReferenceSpec.model_validate({**doc, "tree_choices": None, "dynamic_tree": None})


def test_reference_stage_requires_random_head_flag(tmp_path: Path) -> None:
    cfg = make_cfg("engine.backend=reference", f"output_dir={tmp_path}")
    _fake_checkpoint(tmp_path, random_head=None)
    with pytest.raises(StageError, match="no boolean `eagle_deploy.random_head`"):
        run_stage(stage.ENGINE_STAGE, cfg, tmp_path)


def test_dry_run_prints_the_trtllm_build_command(tmp_path: Path, capsys) -> None:
    cfg_file = tmp_path / "c.yaml"
    import yaml

    from tests.engine_cases import BASE
    data = copy.deepcopy(BASE)
    data["output_dir"] = str(tmp_path / "out")
    cfg_file.write_text(yaml.safe_dump(data))
    assert build_cli.main([str(cfg_file), "--dry-run", "--only", "engine"]) == 0
    out = capsys.readouterr().out
    assert (f"command trtllm-build --checkpoint_dir {tmp_path}/out/checkpoint --output_dir {tmp_path}/out/engine "
            "--speculative_decoding_mode eagle --max_draft_len 63") in out


def test_stage_registered_after_convert() -> None:
    from builders.stages import stages_for

    names = [s.name for s in stages_for(make_cfg())]
    assert names.index("engine") == names.index(layout.CHECKPOINT) + 1


# ---- the NGC demo script (docker/ngc/, run by users on a GPU; checked here without one) ----------------------------


def _sets(name: str) -> list[str]:
    lines = (Path(__file__).resolve().parent.parent / "docker" / "ngc" / name).read_text().splitlines()
    return [x for x in lines if x.strip() and not x.startswith("#")]


@pytest.mark.parametrize("variant", [["demo-tensorrt.sets"], ["demo-tensorrt.sets", "demo-fp8.sets"]])
def test_ngc_demo_overrides_give_a_valid_engine_build(variant: list[str]) -> None:
    from builders.config import load_config
    from builders.convert.fp8 import fp8_problems

    repo = Path(__file__).resolve().parent.parent
    cfg = load_config(repo / "configs" / "demo.yaml", [s for v in variant for s in _sets(v)])
    assert cfg.engine.backend == "tensorrt"
    assert fp8_problems(cfg) == []  # TensorRT-LLM's limits: load_config already validated them
    argv = trtllm_build.trtllm_build_argv(cfg, CKPT, OUT)
    assert ("--use_fp8_context_fmha" in argv) is (len(variant) == 2)


def test_ngc_script_is_valid_bash_and_names_the_pinned_image() -> None:
    import subprocess

    from builders.versions import TRITON_IMAGE

    script = Path(__file__).resolve().parent.parent / "docker" / "ngc" / "build_and_serve.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    text = script.read_text()
    assert TRITON_IMAGE in text and "demo-tensorrt.sets" in text and "builders/build.py configs/demo.yaml" in text
