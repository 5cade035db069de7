"""The family table (core/families.py FAMILIES) is the one place a target architecture is declared: every row has a
tiny random model here; its shape (core/shapes.py) counts exactly the parameters transformers writes for it; the
published DeepSeek-V3 config is sized as MLA + MoE (671e9 parameters within 5%, 61 x (512 + 64) KV elements per
token); the real build CLI accepts each row where its paths serve it and refuses the rest with the reason; every row
the reference engine runs builds and serves token-identical to HF greedy with EAGLE-3 trees."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from builders import build
from builders.capacity import kv_bytes_per_token, weight_bytes
from core.quant import checkpoint_quant
from core.quant import weight_bytes as quant_weight_bytes
from builders.trtllm import architectures
from core.families import BY_NAME, FAMILIES
from core.shapes import ShapeError, shape_of_config
from core.types import GenerationRequest, SamplingParams
from testkit.tiny_families import (_CLASSES, BUILD_ONLY_FAMILIES, CHAIN_FAMILIES, GENERIC_FAMILIES, NOT_ROW_FAMILIES,
                                   TINY, hf_model, make_family_target, make_mimic_eagle3_head)

pytestmark = pytest.mark.usefixtures("one_thread")

DEEPSEEK_V3 = Path(__file__).parent / "fixtures" / "configs" / "deepseek-v3.json"  # deepseek-ai/DeepSeek-V3's keys
# deepseek-ai/DeepSeek-V4-Flash's config.json keys (compress_ratios: 43 decoder layers + 1 MTP entry)
DEEPSEEK_V4 = Path(__file__).parent / "fixtures" / "configs" / "deepseek-v4-flash.json"
PROMPTS = [[5, 17, 33, 42, 9], [11, 12, 13, 14, 15, 16, 100, 7], [250, 3]]
NEW = 16


def test_every_row_has_a_tiny_family() -> None:
    assert set(TINY) == set(BY_NAME), "a family is one table row plus its tiny model (testkit/tiny_families.py TINY)"
    for f in FAMILIES:
        tiny = TINY[f.name]
        assert tiny == "llama" or tiny in _CLASSES
        assert (f.reference is None) == (tiny in BUILD_ONLY_FAMILIES), f.name
        assert f.reference != "generic" or tiny in (*GENERIC_FAMILIES, *CHAIN_FAMILIES, "qwen3_moe", "gpt_oss")
        assert f.path.startswith("tensorrt_llm/_torch/models/modeling_") and "commit" in f.read


def _tensor_elements(model: Path) -> int:
    return sum(t.numel() for t in load_file(str(model / "model.safetensors")).values())


@pytest.mark.parametrize("family", sorted(set(_CLASSES) - set(NOT_ROW_FAMILIES)))
def test_shape_counts_every_tensor_transformers_writes(family: str, tmp_path: Path) -> None:
    target = make_family_target(tmp_path / family, family, tokenizer=False)
    cfg = json.loads((target / "config.json").read_text())
    shape = shape_of_config(cfg, str(target))
    assert shape.params == _tensor_elements(target), family
    assert weight_bytes(shape, 4) == 4 * shape.params
    row = BY_NAME[cfg["architectures"][0]]
    if row.attention in ("hybrid-linear", "hybrid-mamba"):  # one attention layer of four: KV for it alone
        assert shape.state_per_sequence > 0 and shape.kv_per_token == 2 * 2 * 16
    else:
        assert shape.state_per_sequence == 0


def test_published_deepseek_v3_is_sized_as_mla_and_moe() -> None:
    cfg = json.loads(DEEPSEEK_V3.read_text())
    shape = shape_of_config(cfg, str(DEEPSEEK_V3))
    assert abs(weight_bytes(shape, 2) - 671e9 * 2) <= 0.05 * 671e9 * 2, shape.params
    assert kv_bytes_per_token(shape, 2) == 61 * (512 + 64) * 2
    # The MTP layer (num_nextn_predict_layers) is not a decoder layer: 61 layers, not 62.
    assert shape.num_hidden_layers == 61 and cfg["num_nextn_predict_layers"] == 1
    # The dense formula it replaces (2 x layers x kv_heads x hidden / heads) was 24.9x too large.
    assert round(2 * 61 * 128 * (7168 // 128) * 2 / kv_bytes_per_token(shape, 2), 1) == 24.9


def test_published_deepseek_v4_flash_is_sized_with_its_compressed_caches() -> None:
    """DeepSeek-V4-Flash (model card: 284B parameters): 43 decoder layers (the 44th compress_ratios entry is the MTP
    layer), 2 sliding-only, 21 CSA, 20 HCA. KV per sequence: every layer's 128-token window of shared K=V (512) plus
    a 512 + 128 entry per 4 tokens on CSA layers and a 512 entry per 128 tokens on HCA layers."""
    cfg = json.loads(DEEPSEEK_V4.read_text())
    shape = shape_of_config(cfg, str(DEEPSEEK_V4))
    assert abs(shape.params - 284e9) <= 0.01 * 284e9, shape.params
    assert shape.num_hidden_layers == 43 and len(cfg["compress_ratios"]) == 44 and cfg["num_nextn_predict_layers"] == 1
    assert sorted(set(shape.compressed)) == [(4, 640), (128, 512)]
    assert (shape.compressed.count((4, 640)), shape.compressed.count((128, 512))) == (21, 20)
    assert shape.kv_per_token == 43 * 512 + 21 * 160 + 20 * 4
    tokens = 1 << 20
    assert shape.kv_elements(tokens) == 43 * 512 * 128 + 21 * 640 * (tokens // 4) + 20 * 512 * (tokens // 128)
    assert kv_bytes_per_token(shape, 2) == 2 * (43 * 512 + 21 * 160 + 20 * 4)
    # its EAGLE-3 head: a Llama layer of its width and vocabulary, the sliding layers' plain RoPE (the published
    # rope_scaling is the compressed layers' YaRN), none of its streams, compressors, experts or MTP layer
    from core.families import eagle3_head_config

    head = eagle3_head_config(cfg)
    assert (head["hidden_size"], head["vocab_size"], head["intermediate_size"], head["head_dim"]) == (
        4096, 129280, 2048, 512)
    assert head["rope_parameters"] == {"rope_type": "default", "rope_theta": 10000} and "rope_scaling" not in head
    assert not {"hc_mult", "compress_ratios", "compress_rope_theta", "o_groups", "index_topk", "n_routed_experts",
                "num_hash_layers", "num_nextn_predict_layers", "qk_rope_head_dim"} & set(head)
    # Engram as TensorRT-LLM builds it: tables of 101 + 103 (2-grams) and 211 + 223 (3-grams) rows of 16 / 2, a 4-tap
    # depthwise convolution over 4 x 4096 channels and its norm, kv_proj 2 x 16 -> 5 x 4096, key and query norms
    engram = {"has_engram": True, "engram_max_ngram_size": 3, "engram_n_embed_per_ngram": 16,
              "engram_n_head_per_ngram": 2, "engram_kernel_size": 4, "engram_vocab_size": [100, 200],
              "engram_layer_ids": [1]}
    assert shape_of_config({**cfg, **engram}, "x").params - shape.params == (
        (101 + 103 + 211 + 223) * 8 + 4 * 4096 * 4 + 4 * 4096 + 32 * 5 * 4096 + 2 * 4 * 4096)
    with pytest.raises(ShapeError, match=r"engram_vocab_size must list 2 sizes \(n-gram orders 2..3\)"):
        shape_of_config({**cfg, **engram, "engram_vocab_size": [100]}, "x")
    del cfg["compress_ratios"]
    with pytest.raises(ShapeError, match=r"DeepseekV4ForCausalLM: missing key\(s\) layer_types \(or compress_ratios\)"):
        shape_of_config(cfg, "x")


def test_a_config_missing_a_key_of_its_kind_is_named(tmp_path: Path, eagle3_head: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    cfg = json.loads(DEEPSEEK_V3.read_text())
    del cfg["kv_lora_rank"]
    with pytest.raises(ShapeError, match=r"x: DeepseekV3ForCausalLM: missing key\(s\) kv_lora_rank"):
        shape_of_config(cfg, "x")
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(cfg))
    assert build.main([str(_cfg(tmp_path, "c", target, eagle3_head, "pytorch")), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "missing key(s) kv_lora_rank: engine.memory_budget_gib cannot be checked against it" in err, err


def _cfg(tmp_path: Path, name: str, target: Path, head: Path, backend: str, **engine: object) -> Path:
    data = {"name": name, "trtllm_version": "1.4", "output_dir": str(tmp_path / name),
            "target": {"model": str(target), "dtype": "float32" if backend == "reference" else "bfloat16"},
            "draft": {"type": "eagle3", "model": str(head)},
            # the PyTorch backend serves chains only for MLA / windowed / compressed / recurrent rows (tested below)
            "tree": {"dynamic": {"top_k": 2, "depth": 3, "total_draft_tokens": 6}} if backend == "reference"
            else {"choices": "chain-3"},
            "engine": {"backend": backend, "max_batch_size": 3, "max_input_len": 32, "max_seq_len": 64, **engine}}
    if backend == "reference":
        data["engine"]["device"] = "cpu"
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_deepseek_v3_target_is_accepted_and_its_kv_sized_as_mla(tmp_path: Path, eagle3_head: Path,
                                                                capsys: pytest.CaptureFixture) -> None:
    target = tmp_path / "DeepSeek-V3"
    target.mkdir()
    (target / "config.json").write_text(DEEPSEEK_V3.read_text())
    # 1,250 GiB of bf16 weights + one 64-token sequence of MLA KV fit 1300 GiB; the refusal names both.
    ok = _cfg(tmp_path, "ok", target, eagle3_head, "pytorch", memory_budget_gib=1300)
    # --dry-run runs the real preflight: this config-only target (no tokenizer) and the tiny head are refused for
    # what they are, but neither the architecture nor the capacity is among the problems
    assert build.main([str(ok), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "no tokenizer.json or tokenizer.model" in err, err
    assert "not in the architecture table" not in err and "GiB" not in err, err
    assert architectures.problems("DeepseekV3ForCausalLM", version="1.4", backend="pytorch", draft_type="eagle3",
                                  where="t") == []
    capsys.readouterr()
    small = _cfg(tmp_path, "small", target, eagle3_head, "pytorch", memory_budget_gib=1000)
    assert build.main([str(small), "--dry-run"]) == 2
    err = capsys.readouterr().err
    weights = weight_bytes(shape_of_config(json.loads(DEEPSEEK_V3.read_text()), "x"), 2) / 2**30
    assert f"weights {weights:,.2f} GiB" in err and f"at {61 * 576 * 2:,} bytes/token" in err, err


def test_deepseek_v4_preflight_names_its_weights_and_cache(tmp_path: Path, eagle3_head: Path,
                                                            capsys: pytest.CaptureFixture) -> None:
    """The published DeepSeek-V4-Flash config on the PyTorch backend: its quantization_config (FP8 128x128 blocks)
    sizes its 530 GiB of bf16-equivalent parameters at about 267 GiB, which with a 64-token sequence's window +
    compressed KV fit 300 GiB (only the config-only target's missing tokenizer is reported); at 200 GiB the refusal
    names the weights and the KV bytes per token. On the reference engine a window shorter than engine.max_seq_len is
    refused by --dry-run, naming both."""
    target = tmp_path / "DeepSeek-V4-Flash"
    target.mkdir()
    (target / "config.json").write_text(DEEPSEEK_V4.read_text())
    assert build.main([str(_cfg(tmp_path, "ok", target, eagle3_head, "pytorch", memory_budget_gib=300)),
                       "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "no tokenizer.json or tokenizer.model" in err and "GiB" not in err and "architecture table" not in err, err
    assert build.main([str(_cfg(tmp_path, "small", target, eagle3_head, "pytorch", memory_budget_gib=200)),
                       "--dry-run"]) == 2
    err = capsys.readouterr().err
    raw = json.loads(DEEPSEEK_V4.read_text())
    shape = shape_of_config(raw, "x")
    assert round(weight_bytes(shape, 2) / 2**30) == 530
    fp8 = quant_weight_bytes(shape.params, vocab=shape.vocab_size, hidden=shape.hidden_size, tied=False,
                             dtype_bytes=2, quant=checkpoint_quant(raw, None, "x"))
    assert 260 < fp8 / 2**30 < 275
    assert f"weights {fp8 / 2**30:,.2f} GiB" in err, err
    assert f"at {2 * (43 * 512 + 21 * 160 + 20 * 4):,} bytes/token" in err, err
    tiny = make_family_target(tmp_path / "tiny", "deepseek_v4", sliding_window=32)
    head = make_mimic_eagle3_head(tmp_path / "head", tiny)
    data = yaml.safe_load(_cfg(tmp_path, "long", tiny, head, "reference").read_text())
    data["tree"] = {"choices": "chain-3"}
    (tmp_path / "long.yaml").write_text(yaml.safe_dump(data))
    assert build.main([str(tmp_path / "long.yaml"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "sliding_window=32 but sequences may reach 64 tokens" in err and "max_seq_len <= 32" in err, err


@pytest.mark.parametrize("family", CHAIN_FAMILIES)
def test_recurrent_rows_build_with_chains_and_serve_like_hf_greedy(family: str, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    """Qwen3-Next / Qwen3.5 / Nemotron-H / DeepSeek-V4: a tree with branches is refused before anything is written (a
    recurrent layer or a compressor reads a forward's tokens in order); a chain builds and serves token-identical to
    HF greedy, rejected drafts leaving no trace in the recurrent or compressed state."""
    target = make_family_target(tmp_path / "target", family, block_scale=0.3, layers=4)
    head = make_mimic_eagle3_head(tmp_path / "head", target)
    assert build.main([str(_cfg(tmp_path, "tree", target, head, "reference")), "--only", "checkpoint"]) == 2
    err = capsys.readouterr().err
    assert "verifies only chain drafts for it; set tree.choices: chain-N" in err and not (tmp_path / "tree").exists()
    cfg = _cfg(tmp_path, "ok", target, head, "reference")
    data = yaml.safe_load(cfg.read_text())
    data["tree"] = {"choices": "chain-3"}
    cfg.write_text(yaml.safe_dump(data))
    _serves_like_hf(target, cfg, tmp_path / "ok", family)


@pytest.mark.parametrize("family", GENERIC_FAMILIES)
def test_generic_rows_build_and_serve_like_hf_greedy(family: str, tmp_path: Path) -> None:
    target = make_family_target(tmp_path / "target", family, block_scale=0.3)
    head = make_mimic_eagle3_head(tmp_path / "head", target)
    _serves_like_hf(target, _cfg(tmp_path, "ok", target, head, "reference"), tmp_path / "ok", family)


def _serves_like_hf(target: Path, cfg: Path, out: Path, family: str) -> None:
    import torch

    from engines.api import ReferenceEngine

    assert build.main([str(cfg), "--only", "checkpoint", "--only", "engine"]) == 0
    ckpt = json.loads((out / "checkpoint" / "config.json").read_text())
    assert ckpt["architecture"] == json.loads((target / "config.json").read_text())["architectures"][0]
    engine = ReferenceEngine.from_build(out, device="cpu")
    res = engine.generate([GenerationRequest(p, NEW, SamplingParams(), []) for p in PROMPTS])
    hf = hf_model(target)  # transformers' own class (Kimi-K2.5: the image-text-to-text wrapper)
    want = [hf.generate(torch.tensor([p]), max_new_tokens=NEW, do_sample=False, eos_token_id=None,
                        pad_token_id=0)[0, len(p):].tolist() for p in PROMPTS]
    assert [r.output_ids for r in res] == want, family
    # Drafts are partly accepted and partly rejected: the caches are rolled back to accepted paths.
    drafted = sum(r.stats.draft_tokens for r in res)
    accepted = sum(r.stats.accepted_draft_tokens for r in res)
    assert 0 < accepted < drafted, (accepted, drafted)


def test_the_guides_regeneration_command_writes_what_is_committed(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/bring-your-own-model.md, 'Adding a family': `python -m ledger.docs` renders the tables
    from the family table; run on copies, it writes exactly the committed files."""
    from ledger import docs as ledger_docs

    doc, guide = tmp_path / "contracts.md", tmp_path / "bring-your-own-model.md"
    doc.write_text("stale\n")
    guide.write_text(ledger_docs.GUIDE.read_text())
    monkeypatch.setattr(ledger_docs, "DOC", doc)
    monkeypatch.setattr(ledger_docs, "GUIDE", guide)
    assert ledger_docs.main(["--check"]) == 1
    assert ledger_docs.main([]) == 0 and ledger_docs.main(["--check"]) == 0
    assert doc.read_text() == (Path(__file__).parents[1] / "docs" / "contracts.md").read_text()
    for f in FAMILIES:
        assert f"| `{f.name}` |" in guide.read_text()


def test_a_registration_that_blocks_eagle_is_refused_with_upstreams_reason() -> None:
    """Subclassing SpecDecOneEngineForCausalLM is not enough: upstream's Kimi-Linear class asserts that only SA or
    DFlash speculation runs on it, so it is not a row, and its refusal says why."""
    from core.family_survey import NOT_EAGLE3

    assert not set(NOT_EAGLE3) & set(BY_NAME)
    [p] = architectures.problems("KimiLinearForCausalLM", version="1.4", backend="pytorch", draft_type="eagle3",
                                 where="t")
    assert "does not run EAGLE-3 there" in p and "only with SA or DFlash" in p and "000a860d" in p
    assert "Not a row: `KimiLinearForCausalLM`" in "\n".join(architectures.markdown())


def test_one_model_classes_that_feed_no_eagle3_head_are_refused_with_where_upstream_captures() -> None:
    """Qwen4-Exp and GLM-5-Next subclass SpecDecOneEngineForCausalLM for their own MTP layers, but their decoder
    layers never write the hidden states an EAGLE-3 head reads (and Qwen4-Exp rolls its side states back only under
    MTP): both are refused as not running EAGLE-3 upstream, each naming the commits read."""
    from core.family_survey import NOT_EAGLE3, NOT_ROWS

    assert {"Qwen4ExpForCausalLM", "Glm5NextForCausalLM"} <= set(NOT_EAGLE3) - set(NOT_ROWS)
    rendered = "\n".join(architectures.markdown())
    for name, commit in (("Qwen4ExpForCausalLM", "306f9922"), ("Glm5NextForCausalLM", "eaf9e324")):
        [p] = architectures.problems(name, version="1.4", backend="pytorch", draft_type="eagle3", where="t")
        assert "does not run EAGLE-3 there" in p and commit in p
        assert "maybe_capture_hidden_states" in p and "eagle3.py at commit f933a608" in p
        assert f"Not a row: `{name}`" in rendered
    [p] = architectures.problems("Qwen4ExpForCausalLM", version="1.4", backend="reference", draft_type="eagle3",
                                 where="t")
    assert "is_mtp_one_model()" in p and "not EAGLE3_ONE_MODEL" in p and "b35ac1b6" in p
    [p] = architectures.problems("Glm5NextForCausalLM", version="1.4", backend="pytorch", draft_type="eagle3",
                                 where="t")
    assert "MTP / MTP_EAGLE_ONE_MODEL" in p


def test_upstream_registrations_that_are_not_rows_are_refused_with_the_reason() -> None:
    """Step-3.5 is one-model upstream but transformers here has no causal LM for it (nothing can prove its sizing or
    serving); MiniMax-M3's class at the commit read is not one-model: both are refused naming the upstream class and
    the reason, and the generated table lists them."""
    from core.family_survey import NOT_ROWS

    assert not set(NOT_ROWS) & set(BY_NAME)
    [p] = architectures.problems("Step3p5ForCausalLM", version="1.4", backend="pytorch", draft_type="eagle3",
                                 where="t")
    assert "Step3p7ForCausalLM(SpecDecOneEngineForCausalLM" in p and "583e8260" in p
    assert "no causal LM for model_type step3p5" in p and "not a row of the architecture table" in p
    [p] = architectures.problems("MiniMaxM3SparseForCausalLM", version="1.4", backend="pytorch", draft_type="eagle3",
                                 where="t")
    assert "not a SpecDecOneEngineForCausalLM" in p and "runs EAGLE-3 one-model only" in p
    rendered = "\n".join(architectures.markdown())
    assert "- Not a row: `Step3p5ForCausalLM`" in rendered and "- Not a row: `MiniMaxM3SparseForCausalLM`" in rendered
    # registrations read as DecoderModelForCausalLM (not one-model) on the current line: EXAONE 4, Gemma 3 / 4, ...
    for name, commit in (("Exaone4ForCausalLM", "fbbc05dd"), ("Gemma3ForCausalLM", "00e7d103"),
                         ("Gemma4ForCausalLM", "00e7d103"), ("MixtralForCausalLM", "000a01de")):
        [p] = architectures.problems(name, version="1.4", backend="pytorch", draft_type="eagle3", where="t")
        assert f"class {name}(DecoderModelForCausalLM[" in p and commit in p and "runs EAGLE-3 one-model only" in p
        assert f"- Not a row: `{name}`" in rendered
    # one-model upstream, but what they compute is not sized or proven here
    [p] = architectures.problems("MistralLarge3ForCausalLM", version="1.4", backend="pytorch", draft_type="eagle3",
                                 where="t")
    assert "MistralLarge3ForCausalLM(DeepseekV3ForCausalLM)" in p and "no model for it" in p


def test_multimodal_wrappers_that_do_not_hand_drafts_to_their_text_model_are_refused() -> None:
    """Qwen3-VL, Qwen2.5-VL, Mistral 3, Gemma 3, LLaVA-NeXT and Nemotron Nano VL wrap a text model whose forward they
    call without the speculative metadata (read at their commits); Kimi-K3 wraps Kimi-Linear, which blocks EAGLE;
    Inkling's class is not one-model; architectures known from upstream's module index only say so. Each is refused
    naming its upstream class, commit and reason, and the generated table lists it."""
    from core.family_survey import NOT_EAGLE3, NOT_ROWS

    rendered = "\n".join(architectures.markdown())
    for name, commit in (("Qwen3VLForConditionalGeneration", "f4faed18"), ("Qwen2_5_VLForConditionalGeneration",
                                                                          "c666e7ea"),
                         ("Mistral3ForConditionalGeneration", "0dcfa87b"), ("Gemma3ForConditionalGeneration",
                                                                           "a98a9061"),
                         ("LlavaNextForConditionalGeneration", "b35ac1b6"), ("NemotronH_Nano_VL_V2", "9ece86aa")):
        [p] = architectures.problems(name, version="1.4", backend="pytorch", draft_type="eagle3", where="t")
        assert commit in p and "self.llm.forward with fixed arguments (no **kwargs, so no spec_metadata)" in p, p
        assert f"- Not a row: `{name}`" in rendered
    [p] = architectures.problems("KimiK3ForConditionalGeneration", version="1.4", backend="pytorch",
                                 draft_type="eagle3", where="t")
    assert "does not run EAGLE-3 there" in p and "KimiLinearForCausalLM" in p and "c02d8ec7" in p
    [p] = architectures.problems("InklingForConditionalGeneration", version="1.4", backend="pytorch",
                                 draft_type="eagle3", where="t")
    assert "InklingForCausalLM(DecoderModelForCausalLM[" in p and "581fc445" in p
    for name in ("Qwen3_5MoeForConditionalGeneration", "Cosmos3ForConditionalGeneration"):
        [p] = architectures.problems(name, version="1.4", backend="pytorch", draft_type="eagle3", where="t")
        assert f"MODEL_ARCH_TO_MODULE['{name}']" in p and "065ff9e9" in p and "not established" in p, p
    [p] = architectures.problems("NemotronHPuzzleForCausalLM", version="1.4", backend="pytorch", draft_type="eagle3",
                                 where="t")
    assert "@register_auto_model('NemotronHPuzzleForCausalLM')" in p and "00620eb0" in p and "heterogeneous" in p, p
    assert not (set(NOT_ROWS) | set(NOT_EAGLE3)) & set(BY_NAME) and not set(NOT_ROWS) & set(NOT_EAGLE3)


def test_kimi_k2_checkpoints_build_for_pytorch_and_are_refused_by_the_reference_engine(
        tmp_path: Path, eagle3_head: Path, capsys: pytest.CaptureFixture) -> None:
    """Kimi-K2 checkpoints name DeepSeek-V3's architecture with model_type kimi_k2 and their own code (auto_map):
    the PyTorch backend's row (DeepseekV3ForCausalLM) sizes and accepts them; the reference engine, which runs
    transformers' own class of the row's model_type and no checkpoint code, refuses them naming the model_type."""
    from core.families import GenericTargetError, check_generic

    cfg = json.loads(DEEPSEEK_V3.read_text()) | {"model_type": "kimi_k2"}
    shape_of_config(cfg, "kimi")  # sized as the row says
    target = tmp_path / "Kimi-K2"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(cfg))
    assert build.main([str(_cfg(tmp_path, "gpu", target, eagle3_head, "pytorch", memory_budget_gib=1300)),
                       "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "no tokenizer.json or tokenizer.model" in err and "model_type" not in err, err
    tiny = make_family_target(tmp_path / "tiny", "deepseek_v3")
    head = make_mimic_eagle3_head(tmp_path / "head", tiny)
    (tiny / "config.json").write_text(json.dumps(json.loads((tiny / "config.json").read_text())
                                                 | {"model_type": "kimi_k2"}))
    assert build.main([str(_cfg(tmp_path, "cpu", tiny, head, "reference")), "--dry-run"]) == 2
    assert "DeepseekV3ForCausalLM with model_type 'kimi_k2'" in capsys.readouterr().err
    with pytest.raises(GenericTargetError, match=r"DeepseekV3ForCausalLM with model_type 'kimi_k2'.*runs no "
                                                 r"checkpoint code. Use engine.backend pytorch"):
        check_generic(cfg, target, max_seq_len=64)


def test_llama4_chunks_shorter_than_the_sequences_are_refused_by_the_build(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture) -> None:
    """Llama 4's chunked attention is not computed as full attention silently: a build whose engine.max_seq_len
    exceeds attention_chunk_size (read from text_config) is refused before anything is written, naming both."""
    target = make_family_target(tmp_path / "target", "llama4", attention_chunk_size=32)
    head = make_mimic_eagle3_head(tmp_path / "head", target)
    assert build.main([str(_cfg(tmp_path, "long", target, head, "reference")), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "attention_chunk_size=32 but sequences may reach 64 tokens" in err and "max_seq_len <= 32" in err, err
    assert build.main([str(_cfg(tmp_path, "short", target, head, "reference", max_input_len=16,
                                max_seq_len=32)), "--dry-run"]) == 0


def test_laguna_windows_shorter_than_the_sequences_are_refused_by_the_build(tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture) -> None:
    """Laguna's sliding-window layers are not computed as full attention silently: a build whose engine.max_seq_len
    exceeds sliding_window is refused by --dry-run, naming both; within the window it is accepted."""
    target = make_family_target(tmp_path / "target", "laguna", sliding_window=32)
    head = make_mimic_eagle3_head(tmp_path / "head", target)
    assert build.main([str(_cfg(tmp_path, "long", target, head, "reference")), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "sliding_window=32 but sequences may reach 64 tokens" in err and "max_seq_len <= 32" in err, err
    assert build.main([str(_cfg(tmp_path, "short", target, head, "reference", max_input_len=16,
                                max_seq_len=32)), "--dry-run"]) == 0


def test_laguna_with_attention_biases_is_refused_by_the_reference_engine(tmp_path: Path) -> None:
    """transformers gives Laguna's o_proj a bias when attention_bias is set; upstream's LagunaAttention has none:
    the reference engine refuses it rather than compute something the served model does not."""
    from core.families import GenericTargetError, check_generic
    from testkit.tiny_families import family_config

    cfg = family_config("laguna", attention_bias=True)
    cfg.update(architectures=["LagunaForCausalLM"], model_type="laguna")
    with pytest.raises(GenericTargetError, match=r"attention_bias true.*dense_bias=False"):
        check_generic(cfg, tmp_path, max_seq_len=64)
    check_generic({**cfg, "attention_bias": False}, tmp_path, max_seq_len=64)


def _kimi_k25_config(vision: dict) -> dict:
    """DeepSeek-V3's published keys as Kimi-K2.5's text_config (model_type kimi_k2, as published) and a MoonViT3d
    vision_config of the sizes TensorRT-LLM's KimiK25VisionModel defaults to (modeling_kimi_k25.py at 010373d3: 27
    layers of 1152, MLP 4304, 14-pixel patches, a 64 x 64 position grid, 2 x 2 merge, text hidden 7168)."""
    text = json.loads(DEEPSEEK_V3.read_text()) | {"model_type": "kimi_k2"}
    return {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25", "text_config": text,
            "vision_config": vision}


def test_kimi_k25_is_sized_as_deepseek_v3_plus_its_vision_encoder(tmp_path: Path, eagle3_head: Path,
                                                                  capsys: pytest.CaptureFixture) -> None:
    """Kimi-K2.5: the text model (text_config) sized as DeepSeek-V3 (MLA KV, every expert), plus the MoonViT3d encoder
    and patch-merger projector TensorRT-LLM loads beside it, read in the published spelling (vt_*, init_pos_emb_*) or
    transformers'; the build's memory check counts both and names the weights when they do not fit."""
    published = {"vt_hidden_size": 1152, "vt_num_hidden_layers": 27, "vt_intermediate_size": 4304,
                 "vt_num_attention_heads": 16, "patch_size": 14, "init_pos_emb_height": 64, "init_pos_emb_width": 64,
                 "init_pos_emb_time": 4, "merge_kernel_size": [2, 2], "mm_hidden_size": 1152, "text_hidden_size": 7168}
    cfg = _kimi_k25_config(published)
    shape = shape_of_config(cfg, "k25")
    text = shape_of_config(json.loads(DEEPSEEK_V3.read_text()), "v3")
    layer = 4 * (1152 * 1152 + 1152) + 2 * 1152 * 4304 + 4304 + 1152 + 4 * 1152
    projector = 2 * 1152 + 4608 * 4608 + 4608 + 4608 * 7168 + 7168
    vision = 3 * 14 * 14 * 1152 + 1152 + 64 * 64 * 1152 + 27 * layer + 2 * 1152 + projector
    assert shape.params == text.params + vision and vision == 471_143_920
    assert kv_bytes_per_token(shape, 2) == 61 * (512 + 64) * 2 and shape.num_hidden_layers == 61
    spelled = {"hidden_size": 1152, "num_hidden_layers": 27, "intermediate_size": 4304, "num_attention_heads": 16,
               "patch_size": 14, "pos_emb_height": 64, "pos_emb_width": 64, "merge_kernel_size": [2, 2]}
    assert shape_of_config(_kimi_k25_config(spelled), "k25").params == shape.params
    with pytest.raises(ShapeError, match=r"KimiK25ForConditionalGeneration: vision_config: missing key "
                                         r"vt_num_hidden_layers \(or num_hidden_layers\)"):
        shape_of_config(_kimi_k25_config({k: v for k, v in published.items() if k != "vt_num_hidden_layers"}), "k")
    target = tmp_path / "Kimi-K2.5"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(cfg))
    assert build.main([str(_cfg(tmp_path, "ok", target, eagle3_head, "pytorch", memory_budget_gib=1300)),
                       "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "no tokenizer.json or tokenizer.model" in err and "not in the architecture table" not in err, err
    assert "GiB" not in err, err
    assert build.main([str(_cfg(tmp_path, "small", target, eagle3_head, "pytorch", memory_budget_gib=1000)),
                       "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"weights {weight_bytes(shape, 2) / 2**30:,.2f} GiB" in err and f"at {61 * 576 * 2:,} bytes/token" in err
