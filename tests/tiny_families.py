"""Tiny random targets of the families beyond Llama, written by transformers' own classes (so the weights, names and
config keys are exactly what `from_pretrained` reads), with the shared test tokenizer (tests/tiny_models.py).

`make_family_target(dir, family, **options)`: family is one of FAMILIES; every parameter is drawn from a seeded
normal (biases and q/k norm weights included, so a missing bias or norm changes the logits). Options cover what the
families ship: GQA, tied or untied embeddings, a head_dim independent of hidden_size / heads, rope_theta 1e6, YaRN
or linear RoPE scaling, sliding windows, and for MoE the expert counts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from tests.tiny_models import HIDDEN, INTER, VOCAB, make_tokenizer

FAMILIES = ("qwen3", "qwen2", "mistral", "qwen3_moe")

_CLASSES = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
}

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}
LINEAR = {"rope_type": "linear", "factor": 2.0}


def family_config(family: str, *, tie: bool = False, head_dim: int | None = None, heads: int = 4, kv_heads: int = 2,
                  layers: int = 2, rope_theta: float = 1e6, rope_scaling: dict | None = None,
                  sliding_window: int | None = None, **extra: Any) -> dict[str, Any]:
    """The config.json keys of a tiny `family` model (transformers-4 spelling: rope_theta / rope_scaling)."""
    cfg: dict[str, Any] = {
        "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": INTER, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim or HIDDEN // heads,
        "hidden_act": "silu", "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": rope_theta,
        "tie_word_embeddings": tie, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
    }
    if rope_scaling is not None:
        cfg["rope_scaling"] = dict(rope_scaling)
    if family in ("qwen2", "qwen3", "qwen3_moe"):
        cfg.update(use_sliding_window=sliding_window is not None, sliding_window=sliding_window,
                   max_window_layers=0 if sliding_window is not None else layers)
    if family == "mistral":
        cfg["sliding_window"] = sliding_window
    if family == "qwen3_moe":
        cfg.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=1,
                   norm_topk_prob=True, mlp_only_layers=[])
    cfg.update(extra)
    return cfg


def _model(family: str, cfg: dict[str, Any]) -> Any:
    import transformers

    conf_cls, model_cls = (getattr(transformers, n) for n in _CLASSES[family])
    conf = conf_cls(**cfg)
    torch.manual_seed(0)
    return model_cls(conf)


def _randomize(model: torch.nn.Module, seed: int) -> None:
    """Every parameter redrawn: norms around 1, embeddings ~N(0, 1), the rest ~N(0, 0.08)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "norm" in name:
                p.copy_(1.0 + 0.1 * noise)
            elif "embed_tokens" in name:
                p.copy_(noise)
            elif "lm_head" in name:
                p.copy_(0.5 * noise)
            else:
                p.copy_(0.08 * noise)


def make_family_target(out: Path, family: str, *, seed: int = 0, tokenizer: bool = True, **options: Any) -> Path:
    """A random tiny `family` model saved by transformers (float32 safetensors), with generation_config.json and the
    test tokenizer. Same arguments, same bytes."""
    if family not in FAMILIES:
        raise ValueError(f"family {family!r}: one of {', '.join(FAMILIES)}")
    out.mkdir(parents=True, exist_ok=True)
    model = _model(family, family_config(family, **options))
    _randomize(model, seed)
    model.to(torch.float32).save_pretrained(out, safe_serialization=True)
    _transformers4_keys(out / "config.json", options.get("rope_theta", 1e6), options.get("rope_scaling"))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": [2, 0]}))
    if tokenizer:
        make_tokenizer(out)
    return out


def _transformers4_keys(path: Path, theta: float, scaling: dict | None) -> None:
    """transformers 5 saves rope_parameters only; published checkpoints (and TensorRT-LLM's transformers 4) carry
    rope_theta / rope_scaling at the top level: write both, as a checkpoint converted back would."""
    cfg = json.loads(path.read_text())
    cfg["rope_theta"] = theta
    if scaling is not None:
        cfg["rope_scaling"] = dict(scaling)
    path.write_text(json.dumps(cfg, indent=2))
