"""Serving targets beyond Llama: stop tokens from generation_config.json, the chat template's thinking switch in the
clients, and (server) a tiny Qwen3 target with an EAGLE-3 head trained by training/train_head.py, built for the
current line on the reference backend, served by the llmapi model on the real CPU Triton server, answering exactly
what transformers' greedy `generate` answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clients import generate
from core.stops import StopTokenError, generation_eos_ids, stop_token_ids
from testkit.tiny_families import GENERIC_FAMILIES, RECURRENT_FAMILIES, hf_model, make_family_target


@pytest.fixture(scope="module")
def qwen3_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_family_target(tmp_path_factory.mktemp("q3") / "target", "qwen3", layers=4, block_scale=0.3)


def test_stop_tokens_are_the_tokenizers_eos_and_generation_configs(qwen3_target: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(qwen3_target))
    assert tok.eos_token_id == 2 and json.loads((qwen3_target / "generation_config.json").read_text())[
        "eos_token_id"] == [2, 0]
    assert stop_token_ids(tok) == [2, 0]
    for value, want in ((7, [7]), ([7, 8], [7, 8]), (None, [])):
        d = tmp_path / f"g{want}"
        d.mkdir()
        (d / "generation_config.json").write_text(json.dumps({"eos_token_id": value}))
        assert generation_eos_ids(d) == want
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "generation_config.json").write_text(json.dumps({"eos_token_id": "<|im_end|>"}))
    with pytest.raises(StopTokenError, match="eos_token_id='<|im_end|>' must be an int or a list of ints"):
        generation_eos_ids(tmp_path / "bad")
    assert generation_eos_ids(tmp_path / "none") == []


def test_chat_thinking_switch(qwen3_target: Path, tiny_target: Path, capsys: pytest.CaptureFixture) -> None:
    off = generate.chat_prompt(str(qwen3_target), "Hi", "off")
    on = generate.chat_prompt(str(qwen3_target), "Hi", "on")
    default = generate.chat_prompt(str(qwen3_target), "Hi")
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") and "<think>" not in on and on == default
    with pytest.raises(ValueError, match="has no `enable_thinking` switch"):
        generate.chat_prompt(str(tiny_target), "Hi", "off")
    assert generate.main(["--prompt", "Hi", "--thinking", "off", "--url", "127.0.0.1:1"]) == 2
    assert "--thinking switches the chat template's reasoning: add --chat" in capsys.readouterr().err


# ---- a trained head, built for the current line, on the real CPU Triton server ----------------------------------

PROMPTS = ("Hello world!", "What is the capital of France?")
N = 16


def _train_head(target: Path, root: Path) -> Path:
    import yaml

    from training import train_head
    from tests.test_train_eagle3 import tiny_cfg3

    cfg = tiny_cfg3(root, target, epochs=1)
    f = root / "train.yaml"
    f.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    assert train_head.main([str(f)]) == 0
    return Path(cfg.output_dir)


def _build(target: Path, head: Path, out: Path, version: str, tree: dict) -> Path:
    import yaml

    from builders import build

    data = {"name": "family", "trtllm_version": version, "output_dir": str(out),
            "target": {"model": str(target), "dtype": "float32"}, "draft": {"type": "eagle3", "model": str(head)},
            "tree": tree, "triton": {"streaming": True},
            "engine": {"backend": "reference", "device": "cpu", "max_batch_size": 2, "max_input_len": 64,
                       "max_seq_len": 96}}
    (out.parent / f"{out.name}.yaml").write_text(yaml.safe_dump(data))
    assert build.main([str(out.parent / f"{out.name}.yaml")]) == 0
    return out


def _hf_answers(target: Path, prompts: list[str]) -> list[str]:
    """transformers' greedy generate on the served prompt tokens (stops as generation_config.json says)."""
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(target))
    model = hf_model(target)  # transformers' own class (Kimi-K2.5: the image-text-to-text wrapper)
    out = []
    for p in prompts:
        ids = tok.encode(p)
        gen = model.generate(torch.tensor([ids]), max_new_tokens=N, do_sample=False, pad_token_id=0)
        out.append(tok.decode(gen[0, len(ids):], skip_special_tokens=True))
    return out


@pytest.mark.server
def test_trained_qwen3_head_served_by_llmapi_answers_what_hf_generate_does(qwen3_target: Path, tmp_path: Path) -> None:
    import yaml

    from clients import schema as sch
    from clients.client import LLMClient
    from triton_repo.launch import TritonServer, free_port

    head = _train_head(qwen3_target, tmp_path)
    build = _build(qwen3_target, head, tmp_path / "build", "1.4", {"dynamic": {"top_k": 2, "depth": 3,
                                                                               "total_draft_tokens": 6}})
    doc = yaml.safe_load((build / "triton_repo" / "tensorrt_llm" / "1" / "model.yaml").read_text())
    spec = doc["speculative_config"]
    assert spec["decoding_type"] == "Eagle3" and "eagle3_one_model" not in spec
    assert json.loads((build / "checkpoint" / "config.json").read_text())["architecture"] == "Qwen3ForCausalLM"
    prompts = [generate.chat_prompt(str(qwen3_target), p, "off") for p in PROMPTS]
    want = _hf_answers(qwen3_target, prompts)
    srv = TritonServer(build / "triton_repo", grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(),
                       log_path=tmp_path / "tritonserver.log")
    srv.start(timeout_s=300)
    try:
        schema = sch.from_repository(build / "triton_repo")
        with LLMClient(srv.grpc_url, schema=schema) as c:
            got = [c.generate(p, max_tokens=N).text for p in prompts]
            streamed = "".join(ch.text for ch in c.stream(prompts[1], max_tokens=N))
            stats = c.last_stats
    finally:
        srv.stop()
    assert got == want and streamed == want[1] and all(want)
    assert stats.draft_tokens > 0


@pytest.mark.parametrize("family", ["qwen2", "mistral"])
def test_two_model_families_build_for_the_older_lines(family: str, tmp_path: Path) -> None:
    """Qwen2 / Mistral with an EAGLE-3 head: TensorRT-LLM serves them two-model on 1.1 / 1.2 (the architecture
    table), so they build for 1.2 (eagle3_one_model false in the LLM API options of engine.backend pytorch) and the
    reference engine of that build decodes them losslessly."""
    from engines.api import GenerationRequest, ReferenceEngine, SamplingParams
    from testkit.tiny_families import make_mimic_eagle3_head

    opts = {"sliding_window": 96} if family == "mistral" else {"tie": True}
    target = make_family_target(tmp_path / "target", family, block_scale=0.3, **opts)
    head = make_mimic_eagle3_head(tmp_path / "head", target)
    build = _build(target, head, tmp_path / "build", "1.2", {"choices": [[0], [1], [0, 0], [0, 1], [0, 0, 0]]})
    engine = ReferenceEngine.from_build(build, device="cpu")
    prompts = [engine.tokenizer.encode(p) for p in PROMPTS]
    want = _hf_answers(target, PROMPTS)
    reqs = [GenerationRequest(p, N, SamplingParams(), stop_token_ids(engine.tokenizer)) for p in prompts]
    res = engine.generate(reqs)
    assert [engine.tokenizer.decode(r.output_ids, skip_special_tokens=True) for r in res] == want
    assert sum(r.stats.accepted_draft_tokens for r in res) > 0


@pytest.mark.parametrize("family", ["qwen2", "mistral", "qwen3_moe", "gpt_oss", *GENERIC_FAMILIES,
                                    *RECURRENT_FAMILIES, "deepseek_v4"])
def test_trainer_heads_for_other_families_load_as_published_heads(family: str, tmp_path: Path) -> None:
    """training/train_head.py on a Qwen2 / Mistral / Qwen3-MoE / gpt-oss target: the head's config is the published
    layout (Llama keys, model_type llama, none of the target's stack or expert keys), which transformers loads as a
    1-layer LlamaConfig."""
    from transformers import AutoConfig

    target = make_family_target(tmp_path / "target", family, layers=4)
    head = _train_head(target, tmp_path)
    cfg = json.loads((head / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert not {"layer_types", "max_window_layers", "num_experts", "num_local_experts", "n_routed_experts",
                "kv_lora_rank", "num_nextn_predict_layers", "partial_rotary_factor", "first_k_dense_replace"} & set(cfg)
    assert cfg["hidden_act"] == "silu"
    assert cfg["num_hidden_layers"] == 1
    loaded = AutoConfig.from_pretrained(str(head))
    assert type(loaded).__name__ == "LlamaConfig" and loaded.num_hidden_layers == 1
    if family == "deepseek_v4":  # a Llama layer of the target's width: none of its streams, compressors or MTP
        t = json.loads((target / "config.json").read_text())
        assert not {"hc_mult", "compress_rates", "o_groups", "index_topk", "mlp_layer_types"} & set(cfg)
        assert (cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]) == (
            t["hidden_size"], t["vocab_size"], t["moe_intermediate_size"])
        assert cfg["rope_parameters"] == {"rope_type": "default", "rope_theta": 1e4}
        assert max(cfg["eagle_aux_hidden_state_layer_ids"]) <= t["num_hidden_layers"] == 4


@pytest.mark.server
@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3", "qwen3_next", "llama4", "deepseek_v32", "laguna",
                                    "glm_moe_dsa", "kimi_k25", "deepseek_v4"])
def test_moe_target_on_the_generic_path_served_by_llmapi(family: str, tmp_path: Path) -> None:
    """A Qwen3-MoE, DeepSeek-V3 (MLA), DeepSeek-V3.2 (MLA + sparse-attention indexer), Qwen3-Next (gated delta-net,
    chain drafts), Llama 4 (text_config + vision tower, interleaved MoE, chunked / NoPE layers), Laguna (per-layer
    heads, gated attention, RoPE per layer type), GLM-5 (DeepSeek-V3.2's indexer, layers sharing a selection),
    Kimi-K2.5 (DeepSeek-V3 text model of an image-text-to-text wrapper) or DeepSeek-V4 (hyper-connections,
    compressed attention, chain drafts) target
    (transformers' own model class in the reference engine) with an EAGLE-3 head trained by training/train_head.py,
    built for the current line and served by the llmapi model on the real Triton server: the answers are HF
    generate's."""
    from clients import schema as sch
    from clients.client import LLMClient
    from triton_repo.launch import TritonServer, free_port

    target = make_family_target(tmp_path / "target", family, layers=4, block_scale=0.3)
    head = _train_head(target, tmp_path)
    tree = {"choices": "chain-3"} if family in ("qwen3_next", "deepseek_v4") else {"dynamic": {"top_k": 2, "depth": 3,
                                                                               "total_draft_tokens": 6}}
    build = _build(target, head, tmp_path / "build", "1.4", tree)
    want = _hf_answers(target, list(PROMPTS))
    srv = TritonServer(build / "triton_repo", grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(),
                       log_path=tmp_path / "tritonserver.log")
    srv.start(timeout_s=300)
    try:
        with LLMClient(srv.grpc_url, schema=sch.from_repository(build / "triton_repo")) as c:
            got = [c.generate(p, max_tokens=N).text for p in PROMPTS]
            stats = c.last_stats
    finally:
        srv.stop()
    assert got == want and all(want)
    assert stats.draft_tokens > 0


@pytest.mark.parametrize(("family", "vocab"), [("deepseek_v3", 129280), ("glm_moe_dsa", 154880)])
def test_large_vocabulary_and_mtp_layer(family: str, vocab: int, tmp_path: Path) -> None:
    """A DeepSeek-V3-shaped target with DeepSeek's 129,280-token vocabulary, or a GLM-5-shaped one with 154,880
    tokens, and an MTP layer in its checkpoint (`num_nextn_predict_layers: 1`, the layer's tensors after the decoder
    layers, as published): the trainer maps a 32-token draft vocabulary into the full one (d2t), captures decoder
    layers only, and the built target serves HF greedy's tokens; the MTP tensors are not a decoder layer anywhere."""
    import torch
    from safetensors.torch import load_file, save_file


    target = make_family_target(tmp_path / "target", family, layers=4, block_scale=0.3, vocab_size=vocab,
                                num_nextn_predict_layers=1)
    weights = load_file(str(target / "model.safetensors"))
    tcfg = json.loads((target / "config.json").read_text())
    h = tcfg["hidden_size"]
    assert tcfg["num_hidden_layers"] == 4 and tcfg["num_nextn_predict_layers"] == 1
    weights |= {"model.layers.4.eh_proj.weight": torch.zeros(h, 2 * h), "model.layers.4.enorm.weight": torch.ones(h),
                "model.layers.4.hnorm.weight": torch.ones(h)}  # the MTP layer's own tensors (DeepSeek-V3's layout)
    save_file(weights, str(target / "model.safetensors"), metadata={"format": "pt"})
    head = _train_head(target, tmp_path)
    cfg = json.loads((head / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 32 and cfg["vocab_size"] == vocab
    assert max(cfg["eagle_aux_hidden_state_layer_ids"]) < 4 and "num_nextn_predict_layers" not in cfg
    d2t = load_file(str(head / "model.safetensors"))["d2t"]
    assert d2t.shape == (32,) and int((torch.arange(32) + d2t).max()) < vocab
    build = _build(target, head, tmp_path / "build", "1.4", {"dynamic": {"top_k": 2, "depth": 3,
                                                                         "total_draft_tokens": 6}})
    _assert_build_decodes_hf_greedy(build, target)


def test_deepseek_v4_vocabulary_and_mtp_layer(tmp_path: Path) -> None:
    """A DeepSeek-V4-shaped target with DeepSeek's 129,280-token vocabulary, an MTP layer in its checkpoint (`mtp.0.*`
    tensors, as published, which transformers skips) and compress_ratios listing that layer after the decoder layers:
    the trainer maps a 32-token draft vocabulary into the full one, captures decoder layers only (the MoE outputs,
    hidden_size wide), and the built target serves HF greedy's tokens with chain drafts."""
    import torch
    from safetensors.torch import load_file, save_file


    target = make_family_target(tmp_path / "target", "deepseek_v4", layers=4, block_scale=0.3, vocab_size=129280)
    cfg = json.loads((target / "config.json").read_text())
    h = cfg["hidden_size"]
    weights = load_file(str(target / "model.safetensors"))
    weights |= {"mtp.0.e_proj.weight": torch.zeros(h, h), "mtp.0.h_proj.weight": torch.zeros(h, h),
                "mtp.0.enorm.weight": torch.ones(h), "mtp.0.hnorm.weight": torch.ones(h)}  # the MTP layer's own
    save_file(weights, str(target / "model.safetensors"), metadata={"format": "pt"})
    (target / "config.json").write_text(json.dumps({**cfg, "compress_ratios": [0, 4, 128, 0, 0]}))
    head = _train_head(target, tmp_path)
    hcfg = json.loads((head / "config.json").read_text())
    assert hcfg["draft_vocab_size"] == 32 and hcfg["vocab_size"] == 129280 and hcfg["hidden_size"] == h
    assert max(hcfg["eagle_aux_hidden_state_layer_ids"]) < 4 and "num_nextn_predict_layers" not in hcfg
    assert "compress_ratios" not in hcfg and "hc_mult" not in hcfg
    build = _build(target, head, tmp_path / "build", "1.4", {"choices": "chain-3"})
    _assert_build_decodes_hf_greedy(build, target)


def _assert_build_decodes_hf_greedy(build: Path, target: Path) -> None:
    """The build's reference engine decodes two prompts (12 tokens, EAGLE on) to transformers' greedy tokens."""
    import torch
    from transformers import AutoModelForCausalLM

    from core.types import GenerationRequest, SamplingParams
    from engines.api import ReferenceEngine

    prompts = [[5, 17, 33, 42, 9], [11, 12, 13, 14, 15, 16, 100, 7]]
    res = ReferenceEngine.from_build(build, device="cpu").generate(
        [GenerationRequest(p, 12, SamplingParams(), []) for p in prompts])
    hf = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32)
    want = [hf.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                        pad_token_id=0)[0, len(p):].tolist() for p in prompts]
    assert [r.output_ids for r in res] == want
