"""Tensor parallelism for the reference engine: torch.distributed collectives and a two-process CPU launcher.

Every rank runs the same decoding loop on its shard of the weights (TRT-LLM's Megatron-style split, see
builders/convert): column-parallel layers (qkv, mlp fc/gate, lm_head) produce a slice of the output features,
row-parallel layers (attention dense, mlp proj) produce partial sums that are all-reduced. The lm_head slices are
all-gathered, so every rank sees the same full logits and takes the same decisions (sampling uses per-request
generators seeded identically on every rank).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TPGroup:
    rank: int
    size: int

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.size > 1:
            dist.all_reduce(x)
        return x

    def broadcast_ints(self, values: list[int]) -> list[int]:
        """Rank 0's values on every rank (e.g. random seeds, which must agree for ranks to take the same path)."""
        if self.size == 1:
            return values
        t = torch.tensor(values, dtype=torch.int64)
        dist.broadcast(t, src=0)
        return [int(v) for v in t.tolist()]

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate each rank's slice along the last dim (rank order)."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)


def current_group(tp_size: int) -> TPGroup:
    """The TP group for a checkpoint of `tp_size` ranks; tp>1 needs an initialized process group of that size."""
    if tp_size == 1:
        return TPGroup(0, 1)
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            f"this checkpoint has tp_size={tp_size}: load it in each of {tp_size} processes of an initialized "
            "torch.distributed group (e.g. `torchrun --nproc-per-node "
            f"{tp_size} ...` or engines.parallel.spawn), or convert with parallel.tp=1"
        )
    if dist.get_world_size() != tp_size:
        raise RuntimeError(
            f"checkpoint tp_size={tp_size} but torch.distributed world size is {dist.get_world_size()}; "
            f"launch exactly {tp_size} processes"
        )
    return TPGroup(dist.get_rank(), tp_size)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world: int, port: int, fn: Callable[[int], Any], queue: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        queue.put((rank, fn(rank), None))
    except BaseException as e:  # report to the parent instead of hanging it
        queue.put((rank, None, f"{type(e).__name__}: {e}"))
    finally:
        dist.destroy_process_group()


def spawn(fn: Callable[[int], Any], world: int, timeout_s: float = 600.0) -> list[Any]:
    """Run `fn(rank)` in `world` CPU processes joined by a gloo group; return the results in rank order.

    `fn` must be picklable (a module-level function or functools.partial of one)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, fn, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors = []
    for _ in range(world):
        rank, value, err = queue.get(timeout=timeout_s)
        if err:
            errors.append(f"rank {rank}: {err}")
        results[rank] = value
    for p in procs:
        p.join(timeout=60)
    if errors:
        raise RuntimeError("tensor-parallel run failed: " + "; ".join(errors))
    return [results[r] for r in range(world)]
