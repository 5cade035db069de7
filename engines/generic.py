"""The generic target: transformers' own model class runs the target's forward for the reference engine, for any
causal LM whose attention takes a caller-built 4D mask (the families without a native forward here, e.g. MoE).

Same interface as engines/model.py `Llama` (forward / lm_head / embed / layers / kv_heads / head_dim), so the
session, the decoding loop, verify, the doctor and the trainer's features do not know which one runs:
- tree attention: `Step.mask` (which cache slots each new token sees) becomes an additive 4D mask (0 / dtype min),
  passed as `attention_mask`; transformers returns a 4D mask as is (masking_utils `_preprocess_mask_arguments`);
- the KV cache is the engine's own `KVCache`: `_SlotCache.update` writes the new keys/values at `Step.slots` and
  returns the row's slots [0, kv_len), so the engine's compaction (`KVCache.move`) is what rolls the cache back to
  the accepted path, exactly as for the native targets;
- RoPE positions are `Step.positions` (`position_ids`): a tree's nodes take their depth's position;
- captured hidden states (EAGLE-3): the input of decoder layer j, taken with forward pre-hooks (id = number of layers:
  the last layer's output, before the final norm).
- recurrent layers (Qwen3-Next / Qwen3.5's gated delta-net, Nemotron-H's Mamba-2) take no mask and keep a state per row
  instead of K/V (engines/recurrent.py): the engine keeps the state after each row's accepted path, with chain
  drafts only (engines/runtime.py refuses trees with branches for such a target).
- Llama 4's NoPE layers scale q by each token's position (`_Temperature`, the engine's positions, not an arange)
  and its chunked layers take the engine's mask (exact while a sequence fits one chunk: `check_generic`);
  DeepSeek-V3.2's sparse-attention indexer keeps its keys in the engine's cache slots (`_SlotCache.update_indexer`).
- a multimodal wrapper (Kimi-K2.5) runs its text model: engines/text_model.py loads the class the family row names.
- DeepSeek-V4's compressed attention keeps its compressor state per row and rolls it back itself
  (engines/compressed.py, chain drafts only); its window keys take the engine's slots.
A model whose attention ignores the mask (or builds its own, e.g. sliding-window layers) would be computed wrongly:
`check_generic` (core/families.py) refuses sliding windows shorter than the sequences and layer kinds that take no
mask (a family table row without a reference path says why), and
tests/test_engine_generic.py proves token identity per family against transformers' greedy generate.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from core.families import COMPRESSED, MLA, attention_window_of, check_generic, family_of, text_config
from core.shapes import reference_kv_width
from engines.cache import KVCache, Step
from engines.compressed import CompressedStore
from engines.fp8_generic import apply_scales, read_scales
from engines.linear import fake_quant_fp8
from engines.recurrent import RecurrentStore, RecurrentView
from engines.text_model import load_causal_lm


class _SlotCache:
    """The engine's KVCache seen through transformers' Cache.update for one forward; a target with linear-attention
    layers also gets their per-row recurrent state through `view` (engines/recurrent.py)."""

    is_compileable = False  # what transformers' generation and mask helpers ask of a Cache; never a static cache

    def __init__(self, cache: KVCache, step: Step, view: RecurrentView | None = None,
                 indexer_at: int | None = None, layers: list[Any] | None = None,
                 kv_scale: torch.Tensor | None = None) -> None:
        self.cache, self.step, self.view, self.indexer_at = cache, step, view, indexer_at
        self.kv_scale = kv_scale  # an FP8 KV cache: keys and values stored as fp8(x / s) * s
        if layers is not None:  # DeepSeek-V4: its compressors read cache.layers[layer_idx] (engines/compressed.py)
            self.layers = layers

    def __getattr__(self, name: str) -> Any:  # the linear-attention methods (get_conv_state, ...), when there are any
        view = self.__dict__.get("view")
        if view is None or name.startswith("_"):
            raise AttributeError(name)
        return getattr(view, name)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.step
        k_cache, v_cache = self.cache.k[layer_idx], self.cache.v[layer_idx]
        # transformers: (B, kv_heads, T, D); the engine's cache rows: (slots, kv_heads, D). Keys and values may be
        # narrower than the slots (MLA: qk_nope + qk_rope keys, v_head_dim values): each fills its leading part.
        kd, vd = key_states.shape[-1], value_states.shape[-1]
        if self.kv_scale is not None:
            key_states, value_states = fake_quant_fp8(key_states, self.kv_scale), fake_quant_fp8(value_states,
                                                                                                  self.kv_scale)
        k_cache[s.rows[:, None], s.slots, :, :kd] = key_states.transpose(1, 2).to(k_cache.dtype)
        v_cache[s.rows[:, None], s.slots, :, :vd] = value_states.transpose(1, 2).to(v_cache.dtype)
        return s.gather(k_cache)[..., :kd].transpose(1, 2), s.gather(v_cache)[..., :vd].transpose(1, 2)

    def update_indexer(self, keys: torch.Tensor, layer_idx: int) -> torch.Tensor:
        """DeepSeek-V3.2 / GLM-5's sparse-attention indexer keys (B, T, D): kept in the value slots after the rope
        key (core/shapes.py `reference_kv_width` makes them wide enough), so compaction moves them with the
        latents; returns the row's keys of slots [0, kv_len) (masked slots are masked in the indexer's scores)."""
        if self.indexer_at is None:
            raise AttributeError("update_indexer: this target has no sparse-attention indexer")
        s, at, d = self.step, self.indexer_at, keys.shape[-1]
        v_cache = self.cache.v[layer_idx]
        v_cache[s.rows[:, None], s.slots, 0, at:at + d] = keys.to(v_cache.dtype)
        return s.gather(v_cache)[:, :, 0, at:at + d]

    def get_seq_length(self, layer_idx: int = 0) -> int:  # asked when position_ids are absent (they never are here)
        return self.step.kv_len


@dataclass
class GenericLMHead:
    linear: torch.nn.Module
    vocab_size: int

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        return self.linear(h)[..., : self.vocab_size].float()


@dataclass
class GenericTarget:
    """A transformers causal LM as the engine's target."""

    model: Any  # a transformers *ForCausalLM
    embed: torch.Tensor
    lm_head: GenericLMHead
    layers: list[Any]  # the decoder layers (their count sizes the KV cache)
    kv_heads: int
    head_dim: int
    cache_kw: str  # "cache" (transformers >= 5.x) or "past_key_values"
    window: int | None = None  # sliding window / attention chunk of some layers: longer sequences are refused
    window_key: str = "sliding_window"  # the config key `window` comes from (Runtime.check_window names it)
    recurrent: RecurrentStore | None = None  # linear-attention layers' state per row (engines/recurrent.py)
    layer_types: tuple[str, ...] = ()  # the config's layer_types (each kind gets the engine's mask)
    temperature: _Temperature | None = None  # Llama 4's NoPE layers: q scaled by the tokens' positions
    indexer_at: int | None = None  # DSA targets: where the indexer keys start in the value slots
    compressed: CompressedStore | None = None  # DeepSeek-V4: compressor state per row (engines/compressed.py)
    kv_scale: torch.Tensor | None = None  # an FP8 KV cache's scale (a mirrored FP8 export, engines/fp8_generic.py)

    def accept(self, rows: list[int], lengths: list[int]) -> None:
        """After a verification: each row's recurrent state becomes the one after its accepted path (the KV cache
        is compacted by the engine)."""
        if self.recurrent is not None:
            self.recurrent.accept(rows, lengths)
        if self.compressed is not None:
            self.compressed.accept(rows, lengths)

    def forward(self, tokens: torch.Tensor, step: Step, cache: KVCache,
                capture: tuple[int, ...] = ()) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Same contract as engines/model.py Llama.forward: post-norm last hidden state and the captured inputs."""
        if self.compressed is not None and not self.compressed.busy:  # one row at a time, its own compressors
            return self.compressed.forward(self.forward, tokens, step, cache, capture)
        b, t = tokens.shape
        dtype = self.embed.dtype
        visible = step.mask if step.mask is not None else torch.ones(b, 1, t, step.kv_len, dtype=torch.bool,
                                                                      device=tokens.device)
        mask = torch.zeros(visible.shape, dtype=dtype, device=tokens.device)
        mask.masked_fill_(~visible, torch.finfo(dtype).min)
        by_layer: dict[int, torch.Tensor] = {}
        hooks = [self.layers[j].register_forward_pre_hook(_keep_input(by_layer, j), with_kwargs=True)
                 for j in capture if j < len(self.layers)]
        if len(self.layers) in capture:
            hooks.append(self.layers[-1].register_forward_hook(_keep_output(by_layer, len(self.layers))))
        view: RecurrentView | None = None
        masks: torch.Tensor | dict[str, torch.Tensor | None] = mask
        if {"chunked_attention", "indexed_attention"} & set(self.layer_types):  # each kind takes the engine's mask
            masks = {kind: mask for kind in self.layer_types}
        if self.temperature is not None:
            self.temperature.positions = step.positions
        if self.recurrent is not None:  # linear-attention layers take no mask; each row's tokens in order
            fresh = bool((step.positions[:, 0] == 0).all())
            view = RecurrentView(self.recurrent, step.rows, fresh, 0 if fresh or t == 1 else t)
            masks = {"full_attention": mask, "linear_attention": None}
        slot_cache = _SlotCache(cache, step, view, self.indexer_at,
                                None if self.compressed is None else self.compressed.layers, self.kv_scale)
        try:
            out = self.model.model(input_ids=tokens, attention_mask=masks, position_ids=step.positions,
                                   use_cache=True, **{self.cache_kw: slot_cache})
        finally:
            for h in hooks:
                h.remove()
        if view is not None:
            view.commit()
        return out.last_hidden_state, [by_layer[j] for j in capture]


@dataclass
class _Temperature:
    """Llama 4's attention temperature tuning on NoPE layers: q times log1p(floor((position + 1) / floor_scale)) x
    attn_scale + 1, per token. transformers numbers the tokens of a forward from the cache length (arange), which
    is not a tree's positions; so the layers' own tuning is switched off and q_proj's output (q before any norm or
    rotation on these layers) is scaled here by the engine's positions (Step.positions), as TensorRT-LLM's
    Llama4Attention._attention_scaling scales q by position_ids."""

    floor_scale: float
    attn_scale: float
    positions: torch.Tensor | None = None

    def hook(self, module: Any, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
        if self.positions is None:
            raise RuntimeError("GenericTarget.forward sets the positions before the model runs")
        scale = torch.log1p(torch.floor((self.positions.float() + 1.0) / self.floor_scale)) * self.attn_scale + 1.0
        return (output * scale[..., None]).to(output.dtype)


def _temperature(model: Any) -> _Temperature | None:
    """Take over the temperature tuning of the NoPE attention layers that have it (Llama 4), else None."""
    attns = [m for m in model.modules() if getattr(m, "attn_temperature_tuning", False)
             and not getattr(m, "use_rope", True) and hasattr(m, "q_proj")]
    if not attns:
        return None
    temp = _Temperature(float(attns[0].floor_scale), float(attns[0].attn_scale))
    for m in attns:
        m.attn_temperature_tuning = False
        m.q_proj.register_forward_hook(temp.hook)
    return temp


def _keep_input(store: dict[int, torch.Tensor], j: int) -> Any:
    def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        store[j] = args[0] if args else kwargs["hidden_states"]
    return hook


def _keep_output(store: dict[int, torch.Tensor], j: int) -> Any:
    def hook(module: Any, args: tuple[Any, ...], output: Any) -> None:
        store[j] = output[0] if isinstance(output, tuple) else output
    return hook


def load_generic(hf_dir: Path, dtype: torch.dtype, device: torch.device,
                 max_seq_len: int | None = None) -> GenericTarget:
    """transformers' own model class for `hf_dir` (eager attention: it adds the engine's mask as given), for
    sequences of at most `max_seq_len` tokens (None: any, the engine then refuses requests beyond a sliding window)."""
    import json

    cfg = text_config(json.loads((hf_dir / "config.json").read_text()))
    check_generic(cfg, hf_dir / "config.json", max_seq_len)
    # AutoModelForCausalLM, or a multimodal wrapper's text model where the row names it (engines/text_model.py)
    model = load_causal_lm(hf_dir, dtype=dtype, attn_implementation="eager")
    model.to(device).eval()
    scales = read_scales(hf_dir)  # a mirrored FP8 export (builders/convert/hf_quant_generic.py)
    kv_scale = None if scales is None else apply_scales(model, scales, hf_dir)
    text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    fam = family_of((cfg.get("architectures") or [None])[0])
    heads = int(text.num_attention_heads)
    if fam is not None and fam.attention == MLA:  # the compressed latents, one "head" (core/shapes.py)
        kv_heads, head_dim = 1, reference_kv_width(fam, text.to_dict())
    else:
        kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
    layers = list(model.model.layers)
    kw = "cache" if "cache" in inspect.signature(model.model.forward).parameters else "past_key_values"
    types = tuple(getattr(text, "layer_types", None) or ())
    recurrent = RecurrentStore() if "linear_attention" in types else None
    key, window = attention_window_of(cfg) or ("sliding_window", None)
    return GenericTarget(model, model.get_input_embeddings().weight, GenericLMHead(model.lm_head, int(text.vocab_size)),
                         layers, kv_heads, head_dim, kw, window, key, recurrent, types, _temperature(model),
                         int(text.qk_rope_head_dim) if "indexed_attention" in types else None,
                         CompressedStore(model) if fam is not None and fam.attention == COMPRESSED else None,
                         None if kv_scale is None else kv_scale.to(device))
