"""Recurrent state of a generic target's recurrent layers (Qwen3-Next / Qwen3.5's gated delta-net, Nemotron-H's
Mamba-2), per engine row, with the roll-back speculative decoding needs.

A gated delta-net layer keeps a recurrent state (heads x d_k x d_v) and its short convolution's last inputs instead
of a KV cache, so a rejected draft token cannot be dropped by compacting slots: the state must be the one after the
last accepted token. transformers' layer (models/qwen3_next/modeling_qwen3_next.py `Qwen3NextGatedDeltaNet`) can
(and models/nemotron_h's Mamba-2 mixer, through the same Cache methods) return the state after each of a forward's
last N tokens (`get_recurrent_states_to_keep`), computed token by token
with the same recurrent rule its single-token decoding uses; the convolution's inputs come back whole
(`update_conv_state`). A verification forward keeps both pending; `accept` then sets each row to the state after its
accepted path: exactly the state a token-by-token decoding of the accepted tokens reaches.

Drafts must be a chain (one node per depth): a recurrent layer reads a forward's tokens in order, so the nodes of a
branching tree would feed each other (engines/runtime.py refuses other trees for such targets). Prefill and
single-token steps commit their state at once, as transformers' DynamicCache does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F


@dataclass
class RecurrentStore:
    """conv[layer]: (rows, channels, kernel) last convolution inputs; rec[layer]: (rows, heads, d_k, d_v)."""

    conv: dict[int, torch.Tensor] = field(default_factory=dict)
    rec: dict[int, torch.Tensor] = field(default_factory=dict)
    pending: dict[str, Any] | None = None  # a verification's per-token states, until `accept`

    def write(self, store: dict[int, torch.Tensor], layer: int, rows: torch.Tensor, value: torch.Tensor) -> None:
        have = store.get(layer)
        need = int(rows.max()) + 1
        if have is None or have.shape[0] < need:
            grown = torch.zeros((need, *value.shape[1:]), dtype=value.dtype, device=value.device)
            if have is not None:
                grown[: have.shape[0]] = have
            store[layer] = have = grown
        have[rows] = value

    def accept(self, rows: list[int], lengths: list[int]) -> None:
        """After a verification: row rows[j] keeps the state after its first lengths[j] tokens (root included)."""
        p, self.pending = self.pending, None
        if p is None:
            return
        idx = {int(r): j for j, r in enumerate(p["rows"].tolist())}
        for layer, (full, kernel) in p["conv"].items():
            for r, n in zip(rows, lengths):
                self.conv[layer][r] = full[idx[r], :, n: n + kernel]
        for layer, hist in p["rec"].items():
            for r, n in zip(rows, lengths):
                self.rec[layer][r] = hist[n - 1][idx[r]]


class RecurrentView:
    """The recurrent half of transformers' Cache for one forward over `rows` (engines/generic.py `_SlotCache`)."""

    def __init__(self, store: RecurrentStore, rows: torch.Tensor, fresh: bool, keep: int) -> None:
        self.store, self.rows, self.fresh, self.keep = store, rows, fresh, keep
        self.live: dict[int, torch.Tensor] = {}  # conv states handed out for in-place single-token updates
        self.full: dict[int, tuple[torch.Tensor, int]] = {}  # conv inputs (previous window + this forward's)
        self.rec: dict[int, Any] = {}

    # ---- what the layers ask (transformers cache_utils.Cache, linear-attention methods) ----
    def is_recording_past(self, layer_idx: int) -> bool:
        return False  # single-token steps take the fused update, as in transformers' own decoding

    def get_recurrent_states_to_keep(self, layer_idx: int | None = None) -> int:
        return self.keep

    def increase_count(self, layer_idx: int, state_idx: int = 0) -> None:
        return None

    def get_conv_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        if self.fresh:
            return None
        self.live[layer_idx] = t = self.store.conv[layer_idx][self.rows].clone()
        return t

    def update_conv_state(self, conv_states: torch.Tensor, layer_idx: int, state_idx: int = 0,
                          conv_kernel_size: int | None = None, **kwargs: Any) -> torch.Tensor:
        kernel = int(conv_kernel_size or conv_states.shape[-1])
        self.live.pop(layer_idx, None)
        full = conv_states if self.fresh else torch.cat([self.store.conv[layer_idx][self.rows], conv_states], -1)
        self.full[layer_idx] = (full, kernel)
        return full

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        return None if self.fresh else self.store.rec[layer_idx][self.rows].clone()

    def update_recurrent_state(self, recurrent_states: Any, layer_idx: int, state_idx: int = 0,
                               **kwargs: Any) -> torch.Tensor:
        self.rec[layer_idx] = recurrent_states
        return recurrent_states[-1] if isinstance(recurrent_states, list) else recurrent_states

    # ---- after the forward ----
    def commit(self) -> None:
        """Prefill / single-token step: the state after every token. Verification (keep > 0): pending for `accept`."""
        s = self.store
        if self.keep:
            for layer, hist in self.rec.items():  # rows without a state yet get zeros before `accept` writes them
                s.write(s.rec, layer, self.rows, hist[-1] if isinstance(hist, list) else hist)
            for layer, (full, kernel) in self.full.items():
                s.write(s.conv, layer, self.rows, full[..., -kernel:])
            s.pending = {"rows": self.rows, "conv": dict(self.full), "rec": {
                k: v if isinstance(v, list) else [v] for k, v in self.rec.items()}}
            return
        for layer, t in self.live.items():
            s.write(s.conv, layer, self.rows, t)
        for layer, (full, kernel) in self.full.items():
            window = full[..., -kernel:]
            if window.shape[-1] < kernel:  # a prompt shorter than the kernel: zeros before it, as transformers pads
                window = F.pad(window, (kernel - window.shape[-1], 0))
            s.write(s.conv, layer, self.rows, window)
        for layer, state in self.rec.items():
            s.write(s.rec, layer, self.rows, state[-1] if isinstance(state, list) else state)
