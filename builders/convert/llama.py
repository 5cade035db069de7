"""HF Llama -> TensorRT-LLM `LlamaForCausalLM` checkpoint (`config.json` + `rank{r}.safetensors`), streamed.

Layout follows upstream TensorRT-LLM (tensorrt_llm/models/llama/convert.py, tensorrt_llm/models/eagle/weight.py
`convert_hf_llama`, tensorrt_llm/models/llama/config.py `LLaMAConfig.from_hugging_face`):

  model.embed_tokens            -> transformer.vocab_embedding   replicated (use_parallel_embedding=false),
                                                                 first PP rank
  layers.i.input_layernorm      -> transformer.layers.l.input_layernorm   replicated
  layers.i.self_attn.{q,k,v}    -> transformer.layers.l.attention.qkv     [q_r; k_r; v_r], each split on dim 0
  layers.i.self_attn.o_proj     -> transformer.layers.l.attention.dense   split on dim 1
  layers.i.post_attention_ln    -> transformer.layers.l.post_layernorm    replicated
  layers.i.mlp.gate_proj        -> transformer.layers.l.mlp.fc   (!)      split on dim 0
  layers.i.mlp.up_proj          -> transformer.layers.l.mlp.gate (!)      split on dim 0
  layers.i.mlp.down_proj        -> transformer.layers.l.mlp.proj          split on dim 1
  model.norm                    -> transformer.ln_f                       replicated, last PP rank
  lm_head (or tied embedding)   -> lm_head   rows zero-padded to a multiple of tp, split on dim 0, last PP rank

where l = i - first layer of the PP rank (layers are renumbered per rank), PP ranks own
torch.tensor_split(range(L), pp) (tensorrt_llm/mapping.py `pp_layers`), and rank = pp_rank * tp + tp_rank.
K/V heads: when num_kv_heads < tp each head is duplicated tp / num_kv_heads times (convert_utils.dup_kv_weight), so
rank r holds original KV head r // (tp / num_kv_heads).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from core.families import NATIVE
from core.hfconfig import LlamaSpec, ModelConfigError, llama_spec
from builders.convert import families
from builders.convert.shapes import shape_problems, target_shapes
from builders.convert.tokenizer import copy_tokenizer
from builders.convert.weights import DTYPES, OutTensor, Piece, WeightSource, Zeros, write_safetensors


@dataclass(frozen=True)
class Provenance:
    """The top-level `eagle_deploy` key of every checkpoint config.json we write.

    TensorRT-LLM tolerates unknown top-level keys: PretrainedConfig.__init__ (tensorrt_llm/models/modeling_utils.py)
    ends with `for key, value in kwargs.items(): setattr(self, key, value)` and logs a warning
    "Implicitly setting LLaMAConfig.eagle_deploy = ..."; from_dict / from_json_file pass the whole dict through.
    """

    random_head: bool
    target_source: str
    head_source: str

    def to_json(self) -> dict[str, Any]:
        return {"random_head": self.random_head, "target_source": self.target_source, "head_source": self.head_source}


# ---- parallel index math ------------------------------------------------------------------------------------------


def pad_vocab(vocab: int, tp: int) -> int:
    """TRT-LLM pad_vocab_size: round up to a multiple of tp."""
    return -(-vocab // tp) * tp


def pp_layer_range(num_layers: int, pp: int, pp_rank: int) -> list[int]:
    """Layers owned by a PP rank: torch.tensor_split semantics (the first L % pp ranks get one extra layer)."""
    return torch.tensor_split(torch.arange(num_layers), pp)[pp_rank].tolist()


def even_range(n: int, tp: int, r: int, what: str) -> tuple[int, int]:
    if n % tp:
        raise ModelConfigError(f"{what}={n} is not divisible by tp={tp}; choose a tp that divides it")
    step = n // tp
    return r * step, (r + 1) * step


def kv_rows(spec: LlamaSpec, tp: int, r: int) -> tuple[int, int]:
    """Rows of k_proj / v_proj that TP rank r holds (with head duplication when kv heads < tp)."""
    kv, hd = spec.num_key_value_heads, spec.head_dim
    if kv >= tp:
        a, b = even_range(kv, tp, r, "num_key_value_heads")
        return a * hd, b * hd
    if tp % kv:
        raise ModelConfigError(f"num_key_value_heads={kv} < tp={tp} needs tp % num_key_value_heads == 0")
    head = r // (tp // kv)
    return head * hd, (head + 1) * hd


def check_parallel(spec: LlamaSpec, tp: int, pp: int) -> list[str]:
    """Problems that make (tp, pp) impossible for this model; each names the values and the fix."""
    p = []
    where = f"{spec.path.parent.name}"
    if spec.num_attention_heads % tp:
        p.append(
            f"parallel.tp={tp} must divide num_attention_heads={spec.num_attention_heads} of {where}; pick a divisor"
        )
    kv = spec.num_key_value_heads
    if kv % tp and tp % kv:
        p.append(
            f"parallel.tp={tp} and num_key_value_heads={kv} of {where}: one must divide the other; pick another tp"
        )
    if spec.intermediate_size % tp:
        p.append(f"parallel.tp={tp} must divide intermediate_size={spec.intermediate_size} of {where}")
    if pp > spec.num_hidden_layers:
        p.append(f"parallel.pp={pp} exceeds num_hidden_layers={spec.num_hidden_layers} of {where}; lower pp")
    return p


# ---- tensor plans -------------------------------------------------------------------------------------------------


def _cast(t: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
    return t.to(dt) if t.dtype != dt else t


def verbatim(src: WeightSource, dt: torch.dtype, *rows: tuple[str, int, int | None]) -> tuple[Piece, ...]:
    """Byte ranges of the given row ranges when they can be copied byte for byte (safetensors source, no dtype
    cast): row ranges are contiguous in row-major storage. () = compute the tensor instead."""
    pieces = []
    for name, a, b in rows:
        r = src.byte_range(name, a, b) if src.info(name).dtype == dt else None
        if r is None:
            return ()
        pieces.append(r)
    return tuple(pieces)


def copy_tensor(src: WeightSource, hf: str, out: str, dt: torch.dtype) -> OutTensor:
    return OutTensor(out, src.info(hf).shape, dt, lambda: _cast(src.read(hf), dt), verbatim(src, dt, (hf, 0, None)))


def split_tensor(src: WeightSource, hf: str, out: str, dt: torch.dtype, dim: int, a: int, b: int) -> OutTensor:
    shape = list(src.info(hf).shape)
    shape[dim] = b - a
    pieces = verbatim(src, dt, (hf, a, b)) if dim == 0 else ()
    return OutTensor(out, tuple(shape), dt, lambda: _cast(src.read(hf, dim, a, b), dt), pieces)


def zeros_tensor(out: str, shape: tuple[int, ...], dt: torch.dtype) -> OutTensor:
    t = OutTensor(out, shape, dt, lambda: torch.zeros(shape, dtype=dt))
    return OutTensor(out, shape, dt, t.make, (Zeros(t.nbytes),))


def qkv_tensor(src: WeightSource, hf: str, out: str, spec: LlamaSpec, dt: torch.dtype, tp: int, r: int) -> OutTensor:
    """Fused [q_r; k_r; v_r] of TP rank r; `hf` is the layer's `...self_attn` prefix."""
    qa, qb = even_range(spec.q_size, tp, r, "num_attention_heads * head_dim")
    ka, kb = kv_rows(spec, tp, r)
    in_features = src.info(f"{hf}.q_proj.weight").shape[1]

    def make() -> torch.Tensor:
        parts = [
            src.read(f"{hf}.q_proj.weight", 0, qa, qb),
            src.read(f"{hf}.k_proj.weight", 0, ka, kb),
            src.read(f"{hf}.v_proj.weight", 0, ka, kb),
        ]
        return _cast(torch.cat(parts, 0), dt)

    pieces = verbatim(src, dt, (f"{hf}.q_proj.weight", qa, qb), (f"{hf}.k_proj.weight", ka, kb),
                      (f"{hf}.v_proj.weight", ka, kb))
    return OutTensor(out, ((qb - qa) + 2 * (kb - ka), in_features), dt, make, pieces)


def decoder_layer_plan(
    src: WeightSource, hf: str, out: str, spec: LlamaSpec, dt: torch.dtype, tp: int, r: int, *, input_norm: bool
) -> list[OutTensor]:
    """One decoder layer: HF prefix `hf` (e.g. `model.layers.3`) -> TRT-LLM prefix `out`."""
    if spec.attention_bias or spec.mlp_bias:
        raise ModelConfigError(
            f"{spec.path}: attention_bias/mlp_bias=true is not supported by this converter (Llama-family targets "
            "and EAGLE heads have no linear biases)"
        )
    ia, ib = even_range(spec.intermediate_size, tp, r, "intermediate_size")
    oa, ob = even_range(spec.q_size, tp, r, "num_attention_heads * head_dim")
    plan = []
    if input_norm:
        plan.append(copy_tensor(src, f"{hf}.input_layernorm.weight", f"{out}.input_layernorm.weight", dt))
    plan += [
        qkv_tensor(src, f"{hf}.self_attn", f"{out}.attention.qkv.weight", spec, dt, tp, r),
        split_tensor(src, f"{hf}.self_attn.o_proj.weight", f"{out}.attention.dense.weight", dt, 1, oa, ob),
        split_tensor(src, f"{hf}.mlp.gate_proj.weight", f"{out}.mlp.fc.weight", dt, 0, ia, ib),
        split_tensor(src, f"{hf}.mlp.up_proj.weight", f"{out}.mlp.gate.weight", dt, 0, ia, ib),
        split_tensor(src, f"{hf}.mlp.down_proj.weight", f"{out}.mlp.proj.weight", dt, 1, ia, ib),
        copy_tensor(src, f"{hf}.post_attention_layernorm.weight", f"{out}.post_layernorm.weight", dt),
    ]
    return plan


def lm_head_name(src: WeightSource, spec: LlamaSpec) -> str:
    """The HF tensor holding the output projection: lm_head, or the embedding when tied."""
    if "lm_head.weight" in src:
        return "lm_head.weight"
    if spec.tie_word_embeddings:
        return "model.embed_tokens.weight"
    raise ModelConfigError(
        f"{src.dir}: no lm_head.weight and tie_word_embeddings is false; the checkpoint is incomplete"
    )


def lm_head_tensor(src: WeightSource, spec: LlamaSpec, out: str, dt: torch.dtype, tp: int, r: int) -> OutTensor:
    """Rows [r*Vp/tp, (r+1)*Vp/tp) of the zero-padded (Vp = pad_vocab(V, tp)) output projection."""
    hf = lm_head_name(src, spec)
    vocab, hidden = src.info(hf).shape
    per = pad_vocab(vocab, tp) // tp
    a, b = r * per, (r + 1) * per

    def make() -> torch.Tensor:
        real = _cast(src.read(hf, 0, min(a, vocab), min(b, vocab)), dt)
        if real.shape[0] == per:
            return real
        return torch.cat([real, torch.zeros(per - real.shape[0], hidden, dtype=dt)], 0)

    pieces: tuple[Piece, ...] = ()
    if a < vocab:
        pieces = verbatim(src, dt, (hf, a, min(b, vocab)))
    pad = per - max(0, min(b, vocab) - a)
    if pieces and pad:
        pieces += (Zeros(pad * hidden * dt.itemsize),)
    elif a >= vocab:
        pieces = (Zeros(per * hidden * dt.itemsize),)
    return OutTensor(out, (per, hidden), dt, make, pieces)


def target_rank_plan(
    src: WeightSource, spec: LlamaSpec, dt: torch.dtype, tp: int, pp: int, tp_rank: int, pp_rank: int
) -> list[OutTensor]:
    layers = pp_layer_range(spec.num_hidden_layers, pp, pp_rank)
    plan = []
    if pp_rank == 0:
        plan.append(copy_tensor(src, "model.embed_tokens.weight", "transformer.vocab_embedding.weight", dt))
    for i in layers:
        hf, out = f"model.layers.{i}", f"transformer.layers.{i - layers[0]}"
        plan += decoder_layer_plan(src, hf, out, spec, dt, tp, tp_rank, input_norm=True)
        q_rows = even_range(spec.q_size, tp, tp_rank, "num_attention_heads * head_dim")
        plan += families.extra_layer_plan(src, hf, out, spec, dt, q_rows, kv_rows(spec, tp, tp_rank))
    if pp_rank == pp - 1:
        plan.append(copy_tensor(src, "model.norm.weight", "transformer.ln_f.weight", dt))
        plan.append(lm_head_tensor(src, spec, "lm_head.weight", dt, tp, tp_rank))
    return plan


# ---- config -------------------------------------------------------------------------------------------------------


def mapping_json(tp: int, pp: int) -> dict[str, int]:
    return {"world_size": tp * pp, "tp_size": tp, "pp_size": pp}


def llama_config_json(spec: LlamaSpec, *, dtype: str, tp: int, pp: int, architecture: str) -> dict[str, Any]:
    """The keys LLaMAConfig / PretrainedConfig read (tensorrt_llm/models/llama/config.py, modeling_utils.py)."""
    return {
        "architecture": architecture,
        "dtype": dtype,
        "logits_dtype": "float32",
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_size": spec.head_dim,
        "hidden_act": spec.hidden_act,
        "norm_epsilon": spec.rms_norm_eps,
        "position_embedding_type": "rope_gpt_neox",
        "rotary_base": spec.rope_theta,
        "rotary_scaling": spec.rope_scaling,
        "max_position_embeddings": spec.max_position_embeddings,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "use_parallel_embedding": False,
        "embedding_sharding_dim": 0,
        "share_embedding_table": False,
        "attn_bias": spec.attention_bias,
        "mlp_bias": spec.mlp_bias,
        "residual_mlp": False,
        "mapping": mapping_json(tp, pp),
        "quantization": {"quant_algo": None, "kv_cache_quant_algo": None, "exclude_modules": None},
    }


def target_config_json(spec: LlamaSpec, *, dtype: str, tp: int, pp: int) -> dict[str, Any]:
    """The target's checkpoint config: Llama's keys under the target's own architecture name, and the family keys
    only for the other families (a Llama checkpoint stays exactly what TensorRT-LLM's engine flow reads)."""
    cfg = llama_config_json(spec, dtype=dtype, tp=tp, pp=pp, architecture=spec.architecture)
    if spec.architecture != "LlamaForCausalLM":
        cfg.update(families.config_keys(spec))
    return cfg


def write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")


def dtype_of(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ModelConfigError(f"dtype {name!r} is not one of {', '.join(DTYPES)}") from None


def write_target_ranks(src: WeightSource, spec: LlamaSpec, out_dir: Path, *, dtype: str, tp: int, pp: int) -> None:
    dt = dtype_of(dtype)
    for pp_rank in range(pp):
        for tp_rank in range(tp):
            rank = pp_rank * tp + tp_rank
            plan = target_rank_plan(src, spec, dt, tp, pp, tp_rank, pp_rank)
            write_safetensors(out_dir / f"rank{rank}.safetensors", plan, desc=f"target rank{rank}")


def convert_llama(
    hf_dir: Path, out_dir: Path, *, dtype: str, tp: int = 1, pp: int = 1, provenance: Provenance | None = None,
    weights: bool = True,
) -> None:
    """HF target directory -> checkpoint in `out_dir` (+ tokenizer/): TRT-LLM's LlamaForCausalLM layout, plus the
    family's tensors and keys for the other native families (builders/convert/families.py). `weights` False: the
    config.json and tokenizer/ only (the weights are checked, not copied: `eagle_deploy.target_weights` false), for a
    build whose serving path loads the Hugging Face target itself (engine.backend pytorch)."""
    hf_dir, out_dir = Path(hf_dir), Path(out_dir)
    spec = llama_spec(hf_dir, require_arch=False)
    if spec.architecture not in NATIVE:
        raise ModelConfigError(f"{spec.path}: architecture {spec.architecture!r}; this converter writes "
                               f"{', '.join(NATIVE)} targets (docs/contracts.md, 'Target architectures')")
    problems = check_parallel(spec, tp, pp)
    if problems:
        raise ModelConfigError("; ".join(problems))
    with WeightSource(hf_dir) as src:  # validates every weight file's header before anything is written
        lm_head_name(src, spec)
        problems = shape_problems(src, target_shapes(spec), "target.model")
        if problems:
            raise ModelConfigError("; ".join(problems))
        out_dir.mkdir(parents=True, exist_ok=True)
        if weights:
            write_target_ranks(src, spec, out_dir, dtype=dtype, tp=tp, pp=pp)
    cfg = target_config_json(spec, dtype=dtype, tp=tp, pp=pp)
    prov = provenance or Provenance(random_head=False, target_source=str(hf_dir), head_source="none")
    cfg["eagle_deploy"] = dict(prov.to_json(), target_weights=weights)
    write_json(out_dir / "config.json", cfg)
    copy_tokenizer(hf_dir, out_dir)
