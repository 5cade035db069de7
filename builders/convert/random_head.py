"""A randomly initialized EAGLE-1 head of the target's shape, in the SafeAILab layout (config.json +
model.safetensors), for pipelines run before a trained head exists. It is labelled RANDOM: config.json carries
`"eagle_deploy_random_head": true`; the checkpoint's `eagle_deploy.random_head`, the manifest notes and the stage log
say so too. Its drafts are noise: acceptance is ~0, so speed-ups measured with it mean nothing.

Init follows HF Llama `_init_weights`: linear weights ~ N(0, initializer_range), norms = 1, fc.bias = 0; the
embedding is the target's (SafeAILab heads carry a frozen copy of it).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from builders.convert.llama import write_json
from builders.convert.weights import OutTensor, WeightSource, write_safetensors
from core.hfconfig import llama_spec

RANDOM_LABEL = "RANDOM"


def write_random_head(hf_dir: Path, out_dir: Path, seed: int) -> None:
    hf_dir, out_dir = Path(hf_dir), Path(out_dir)
    spec = llama_spec(hf_dir)
    h, inter = spec.hidden_size, spec.intermediate_size
    std = float(spec.raw.get("initializer_range", 0.02))  # HF LlamaConfig default 0.02
    gen = torch.Generator().manual_seed(seed)

    def normal(shape: tuple[int, ...]) -> Callable[[], torch.Tensor]:
        # One shared generator: values depend on the plan order, which is fixed, so a seed gives the same bytes.
        return lambda: torch.randn(*shape, generator=gen) * std

    shapes = {
        "layers.0.self_attn.q_proj.weight": (spec.q_size, h),
        "layers.0.self_attn.k_proj.weight": (spec.kv_size, h),
        "layers.0.self_attn.v_proj.weight": (spec.kv_size, h),
        "layers.0.self_attn.o_proj.weight": (h, spec.q_size),
        "layers.0.mlp.gate_proj.weight": (inter, h),
        "layers.0.mlp.up_proj.weight": (inter, h),
        "layers.0.mlp.down_proj.weight": (h, inter),
        "fc.weight": (h, 2 * h),
    }
    plan = [OutTensor(n, s, torch.float32, normal(s)) for n, s in shapes.items()]
    plan.append(OutTensor("layers.0.post_attention_layernorm.weight", (h,), torch.float32, lambda: torch.ones(h)))
    plan.append(OutTensor("fc.bias", (h,), torch.float32, lambda: torch.zeros(h)))
    out_dir.mkdir(parents=True, exist_ok=True)
    with WeightSource(hf_dir) as src:
        emb = src.info("model.embed_tokens.weight")
        plan.append(OutTensor("embed_tokens.weight", emb.shape, torch.float32,
                              lambda: src.read("model.embed_tokens.weight").to(torch.float32)))
        write_safetensors(out_dir / "model.safetensors", plan, desc="random head",
                          metadata={"format": "pt", "eagle_deploy": RANDOM_LABEL})
    cfg = dict(
        spec.raw,
        num_hidden_layers=1,
        bias=True,
        architectures=["LlamaForCausalLM"],
        eagle_deploy_random_head=True,
        eagle_deploy_label=f"{RANDOM_LABEL} EAGLE-1 head (seed {seed}); acceptance ~0",
    )
    cfg.pop("eagle_deploy_source", None)
    write_json(out_dir / "config.json", cfg)
