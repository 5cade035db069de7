"""HF Llama -> TensorRT-LLM LlamaForCausalLM checkpoint (builders/convert/llama.py), on the tiny fixtures.

Expected layout from upstream tensorrt_llm/models/llama/convert.py and models/eagle/weight.py `convert_hf_llama`:
fused qkv [q;k;v] per rank, gate_proj -> mlp.fc, up_proj -> mlp.gate, dense/proj split on dim 1, K/V heads
duplicated when kv_heads < tp, lm_head zero-padded to a multiple of tp, PP ranks renumber their layers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from builders.convert import convert_llama
from builders.convert.llama import pad_vocab, pp_layer_range
from builders.convert.weights import WeightFileError, WeightSource, read_safetensors_header
from core.hfconfig import ModelConfigError
from testkit import tiny_models as tm
from tests.convert_helpers import ckpt, derive_target, hf_tensors, reassemble_layer, truncate

H, HD = tm.HIDDEN, tm.HIDDEN // tm.HEADS


def _check_tp_roundtrip(target: Path, out: Path, tp: int, dtype: torch.dtype = torch.float32) -> None:
    hf = hf_tensors(target)
    cfg, ranks = ckpt(out)
    assert cfg["mapping"] == {"world_size": tp, "tp_size": tp, "pp_size": 1}
    for i in range(tm.LAYERS):
        got = reassemble_layer(ranks, f"transformer.layers.{i}", tm.HEADS, tm.KV_HEADS, HD)
        for name, value in got.items():
            assert torch.equal(value, hf[f"model.layers.{i}.{name}"].to(dtype)), (tp, i, name)
        for r in ranks:
            assert torch.equal(
                r[f"transformer.layers.{i}.input_layernorm.weight"],
                hf[f"model.layers.{i}.input_layernorm.weight"].to(dtype),
            )
    vocab = cfg["vocab_size"]
    lm = torch.cat([r["lm_head.weight"] for r in ranks])
    assert lm.shape == (pad_vocab(vocab, tp), H)
    src_lm = hf["lm_head.weight"] if "lm_head.weight" in hf else hf["model.embed_tokens.weight"]
    assert torch.equal(lm[:vocab], src_lm.to(dtype))
    assert not lm[vocab:].any(), "vocab padding rows must be zero"
    for r in ranks:  # embedding and final norm are replicated (use_parallel_embedding=false)
        assert torch.equal(r["transformer.vocab_embedding.weight"], hf["model.embed_tokens.weight"].to(dtype))
        assert torch.equal(r["transformer.ln_f.weight"], hf["model.norm.weight"].to(dtype))


def test_untied_tp1_names_values_and_config(tiny_target: Path, tmp_path: Path) -> None:
    convert_llama(tiny_target, tmp_path, dtype="float32")
    cfg, (r0,) = ckpt(tmp_path)
    expected = {"transformer.vocab_embedding.weight", "transformer.ln_f.weight", "lm_head.weight"}
    for i in range(tm.LAYERS):
        expected |= {f"transformer.layers.{i}.{n}.weight" for n in (
            "input_layernorm", "attention.qkv", "attention.dense", "mlp.fc", "mlp.gate", "mlp.proj", "post_layernorm")}
    assert set(r0) == expected
    hf = hf_tensors(tiny_target)
    # The swap upstream documents: gate_proj -> mlp.fc, up_proj -> mlp.gate.
    assert torch.equal(r0["transformer.layers.1.mlp.fc.weight"], hf["model.layers.1.mlp.gate_proj.weight"])
    assert torch.equal(r0["transformer.layers.1.mlp.gate.weight"], hf["model.layers.1.mlp.up_proj.weight"])
    qkv = torch.cat([hf[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"])
    assert torch.equal(r0["transformer.layers.0.attention.qkv.weight"], qkv)
    _check_tp_roundtrip(tiny_target, tmp_path, 1)
    assert cfg["architecture"] == "LlamaForCausalLM"
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_size"]) == (tm.HEADS, tm.KV_HEADS, HD)
    assert cfg["rotary_base"] == 10000.0 and cfg["rotary_scaling"] is None
    assert cfg["tie_word_embeddings"] is False and cfg["norm_epsilon"] == 1e-5
    assert cfg["position_embedding_type"] == "rope_gpt_neox" and cfg["logits_dtype"] == "float32"
    assert cfg["eagle_deploy"] == {"random_head": False, "target_source": str(tiny_target), "head_source": "none",
                                  "target_weights": True}
    assert sorted(p.name for p in (tmp_path / "tokenizer").iterdir()) == [
        "chat_template.jinja", "generation_config.json", "tokenizer.json", "tokenizer_config.json"]


def test_tied_embeddings_and_llama3_rope(tiny_target_tied: Path, tmp_path: Path) -> None:
    convert_llama(tiny_target_tied, tmp_path, dtype="float32")
    cfg, (r0,) = ckpt(tmp_path)
    hf = hf_tensors(tiny_target_tied)
    assert "lm_head.weight" not in hf
    assert torch.equal(r0["lm_head.weight"], hf["model.embed_tokens.weight"])
    assert cfg["tie_word_embeddings"] is True
    rs = cfg["rotary_scaling"]
    assert rs["type"] == rs["rope_type"] == "llama3"
    assert (rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"], rs["original_max_position_embeddings"]) == (
        8.0, 1.0, 4.0, 64)


def test_transformers5_rope_parameters(tiny_target: Path, tmp_path: Path) -> None:
    """transformers 5 writes rope_theta/rope_type inside `rope_parameters` (as SmolLM2's extracted config has)."""
    t = derive_target(tiny_target, tmp_path / "t5")
    cfg = json.loads((t / "config.json").read_text())
    del cfg["rope_theta"]
    cfg["rope_parameters"] = {"rope_theta": 100000.0, "rope_type": "default"}
    (t / "config.json").write_text(json.dumps(cfg))
    convert_llama(t, tmp_path / "out", dtype="float32")
    out = json.loads((tmp_path / "out" / "config.json").read_text())
    assert out["rotary_base"] == 100000.0 and out["rotary_scaling"] is None


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_dtype_cast(tiny_target: Path, tmp_path: Path, dtype: str) -> None:
    convert_llama(tiny_target, tmp_path, dtype=dtype)
    cfg, (r0,) = ckpt(tmp_path)
    dt = getattr(torch, dtype)
    assert cfg["dtype"] == dtype
    assert {t.dtype for t in r0.values()} == {dt}
    _check_tp_roundtrip(tiny_target, tmp_path, 1, dt)


def test_tp2_roundtrip_with_vocab_padding(tiny_target: Path, tmp_path: Path) -> None:
    odd = derive_target(tiny_target, tmp_path / "odd", vocab=319)  # 319 % 2 != 0 -> lm_head padded to 320
    convert_llama(odd, tmp_path / "out", dtype="float32", tp=2)
    cfg, ranks = ckpt(tmp_path / "out")
    assert cfg["vocab_size"] == 319 and [r["lm_head.weight"].shape[0] for r in ranks] == [160, 160]
    assert [r["transformer.layers.0.attention.qkv.weight"].shape for r in ranks] == [(64, H)] * 2  # q 32 + k 16 + v 16
    _check_tp_roundtrip(odd, tmp_path / "out", 2)


def test_tp4_duplicates_kv_heads(tiny_target: Path, tmp_path: Path) -> None:
    """kv_heads=2 < tp=4: each KV head is duplicated on 2 ranks (upstream convert_utils.dup_kv_weight)."""
    convert_llama(tiny_target, tmp_path, dtype="float32", tp=4)
    _, ranks = ckpt(tmp_path)
    hf = hf_tensors(tiny_target)
    k = hf["model.layers.0.self_attn.k_proj.weight"]
    for r, shard in enumerate(ranks):
        qkv = shard["transformer.layers.0.attention.qkv.weight"]
        assert qkv.shape == (HD + 2 * HD, H)  # one q head, one k head, one v head
        assert torch.equal(qkv[HD:2 * HD], k[(r // 2) * HD:(r // 2 + 1) * HD])
    _check_tp_roundtrip(tiny_target, tmp_path, 4)


def test_pp2_split_renumbers_layers(tiny_dir: Path, tmp_path: Path) -> None:
    """3 layers over pp=2: torch.tensor_split gives [0, 1] and [2] (tensorrt_llm/mapping.py pp_layers)."""
    t = tm.make_target(tiny_dir / "target_3layers", layers=3, tokenizer=False, seed=5)
    tm.make_tokenizer(t)
    assert pp_layer_range(3, 2, 0) == [0, 1] and pp_layer_range(3, 2, 1) == [2]
    convert_llama(t, tmp_path, dtype="float32", tp=2, pp=2)
    cfg, ranks = ckpt(tmp_path)
    assert cfg["mapping"] == {"world_size": 4, "tp_size": 2, "pp_size": 2}
    hf = hf_tensors(t)
    first, last = ranks[0], ranks[2]  # rank = pp_rank * tp + tp_rank
    assert "transformer.vocab_embedding.weight" in first and "lm_head.weight" not in first
    assert "transformer.ln_f.weight" not in first and "transformer.layers.2.mlp.fc.weight" not in first
    assert "transformer.vocab_embedding.weight" not in last and {"lm_head.weight", "transformer.ln_f.weight"} <= set(
        last
    )
    assert not any(k.startswith("transformer.layers.1.") for k in last)
    got = reassemble_layer([ranks[2], ranks[3]], "transformer.layers.0", tm.HEADS, tm.KV_HEADS, HD)
    assert torch.equal(got["mlp.down_proj.weight"], hf["model.layers.2.mlp.down_proj.weight"])
    assert torch.equal(got["self_attn.q_proj.weight"], hf["model.layers.2.self_attn.q_proj.weight"])


def _same_checkpoint(a: Path, b: Path) -> None:
    assert (a / "rank0.safetensors").read_bytes() == (b / "rank0.safetensors").read_bytes()


def test_sharded_index_and_pytorch_bin_inputs(tiny_target: Path, tmp_path: Path) -> None:
    convert_llama(tiny_target, tmp_path / "ref", dtype="float16")
    hf = hf_tensors(tiny_target)
    names = sorted(hf)
    # Sharded safetensors with model.safetensors.index.json.
    sharded = derive_target(tiny_target, tmp_path / "sharded")
    (sharded / "model.safetensors").unlink()
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for fname, keys in halves.items():
        save_file({k: hf[k] for k in keys}, str(sharded / fname), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: f for f, ks in halves.items() for k in ks}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    convert_llama(sharded, tmp_path / "from_sharded", dtype="float16")
    _same_checkpoint(tmp_path / "ref", tmp_path / "from_sharded")
    # pytorch_model.bin (read with torch.load(weights_only=True, mmap=True)).
    binary = derive_target(tiny_target, tmp_path / "bin")
    (binary / "model.safetensors").unlink()
    torch.save(hf, binary / "pytorch_model.bin")
    convert_llama(binary, tmp_path / "from_bin", dtype="float16")
    _same_checkpoint(tmp_path / "ref", tmp_path / "from_bin")


def test_truncated_and_missing_files_name_the_file(tiny_target: Path, tmp_path: Path) -> None:
    bad = derive_target(tiny_target, tmp_path / "bad")
    truncate(bad / "model.safetensors")
    with pytest.raises(WeightFileError, match=r"bad/model\.safetensors: truncated safetensors file.*100 missing"):
        read_safetensors_header(bad / "model.safetensors")
    with pytest.raises(WeightFileError, match="truncated"):
        convert_llama(bad, tmp_path / "out", dtype="float32")
    assert not (tmp_path / "out").exists(), "nothing may be written for a truncated input"
    badbin = derive_target(tiny_target, tmp_path / "badbin")
    (badbin / "model.safetensors").unlink()
    torch.save(hf_tensors(tiny_target), badbin / "pytorch_model.bin")
    truncate(badbin / "pytorch_model.bin", 2000)
    with pytest.raises(WeightFileError, match=r"badbin/pytorch_model\.bin: not a readable torch zip archive"):
        WeightSource(badbin)
    shards = derive_target(tiny_target, tmp_path / "shards")
    (shards / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "model-00009.safetensors"}}))
    with pytest.raises(WeightFileError, match=r"lists shard\(s\) that are missing: .*model-00009\.safetensors"):
        WeightSource(shards)


def _raw_safetensors(path: Path, header: object, data: bytes = b"\0" * 16) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data)
    return path


@pytest.mark.parametrize(("header", "message"), [
    ([1, 2], "corrupt safetensors header (a JSON list, not an object of tensors)"),
    ({"w": {"dtype": "F32", "shape": [2, 2]}}, "tensor 'w' has missing or malformed data_offsets/shape in the header "
                                               "(got data_offsets=None, shape=[2, 2])"),
    ({"w": {"dtype": "F32", "data_offsets": [0, 16]}}, "tensor 'w' has missing or malformed data_offsets/shape"),
    ({"w": {"dtype": "F32", "shape": [4], "data_offsets": "0-16"}}, "missing or malformed data_offsets/shape"),
    ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [-16, 0]}}, "tensor 'w' has invalid data_offsets [-16, 0]"),
])
def test_malformed_safetensors_headers_name_the_file(tmp_path: Path, header: object, message: str) -> None:
    f = _raw_safetensors(tmp_path / "model.safetensors", header)
    with pytest.raises(WeightFileError) as err:
        read_safetensors_header(f)
    assert str(err.value).startswith(f"{f}: ") and message in str(err.value), str(err.value)


def test_tp_must_divide_heads(tiny_target: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelConfigError, match=r"parallel\.tp=8 must divide num_attention_heads=4"):
        convert_llama(tiny_target, tmp_path / "out", dtype="float32", tp=8)
    assert not (tmp_path / "out").exists()


def test_not_a_llama_target(tiny_target: Path, tmp_path: Path) -> None:
    t = derive_target(tiny_target, tmp_path / "gpt2")
    cfg = json.loads((t / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (t / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelConfigError, match="architecture 'GPT2LMHeadModel'; this converter writes "
                       "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM targets"):
        convert_llama(t, tmp_path / "out", dtype="float32")
    assert not (tmp_path / "out").exists()


def test_kernel_copy_path_equals_computed_path(
    tiny_target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same-dtype row ranges are copied as byte ranges (copy_file_range); forcing the computed path (read, cat,
    pad, write) must give identical files, including the zero-padded lm_head at tp=2 with vocab 319."""
    odd = derive_target(tiny_target, tmp_path / "odd", vocab=319)
    convert_llama(odd, tmp_path / "kernel", dtype="float32", tp=2)
    monkeypatch.setattr(WeightSource, "byte_range", lambda self, *a, **k: None)
    convert_llama(odd, tmp_path / "computed", dtype="float32", tp=2)
    for r in range(2):
        name = f"rank{r}.safetensors"
        assert (tmp_path / "kernel" / name).read_bytes() == (tmp_path / "computed" / name).read_bytes()
