"""Self-distilled answers: the target's greedy continuations of many prompts, decoded in batches, with the features
of every token captured on the way (the decode step that consumes a token computes its hidden state anyway).

A batch holds prompts of similar length (sorted). Each prompt is prefilled alone (no padding), then their KV caches
are left-padded into one batch cache; position ids count real tokens only, as HF `generate` does, so each row
decodes exactly as it would alone. Step s feeds every row its s-th answer token
(rows already finished are fed padding, masked out); a row's last token is fed once more after it ends so that
its feature exists too: the sequence prompt + answer gets a feature at every position, what `features.py` would
compute in a separate pass, at no extra target forward. Rows stop at an eos token (kept) or `max_new` tokens.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from training.features import FeatureSpec, LayerInputs, greedy_tokens

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass
class Row:
    prompt: list[int]
    answer: list[int] = field(default_factory=list)
    done: bool = False  # eos generated or max_new reached
    chunks: dict[str, list[torch.Tensor]] = field(default_factory=dict)  # captured features, in position order

    def keep(self, name: str, x: torch.Tensor) -> None:
        self.chunks.setdefault(name, []).append(x.float().cpu())

    def features(self, model: PreTrainedModel, spec: FeatureSpec) -> dict[str, torch.Tensor]:
        out = {k: torch.cat(v)[: len(self.prompt) + len(self.answer)] for k, v in self.chunks.items()}
        if spec.layer_ids:
            out["greedy"] = greedy_tokens(model, out["hidden"])
        return out


def _cache_arg(model: PreTrainedModel) -> str:
    """The KV-cache keyword of the target's forward: `cache` (transformers >= 5.2x) or `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model.model.forward).parameters else "past_key_values"


def _step(
    model: PreTrainedModel,
    ids: torch.Tensor,
    att: torch.Tensor,
    pos: torch.Tensor,
    cache: Any,
    spec: FeatureSpec | None,
) -> tuple[torch.Tensor, torch.Tensor | None, Any]:
    """One target forward with the KV cache; returns (last_hidden_state, aux or None, cache)."""
    name = _cache_arg(model)
    with LayerInputs(model, spec.layer_ids if spec else None) as cap:
        out = model.model(input_ids=ids, attention_mask=att, position_ids=pos, use_cache=True, **{name: cache})
        aux = cap.aux() if spec and spec.layer_ids else None
    return out.last_hidden_state, aux, getattr(out, name)


def _next_tokens(model: PreTrainedModel, hidden_last: torch.Tensor) -> list[int]:
    lm = model.get_output_embeddings()
    return lm(hidden_last.to(lm.weight.device)).argmax(-1).tolist()


def _layer_kv(cache: Any, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    if hasattr(cache, "layers"):  # transformers 5
        return cache.layers[layer].keys, cache.layers[layer].values
    return cache.key_cache[layer], cache.value_cache[layer]  # transformers 4


@functools.cache
def _reserved_layer_class() -> type:
    """A transformers `DynamicLayer` whose keys and values are views of buffers reserved for the whole answer.

    `DynamicLayer.update` concatenates: every decode step allocates a new cache-sized tensor per layer and copies the
    whole cache into it, O(answer length^2) bytes per answer. Writing the new position in place copies one position;
    the attention reads the filled prefix as a view. (A function so that transformers is imported only when used.)"""
    from transformers.cache_utils import DynamicLayer

    class ReservedLayer(DynamicLayer):
        def __init__(self, keys: torch.Tensor, values: torch.Tensor, filled: int) -> None:
            """keys, values: [B, kv_heads, capacity, head_dim], their first `filled` positions already written."""
            super().__init__()
            self._k, self._v = keys, values
            self.device = keys.device
            self.is_initialized = True
            self._grow(filled)

        def _grow(self, n: int) -> None:
            self.keys, self.values = self._k[:, :, :n], self._v[:, :, :n]

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
        ) -> tuple[torch.Tensor, torch.Tensor]:
            n, m = self.keys.shape[-2], key_states.shape[-2]
            if n + m > self._k.shape[-2]:
                raise RuntimeError(f"reserved KV cache of {self._k.shape[-2]} positions is full (needs {n + m})")
            self._k[:, :, n : n + m] = key_states
            self._v[:, :, n : n + m] = value_states
            self._grow(n + m)
            return self.keys, self.values

    return ReservedLayer


def prefill(
    model: PreTrainedModel, prompts: list[list[int]], spec: FeatureSpec | None, rows: list[Row], capacity: int
) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each prompt alone (no padding: a batch of prompts of different lengths would spend up to half of its
    compute on pads), its KV written left-padded into one batch cache of `capacity` positions per row. Returns
    (cache, attention mask, positions, last hidden state of each row [B, H])."""
    from transformers import DynamicCache

    dev = model.get_input_embeddings().weight.device
    width = max(len(p) for p in prompts)
    buffers: list[tuple[torch.Tensor, torch.Tensor]] = []
    last = []
    for b, (row, p) in enumerate(zip(rows, prompts)):
        ids = torch.tensor([p], device=dev)
        hidden, aux, cache = _step(model, ids, torch.ones_like(ids), torch.arange(len(p), device=dev)[None],
                                   DynamicCache(), spec)
        if spec:
            row.keep("hidden", hidden[0])
            if aux is not None:
                row.keep("aux", aux[0])
        last.append(hidden[0, -1])
        for j in range(len(model.model.layers)):
            k, v = _layer_kv(cache, j)  # [1, kv_heads, len(p), head_dim]
            if b == 0:  # zeros: the left padding, masked out below
                buffers.append((k.new_zeros(len(prompts), k.shape[1], capacity, k.shape[3]),
                                v.new_zeros(len(prompts), v.shape[1], capacity, v.shape[3])))
            buffers[j][0][b, :, width - len(p) : width] = k[0]
            buffers[j][1][b, :, width - len(p) : width] = v[0]
    cache = DynamicCache()
    cache.layers = [_reserved_layer_class()(k, v, width) for k, v in buffers]
    att = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    pos = torch.tensor([[len(p) - 1] for p in prompts])
    return cache, att, pos, torch.stack(last)


@torch.no_grad()
def greedy_batch(
    model: PreTrainedModel, prompts: list[list[int]], max_new: int, eos: set[int], pad: int, spec: FeatureSpec | None
) -> list[Row]:
    """Decode one batch of prompts (see the module docstring); rows keep their features when `spec` is given."""
    dev = model.get_input_embeddings().weight.device
    rows = [Row(list(p)) for p in prompts]
    # every row is fed at most max_new + 1 tokens after its prompt (its last answer token once more)
    cache, att, pos, last = prefill(model, prompts, spec, rows, max(len(p) for p in prompts) + max_new + 1)
    _extend(rows, _next_tokens(model, last), max_new, eos)
    s = 0
    while any(s < len(row.answer) for row in rows) and (spec is not None or not all(row.done for row in rows)):
        feed = torch.tensor([[row.answer[s] if s < len(row.answer) else pad] for row in rows])
        att = torch.cat([att, torch.tensor([[1 if s < len(row.answer) else 0] for row in rows])], dim=1)
        pos = pos + 1
        hidden, aux, cache = _step(model, feed.to(dev), att.to(dev), pos.to(dev), cache, spec)
        if spec:  # one device-to-host copy per step, not one per row
            got = {"hidden": hidden.float().cpu(), **({"aux": aux.float().cpu()} if aux is not None else {})}
            for r, row in enumerate(rows):
                if s < len(row.answer):
                    for name, x in got.items():
                        row.keep(name, x[r])
        if not all(row.done for row in rows):
            _extend(rows, _next_tokens(model, hidden[:, -1]), max_new, eos)
        s += 1
    return rows


def _extend(rows: list[Row], tokens: list[int], max_new: int, eos: set[int]) -> None:
    for row, t in zip(rows, tokens):
        if not row.done:
            row.answer.append(t)
            row.done = t in eos or len(row.answer) >= max_new


def regenerate_with_features(
    model: PreTrainedModel, prompts: list[list[int]], max_new: int, eos: set[int], pad: int, batch_size: int,
    spec: FeatureSpec | None,
) -> list[tuple[list[int], dict[str, torch.Tensor] | None]]:
    """(answer ids, features of prompt + answer or None) per prompt, in the given order; batches of
    `batch_size` prompts of similar length."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out: list[tuple[list[int], dict[str, torch.Tensor] | None]] = [([], None)] * len(prompts)
    for b in range(0, len(order), batch_size):
        idx = order[b : b + batch_size]
        rows = greedy_batch(model, [prompts[i] for i in idx], max_new, eos, pad, spec)
        for i, row in zip(idx, rows):
            out[i] = (row.answer, row.features(model, spec) if spec else None)
    return out
