"""EAGLE-3 head -> a validated, normalized directory `<out>/eagle3/` (+ the target checkpoint in `<out>/`).

TensorRT-LLM runs EAGLE-3 only on its PyTorch backend, loading the head as `speculative_model` from an HF-style
directory (tensorrt_llm/_torch/models/modeling_speculative.py, Eagle3ForCausalLM / Eagle3DraftModel):
  - tensors `midlayer.*` (or `layers.0.*`, remapped upstream), `fc.weight` [H, n_capture * target_hidden_size]
    (`fc.bias` only when config `bias` is true; upstream's default is false), `norm.weight`, `lm_head.weight`
    [draft_vocab, H] (else the target's is used), `d2t` [draft_vocab] (a parameter only when draft_vocab_size !=
    vocab_size), `embed_tokens.weight` only when target_hidden_size != hidden_size; extra tensors such as `t2d` are
    ignored;
  - config keys `draft_vocab_size` (upstream warns and falls back to vocab_size when absent), `target_hidden_size`
    (else hidden_size), `bias`, the Llama keys (heads, rms_norm_eps, rope).
We write all of these explicitly, plus `eagle_aux_hidden_state_layer_ids`: the target layers whose INPUT hidden
states the head fuses (SafeAILab / vLLM convention: id j = output of layer j-1, 0 = the embeddings).
TRT-LLM's `eagle3_layers_to_capture` counts layer OUTPUTS instead (tensorrt_llm/_torch/speculative/eagle3.py:
default (1, L//2-1, L-4) == SafeAILab's (2, L//2, L-3); -1 = embeddings), so we also record
`eagle_deploy.trtllm_layers_to_capture` = ids - 1 for the LLM API config.
d2t holds offsets: target_id = draft_id + d2t[draft_id]; t2d[target_id] is true for ids in the draft vocabulary.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import torch

from builders.convert.hf_compat import transformers4_config
from builders.convert.llama import Provenance, check_parallel, convert_llama, dtype_of, write_json
from builders.convert.shapes import eagle3_head_shapes, shape_problems
from builders.convert.weights import OutTensor, WeightSource, write_safetensors
from builders.convert.families import generic_checkpoint
from builders.convert.tokenizer import copy_tokenizer
from builders.layout import EAGLE3_HEAD
from core.hfconfig import LlamaSpec, ModelConfigError, aux_layer_ids, llama_spec, read_config
from core.families import NATIVE, eagle3_head_config

EAGLE3_DIR = EAGLE3_HEAD
INT_TENSORS = ("d2t", "t2d")  # index tensors: never cast to the float dtype


def _midlayer_prefix(src: WeightSource) -> str:
    if "midlayer.self_attn.q_proj.weight" in src:
        return "midlayer"
    if "layers.0.self_attn.q_proj.weight" in src:
        return "layers.0"
    raise ModelConfigError(f"draft.model {src.dir}: no midlayer.* (or layers.0.*) tensors; not an EAGLE-3 head")


def resolve_layer_ids(head_cfg: dict[str, Any], override: list[int] | None, head_dir: Path) -> list[int]:
    """The captured layer ids: draft.eagle3.layers_to_capture, else the head's config; both present must agree."""
    from_head = aux_layer_ids(head_cfg, head_dir / "config.json")
    if override is not None and from_head is not None and list(from_head) != list(override):
        raise ModelConfigError(
            f"draft.eagle3.layers_to_capture={override} disagrees with eagle_aux_hidden_state_layer_ids={from_head} "
            f"in {head_dir / 'config.json'}; remove draft.eagle3.layers_to_capture to use the head's"
        )
    ids = override if override is not None else from_head
    if ids is None:
        raise ModelConfigError(
            f"{head_dir / 'config.json'} has no eagle_aux_hidden_state_layer_ids; set draft.eagle3.layers_to_capture "
            "to the target layers the head was trained on (SafeAILab default for L layers: [2, L//2, L-3])"
        )
    return [int(i) for i in ids]


def check_eagle3(head_dir: Path, target: LlamaSpec, layer_ids: list[int], src: WeightSource) -> list[str]:
    """Problems between an EAGLE-3 head and its target (before anything is written)."""
    cfg = read_config(head_dir)
    p: list[str] = []
    d = f"draft.model {head_dir}"
    try:
        head = llama_spec(head_dir, require_arch=False)
    except ModelConfigError as e:
        return [str(e)]
    extra = [k for k in ("fc_norm", "norm_output") if cfg.get(k)]
    if extra:  # SpecForge's "eagle3.1" layout (configs/qwen3-30B-A3B-eagle3.1.json): norms this converter drops
        p.append(f"{d}: {', '.join(f'{k}=true' for k in extra)}: a head with extra norms (SpecForge's EAGLE-3.1 "
                 "layout) is not computed by this toolkit's converter or reference engine; use a plain EAGLE-3 head")
    th = int(cfg.get("target_hidden_size", head.hidden_size))  # upstream default: hidden_size
    if th != target.hidden_size:
        p.append(f"{d}: target_hidden_size={th} but the target's hidden_size is {target.hidden_size}")
    if head.vocab_size != target.vocab_size:
        p.append(f"{d}: vocab_size={head.vocab_size} but the target's is {target.vocab_size}; tokenizers differ")
    bad = [i for i in layer_ids if not 0 <= i < target.num_hidden_layers]
    if bad:
        p.append(f"{d}: captured layer ids {bad} are outside 0..{target.num_hidden_layers - 1} (the target's layers)")
    try:
        prefix = _midlayer_prefix(src)
    except ModelConfigError as e:
        return p + [str(e)]
    if "fc.weight" not in src:
        p.append(f"{d}: no fc.weight")
    elif src.info("fc.weight").shape != (head.hidden_size, len(layer_ids) * th):
        p.append(f"{d}: fc.weight has shape {src.info('fc.weight').shape}, expected ({head.hidden_size}, "
                 f"{len(layer_ids) * th}) for {len(layer_ids)} captured layers of width {th}")
    draft_vocab = cfg.get("draft_vocab_size")
    rows = src.info("lm_head.weight").shape[0] if "lm_head.weight" in src else None
    required, optional = eagle3_head_shapes(head, target, prefix, len(layer_ids), th,
                                            draft_vocab if isinstance(draft_vocab, int) else rows)
    required.pop("fc.weight")  # checked above, with the captured layers named
    p += shape_problems(src, required, "draft.model", optional)
    if "lm_head.weight" in src:
        lm_rows = src.info("lm_head.weight").shape[0]
        if draft_vocab is not None and lm_rows != draft_vocab:
            p.append(f"{d}: lm_head.weight has {lm_rows} rows but draft_vocab_size={draft_vocab}")
        draft_vocab = lm_rows
    if draft_vocab is None:
        p.append(f"{d}: no lm_head.weight and no draft_vocab_size; cannot tell the draft vocabulary")
        return p
    if draft_vocab != target.vocab_size:
        if "d2t" not in src or src.info("d2t").shape != (draft_vocab,):
            p.append(
                f"{d}: draft_vocab_size={draft_vocab} < vocab {target.vocab_size} needs a d2t tensor of shape "
                f"({draft_vocab},)"
            )
        else:
            d2t = src.read("d2t").to(torch.int64)
            tgt = torch.arange(draft_vocab) + d2t
            if tgt.min() < 0 or tgt.max() >= target.vocab_size:
                p.append(f"{d}: d2t maps draft ids outside the target vocabulary 0..{target.vocab_size - 1}")
            elif "t2d" in src and src.info("t2d").shape == (target.vocab_size,):  # a wrong shape is reported above
                t2d = src.read("t2d").to(torch.bool)
                if not bool(t2d[tgt].all()) or int(t2d.sum()) != draft_vocab:
                    p.append(f"{d}: t2d disagrees with d2t (t2d must be true exactly at the {draft_vocab} mapped ids)")
    return p


def _t2d_from_d2t(d2t: torch.Tensor, vocab: int) -> torch.Tensor:
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[torch.arange(d2t.shape[0]) + d2t.to(torch.int64)] = True
    return t2d


def normalized_config(head_cfg: dict[str, Any], head: LlamaSpec, target: LlamaSpec, *, dtype: str,
                      layer_ids: list[int], draft_vocab: int, bias: bool, prov: Provenance) -> dict[str, Any]:
    # transformers-4 readers (TensorRT-LLM 1.1/1.2's PyTorch backend) take the RoPE base from the top-level
    # rope_theta only; a head saved by transformers 5 carries it in rope_parameters alone
    # (builders/convert/hf_compat.py).
    cfg = transformers4_config(head_cfg, rope_theta=head.rope_theta, rope_scaling=head.rope_scaling, dtype=dtype)
    cfg.update(
        architectures=["LlamaForCausalLMEagle3"],
        num_hidden_layers=head.num_hidden_layers,
        draft_vocab_size=draft_vocab,
        target_hidden_size=target.hidden_size,
        eagle_aux_hidden_state_layer_ids=layer_ids,
        bias=bias,
        eagle_deploy=dict(prov.to_json(), trtllm_layers_to_capture=[i - 1 for i in layer_ids]),
    )
    cfg.pop("eagle_config", None)  # its layer ids are now top-level; TensorRT-LLM reads them from nowhere else
    return eagle3_head_config(cfg)


def write_eagle3_head(head_dir: Path, target: LlamaSpec, out: Path, *, dtype: str, layer_ids: list[int],
                      prov: Provenance) -> None:
    """Validate the head and write `<out>/config.json` + `<out>/model.safetensors` (midlayer.* naming)."""
    dt = dtype_of(dtype)
    head = llama_spec(head_dir, require_arch=False)
    head_cfg = read_config(head_dir)
    with WeightSource(head_dir) as src:
        problems = check_eagle3(head_dir, target, layer_ids, src)
        if problems:
            raise ModelConfigError("; ".join(problems))
        prefix = _midlayer_prefix(src)
        plan: list[OutTensor] = []
        for name in sorted(src.tensors):
            info = src.info(name)
            new = "midlayer." + name[len(prefix) + 1:] if name.startswith(prefix + ".") else name
            if name in INT_TENSORS:
                want = torch.int64 if name == "d2t" else torch.bool
                plan.append(OutTensor(new, info.shape, want, partial(src.read_as, name, want)))
            elif info.dtype.is_floating_point:
                plan.append(OutTensor(new, info.shape, dt, partial(src.read_as, name, dt)))
            else:
                raise ModelConfigError(f"draft.model {head_dir}: unexpected non-float tensor {name!r} ({info.dtype})")
        draft_vocab = (
            src.info("lm_head.weight").shape[0] if "lm_head.weight" in src else int(head_cfg["draft_vocab_size"])
        )
        if draft_vocab != target.vocab_size and "t2d" not in src:
            d2t_values = src.read("d2t")
            plan.append(OutTensor("t2d", (target.vocab_size,), torch.bool,
                                  lambda: _t2d_from_d2t(d2t_values, target.vocab_size)))
        out.mkdir(parents=True, exist_ok=True)
        write_safetensors(out / "model.safetensors", plan, desc="eagle3 head")
        cfg = normalized_config(head_cfg, head, target, dtype=dtype, layer_ids=layer_ids, draft_vocab=draft_vocab,
                                bias="fc.bias" in src, prov=prov)
    write_json(out / "config.json", cfg)


def convert_eagle3(
    hf_dir: Path, head_dir: Path, out_dir: Path, *, dtype: str, tp: int = 1, layers_to_capture: list[int] | None,
    provenance: Provenance | None = None, target_weights: bool = True,
) -> None:
    """Target -> checkpoint in `out_dir` (converted weights for the native families, a `generic_target` config for
    the others); EAGLE-3 head -> normalized `out_dir/eagle3/`. `target_weights` False: the target's config.json and
    tokenizer/ without its weights (what the PyTorch backend's build needs: TensorRT-LLM loads the HF target)."""
    hf_dir, head_dir, out_dir = Path(hf_dir), Path(head_dir), Path(out_dir)
    target = llama_spec(hf_dir, require_arch=False)
    problems = check_parallel(target, tp, 1)
    if problems:
        raise ModelConfigError("; ".join(problems))
    layer_ids = resolve_layer_ids(read_config(head_dir), layers_to_capture, head_dir)
    prov = provenance or Provenance(random_head=False, target_source=str(hf_dir), head_source=str(head_dir))
    with WeightSource(hf_dir):  # validates the target's weight files before anything is written
        pass
    # Then the head: it is small and its checks are the likeliest to fail.
    write_eagle3_head(head_dir, target, out_dir / EAGLE3_DIR, dtype=dtype, layer_ids=layer_ids, prov=prov)
    if target.architecture in NATIVE:
        convert_llama(hf_dir, out_dir, dtype=dtype, tp=tp, pp=1, provenance=prov, weights=target_weights)
        return
    cfg = generic_checkpoint(target, hf_dir, dtype=dtype, tp=tp)
    cfg["eagle_deploy"] = prov.to_json()
    write_json(out_dir / "config.json", cfg)
    copy_tokenizer(hf_dir, out_dir)
