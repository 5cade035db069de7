"""Draft heads this toolkit refuses by their kind, before their tensors are read (torch-free: the converter's
preflight and the doctor ask the same question).

MLA EAGLE-3 heads: NVIDIA's and ModelOpt's EAGLE-3 heads for DeepSeek-V3 / Kimi-K2 are one DeepSeek-V3 decoder layer
(multi-head latent attention: `kv_lora_rank`, `q_lora_rank`, `qk_rope_head_dim`), published with
`architectures: [Eagle3DeepseekV2ForCausalLM]` (vLLM's name, vllm/model_executor/models/deepseek_eagle3.py).
TensorRT-LLM's EAGLE-3 drafter is Llama-shaped; loading MLA drafts is NVIDIA/TensorRT-LLM PR #15426, open when this
was written, and this toolkit's converter and reference engine compute Llama-shaped heads only.
"""

from __future__ import annotations

from typing import Any

MLA_HEAD_ARCHITECTURES = ("Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM")
MLA_KEYS = ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim")
PR_MLA_DRAFT = "NVIDIA/TensorRT-LLM PR #15426"


def mla_head_problem(cfg: dict[str, Any], where: str) -> str | None:
    """Why an EAGLE-3 head config that is an MLA draft is refused (None for any other head)."""
    layer = cfg.get("transformer_layer_config")  # a speculators head keeps its decoder layer's keys there
    keys = {**(layer if isinstance(layer, dict) else {}), **cfg}
    arch = [a for a in (keys.get("architectures") or []) if a in MLA_HEAD_ARCHITECTURES]
    mla = [f"{k}={keys[k]}" for k in MLA_KEYS if keys.get(k)]
    if not arch and not mla:
        return None
    what = ", ".join(([f"architectures {arch[0]}"] if arch else []) + mla)
    return (f"{where}: an MLA EAGLE-3 draft head ({what}): TensorRT-LLM loads Llama-shaped EAGLE-3 drafters only "
            f"(MLA drafts are {PR_MLA_DRAFT}, not merged), and this toolkit's converter and reference engine compute "
            "Llama-shaped heads only; use a Llama-shaped EAGLE-3 head for this target (LlamaForCausalLMEagle3, e.g. "
            "trained with `eagle-train`, docs/train-a-head.md)")
