"""Every tensor a converter reads, with the shape its config implies; checked against the safetensors headers (or
the `.bin` index) BEFORE any tensor data is read, so a short or wide tensor is refused by name instead of being read
past its end (into the neighbouring tensor's bytes) or failing mid-write.

Shapes follow the HF Llama layout (transformers LlamaAttention / LlamaMLP: Linear weights are [out, in]):
q_proj [heads*head_dim, in], k_proj/v_proj [kv_heads*head_dim, in], o_proj [hidden, heads*head_dim],
gate/up [intermediate, hidden], down [hidden, intermediate], norms [hidden].
EAGLE-1/2 heads (SafeAILab eagle/model/cnets.py `Model`): fc [hidden, 2*hidden] (+ bias [hidden]), layers.j.*,
no input_layernorm in layer 0, optional embed_tokens [vocab, hidden].
EAGLE-3 heads (tensorrt_llm/_torch/models/modeling_speculative.py `Eagle3DecoderLayer`): the midlayer's q/k/v take
concat[input_layernorm(embed), hidden_norm(feature)] = 2*hidden inputs; fc [hidden, n_capture*target_hidden];
norm [hidden]; lm_head [draft_vocab, hidden]; d2t [draft_vocab]; t2d [vocab].
"""

from __future__ import annotations

from builders.convert import families
from builders.convert.weights import WeightSource
from core.hfconfig import LlamaSpec

Shapes = dict[str, tuple[int, ...]]


def layer_shapes(spec: LlamaSpec, prefix: str, *, in_width: int | None = None, input_norm: bool = True) -> Shapes:
    """One Llama decoder layer's tensors (`in_width`: q/k/v input width, default hidden_size)."""
    h, i, q, kv = spec.hidden_size, spec.intermediate_size, spec.q_size, spec.kv_size
    w = h if in_width is None else in_width
    out: Shapes = {
        f"{prefix}.self_attn.q_proj.weight": (q, w),
        f"{prefix}.self_attn.k_proj.weight": (kv, w),
        f"{prefix}.self_attn.v_proj.weight": (kv, w),
        f"{prefix}.self_attn.o_proj.weight": (h, q),
        f"{prefix}.mlp.gate_proj.weight": (i, h),
        f"{prefix}.mlp.up_proj.weight": (i, h),
        f"{prefix}.mlp.down_proj.weight": (h, i),
        f"{prefix}.post_attention_layernorm.weight": (h,),
    }
    if input_norm:
        out[f"{prefix}.input_layernorm.weight"] = (h,)
    return out


def target_shapes(spec: LlamaSpec) -> Shapes:
    """Every HF tensor the Llama converter reads, with its shape."""
    h = spec.hidden_size
    out: Shapes = {"model.embed_tokens.weight": (spec.vocab_size, h), "model.norm.weight": (h,)}
    for n in range(spec.num_hidden_layers):
        out.update(layer_shapes(spec, f"model.layers.{n}"))
        out.update(families.extra_shapes(spec, n))  # q/k/v biases, q/k norms of the other native families
    if not spec.tie_word_embeddings:
        out["lm_head.weight"] = (spec.vocab_size, h)
    return out


def eagle_head_shapes(head: LlamaSpec, target: LlamaSpec) -> tuple[Shapes, Shapes]:
    """(required, optional) tensors of an EAGLE-1/2 head; optional ones are checked only when present."""
    h = head.hidden_size
    required: Shapes = {"fc.weight": (h, 2 * target.hidden_size)}
    for j in range(head.num_hidden_layers):
        required.update(layer_shapes(head, f"layers.{j}", input_norm=j > 0))
    optional: Shapes = {"fc.bias": (h,), "embed_tokens.weight": (target.vocab_size, target.hidden_size),
                        "layers.0.input_layernorm.weight": (h,)}
    return required, optional


def eagle3_head_shapes(head: LlamaSpec, target: LlamaSpec, prefix: str, n_capture: int, target_hidden: int,
                       draft_vocab: int | None) -> tuple[Shapes, Shapes]:
    """(required, optional) tensors of an EAGLE-3 head whose decoder layer is named `prefix`."""
    h = head.hidden_size
    required: Shapes = {"fc.weight": (h, n_capture * target_hidden), "norm.weight": (h,)}
    required.update(layer_shapes(head, prefix, in_width=2 * h))
    required[f"{prefix}.hidden_norm.weight"] = (h,)
    optional: Shapes = {"fc.bias": (h,), "embed_tokens.weight": (target.vocab_size, h), "t2d": (target.vocab_size,)}
    if draft_vocab is not None:
        optional.update({"lm_head.weight": (draft_vocab, h), "d2t": (draft_vocab,)})
    return required, optional


def shape_problems(src: WeightSource, required: Shapes, what: str, optional: Shapes | None = None) -> list[str]:
    """Missing required tensors, and every present tensor whose shape differs from the expected one; each problem
    names the tensor, its file, the expected and the found shape."""
    p = []
    missing = [n for n in required if n not in src]
    if missing:
        more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
        p.append(f"{what} {src.dir}: missing tensor(s) {', '.join(missing[:3])}{more}")
    for n, shape in {**(optional or {}), **required}.items():
        if n in src and src.info(n).shape != shape:
            info = src.info(n)
            p.append(f"{what}: tensor {n} in {info.file} has shape {info.shape}, expected {shape} (from the "
                     f"config.json values); the weights do not match their config")
    return p
