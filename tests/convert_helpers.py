"""Test helpers for the converters: read checkpoints back and invert the documented TRT-LLM transforms."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def hf_tensors(d: Path) -> dict[str, torch.Tensor]:
    return load_file(str(d / "model.safetensors"))


def ckpt(d: Path) -> tuple[dict, list[dict[str, torch.Tensor]]]:
    cfg = json.loads((d / "config.json").read_text())
    world = cfg["mapping"]["world_size"]
    return cfg, [load_file(str(d / f"rank{r}.safetensors")) for r in range(world)]


def unfuse_qkv(qkv: torch.Tensor, heads: int, kv_heads: int, head_dim: int, tp: int) -> tuple:
    """Split one rank's fused [q_r; k_r; v_r] back into its parts (kv heads per rank = max(1, kv/tp))."""
    q_rows = heads // tp * head_dim
    kv_rows = max(1, kv_heads // tp) * head_dim
    return qkv[:q_rows], qkv[q_rows:q_rows + kv_rows], qkv[q_rows + kv_rows:]


def reassemble_layer(ranks: list[dict], pre: str, heads: int, kv_heads: int, head_dim: int) -> dict[str, torch.Tensor]:
    """TP shards of one TRT-LLM decoder layer -> HF-named tensors (K/V de-duplicated when kv_heads < tp)."""
    tp = len(ranks)
    parts = [unfuse_qkv(r[f"{pre}.attention.qkv.weight"], heads, kv_heads, head_dim, tp) for r in ranks]
    reps = max(1, tp // kv_heads)
    k = torch.cat([p[1] for p in parts][::reps])
    v = torch.cat([p[2] for p in parts][::reps])
    for i, p in enumerate(parts):  # duplicated heads must be identical copies
        assert torch.equal(p[1], parts[i - i % reps][1]) and torch.equal(p[2], parts[i - i % reps][2])
    return {
        "self_attn.q_proj.weight": torch.cat([p[0] for p in parts]),
        "self_attn.k_proj.weight": k,
        "self_attn.v_proj.weight": v,
        "self_attn.o_proj.weight": torch.cat([r[f"{pre}.attention.dense.weight"] for r in ranks], 1),
        "mlp.gate_proj.weight": torch.cat([r[f"{pre}.mlp.fc.weight"] for r in ranks]),
        "mlp.up_proj.weight": torch.cat([r[f"{pre}.mlp.gate.weight"] for r in ranks]),
        "mlp.down_proj.weight": torch.cat([r[f"{pre}.mlp.proj.weight"] for r in ranks], 1),
        "post_attention_layernorm.weight": ranks[0][f"{pre}.post_layernorm.weight"],
    }


def derive_target(src: Path, dst: Path, *, vocab: int | None = None, layers_from: Path | None = None) -> Path:
    """Copy a tiny target, optionally truncating its vocabulary (to exercise lm_head padding)."""
    shutil.copytree(src, dst)
    if vocab is not None:
        t = hf_tensors(dst)
        for k in ("model.embed_tokens.weight", "lm_head.weight"):
            if k in t:
                t[k] = t[k][:vocab].contiguous()
        save_file(t, str(dst / "model.safetensors"), metadata={"format": "pt"})
        cfg = json.loads((dst / "config.json").read_text())
        cfg["vocab_size"] = vocab
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def truncate(path: Path, drop: int = 100) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:-drop])
