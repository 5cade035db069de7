"""DeepSeek-V4's compressed attention on the generic path (engines/generic.py), per engine row, with the roll-back
speculative decoding needs; and its EAGLE-3 features.

Every DeepSeek-V4 layer attends to a sliding window of shared K=V plus compressed entries. The window keys go to the
engine's own slots (`_SlotCache.update`, compacted like any KV cache; sequences longer than the window are refused by
`check_generic`). The compressed entries are not slots: a compressor (transformers' DeepseekV4CSACompressor /
DeepseekV4HCACompressor, models/deepseek_v4/modeling_deepseek_v4.py) buffers each token's projections until
`compress rate` of them close a window, then pools them into one entry (CSA: with the previous window's overlap
series, and its lightning indexer keeps keys the same way). That state lives in transformers' own cache layers
(DeepseekV4CSACache / DeepseekV4HCACache: buffer_kv / buffer_gate / compressed_kv / entry_count / overlap_*), one
list per row here, so a row is computed exactly as transformers computes one sequence.

A verification feeds a row's chain of draft tokens in order, so its compressors pool draft tokens too. Before such a
forward the row's compressor state is snapshotted and each compressor's inputs (hidden states, q latent, positions)
are kept; `accept` then restores the snapshot and runs the compressors alone over the accepted tokens' inputs, which
leaves exactly the state a sequence of the accepted tokens reaches (the compressors' windows depend only on the
tokens and their order: a buffer across forwards gives the same windows as one forward). The decoder layers are not
run again. Only chains: a branching tree's nodes would be pooled into one window (engines/runtime.py refuses it).
Rows are run one at a time (B = 1 each): rows at different lengths close windows at different tokens.

EAGLE-3 features: TensorRT-LLM captures a DeepSeek-V4 layer's MoE output, the block's output before hc_ffn's
post-mapping, hidden_size wide (DeepseekV4DecoderLayer.forward_MoE, modeling_deepseekv4.py at 02586bf0), not the
hc_mult residual streams. So feature id j (upstream's layer j - 1, as for every target here) is layer j - 1's
`mlp` output, and id 0 the token embedding (the streams' common start).
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

from core.families import feature_source
from engines.cache import KVCache, Step

_STATE = ("buffer_kv", "buffer_gate", "compressed_kv", "entry_count", "overlap_kv", "overlap_gate")
Forward = Callable[..., tuple[torch.Tensor, list[torch.Tensor]]]
Snapshot = list[dict[str, dict[str, Any]] | None]  # per layer: its compressor dicts (None: a sliding-only layer)


class CompressedStore:
    """The compressed layers' state of every row of a DeepSeek-V4 target, and its roll-back."""

    def __init__(self, model: Any) -> None:
        from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4CSACache, DeepseekV4HCACache

        self.model = model
        self.config = model.config
        self.kinds = {"compressed_sparse_attention": DeepseekV4CSACache,
                      "heavily_compressed_attention": DeepseekV4HCACache}
        self.types = list(self.config.layer_types)
        self.compressors: dict[int, Any] = {}
        for j, layer in enumerate(model.model.layers):
            comp = layer.self_attn.compressor
            if comp is not None:
                self.compressors[j] = comp
                comp.register_forward_pre_hook(self._record(j))
        self.rows: dict[int, list[Any]] = {}
        self.layers: list[Any] = []  # the row being run: what `_SlotCache.layers` hands the compressors
        self.pending: dict[int, tuple[Snapshot | None, dict[int, tuple[Any, ...]], int]] = {}
        self.recording: dict[int, tuple[Any, ...]] | None = None
        self.busy = False

    def _record(self, j: int) -> Callable[..., None]:
        def hook(module: Any, args: tuple[Any, ...]) -> None:
            if self.recording is not None:
                self.recording[j] = tuple(args[:3])  # hidden_states, q_residual, position_ids
        return hook

    def _fresh(self) -> list[Any]:
        return [self.kinds[t](self.config) if t in self.kinds else None for t in self.types]

    def _snapshot(self, row: int) -> Snapshot:
        """The row's compressor state; its tensors are replaced, never written in place, by transformers' cache
        layers (store_compression_weights, update_compressor_states, update_overlap_state), so shallow copies of
        the dicts keep it."""
        return [None if layer is None else {a: dict(getattr(layer, a)) for a in _STATE if hasattr(layer, a)}
                for layer in self.rows[row]]

    def _restore(self, row: int, snap: Snapshot) -> None:
        for layer, state in zip(self.rows[row], snap):
            for attr, value in (state or {}).items():
                setattr(layer, attr, dict(value))

    def forward(self, inner: Forward, tokens: torch.Tensor, step: Step, cache: KVCache,
                capture: tuple[int, ...]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Each row through `inner` (GenericTarget.forward) alone, with its own compressor state; returns the
        batch's last hidden states and the captured features (ids as in the module docstring)."""
        n_layers = len(self.model.model.layers)
        outs: list[torch.Tensor] = []
        feats: list[list[torch.Tensor]] = []
        t = tokens.shape[1]
        self.busy = True
        try:
            for j, row in enumerate(step.rows.tolist()):
                sub = Step(step.rows[j:j + 1], step.slots[j:j + 1], step.positions[j:j + 1],
                           None if step.mask is None else step.mask[j:j + 1], step.kv_len, slice(row, row + 1))
                fresh = int(step.positions[j, 0]) == 0
                if fresh or row not in self.rows:
                    self.rows[row] = self._fresh()
                snap = self._snapshot(row) if t > 1 and not fresh else None
                self.layers, self.recording = self.rows[row], {}
                kept: dict[int, torch.Tensor] = {}
                hooks = [self._capture_hook(i, kept, n_layers) for i in capture]
                try:
                    hidden, _ = inner(tokens[j:j + 1], sub, cache, ())
                finally:
                    for h in hooks:
                        h.remove()
                    self.pending[row] = (snap, self.recording, t)
                    self.recording = None
                outs.append(hidden)
                feats.append([kept[i] for i in capture])
        finally:
            self.busy = False
        return torch.cat(outs), [torch.cat([f[k] for f in feats]) for k in range(len(capture))]

    def _capture_hook(self, i: int, kept: dict[int, torch.Tensor], n_layers: int) -> Any:
        if not 0 <= i <= n_layers:
            raise ValueError(f"feature id {i}: a DeepSeek-V4 target has ids 0..{n_layers}")
        where, k = feature_source("deepseek_v4", i)
        module = self.model.model.embed_tokens if where == "embed" else self.model.model.layers[k].mlp

        def hook(mod: Any, args: tuple[Any, ...], output: torch.Tensor) -> None:
            kept[i] = output
        return module.register_forward_hook(hook)

    def accept(self, rows: list[int], lengths: list[int]) -> None:
        """After a verification: row rows[k] keeps the compressor state of its first lengths[k] tokens (root
        included); a row that kept every token it was fed keeps its state as it is."""
        for row, n in zip(rows, lengths):
            snap, inputs, t = self.pending.pop(row, (None, {}, 0))
            if snap is None or n >= t:
                continue
            self._restore(row, snap)
            holder = SimpleNamespace(layers=self.rows[row])
            with torch.no_grad():
                for j, (hidden, q_residual, positions) in sorted(inputs.items()):
                    self.compressors[j](hidden[:, :n], q_residual[:, :n], positions[:, :n], holder, j)
