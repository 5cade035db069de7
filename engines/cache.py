"""The KV cache and what one forward writes into it.

Every forward appends T new tokens per sequence to a cache: `Step` says which cache rows, which slots the new K/V
go to, the RoPE position of each new token, and which keys each new token may see (the tree mask). A causal chain
is the special case of a tree that is a line.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class KVCache:
    """Preallocated keys/values: k[layer] is (rows, slots, kv_heads, head_dim)."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]

    @classmethod
    def allocate(
        cls, layers: int, rows: int, slots: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device
    ) -> KVCache:
        shape = (rows, slots, kv_heads, head_dim)
        return cls(
            [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)],
            [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)],
        )

    @property
    def slots(self) -> int:
        return self.k[0].shape[1]

    def move(self, row: int, src: torch.Tensor, dst: torch.Tensor) -> None:
        """KV compaction: copy the entries at slots `src` to slots `dst` in one row, every layer."""
        for k, v in zip(self.k, self.v):
            k[row, dst] = k[row, src]
            v[row, dst] = v[row, src]


@dataclass
class Step:
    """Where T new tokens per sequence go and what they may attend to.

    rows (B,): cache rows; slots (B, T): cache slots of the new K/V; positions (B, T): RoPE positions;
    mask (B, 1, T, kv_len) bool over cache slots [0, kv_len), or None when every new token sees every slot < kv_len
    (a single sequence, single token). Every position is < kv_len (a token's position is at most its slot)."""

    rows: torch.Tensor
    slots: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor | None
    kv_len: int
    row_slice: slice | None = None  # rows as a slice when they are contiguous: avoids gathering the cache

    def gather(self, cache: torch.Tensor) -> torch.Tensor:
        if self.row_slice is not None:
            return cache[self.row_slice, : self.kv_len]
        return cache[self.rows, : self.kv_len]


@dataclass(frozen=True)
class Rows:
    """The cache rows of one forward and their committed lengths, on the device and as host lists."""

    idx: torch.Tensor  # (B,)
    lens: torch.Tensor  # (B,)
    host: list[int]
    host_lens: list[int]

    @classmethod
    def of(cls, rows: list[int], lens: list[int], device: torch.device) -> Rows:
        return cls(torch.tensor(rows, device=device), torch.tensor(lens, device=device), rows, lens)

    def step(self, positions: torch.Tensor, visible: torch.Tensor, start: int = 0) -> Step:
        return make_step(
            self.idx, self.lens, positions, visible, start=start, host_rows=self.host, host_lens=self.host_lens
        )


def contiguous_slice(rows: list[int]) -> slice | None:
    if rows == list(range(rows[0], rows[0] + len(rows))):
        return slice(rows[0], rows[0] + len(rows))
    return None


def make_step(
    rows: torch.Tensor, lens: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor, *, start: int = 0,
    host_rows: list[int] | None = None, host_lens: list[int] | None = None,
) -> Step:
    """T new tokens per row written after the row's `lens` committed entries, in a scratch region of R slots.

    New token t goes to scratch slot start + t (cache slot lens + start + t); positions (B, T): RoPE positions;
    visible (B, T, R): new token t may see scratch slot r (itself, and for trees its ancestors). Every new token also
    sees all committed entries of its own row. `host_rows` / `host_lens` are `rows` / `lens` as Python lists when the
    caller has them (on CUDA reading them back would cost a device -> host sync per step)."""
    b, t = positions.shape
    r = visible.shape[-1]
    dev = lens.device
    host_rows = rows.tolist() if host_rows is None else host_rows
    host_lens = lens.tolist() if host_lens is None else host_lens
    slots = lens[:, None] + torch.arange(start, start + t, device=dev)
    if b == 1 and t == 1 and r == 1:
        return Step(rows, slots, positions, None, host_lens[0] + 1, contiguous_slice(host_rows))
    kv_len = max(host_lens) + r
    rel = torch.arange(kv_len, device=dev)[None, :] - lens[:, None]  # (B, S): slot relative to the scratch region
    committed = rel < 0
    in_scratch = (rel >= 0) & (rel < r)
    scratch = torch.gather(visible, 2, rel.clamp(0, r - 1)[:, None, :].expand(b, t, kv_len))  # (B, T, S)
    mask = (committed[:, None, :] | (in_scratch[:, None, :] & scratch))[:, None]
    return Step(rows, slots, positions, mask, kv_len, contiguous_slice(host_rows))
