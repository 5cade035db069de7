"""The vision encoders and projectors that multimodal rows of the family table load beside their text model, sized
from config.json's `vision_config` (torch-free; core/shapes.py adds them to the text model's parameters).

Kimi-K2.5 (`KimiK25ForConditionalGeneration`): TensorRT-LLM's KimiK25VisionModel (tensorrt_llm/_torch/models/
modeling_kimi_k25.py at commit 010373d3b4e9165d22f253d981df48484877336f) builds, from vision_config:
- PatchEmbed3d: a Conv2d(3, hidden, patch_size) with bias and a learnable (pos_emb_height, pos_emb_width, hidden)
  position grid (the temporal sin-cos table is a buffer, not a weight);
- MoonViT3dEncoder: per layer two LayerNorms, q/k/v/o projections with biases (dense_bias), an MLP hidden ->
  intermediate -> hidden with biases; a final LayerNorm;
- PatchMergerMLP: a LayerNorm over hidden (mm_hidden_size, which the merge reshape makes equal to hidden), then
  Linear(m, m) and Linear(m, text hidden) with biases, m = hidden x merge_kernel_size[0] x merge_kernel_size[1].
It reads the published checkpoints' spelling first (vt_hidden_size, vt_num_hidden_layers, vt_intermediate_size,
init_pos_emb_height / width) and transformers' (hidden_size, num_hidden_layers, intermediate_size, pos_emb_height /
width, as transformers' Kimi_K25VisionConfig writes them) where those are absent; so does this.
"""

from __future__ import annotations

from typing import Any


class VisionShapeError(ValueError):
    """A vision_config that lacks a key the encoder's size depends on; the message names it."""


def _key(cfg: dict[str, Any], published: str, transformers: str) -> int:
    value = cfg.get(published, cfg.get(transformers))
    if value is None:
        raise VisionShapeError(f"vision_config: missing key {published} (or {transformers})")
    return int(value)


def kimi_k25_vision(vision: dict[str, Any], text_hidden: int) -> int:
    """Parameters of Kimi-K2.5's MoonViT3d encoder and patch-merger projector."""
    vh = _key(vision, "vt_hidden_size", "hidden_size")
    layers = _key(vision, "vt_num_hidden_layers", "num_hidden_layers")
    inter = _key(vision, "vt_intermediate_size", "intermediate_size")
    pos = _key(vision, "init_pos_emb_height", "pos_emb_height") * _key(vision, "init_pos_emb_width", "pos_emb_width")
    patch = _key(vision, "patch_size", "patch_size")
    kernel = vision.get("merge_kernel_size")
    if not isinstance(kernel, list | tuple) or len(kernel) != 2:
        raise VisionShapeError(f"vision_config: merge_kernel_size {kernel!r} must be [height, width]")
    p = 3 * patch * patch * vh + vh + pos * vh  # patch embedding (bias) and the position grid
    p += layers * (4 * (vh * vh + vh) + 2 * vh * inter + inter + vh + 4 * vh)  # attention, MLP, two LayerNorms
    p += 2 * vh  # final LayerNorm
    merged = vh * int(kernel[0]) * int(kernel[1])
    return p + 2 * vh + merged * merged + merged + merged * text_hidden + text_hidden  # projector
