"""EAGLE converters on the tiny fixtures: EagleForCausalLM (builders/convert/eagle.py), EAGLE-3 normalization
(builders/convert/eagle3.py) and the random head (builders/convert/random_head.py).

Expected names and config keys: upstream tensorrt_llm/models/eagle/weight.py `load_eagle_hf`,
tensorrt_llm/models/eagle/config.py `EagleConfig`, tensorrt_llm/models/eagle/model.py `EagleNet`;
EAGLE-3 keys: tensorrt_llm/_torch/models/modeling_speculative.py `Eagle3DraftModel` / `Eagle3ForCausalLM`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from builders.convert import convert_eagle, convert_eagle3, write_random_head
from core.hfconfig import ModelConfigError
from testkit import tiny_models as tm
from tests.convert_helpers import ckpt, hf_tensors, reassemble_layer

H, HD = tm.HIDDEN, tm.HIDDEN // tm.HEADS
LIMITS = {"max_draft_len": 6, "num_eagle_layers": 3, "max_non_leaves_per_layer": 2}  # topk-2-... style values


def _head_copy(head: Path, dst: Path, *, drop: tuple[str, ...] = (), config: dict | None = None) -> Path:
    shutil.copytree(head, dst)
    if drop:
        t = {k: v for k, v in hf_tensors(dst).items() if k not in drop}
        save_file(t, str(dst / "model.safetensors"), metadata={"format": "pt"})
    if config is not None:
        cfg = json.loads((dst / "config.json").read_text())
        cfg.update(config)
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_eagle_checkpoint_names_values_config(tiny_target: Path, eagle_head: Path, tmp_path: Path) -> None:
    convert_eagle(tiny_target, eagle_head, tmp_path, dtype="float32", **LIMITS)
    cfg, (r0,) = ckpt(tmp_path)
    head, tgt = hf_tensors(eagle_head), hf_tensors(tiny_target)
    assert cfg["architecture"] == "EagleForCausalLM"
    assert {k: cfg[k] for k in LIMITS} == LIMITS
    net = cfg["eagle_net_config"]
    assert net["architecture"] == "LlamaForCausalLM" and net["num_hidden_layers"] == 1
    assert net["vocab_size"] == tm.VOCAB and net["mapping"] == {"world_size": 1, "tp_size": 1, "pp_size": 1}
    assert net["rotary_base"] == cfg["rotary_base"] and net["head_size"] == HD
    assert cfg["eagle_deploy"]["random_head"] is False and cfg["eagle_deploy"]["head_source"] == str(eagle_head)
    for k in range(LIMITS["num_eagle_layers"]):
        p = f"eagle_nets.{k}"
        drafter = {n[len(p) + 1:] for n in r0 if n.startswith(p + ".")}
        assert drafter == {
            "drafter.vocab_embedding.weight", "drafter.fc.weight", "drafter.fc.bias", "lm_head.weight",
            *(f"drafter.layers.0.{n}.weight" for n in (
                "attention.qkv", "attention.dense", "mlp.fc", "mlp.gate", "mlp.proj", "post_layernorm")),
        }, "layer 0 has no input_layernorm; the drafter has no ln_f"
        assert torch.equal(r0[f"{p}.drafter.fc.weight"], head["fc.weight"])
        assert torch.equal(r0[f"{p}.drafter.fc.bias"], head["fc.bias"])
        assert torch.equal(r0[f"{p}.drafter.vocab_embedding.weight"], head["embed_tokens.weight"])
        assert torch.equal(r0[f"{p}.lm_head.weight"], tgt["lm_head.weight"]), "EagleNet lm_head = the target's"
        got = reassemble_layer([r0], f"{p}.drafter.layers.0", tm.HEADS, tm.KV_HEADS, HD)
        for name, value in got.items():
            assert torch.equal(value, head[f"layers.0.{name}"]), (k, name)
    assert torch.equal(r0["transformer.layers.1.mlp.fc.weight"], tgt["model.layers.1.mlp.gate_proj.weight"])


def test_eagle_head_without_bias_gets_zero_bias(tiny_target: Path, eagle_head_nobias: Path, tmp_path: Path) -> None:
    convert_eagle(tiny_target, eagle_head_nobias, tmp_path, dtype="float16", **LIMITS)
    _, (r0,) = ckpt(tmp_path)
    for k in range(LIMITS["num_eagle_layers"]):
        b = r0[f"eagle_nets.{k}.drafter.fc.bias"]
        assert b.shape == (H,) and b.dtype == torch.float16 and not b.any()
    assert torch.equal(r0["eagle_nets.0.drafter.fc.weight"], hf_tensors(eagle_head_nobias)["fc.weight"].half())


def test_bias_declared_vs_present_is_checked(tiny_target: Path, eagle_head: Path, tmp_path: Path) -> None:
    declared_absent = _head_copy(eagle_head, tmp_path / "h1", drop=("fc.bias",), config={"bias": True})
    with pytest.raises(ModelConfigError, match=r'declares "bias": true .* no fc\.bias; set "bias": false'):
        convert_eagle(tiny_target, declared_absent, tmp_path / "o1", dtype="float32", **LIMITS)
    omitted = _head_copy(eagle_head, tmp_path / "h2", drop=("fc.bias",))  # no key: EAGLE's default is true
    with pytest.raises(ModelConfigError, match="EAGLE's default is true"):
        convert_eagle(tiny_target, omitted, tmp_path / "o2", dtype="float32", **LIMITS)
    contradicts = _head_copy(eagle_head, tmp_path / "h3", config={"bias": False})
    with pytest.raises(ModelConfigError, match=r'declares "bias": false but the weights contain fc\.bias'):
        convert_eagle(tiny_target, contradicts, tmp_path / "o3", dtype="float32", **LIMITS)
    assert not any((tmp_path / o).exists() for o in ("o1", "o2", "o3"))


def test_mismatched_head_is_refused(tiny_target: Path, eagle_head: Path, tmp_path: Path) -> None:
    wrong = _head_copy(eagle_head, tmp_path / "wrong", config={"vocab_size": 999})
    with pytest.raises(ModelConfigError, match=r"vocab_size=999 but the target's is 320"):
        convert_eagle(tiny_target, wrong, tmp_path / "out", dtype="float32", **LIMITS)
    assert not (tmp_path / "out").exists()


def test_eagle_tp2_splits_fc_rows(tiny_target: Path, eagle_head: Path, tmp_path: Path) -> None:
    convert_eagle(tiny_target, eagle_head, tmp_path, dtype="float32", tp=2, **LIMITS)
    cfg, ranks = ckpt(tmp_path)
    head = hf_tensors(eagle_head)
    assert cfg["eagle_net_config"]["mapping"] == {"world_size": 2, "tp_size": 2, "pp_size": 1}
    assert torch.equal(torch.cat([r["eagle_nets.1.drafter.fc.weight"] for r in ranks]), head["fc.weight"])
    assert torch.equal(torch.cat([r["eagle_nets.1.drafter.fc.bias"] for r in ranks]), head["fc.bias"])
    got = reassemble_layer(ranks, "eagle_nets.2.drafter.layers.0", tm.HEADS, tm.KV_HEADS, HD)
    assert torch.equal(got["self_attn.k_proj.weight"], head["layers.0.self_attn.k_proj.weight"])


def test_eagle3_normalized_head(tiny_target: Path, eagle3_head: Path, tmp_path: Path) -> None:
    convert_eagle3(tiny_target, eagle3_head, tmp_path, dtype="bfloat16", layers_to_capture=None)
    cfg, (r0,) = ckpt(tmp_path)
    assert cfg["architecture"] == "LlamaForCausalLM" and "transformer.layers.1.mlp.fc.weight" in r0
    ncfg = json.loads((tmp_path / "eagle3" / "config.json").read_text())
    src_cfg = json.loads((eagle3_head / "config.json").read_text())
    assert ncfg["eagle_aux_hidden_state_layer_ids"] == src_cfg["eagle_aux_hidden_state_layer_ids"] == [1, 1, 0]
    assert ncfg["eagle_deploy"]["trtllm_layers_to_capture"] == [0, 0, -1]  # TRT-LLM counts layer outputs
    assert (ncfg["draft_vocab_size"], ncfg["target_hidden_size"], ncfg["bias"]) == (96, H, False)
    assert ncfg["architectures"] == ["LlamaForCausalLMEagle3"] and ncfg["torch_dtype"] == "bfloat16"
    w = load_file(str(tmp_path / "eagle3" / "model.safetensors"))
    src = hf_tensors(eagle3_head)
    assert set(w) == set(src)
    assert w["d2t"].dtype == torch.int64 and torch.equal(w["d2t"], src["d2t"])
    assert w["t2d"].dtype == torch.bool and int(w["t2d"].sum()) == 96
    assert torch.equal(w["t2d"].nonzero().flatten(), torch.arange(96) + w["d2t"])
    assert w["fc.weight"].dtype == torch.bfloat16 and torch.equal(w["fc.weight"], src["fc.weight"].bfloat16())


def test_eagle3_layers_naming_and_generated_t2d(tiny_target: Path, eagle3_head: Path, tmp_path: Path) -> None:
    """A head saved with `layers.0.*` names and no t2d is normalized to `midlayer.*` with t2d derived from d2t."""
    h = tmp_path / "h"
    h.mkdir()
    src = hf_tensors(eagle3_head)
    t = {
        (k.replace("midlayer.", "layers.0.", 1) if k.startswith("midlayer.") else k): v
        for k, v in src.items()
        if k != "t2d"
    }
    save_file(t, str(h / "model.safetensors"))
    shutil.copy(eagle3_head / "config.json", h / "config.json")
    convert_eagle3(tiny_target, h, tmp_path / "out", dtype="float32", layers_to_capture=[1, 1, 0])
    w = load_file(str(tmp_path / "out" / "eagle3" / "model.safetensors"))
    assert set(w) == set(src) and torch.equal(w["t2d"], src["t2d"])
    assert torch.equal(w["midlayer.hidden_norm.weight"], src["midlayer.hidden_norm.weight"])


def test_eagle3_layer_ids_conflict_and_missing(tiny_target: Path, eagle3_head: Path, tmp_path: Path) -> None:
    with pytest.raises(
        ModelConfigError,
        match=r"layers_to_capture=\[0, 1, 1\] disagrees with eagle_aux_hidden_state_layer_ids=\[1, 1, 0\]",
    ):
        convert_eagle3(tiny_target, eagle3_head, tmp_path / "o1", dtype="float32", layers_to_capture=[0, 1, 1])
    no_ids = tmp_path / "no_ids"
    shutil.copytree(eagle3_head, no_ids)
    cfg = json.loads((no_ids / "config.json").read_text())
    del cfg["eagle_aux_hidden_state_layer_ids"]
    (no_ids / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        ModelConfigError, match=r"no eagle_aux_hidden_state_layer_ids; set draft\.eagle3\.layers_to_capture"
    ):
        convert_eagle3(tiny_target, no_ids, tmp_path / "o2", dtype="float32", layers_to_capture=None)
    with pytest.raises(ModelConfigError, match=r"captured layer ids \[5\] are outside 0\.\.1"):
        convert_eagle3(tiny_target, no_ids, tmp_path / "o3", dtype="float32", layers_to_capture=[1, 0, 5])
    assert not any((tmp_path / o).exists() for o in ("o1", "o2", "o3"))


def test_eagle3_bad_d2t_is_refused(tiny_target: Path, eagle3_head: Path, tmp_path: Path) -> None:
    h = tmp_path / "h"
    shutil.copytree(eagle3_head, h)
    t = hf_tensors(h)
    t["d2t"] = t["d2t"] + 1000
    save_file(t, str(h / "model.safetensors"))
    with pytest.raises(ModelConfigError, match="d2t maps draft ids outside the target vocabulary"):
        convert_eagle3(tiny_target, h, tmp_path / "out", dtype="float32", layers_to_capture=None)


def test_random_head_is_deterministic_and_converts(tiny_target: Path, tmp_path: Path) -> None:
    write_random_head(tiny_target, tmp_path / "a", seed=7)
    write_random_head(tiny_target, tmp_path / "b", seed=7)
    write_random_head(tiny_target, tmp_path / "c", seed=8)
    a = (tmp_path / "a" / "model.safetensors").read_bytes()
    assert a == (tmp_path / "b" / "model.safetensors").read_bytes()
    assert a != (tmp_path / "c" / "model.safetensors").read_bytes()
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    assert cfg["eagle_deploy_random_head"] is True and cfg["eagle_deploy_label"].startswith("RANDOM")
    w = hf_tensors(tmp_path / "a")
    assert w["fc.weight"].shape == (H, 2 * H) and not w["fc.bias"].any()
    assert 0.015 < float(w["layers.0.mlp.up_proj.weight"].std()) < 0.025  # N(0, initializer_range=0.02)
    assert torch.equal(w["embed_tokens.weight"], hf_tensors(tiny_target)["model.embed_tokens.weight"])
    convert_eagle(tiny_target, tmp_path / "a", tmp_path / "out", dtype="float32", **LIMITS)
    _, (r0,) = ckpt(tmp_path / "out")
    assert torch.equal(r0["eagle_nets.2.drafter.fc.weight"], w["fc.weight"])


def test_heads_from_pytorch_model_bin(tiny_target: Path, eagle_head: Path, eagle3_head: Path, tmp_path: Path) -> None:
    """SafeAILab publishes heads as pytorch_model.bin: read with torch.load(weights_only=True), same output."""
    for head, kind in ((eagle_head, "eagle"), (eagle3_head, "eagle3")):
        b = tmp_path / f"{kind}_bin"
        b.mkdir()
        shutil.copy(head / "config.json", b / "config.json")
        torch.save(hf_tensors(head), b / "pytorch_model.bin")
        if kind == "eagle":
            convert_eagle(tiny_target, head, tmp_path / "st", dtype="float16", **LIMITS)
            convert_eagle(tiny_target, b, tmp_path / "bin", dtype="float16", **LIMITS)
            files = ("rank0.safetensors",)
        else:
            convert_eagle3(tiny_target, head, tmp_path / "st3", dtype="float16", layers_to_capture=None)
            convert_eagle3(tiny_target, b, tmp_path / "bin3", dtype="float16", layers_to_capture=None)
            files = ("eagle3/model.safetensors",)
        suffix = "" if kind == "eagle" else "3"
        for f in files:
            assert (tmp_path / f"st{suffix}" / f).read_bytes() == (tmp_path / f"bin{suffix}" / f).read_bytes(), kind


def test_eagle3_head_from_specforge_and_transformers5(tiny_target: Path, eagle3_head: Path, tmp_path: Path) -> None:
    """A SpecForge / ModelOpt export keeps the layer ids in an `eagle_config` block, and a head saved by transformers
    5 carries its RoPE base only in `rope_parameters`: both are read, and the normalized config spells them the way
    TensorRT-LLM 1.1/1.2 (transformers 4) reads them: top-level ids and `rope_theta`."""
    h = tmp_path / "h"
    shutil.copytree(eagle3_head, h)
    cfg = json.loads((h / "config.json").read_text())
    ids = cfg.pop("eagle_aux_hidden_state_layer_ids")
    cfg.pop("rope_theta", None)
    cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True}
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 500000.0}
    (h / "config.json").write_text(json.dumps(cfg))
    convert_eagle3(tiny_target, h, tmp_path / "out", dtype="float16", layers_to_capture=None)
    ncfg = json.loads((tmp_path / "out" / "eagle3" / "config.json").read_text())
    assert ncfg["eagle_aux_hidden_state_layer_ids"] == ids and "eagle_config" not in ncfg
    assert ncfg["rope_theta"] == 500000.0 and "rope_scaling" not in ncfg
    # both spellings present and different: refused, naming both
    cfg["eagle_aux_hidden_state_layer_ids"] = [0, 0, 1]
    (h / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelConfigError, match=r"disagrees with eagle_config.eagle_aux_hidden_state_layer_ids"):
        convert_eagle3(tiny_target, h, tmp_path / "out2", dtype="float16", layers_to_capture=None)


def test_rope_base_from_either_spelling(tmp_path: Path) -> None:
    from core.hfconfig import rope_theta_of

    f = tmp_path / "config.json"
    assert rope_theta_of({"rope_theta": 1e6}, f) == 1e6
    assert rope_theta_of({"rope_parameters": {"rope_type": "default", "rope_theta": 1e5}}, f) == 1e5
    assert rope_theta_of({"rope_theta": 1e5, "rope_parameters": {"rope_theta": 1e5}}, f) == 1e5
    assert rope_theta_of({}, f) == 10000.0  # HF LlamaConfig's default
    with pytest.raises(ModelConfigError, match="rope_theta=10000 disagrees with rope_parameters.rope_theta=100000"):
        rope_theta_of({"rope_theta": 10000, "rope_parameters": {"rope_theta": 100000}}, f)


def test_checkpoint_tokenizer_loads_in_transformers_4(tiny_target: Path, eagle_head: Path, tmp_path: Path) -> None:
    """The tiny target's tokenizer was saved by transformers 5 ("TokenizersBackend", a class 4.x lacks): the
    checkpoint's copy names PreTrainedTokenizerFast and keeps every other file byte for byte."""
    src = json.loads((tiny_target / "tokenizer_config.json").read_text())
    assert src["tokenizer_class"] == "TokenizersBackend"
    convert_eagle(tiny_target, eagle_head, tmp_path, dtype="float16", **LIMITS)
    tok = tmp_path / "tokenizer"
    out = json.loads((tok / "tokenizer_config.json").read_text())
    assert out == dict(src, tokenizer_class="PreTrainedTokenizerFast")
    assert (tok / "tokenizer.json").read_bytes() == (tiny_target / "tokenizer.json").read_bytes()
    from transformers import AutoTokenizer

    a, b = AutoTokenizer.from_pretrained(tok), AutoTokenizer.from_pretrained(tiny_target)
    assert a.encode("The quick brown fox") == b.encode("The quick brown fox") and a.eos_token == b.eos_token
