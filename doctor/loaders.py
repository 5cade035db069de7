"""Where a head loads as it is: each engine's loader, the fields it reads (cited), and what goes wrong silently.

Each rule below restates what the cited loader does with a field; `problems(head, target, engine)` lists what goes
wrong when that engine loads this head unchanged (empty = it loads as it is). Sources (read for this module):

- eagle-repo: SafeAILab/EAGLE@cb7e0841fe0c206c6ed74a197ad5e2a1f13f5a2b
    eagle/model/ea_model.py `EaModel.__init__`: `bias` from config.json (default True); EAGLE-3 d2t/t2d deleted when
      vocab_size == draft_vocab_size; `load_state_dict(..., strict=False)` (unknown or missing tensors are silent);
      `EaModel.from_pretrained`: pytorch_model.bin, else model.safetensors (one file).
    eagle/model/cnets.py `Model.__init__` (EAGLE-3): embed_tokens loaded from the TARGET only when the config has no
      `target_hidden_size` (else the head's `embed_tokens.weight`, random when absent); fc [3 * target_hidden_size or
      3 * hidden_size -> hidden_size] with bias=False; `LlamaAttention._init_rope`: `rope_theta` top-level attribute
      (absent: 10000), `rope_scaling["type"]` linear / dynamic only.
    eagle/model/modeling_llama_kv.py `LlamaModel.forward`: captures the inputs of layers 2, L//2, L-3 (hard-coded;
      no config field is read).
    eagle/model/cnets1.py `Model` (EAGLE-1/2): fc bias from `bias`, embed_tokens from the target.
- trtllm-1.4 (PyTorch backend; 1.1/1.2 read the same fields, ledger/checkpoint.py EAGLE3_HEAD):
  NVIDIA/TensorRT-LLM@00679c66c3e38f6d2651ad0a5bef0f94d862e36c tensorrt_llm/_torch/models/modeling_speculative.py
    `Eagle3DraftModel.__init__`: `target_hidden_size` (else hidden_size), fc bias = config `bias` (default False),
      `d2t` parameter only when draft_vocab_size != vocab_size, embed_tokens its own only when target_hidden_size !=
      hidden_size (else shared with the target); `Eagle3ForCausalLM.load_weights`: `layers.0.*` remapped to
      `midlayer.*`, lm_head from the target when the head has none. The captured layers come from the LLM API's
      `eagle3_layers_to_capture` (output-indexed), not from the head's config.
- vllm: vllm-project/vllm@00bd1493b3e82d6c13c68ee8a0e1c5a96707e190 vllm/model_executor/models/llama_eagle3.py
    `LlamaModel.__init__` (fc input 3 * target_hidden_size, bias=False), `Eagle3LlamaForCausalLM.load_weights`
    (`midlayer.` -> `layers.0.`; `d2t` -> draft_id_to_target_id, zeros when absent; embed_tokens skipped when
    absent: the target's is used; t2d ignored).
- sglang: sgl-project/sglang@03d5a7771f6082e7737a5f19cae7d1e863087013 python/sglang/srt/models/llama_eagle3.py
    `LlamaForCausalLMEagle3.__init__` (tie_word_embeddings true: lm_head = embed_tokens; draft_vocab_size None: the
    target's lm_head) and `.load_weights` (d2t -> hot_token_id; names that match no parameter are skipped silently,
    so `layers.0.*` tensors never reach `midlayer`).
- speculators: the `speculators` 0.9.0 package, speculators/models/eagle3/core.py `Eagle3DraftModel` (fc
  [n_aux * hidden_size -> hidden_size], bias=False; embed_tokens / d2t / t2d may be missing) and config.py
  `Eagle3SpeculatorConfig` (speculators_model_type, transformer_layer_config, draft_vocab_size, target_hidden_size,
  eagle_aux_hidden_state_layer_ids).
- reference: this project's engine (engines/checkpoint.py `load_eagle3` after builders/convert/eagle3.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from core.hfconfig import LlamaSpec

if TYPE_CHECKING:
    from doctor.head import Head  # loads torch; annotations only, so `eagle-doctor --help` answers at once

ENGINES = ("reference", "trtllm-1.1", "trtllm-1.2", "trtllm-1.4", "vllm", "sglang", "eagle-repo")
TRTLLM = ("trtllm-1.1", "trtllm-1.2", "trtllm-1.4")

SOURCES = {
    "eagle-repo": "SafeAILab/EAGLE@cb7e0841fe0c206c6ed74a197ad5e2a1f13f5a2b eagle/model/ea_model.py EaModel, "
                  "eagle/model/cnets.py Model, eagle/model/modeling_llama_kv.py LlamaModel.forward",
    "trtllm": "NVIDIA/TensorRT-LLM@00679c66c3e38f6d2651ad0a5bef0f94d862e36c "
              "tensorrt_llm/_torch/models/modeling_speculative.py Eagle3DraftModel / Eagle3ForCausalLM",
    "vllm": "vllm-project/vllm@00bd1493b3e82d6c13c68ee8a0e1c5a96707e190 vllm/model_executor/models/llama_eagle3.py "
            "Eagle3LlamaForCausalLM.load_weights",
    "sglang": "sgl-project/sglang@03d5a7771f6082e7737a5f19cae7d1e863087013 python/sglang/srt/models/llama_eagle3.py "
              "LlamaForCausalLMEagle3",
    "speculators": "speculators 0.9.0 speculators/models/eagle3/core.py Eagle3DraftModel",
}


def safeailab_default_ids(layers: int) -> list[int]:
    return [2, layers // 2, layers - 3]


def _reduced(head: Head, target: LlamaSpec) -> bool:
    dv = head.draft_vocab
    return dv is not None and dv != target.vocab_size


def _switches(head: Head, supported: tuple[str, ...]) -> list[str]:
    prefixes = supported + tuple(f"eagle_config.{k}" for k in supported)
    off = [s for s in head.switches if not s.startswith(prefixes)]
    msg = f"architecture switch(es) {', '.join(off)} not implemented by this loader: it runs the plain EAGLE-3 network"
    return [msg] if off else []


def _eagle_repo(head: Head, target: LlamaSpec) -> list[str]:
    p: list[str] = _switches(head, ())
    s = SOURCES["eagle-repo"]
    if head.layout == "speculators":
        p.append("a speculators config (nested transformer_layer_config) is not an EConfig; export --to eagle-repo")
    if head.mid != "midlayer":
        p.append("tensors are named layers.0.*; EaModel loads with strict=False, so the midlayer stays random "
                 "(rename to midlayer.*: export --to eagle-repo)")
    if "target_hidden_size" in head.cfg and "embed_tokens.weight" not in head.shapes:
        p.append("config sets target_hidden_size and the head ships no embed_tokens.weight: cnets.py Model then "
                 "loads no embedding and drafts from a RANDOM one (ship embed_tokens.weight or drop "
                 "target_hidden_size: export --to eagle-repo)")
    ids = head.layer_ids
    if ids is not None and ids != safeailab_default_ids(target.num_hidden_layers):
        p.append(f"captures layers {safeailab_default_ids(target.num_hidden_layers)} (hard-coded in "
                 f"modeling_llama_kv.py) but the head was trained on {ids}")
    if "rope_theta" not in head.cfg and head.rope_theta != 10000.0:
        p.append(f"no top-level rope_theta: the head runs with RoPE base 10000 instead of {head.rope_theta:g}")
    scaling = head.cfg.get("rope_scaling")
    if isinstance(scaling, dict) and scaling.get("type") not in ("linear", "dynamic"):
        p.append(f"rope_scaling type {scaling.get('type', scaling.get('rope_type'))!r}: cnets.py accepts only "
                 "linear / dynamic (ValueError at load)")
    if "fc.bias" in head.shapes:
        p.append("fc.bias is dropped (the EAGLE-3 fc has bias=False)")
    if _reduced(head, target) and "d2t" not in head.shapes:
        p.append("no d2t: the buffer stays zeros, so draft id i is read as target id i")
    return [f"{m} [{s}]" for m in p]


def _trtllm(head: Head, target: LlamaSpec) -> list[str]:
    # Eagle3DraftModel.__init__ reads eagle_config (eh_proj_before_attn, norm_before_fc, return_hidden_post_norm)
    # and the top-level fc_norm / norm_output
    p: list[str] = _switches(head, ("eh_proj_before_attn", "norm_before_fc", "return_hidden_post_norm", "fc_norm",
                                    "norm_output"))
    th = int(head.cfg.get("target_hidden_size", head.cfg.get("hidden_size", 0)))
    if head.layout == "speculators":
        p.append("speculators config: the PyTorch backend reads a flat Llama config; export --to trtllm")
    if th != int(head.cfg.get("hidden_size", 0)) and "embed_tokens.weight" not in head.shapes:
        p.append("target_hidden_size != hidden_size makes the head own its embedding, but it ships none")
    if _reduced(head, target) and "d2t" not in head.shapes:
        p.append("draft_vocab_size != vocab_size but no d2t: the d2t parameter stays uninitialized")
    if "draft_vocab_size" not in head.cfg:
        p.append("no draft_vocab_size in the config (upstream falls back to vocab_size)")
    if "fc.bias" in head.shapes and head.cfg.get("bias") is not True:
        p.append("fc.bias present but config bias is not true: the fc is built without a bias")
    if "rope_theta" not in head.cfg and head.rope_theta != 10000.0:
        p.append("only rope_parameters holds the RoPE base; transformers-4 readers (1.1 / 1.2) take 10000")
    return [f"{m} [{SOURCES['trtllm']}]" for m in p]


def _vllm(head: Head, target: LlamaSpec) -> list[str]:
    # LlamaDecoderLayer reads norm_before_residual; LlamaModel reads eagle_config.use_aux_hidden_state
    p: list[str] = _switches(head, ("norm_before_residual", "use_aux_hidden_state"))
    if head.layout == "speculators":
        return [f"{m} [{SOURCES['vllm']}]" for m in p]  # vLLM reads speculators configs natively
    if _reduced(head, target) and "d2t" not in head.shapes:
        p.append("no d2t: draft_id_to_target_id stays zeros (draft id i read as target id i)")
    if "fc.bias" in head.shapes:
        p.append("fc.bias present but the fc has bias=False (unexpected tensor)")
    return [f"{m} [{SOURCES['vllm']}]" for m in p]


def _sglang(head: Head, target: LlamaSpec) -> list[str]:
    p: list[str] = []
    if head.mid != "midlayer":
        p.append("layers.0.* tensors match no parameter and are skipped silently: the midlayer stays random")
    if head.cfg.get("tie_word_embeddings"):
        p.append("tie_word_embeddings is true: the embedding is used as the lm_head instead of the head's lm_head")
    if _reduced(head, target) and "d2t" not in head.shapes:
        p.append("no d2t: hot_token_id is unset, draft ids are read as target ids")
    if head.layout == "speculators":
        p.append("speculators config: SGLang reads a flat Llama config; export --to specforge")
    return [f"{m} [{SOURCES['sglang']}]" for m in p]


def _reference(head: Head, target: LlamaSpec) -> list[str]:
    if head.switches:
        return _switches(head, ())
    # A speculators head needs nothing here: the build's convert stage reads it through its flat view
    # (builders/convert/head_layout.py), like every other layout the doctor reads.
    if head.kind.eagle3 and head.layer_ids is None:
        return ["no captured layer ids: set draft.eagle3.layers_to_capture in the build config"]
    return []


def _eagle1(head: Head, target: LlamaSpec, engine: str) -> list[str]:
    """EAGLE-1/2 heads (SafeAILab layout): what differs between the loaders we read."""
    if engine == "trtllm-1.4":
        return ["EAGLE-1/2 runs on the TensorRT engine flow (1.1 / 1.2 here); 1.4 serves EAGLE-3 heads"]
    if engine in ("vllm", "sglang"):
        return [f"EAGLE-1/2 loader of {engine} not verified by this tool"]
    if engine == "eagle-repo" and "fc.bias" not in head.shapes and head.cfg.get("bias", True) is not False:
        msg = ("no fc.bias but config bias is true or absent (EaModel default True): load_state_dict(strict=False) "
               f"leaves a random bias; set \"bias\": false [{SOURCES['eagle-repo']}]")
        return [msg]
    return []


RULES: dict[str, Callable[[Head, LlamaSpec], list[str]]] = {
    "reference": _reference, "vllm": _vllm, "sglang": _sglang, "eagle-repo": _eagle_repo,
    **{t: _trtllm for t in TRTLLM},
}


def problems(head: Head, target: LlamaSpec, engine: str) -> list[str]:
    if not head.kind.eagle3:
        return _eagle1(head, target, engine)
    return RULES[engine](head, target)


def compatibility(head: Head, target: LlamaSpec) -> dict[str, list[str]]:
    return {e: problems(head, target, e) for e in ENGINES}
