"""Data-parallel training under torchrun: process group, ranks, and the one rule that makes N ranks equal 1.

`torchrun --nproc-per-node N training/train_head.py CONFIG` starts N processes with RANK / WORLD_SIZE /
LOCAL_RANK / LOCAL_WORLD_SIZE set; `init_dist` joins them (NCCL between GPUs, gloo between CPU processes). Without
torchrun it is one process (world 1, no process group).

Equal to one process: every rank draws the same global batch of step s (the order depends on the seed and the
epoch only), takes every world-th example of it, and normalizes its loss by the GLOBAL counts (loss positions of
the whole batch, known to every rank from the small data shards). Rank r's loss L_r then sums over ranks to the
one-process loss, and since DDP averages gradients, each rank back-propagates world * L_r. Random draws (feature
noise, loss-position subsets) are keyed by step and example, never by rank. So the head after step s is the
one-process head up to float summation order, whatever the number of ranks, and a checkpoint resumes under any
number of ranks.
"""

from __future__ import annotations

import os
from typing import Any
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as tdist

# Waits at a barrier cover another rank's longest single piece of work (one shard of features or answers, one
# held-out evaluation on rank 0); the 10-minute default of NCCL is shorter than one shard of a 70B target.
BARRIER_TIMEOUT = timedelta(hours=2)


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            tdist.barrier()

    def all_sum(self, values: dict[str, float], device: torch.device) -> dict[str, float]:
        """Sum each value over ranks (every rank passes the same keys)."""
        if self.world == 1:
            return dict(values)
        keys = sorted(values)
        t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=device)
        tdist.all_reduce(t)
        return dict(zip(keys, t.tolist()))

    def share(self, indices: list[int]) -> list[int]:
        """This rank's examples of a global batch (every world-th; ranks past the batch's end get none)."""
        return indices[self.rank :: self.world]


def env_dist() -> Dist:
    """Ranks from torchrun's environment (one process when WORLD_SIZE is unset)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    return Dist(rank, world, local_rank, local_world)


def init_dist(d: Dist, device: torch.device) -> None:
    """Join the process group: NCCL when this rank trains on a GPU, gloo on the CPU."""
    if d.world == 1 or tdist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs: dict[str, Any] = {"device_id": device} if device.type == "cuda" else {}
    tdist.init_process_group(backend, rank=d.rank, world_size=d.world, timeout=BARRIER_TIMEOUT, **kwargs)


def close_dist(d: Dist) -> None:
    if d.world > 1 and tdist.is_initialized():
        tdist.destroy_process_group()
