"""EAGLE-1/2 head (SafeAILab layout) + Llama target -> TensorRT-LLM `EagleForCausalLM` checkpoint.

Upstream references: tensorrt_llm/models/eagle/config.py (EagleConfig: num_eagle_layers, max_draft_len,
max_non_leaves_per_layer, eagle_net_config), tensorrt_llm/models/eagle/model.py (EagleNet = LLaMAModel drafter with
fc_after_embed, no input_layernorm in layer 0, no final norm, its own lm_head; eagle_net_config.mapping is reset to
tp_size = world_size), tensorrt_llm/models/eagle/weight.py `load_eagle_hf` (the tensor names below; fc and fc.bias
split on dim 0; every eagle_nets.{k} holds the same head weights; lm_head is a copy of the TARGET's lm_head).

Per TP rank r, for k in 0..num_eagle_layers-1:
  eagle_nets.k.drafter.vocab_embedding.weight   head embed_tokens (SafeAILab heads carry the target's), replicated
  eagle_nets.k.drafter.fc.weight / .fc.bias     head fc (2H -> H), rows split; zero bias when the head has none
  eagle_nets.k.drafter.layers.j.*               head decoder layer j, same transforms as the target's layers;
                                                input_layernorm only for j > 0
                                                (use_input_layernorm_in_first_layer=False)
  eagle_nets.k.lm_head.weight                   the target's lm_head (padded to a multiple of tp, rows split)

LLaMA3 heads are trained with `"bias": false` and have no fc.bias; upstream then fails with KeyError 'fc.bias'
(TensorRT-LLM issue 2588). The model computes fc(x) + 0 in that case, so a zero bias is exact.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from builders.convert.llama import (
    OutTensor,
    Provenance,
    check_parallel,
    copy_tensor,
    decoder_layer_plan,
    dtype_of,
    even_range,
    llama_config_json,
    lm_head_tensor,
    mapping_json,
    split_tensor,
    target_rank_plan,
    write_json,
    zeros_tensor,
)
from builders.convert.shapes import eagle_head_shapes, shape_problems, target_shapes
from builders.convert.tokenizer import copy_tokenizer
from builders.convert.weights import WeightSource, write_safetensors
from core.hfconfig import LlamaSpec, ModelConfigError, llama_spec, read_config


def head_bias(head_dir: Path, src: WeightSource) -> bool:
    """Whether the head's fc has a bias tensor; a config `bias` that contradicts the weights is an error.

    SafeAILab EAGLE builds `fc = nn.Linear(2H, H, bias=config.get("bias", True))` (eagle/model/cnets.py): an
    absent key means a bias IS expected.
    """
    cfg = read_config(head_dir)
    declared = cfg.get("bias", True)
    if not isinstance(declared, bool):
        raise ModelConfigError(f"{head_dir / 'config.json'}: \"bias\" must be true or false, got {declared!r}")
    present = "fc.bias" in src
    if declared and not present:
        raise ModelConfigError(
            f"{head_dir}: config.json declares \"bias\": true (or omits it; EAGLE's default is true) but the weights "
            "have no fc.bias; set \"bias\": false in the head's config.json if the head was trained without it"
        )
    if present and not declared:
        raise ModelConfigError(
            f"{head_dir}: config.json declares \"bias\": false but the weights contain fc.bias; fix the config"
        )
    return present


def check_head(head: LlamaSpec, target: LlamaSpec, src: WeightSource) -> list[str]:
    """Shape problems between an EAGLE-1 head and its target (before anything is written)."""
    p = []
    d = src.dir
    if head.hidden_size != target.hidden_size:
        p.append(f"draft.model {d}: hidden_size={head.hidden_size} but the target's is {target.hidden_size}; "
                 "this head was trained for another target")
    if head.vocab_size != target.vocab_size:
        p.append(f"draft.model {d}: vocab_size={head.vocab_size} but the target's is {target.vocab_size}; "
                 "the head and the target must share the tokenizer")
    if "fc.weight" not in src:
        p.append(f"draft.model {d}: no fc.weight; not an EAGLE-1/2 head (EAGLE-3 heads need draft.type=eagle3)")
        return p
    required, optional = eagle_head_shapes(head, target)
    p += shape_problems(src, required, "draft.model", optional)
    return p


def eagle_net_config(head: LlamaSpec, target: LlamaSpec, *, dtype: str, tp: int) -> dict[str, Any]:
    """`eagle_net_config`: the drafter's Llama config (rope and vocab from the target, as upstream)."""
    cfg = llama_config_json(head, dtype=dtype, tp=tp, pp=1, architecture="LlamaForCausalLM")
    cfg.update(
        vocab_size=target.vocab_size,
        rotary_base=target.rope_theta,
        rotary_scaling=target.rope_scaling,
        head_dim=head.head_dim,
        mapping=mapping_json(tp, 1),
    )
    return cfg


def drafter_plan(
    head_src: WeightSource, tgt_src: WeightSource, head: LlamaSpec, target: LlamaSpec, *,
    k: int, dt: torch.dtype, tp: int, r: int, bias: bool,
) -> list[OutTensor]:
    pre = f"eagle_nets.{k}"
    emb = (
        ("embed_tokens.weight", head_src)
        if "embed_tokens.weight" in head_src
        else ("model.embed_tokens.weight", tgt_src)
    )
    fa, fb = even_range(head.hidden_size, tp, r, "head hidden_size")
    plan = [
        copy_tensor(emb[1], emb[0], f"{pre}.drafter.vocab_embedding.weight", dt),
        split_tensor(head_src, "fc.weight", f"{pre}.drafter.fc.weight", dt, 0, fa, fb),
        split_tensor(head_src, "fc.bias", f"{pre}.drafter.fc.bias", dt, 0, fa, fb)
        if bias
        else zeros_tensor(f"{pre}.drafter.fc.bias", (fb - fa,), dt),
    ]
    for j in range(head.num_hidden_layers):
        plan += decoder_layer_plan(
            head_src, f"layers.{j}", f"{pre}.drafter.layers.{j}", head, dt, tp, r, input_norm=j > 0
        )
    plan.append(lm_head_tensor(tgt_src, target, f"{pre}.lm_head.weight", dt, tp, r))
    return plan


def convert_eagle(
    hf_dir: Path, head_dir: Path, out_dir: Path, *, dtype: str, max_draft_len: int, num_eagle_layers: int,
    max_non_leaves_per_layer: int, tp: int = 1, provenance: Provenance | None = None,
) -> None:
    """Target + EAGLE-1/2 head -> EagleForCausalLM checkpoint in `out_dir` (+ tokenizer/)."""
    hf_dir, head_dir, out_dir = Path(hf_dir), Path(head_dir), Path(out_dir)
    target = llama_spec(hf_dir)
    head = llama_spec(head_dir, require_arch=False)
    dt = dtype_of(dtype)
    with WeightSource(hf_dir) as tgt_src, WeightSource(head_dir) as head_src:
        problems = check_parallel(target, tp, 1) + check_parallel(head, tp, 1) + check_head(head, target, head_src)
        problems += shape_problems(tgt_src, target_shapes(target), "target.model")
        if problems:
            raise ModelConfigError("; ".join(problems))
        bias = head_bias(head_dir, head_src)
        out_dir.mkdir(parents=True, exist_ok=True)
        for r in range(tp):
            plan = target_rank_plan(tgt_src, target, dt, tp, 1, r, 0)
            for k in range(num_eagle_layers):
                plan += drafter_plan(head_src, tgt_src, head, target, k=k, dt=dt, tp=tp, r=r, bias=bias)
            write_safetensors(out_dir / f"rank{r}.safetensors", plan, desc=f"eagle rank{r}")
    cfg = llama_config_json(target, dtype=dtype, tp=tp, pp=1, architecture="EagleForCausalLM")
    cfg.update(
        num_eagle_layers=num_eagle_layers,
        max_draft_len=max_draft_len,
        max_non_leaves_per_layer=max_non_leaves_per_layer,
        eagle_net_config=eagle_net_config(head, target, dtype=dtype, tp=tp),
    )
    prov = provenance or Provenance(random_head=False, target_source=str(hf_dir), head_source=str(head_dir))
    cfg["eagle_deploy"] = prov.to_json()
    write_json(out_dir / "config.json", cfg)
    copy_tokenizer(hf_dir, out_dir)
