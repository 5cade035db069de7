"""Every field the converters write, checked against the Hugging Face config it derives from, and the reference
engine's reading of it. The expectations are written here from the HF configs alone (not from core.hfconfig),
per upstream's mapping:

- target (LlamaForCausalLM) and EagleForCausalLM top level: tensorrt_llm/models/llama/config.py
  `LLaMAConfig.from_hugging_face`; EagleForCausalLM adds num_eagle_layers, max_draft_len, max_non_leaves_per_layer
  (tensorrt_llm/models/eagle/config.py `EagleConfig`);
- `eagle_net_config` (the EAGLE-1/2 drafter): the head's sizes and norm epsilon, the TARGET's vocabulary and RoPE
  (rotary_base AND rotary_scaling: examples/eagle/convert_checkpoint.py builds it from args.rotary_base /
  args.rotary_scaling, read from the target's config); a Llama-3.1 head whose config lacks rope_scaling must still
  draft with llama3 RoPE;
- EAGLE-3 normalized head: the head's own config (TensorRT-LLM's PyTorch backend reads the speculative model's
  config.json, tensorrt_llm/_torch/models/modeling_speculative.py), RoPE spelled for transformers-4 readers.

RoPE is checked as the inverse frequencies the engine computes vs transformers' own `ROPE_INIT_FUNCTIONS` on the HF
config: the independent definition of llama3 scaling."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from builders.convert import convert_eagle, convert_eagle3, convert_llama
from engines.api import ReferenceEngine
from core.trees import DraftTree
from testkit import tiny_models as tm

LIMITS = {"max_draft_len": 6, "num_eagle_layers": 3, "max_non_leaves_per_layer": 2}
LLAMA31_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64}
LINEAR_ROPE = {"type": "linear", "factor": 2.0}

# target variants: (rope_scaling at the top level, transformers-5 rope_parameters instead, extra config keys)
TARGETS: dict[str, dict[str, Any]] = {
    "plain": {},
    "llama3.1": {"rope_scaling": LLAMA31_ROPE, "rope_theta": 500000.0},
    "llama3.1-transformers5": {"rope_parameters": dict(LLAMA31_ROPE, rope_theta=500000.0)},
    "linear-tied": {"rope_scaling": LINEAR_ROPE, "tie_word_embeddings": True},
    "defaults": {"drop": ["num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings",
                          "tie_word_embeddings", "attention_bias", "mlp_bias", "rope_theta"]},
}


def _edit_config(d: Path, edit: dict[str, Any]) -> dict[str, Any]:
    cfg = json.loads((d / "config.json").read_text())
    for k in edit.get("drop", []):
        cfg.pop(k, None)
    cfg.update({k: v for k, v in edit.items() if k != "drop"})
    if "rope_parameters" in edit:
        cfg.pop("rope_theta", None)
        cfg.pop("rope_scaling", None)
    (d / "config.json").write_text(json.dumps(cfg))
    return cfg


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("field_targets")
    out = {}
    for name, edit in TARGETS.items():
        # "defaults" drops num_key_value_heads: HF's default is num_attention_heads, so the weights have as many
        d = tm.make_target(root / name, tie=bool(edit.get("tie_word_embeddings")),
                           kv_heads=tm.HEADS if name == "defaults" else tm.KV_HEADS)
        _edit_config(d, edit)
        out[name] = d
    return out


def hf(d: Path) -> dict[str, Any]:
    return json.loads((d / "config.json").read_text())


def rope_of(cfg: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(base, scaling) from either spelling; scaling None when plain."""
    params = cfg.get("rope_parameters")
    if isinstance(params, dict):
        base = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    else:
        base, scaling = cfg.get("rope_theta", 10000.0), cfg.get("rope_scaling")
    if scaling is not None and scaling.get("rope_type", scaling.get("type")) in (None, "default"):
        scaling = None
    return float(base), scaling


def same_scaling(written: dict[str, Any] | None, source: dict[str, Any] | None) -> bool:
    """The written rotary_scaling carries the source's parameters and names its type both ways (TRT-LLM reads
    "type" in older releases, "rope_type" in newer)."""
    if source is None:
        return written is None
    if written is None:
        return False
    kind = source.get("rope_type", source.get("type"))
    params = {k: v for k, v in source.items() if k not in ("type", "rope_type")}
    return written == dict(params, type=kind, rope_type=kind)  # nothing else (no rope_theta inside)


def expected_llama_fields(cfg: dict[str, Any], *, dtype: str, tp: int, architecture: str) -> dict[str, Any]:
    """LLaMAConfig keys from an HF Llama config, with HF LlamaConfig's defaults for absent keys."""
    heads = cfg["num_attention_heads"]
    base, _ = rope_of(cfg)
    return {
        "architecture": architecture, "dtype": dtype, "logits_dtype": "float32",
        "vocab_size": cfg["vocab_size"], "hidden_size": cfg["hidden_size"],
        "intermediate_size": cfg["intermediate_size"], "num_hidden_layers": cfg["num_hidden_layers"],
        "num_attention_heads": heads, "num_key_value_heads": cfg.get("num_key_value_heads") or heads,
        "head_size": cfg.get("head_dim") or cfg["hidden_size"] // heads, "hidden_act": cfg.get("hidden_act", "silu"),
        "norm_epsilon": cfg["rms_norm_eps"], "position_embedding_type": "rope_gpt_neox", "rotary_base": base,
        "max_position_embeddings": cfg.get("max_position_embeddings", 2048),
        "tie_word_embeddings": cfg.get("tie_word_embeddings", False), "use_parallel_embedding": False,
        "embedding_sharding_dim": 0, "share_embedding_table": False, "attn_bias": cfg.get("attention_bias", False),
        "mlp_bias": cfg.get("mlp_bias", False), "residual_mlp": False,
        "mapping": {"world_size": tp, "tp_size": tp, "pp_size": 1},
        "quantization": {"quant_algo": None, "kv_cache_quant_algo": None, "exclude_modules": None},
    }


def check_fields(written: dict[str, Any], want: dict[str, Any], scaling: dict[str, Any] | None, where: str,
                 extra: set[str] = frozenset()) -> None:
    """Every written key is expected (no unchecked field), every expected value is written."""
    unchecked = set(written) - set(want) - {"rotary_scaling"} - set(extra)
    assert not unchecked, f"{where}: fields {sorted(unchecked)} are written but no test derives them from a config"
    for k, v in want.items():  # as JSON text: 2.0 is not 2 for TensorRT-LLM's Mapping(world_size=...)
        assert json.dumps(written.get(k), sort_keys=True) == json.dumps(v, sort_keys=True), (
            f"{where}: {k}={written.get(k)!r}, expected {v!r} from the HF config")
    assert same_scaling(written.get("rotary_scaling"), scaling), (
        f"{where}: rotary_scaling={written.get('rotary_scaling')!r} but the config it derives from says {scaling!r}"
    )


def hf_inv_freq(cfg: dict[str, Any]) -> torch.Tensor:
    """transformers' own RoPE inverse frequencies for an HF Llama config (the independent definition)."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    c = LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures",)})
    kind = c.rope_parameters.get("rope_type", "default") if getattr(c, "rope_parameters", None) else "default"
    if kind == "default":
        base = c.rope_parameters["rope_theta"]
        d = c.head_dim
        return 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    return ROPE_INIT_FUNCTIONS[kind](c, "cpu")[0]


def head_config_without_rope(head: Path) -> None:
    """A head config the way many EAGLE-1/2 heads ship: no rope_scaling and another rope_theta (the drafter must
    still use the target's RoPE)."""
    cfg = hf(head)
    for k in ("rope_scaling", "rope_parameters"):
        cfg.pop(k, None)
    cfg.update(rope_theta=10000.0, rms_norm_eps=1e-6, max_position_embeddings=4096)
    (head / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("head_rope", ["copied", "absent"])
def test_eagle1_fields_and_the_engines_reading(
    targets: dict[str, Path], tmp_path: Path, target: str, head_rope: str
) -> None:
    tdir = targets[target]
    # (tiny_models writes a head from a config with every key; "defaults" lacks some, so its head comes from "plain")
    head = tm.make_eagle_head(tmp_path / "head", targets["plain"] if target == "defaults" else tdir)
    if head_rope == "absent":
        head_config_without_rope(head)
    out = tmp_path / "ckpt"
    convert_eagle(tdir, head, out, dtype="float32", **LIMITS)
    written = json.loads((out / "config.json").read_text())
    tcfg, hcfg = hf(tdir), hf(head)
    _, tscale = rope_of(tcfg)
    want = dict(expected_llama_fields(tcfg, dtype="float32", tp=1, architecture="EagleForCausalLM"), **LIMITS)
    check_fields(written, want, tscale, f"{target} EagleForCausalLM config.json", {"eagle_net_config", "eagle_deploy"})
    assert written["eagle_deploy"] == {"random_head": False, "target_source": str(tdir), "head_source": str(head)}
    # The drafter: the head's sizes and epsilon, the target's vocabulary and RoPE (base and scaling).
    net_want = expected_llama_fields(dict(hcfg, vocab_size=tcfg["vocab_size"]), dtype="float32", tp=1,
                                     architecture="LlamaForCausalLM")
    net_want["rotary_base"] = rope_of(tcfg)[0]
    net_want["head_dim"] = net_want["head_size"]  # also written under its HF name
    check_fields(written["eagle_net_config"], net_want, tscale,
                 f"{target} eagle_net_config (head rope {head_rope}; the drafter's rotary_base and rotary_scaling come "
                 "from the TARGET config, builders/convert/eagle.py eagle_net_config)")
    # The engine's reading: target and drafter RoPE are the target's llama3/linear/plain frequencies.
    engine = ReferenceEngine.from_checkpoint(out, tree=DraftTree.from_choices([[0]]), dtype="float32", device="cpu")
    rt = engine._rt
    inv = hf_inv_freq(tcfg)
    torch.testing.assert_close(rt.target.rope.inv, inv, msg=f"{target}: the target's RoPE is not the HF config's")
    torch.testing.assert_close(
        rt.drafter.rope.inv, inv,
        msg=lambda m: f"{target}, head rope {head_rope}: the EAGLE-1 drafter's RoPE differs from the target's "
        f"(eagle_net_config.rotary_scaling / rotary_base must come from the TARGET config, builders/convert/eagle.py "
        f"eagle_net_config): {m}",
    )
    d = rt.drafter
    assert (d.head_dim, d.kv_heads, d.lm_head.vocab_size) == (
        want["head_size"], hcfg.get("num_key_value_heads") or hcfg["num_attention_heads"], tcfg["vocab_size"])
    assert d.layers[0].eps == hcfg["rms_norm_eps"] and rt.target.eps == tcfg["rms_norm_eps"]


@pytest.mark.parametrize("target", ["plain", "llama3.1", "llama3.1-transformers5"])
def test_target_only_fields(targets: dict[str, Path], tmp_path: Path, target: str) -> None:
    tdir = targets[target]
    convert_llama(tdir, tmp_path, dtype="float16", tp=2)
    written = json.loads((tmp_path / "config.json").read_text())
    tcfg = hf(tdir)
    want = expected_llama_fields(tcfg, dtype="float16", tp=2, architecture="LlamaForCausalLM")
    check_fields(written, want, rope_of(tcfg)[1], f"{target} LlamaForCausalLM config.json", {"eagle_deploy"})


@pytest.mark.parametrize("target", ["plain", "llama3.1", "llama3.1-transformers5"])
@pytest.mark.parametrize("head_layout", ["transformers4", "transformers5", "specforge"])
def test_eagle3_fields_and_the_engines_reading(
    targets: dict[str, Path], tmp_path: Path, target: str, head_layout: str
) -> None:
    """The EAGLE-3 head keeps its own config (TensorRT-LLM reads it as the speculative model's); for a Llama-3.1
    target its llama3 rope_scaling is written at the top level with rope_theta (transformers-4 readers) and the
    engine drafts with those frequencies. A SpecForge-style config (layer ids in an `eagle_config` block, no
    draft_vocab_size, no target_hidden_size) gets them from the block, the lm_head rows and the target."""
    tdir = targets[target]
    head = tm.make_eagle3_head(tmp_path / "head3", tdir)
    hcfg = hf(head)
    ids, draft_vocab = hcfg["eagle_aux_hidden_state_layer_ids"], hcfg["draft_vocab_size"]
    if head_layout == "specforge":
        for k in ("eagle_aux_hidden_state_layer_ids", "draft_vocab_size", "target_hidden_size"):
            hcfg.pop(k)
        hcfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True}
        (head / "config.json").write_text(json.dumps(hcfg))
    if head_layout == "transformers5":
        base, scaling = rope_of(hcfg)
        for k in ("rope_theta", "rope_scaling"):
            hcfg.pop(k, None)
        hcfg["rope_parameters"] = dict(scaling or {"rope_type": "default"}, rope_theta=base)
        (head / "config.json").write_text(json.dumps(hcfg))
    out = tmp_path / "ckpt3"
    convert_eagle3(tdir, head, out, dtype="float32", layers_to_capture=None)
    n = json.loads((out / "eagle3" / "config.json").read_text())
    tcfg = hf(tdir)
    base, scaling = rope_of(hcfg)
    derived = {
        "architectures": ["LlamaForCausalLMEagle3"], "torch_dtype": "float32", "dtype": "float32",
        "num_hidden_layers": hcfg["num_hidden_layers"], "draft_vocab_size": draft_vocab,
        "target_hidden_size": tcfg["hidden_size"], "eagle_aux_hidden_state_layer_ids": ids, "bias": False,
        "rope_theta": base,
    }
    for k, v in derived.items():
        assert n[k] == v, f"{target} EAGLE-3 {head_layout}: {k}={n[k]!r}, expected {v!r}"
    assert same_scaling(n.get("rope_scaling"), scaling), f"EAGLE-3 rope_scaling {n.get('rope_scaling')} vs {scaling}"
    assert n["eagle_deploy"] == {"random_head": False, "target_source": str(tdir), "head_source": str(head),
                                 "trtllm_layers_to_capture": [i - 1 for i in ids]}
    assert "eagle_config" not in n, "the ids are top-level now; TensorRT-LLM reads them from nowhere else"
    for k, v in hcfg.items():  # every other key of the head's config is kept as it was
        if k not in derived and k not in ("rope_scaling", "eagle_config"):
            assert n[k] == v, f"EAGLE-3 head key {k} changed: {n[k]!r} vs {v!r}"
    engine = ReferenceEngine.from_checkpoint(out, tree=DraftTree.from_choices([[0]]), dtype="float32", device="cpu",
                                             eagle3_head_dir=out / "eagle3")
    d = engine._rt.drafter
    torch.testing.assert_close(d.rope.inv, hf_inv_freq(hcfg), msg=lambda m: f"EAGLE-3 drafter RoPE: {m}")
    torch.testing.assert_close(engine._rt.target.rope.inv, hf_inv_freq(tcfg))
    assert d.capture == tuple(ids) and d.eps == hcfg["rms_norm_eps"]
    assert d.lm_head.weight.shape[0] == draft_vocab


def test_rope_base_given_twice_must_agree(targets: dict[str, Path], tmp_path: Path) -> None:
    """transformers 4 and 5 spellings of the RoPE base in one config must agree; the error names the file, both
    values and why (core/hfconfig.py rope_theta_of)."""
    import shutil

    from core.hfconfig import ModelConfigError

    d = tmp_path / "both"
    shutil.copytree(targets["plain"], d)
    cfg = hf(d)
    cfg.update(rope_theta=10000.0, rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelConfigError) as err:
        convert_llama(d, tmp_path / "out", dtype="float32")
    assert str(err.value) == (
        f"{d / 'config.json'}: rope_theta=10000.0 disagrees with rope_parameters.rope_theta=500000.0; fix the config "
        "(they are the same RoPE base for transformers 4 and 5 readers)"
    )
