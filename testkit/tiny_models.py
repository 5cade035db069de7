"""Tiny random models written to disk in the real formats, shared by all tests.

- `make_tokenizer(dir)`: a byte-level BPE tokenizer (vocab 320) trained in-process on a fixed text, with a chat
  template and eos/bos tokens, saved as a Hugging Face tokenizer (tokenizer.json + tokenizer_config.json).
- `make_target(dir, ...)`: a 2-layer GQA Llama (HF `LlamaForCausalLM`, safetensors), tied or untied embeddings,
  optional llama3 rope scaling, with the tokenizer.
- `make_eagle_head(dir, target_dir, bias=...)`: an EAGLE-1/2 head in the SafeAILab layout.
- `make_eagle3_head(dir, target_dir, draft_vocab=...)`: an EAGLE-3 head with d2t/t2d.

Everything is seeded: the same call writes the same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

VOCAB = 320
HIDDEN = 64
INTER = 128
HEADS = 4
KV_HEADS = 2
LAYERS = 2

_CORPUS = (
    "The quick brown fox jumps over the lazy dog. EAGLE drafts tokens from the target's features and the target "
    "verifies the whole tree in one pass. Speculative decoding keeps the output identical. Hello world! "
    "What is the capital of France? Paris is the capital of France. 0123456789 user assistant system "
)
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_tokenizer(out: Path, vocab_size: int = VOCAB) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return out


def llama_config(
    *,
    tie: bool = False,
    rope_scaling: dict | None = None,
    vocab: int = VOCAB,
    layers: int = LAYERS,
    heads: int = HEADS,
    kv_heads: int = KV_HEADS,
) -> dict:
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": HIDDEN // heads,
        "hidden_act": "silu",
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": tie,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
    }
    if rope_scaling is not None:
        cfg["rope_scaling"] = rope_scaling
    return cfg


LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def _randn(g: torch.Generator, *shape: int, scale: float = 0.08) -> torch.Tensor:
    return torch.randn(*shape, generator=g) * scale


def _norm(g: torch.Generator, n: int) -> torch.Tensor:
    return 1.0 + 0.1 * torch.randn(n, generator=g)


def _decoder_layer(g: torch.Generator, prefix: str, cfg: dict, *, input_norm: bool, qkv_in: int | None = None) -> dict:
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    hd = cfg["head_dim"]
    qkv_in = qkv_in or h
    t = {
        f"{prefix}.self_attn.q_proj.weight": _randn(g, cfg["num_attention_heads"] * hd, qkv_in),
        f"{prefix}.self_attn.k_proj.weight": _randn(g, cfg["num_key_value_heads"] * hd, qkv_in),
        f"{prefix}.self_attn.v_proj.weight": _randn(g, cfg["num_key_value_heads"] * hd, qkv_in),
        f"{prefix}.self_attn.o_proj.weight": _randn(g, h, cfg["num_attention_heads"] * hd),
        f"{prefix}.mlp.gate_proj.weight": _randn(g, inter, h),
        f"{prefix}.mlp.up_proj.weight": _randn(g, inter, h),
        f"{prefix}.mlp.down_proj.weight": _randn(g, h, inter),
        f"{prefix}.post_attention_layernorm.weight": _norm(g, h),
    }
    if input_norm:
        t[f"{prefix}.input_layernorm.weight"] = _norm(g, h)
    return t


def make_target(
    out: Path,
    *,
    tie: bool = False,
    rope_scaling: dict | None = None,
    seed: int = 0,
    tokenizer: bool = True,
    layers: int = LAYERS,
    heads: int = HEADS,
    kv_heads: int = KV_HEADS,
) -> Path:
    """A random 2-layer GQA Llama in HF layout (float32 safetensors)."""
    out.mkdir(parents=True, exist_ok=True)
    cfg = llama_config(tie=tie, rope_scaling=rope_scaling, layers=layers, heads=heads, kv_heads=kv_heads)
    g = torch.Generator().manual_seed(seed)
    t: dict[str, torch.Tensor] = {"model.embed_tokens.weight": _randn(g, VOCAB, HIDDEN, scale=1.0)}
    for i in range(layers):
        t.update(_decoder_layer(g, f"model.layers.{i}", cfg, input_norm=True))
    t["model.norm.weight"] = _norm(g, HIDDEN)
    if not tie:
        t["lm_head.weight"] = _randn(g, VOCAB, HIDDEN, scale=0.5)
    save_file(t, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    if tokenizer:
        make_tokenizer(out)
    return out


def make_eagle_head(
    out: Path, target_dir: Path, *, bias: bool = True, seed: int = 1, declare_bias: bool | None = None
) -> Path:
    """EAGLE-1/2 head (SafeAILab layout). `declare_bias` writes config "bias" (None = omit the key)."""
    out.mkdir(parents=True, exist_ok=True)
    tcfg = json.loads((target_dir / "config.json").read_text())
    cfg = dict(tcfg, num_hidden_layers=1)
    if declare_bias is not None:
        cfg["bias"] = declare_bias
    g = torch.Generator().manual_seed(seed)
    h = tcfg["hidden_size"]
    t = _decoder_layer(g, "layers.0", cfg, input_norm=False)
    t["fc.weight"] = _randn(g, h, 2 * h)
    if bias:
        t["fc.bias"] = _randn(g, h, scale=0.01)
    # SafeAILab heads carry a frozen copy of the target embedding.
    from safetensors import safe_open

    with safe_open(str(target_dir / "model.safetensors"), "pt") as f:
        t["embed_tokens.weight"] = f.get_tensor("model.embed_tokens.weight").clone()
    save_file(t, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


def make_eagle3_head(out: Path, target_dir: Path, *, draft_vocab: int = 96, seed: int = 2) -> Path:
    """EAGLE-3 head: fc over 3 fused target layers, midlayer with 2H-input attention, reduced vocab via d2t/t2d."""
    out.mkdir(parents=True, exist_ok=True)
    tcfg = json.loads((target_dir / "config.json").read_text())
    h, vocab, n_layers = tcfg["hidden_size"], tcfg["vocab_size"], tcfg["num_hidden_layers"]
    g = torch.Generator().manual_seed(seed)
    cfg = dict(
        tcfg,
        architectures=["LlamaForCausalLMEagle3"],
        num_hidden_layers=1,
        draft_vocab_size=draft_vocab,
        target_hidden_size=h,
        eagle_aux_hidden_state_layer_ids=[min(2, n_layers - 1), n_layers // 2, max(n_layers - 3, 0)],
    )
    t = _decoder_layer(g, "midlayer", cfg, input_norm=True, qkv_in=2 * h)
    t["midlayer.hidden_norm.weight"] = _norm(g, h)
    t["norm.weight"] = _norm(g, h)
    t["fc.weight"] = _randn(g, h, 3 * h)
    t["lm_head.weight"] = _randn(g, draft_vocab, h, scale=0.5)
    # Draft vocab = a fixed subset of target ids; d2t holds offsets target_id - draft_id (ascending ids).
    ids = torch.sort(torch.randperm(vocab, generator=g)[:draft_vocab]).values
    t["d2t"] = ids - torch.arange(draft_vocab)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    t["t2d"] = t2d
    save_file(t, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


def mimic_pair(out: Path, *, vocab: int, seed: int, block_scale: float) -> tuple[Path, Path]:
    """A target that is close to a bigram model and an EAGLE-1 head constructed to predict that bigram.

    Target: a tiny random Llama whose attention/MLP outputs are scaled by `block_scale` and whose final norm weight is
    1, so its next token is mostly argmax(lm_head(norm(embed(x)))) but not always. Head: fc = [I, 0] (passes the
    token embedding through), attention and MLP outputs zeroed, so it drafts exactly argmax(lm_head(embed(x))):
    acceptance is high but not perfect, which exercises accepted paths, rejections and bonus tokens."""
    cfg = llama_config(vocab=vocab)
    g = torch.Generator().manual_seed(seed)
    h = cfg["hidden_size"]
    t = {"model.embed_tokens.weight": torch.randn(vocab, h, generator=g)}
    for i in range(cfg["num_hidden_layers"]):
        t.update(_decoder_layer(g, f"model.layers.{i}", cfg, input_norm=True))
    for k in list(t):
        if k.endswith(("o_proj.weight", "down_proj.weight")):
            t[k] = t[k] * block_scale
    t["model.norm.weight"] = torch.ones(h)
    t["lm_head.weight"] = torch.randn(vocab, h, generator=g) * 0.5
    target = out / "target"
    target.mkdir(parents=True, exist_ok=True)
    save_file(t, str(target / "model.safetensors"), metadata={"format": "pt"})
    (target / "config.json").write_text(json.dumps(cfg, indent=2))
    (target / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    make_tokenizer(target)  # the converter copies it; its ids need not cover a small model vocabulary
    hd = {k: v for k, v in _decoder_layer(g, "layers.0", cfg, input_norm=False).items()}
    for k in list(hd):
        if k.endswith(("o_proj.weight", "down_proj.weight")):
            hd[k] = torch.zeros_like(hd[k])
    hd["fc.weight"] = torch.cat([torch.eye(h), torch.zeros(h, h)], 1)
    hd["fc.bias"] = torch.zeros(h)
    hd["embed_tokens.weight"] = t["model.embed_tokens.weight"].clone()
    head = out / "head"
    head.mkdir(parents=True, exist_ok=True)
    save_file(hd, str(head / "model.safetensors"), metadata={"format": "pt"})
    (head / "config.json").write_text(json.dumps(dict(cfg, num_hidden_layers=1), indent=2))
    return target, head


def make_llmapi_pair(tmp: Path) -> tuple[Path, Path]:
    """A 4-layer target and an EAGLE-3 head capturing its layers 1, 2, 3 (three distinct layers: the LLM API's set),
    the pair the current line's llmapi model serves in tests."""
    target = make_target(tmp / "target", layers=4)
    head = make_eagle3_head(tmp / "eagle3", target)
    cfg = json.loads((head / "config.json").read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = [1, 2, 3]
    (head / "config.json").write_text(json.dumps(cfg))
    return target, head
