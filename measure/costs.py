"""What a decoding step costs on this machine, and what it could cost at best.

- `forward_fns`: the target's forward with T new tokens after a context (KV cache, logits at the last position), the
  unit the verification of a T-node tree costs.
- `bounds`: the two roofs of such a forward. Memory: every weight is read once per forward, so it cannot take less
  than (bytes of the weights its products read) / (measured memory bandwidth). Compute: 2 * T * params FLOPs for the
  decoder layers (+ one lm_head row) cannot take less than that / (a large float32 GEMM's measured FLOP rate).
- `profile_cycles`: the parts of the speculative cycles of a generation (measure/profile.py `Laps`).
- `eagle_speedup`: what EAGLE buys over target-only decoding with the same engine (`make demo` prints it).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import torch

from core.laps import NO_LAPS, Laps
from engines.api import GenerationRequest, GenerationResult, ReferenceEngine, SamplingParams, aggregate_stats
from engines.linear import Linear
from engines.cache import KVCache, Rows
from engines.model import Llama
from engines.session import Session
from measure.profile import laps_for

K = TypeVar("K")


def median_s(fn: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ---- the roofs ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Machine:
    copy_bytes_per_s: float  # STREAM-copy convention: (bytes read + bytes written) / s
    read_bytes_per_s: float  # a reduction over a buffer: bytes read / s
    gemm_flops: float  # FLOP/s of a large square matmul in the dtype the engine's products run in


def measure_machine(device: torch.device, gemm_dtype: torch.dtype = torch.float32, mib: int = 256,
                    repeats: int = 5) -> Machine:
    """Memory bandwidth of a large copy and a large read, and a large GEMM's FLOP rate in `gemm_dtype` (the dtype
    the products run in: engines/linear.py `layout_for`), on `device`."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    n = mib * 2**20 // 4
    a, b = torch.ones(n, device=device), torch.empty(n, device=device)

    def timed(fn: Callable[[], object]) -> float:
        return median_s(lambda: (fn(), sync()), repeats)

    copy = 2 * 4 * n / timed(lambda: b.copy_(a))
    read = 4 * n / timed(lambda: a.sum())
    m = 2048 if device.type == "cpu" else 8192
    x = torch.randn(m, m, device=device).to(gemm_dtype)
    flops = 2 * m**3 / timed(lambda: x @ x)
    return Machine(copy, read, flops)


def linears_of(target: Llama) -> tuple[list[Linear], Linear]:
    """The decoder layers' linears and the lm_head's."""
    out: list[Linear] = []
    for layer in target.layers:
        mlp = layer.mlp
        out += [layer.attn.qkv, layer.attn.dense, mlp.proj]
        out += [mlp.fc_gate] if mlp.fc_gate is not None else [x for x in (mlp.fc, mlp.gate) if x is not None]
    return out, target.lm_head.linear


def weight_bytes(target: Llama) -> int:
    """Bytes of weights one target forward reads (every layer product and one lm_head product), in the layout its
    products use (engines/linear.py: float32 for the float32-kernel layout, as stored for the bf16 panels)."""
    layers, head = linears_of(target)
    return sum(lin.weight.numel() * lin.weight.element_size() for lin in layers + [head])


def forward_flops(target: Llama, t: int) -> float:
    """2 * T * params of the decoder layers' products + 2 * params of one lm_head row (logits at the last position)."""
    layers, head = linears_of(target)
    return 2.0 * t * sum(lin.weight.numel() for lin in layers) + 2.0 * head.weight.numel()


@dataclass(frozen=True)
class Bounds:
    memory_copy_s: float  # weight bytes / copy bandwidth
    memory_read_s: float  # weight bytes / read bandwidth
    compute_s: float  # FLOPs / GEMM rate

    @property
    def roof_s(self) -> float:
        """The larger of the compute bound and the (faster-bandwidth) memory bound: no forward can beat it."""
        return max(self.compute_s, min(self.memory_copy_s, self.memory_read_s))


def bounds(target: Llama, t: int, machine: Machine) -> Bounds:
    wb = weight_bytes(target)
    return Bounds(
        wb / machine.copy_bytes_per_s, wb / machine.read_bytes_per_s, forward_flops(target, t) / machine.gemm_flops
    )


# ---- the forward ----------------------------------------------------------------------------------------------------


def interleaved_ms(fns: Mapping[K, Callable[[], object]], repeats: int) -> dict[K, float]:
    """Median wall ms of each function, called round-robin (one call each per round, after one warm-up round) so
    that a change of load on a shared machine reaches every function alike."""
    times: dict[K, list[float]] = {k: [] for k in fns}
    for r in range(repeats + 1):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            if r:
                times[k].append(time.perf_counter() - t0)
    return {k: 1e3 * statistics.median(v) for k, v in times.items()}


def forward_fns(target: Llama, dtype: torch.dtype, device: torch.device, ts: list[int], context: int = 200,
                seed: int = 0) -> dict[int, Callable[[], None]]:
    """For each T in `ts`: one target forward with T new tokens (causal among themselves) after `context` cached
    tokens, plus the lm_head at the last position. One sequence; each call overwrites the same cache slots."""
    g = torch.Generator().manual_seed(seed)
    vocab = target.lm_head.vocab_size
    cache = KVCache.allocate(
        len(target.layers), 1, context + max(ts) + 1, target.kv_heads, target.head_dim, dtype, device
    )
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with torch.inference_mode():
        prompt = torch.randint(0, vocab, (1, context), generator=g).to(device)
        causal = torch.ones(context, context, dtype=torch.bool, device=device).tril()[None]
        target.forward(
            prompt, Rows.of([0], [0], device).step(torch.arange(context, device=device)[None], causal), cache
        )
    rows = Rows.of([0], [context], device)

    def make(t: int) -> Callable[[], None]:
        tokens = torch.randint(0, vocab, (1, t), generator=g).to(device)
        visible = torch.ones(t, t, dtype=torch.bool, device=device).tril()[None]
        positions = (context + torch.arange(t, device=device))[None]

        @torch.inference_mode()
        def one() -> None:
            hidden, _ = target.forward(tokens, rows.step(positions, visible), cache)
            target.lm_head(hidden[:, -1])
            sync()

        return one

    return {t: make(t) for t in ts}


# ---- the cycle ------------------------------------------------------------------------------------------------------


@dataclass
class CycleProfile:
    laps: Laps  # parts summed over every speculative step
    prefill_s: float  # wall time of the prefill steps
    decode_s: float  # wall time of the decoding steps, measured around each `Session.step()` call
    tokens: int  # tokens generated by the decoding steps (the prefill's first token of each request excluded)
    results: list[GenerationResult]

    def per_cycle_ms(self) -> dict[str, float]:
        return self.laps.per_step_ms()


def profile_cycles(session: Session, requests: list[GenerationRequest], laps: Laps | None = None) -> CycleProfile:
    """Decode `requests` in `session` (with room for all of them), `laps` (default: `laps_for`, which
    synchronizes CUDA at every mark) on for the decoding steps. Returns the parts of every speculative step, the wall
    time of the prefill and of the decoding steps measured outside, and the results."""
    laps = laps_for(session.rt.device) if laps is None else laps
    slots = [session.add(r) for r in requests]
    t0 = time.perf_counter()
    while session.pending:
        session.step()
    prefill = time.perf_counter() - t0
    first = sum(len(session.slot(i).out) for i in slots)
    session.laps = laps
    decode = 0.0
    try:
        while not session.done:
            t0 = time.perf_counter()
            session.step()
            decode += time.perf_counter() - t0
    finally:
        session.laps = NO_LAPS
    tokens = sum(len(session.slot(i).out) for i in slots) - first
    return CycleProfile(laps, prefill, decode, tokens, [session.pop(i) for i in slots])


# ---- what EAGLE buys ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Speedup:
    eagle_tps: float
    target_tps: float
    tau: float
    identical: int  # prompts whose EAGLE output equals target-only decoding's
    prompts: int

    @property
    def ratio(self) -> float:
        return self.eagle_tps / self.target_tps


def eagle_speedup(engine: ReferenceEngine, prompts: list[list[int]], max_new_tokens: int, eos: list[int]) -> Speedup:
    """Greedy tokens/s of EAGLE and of target-only decoding with the same engine on the same prompts, one prompt at
    a time, the two decodings of a prompt back to back (a change of load reaches both alike)."""
    if not engine.has_draft:
        raise ValueError("the engine has no EAGLE head: nothing to compare target-only decoding with")
    secs = {True: 0.0, False: 0.0}
    toks = {True: 0, False: 0}
    outs: dict[bool, list[list[int]]] = {True: [], False: []}
    stats = []
    for ids in prompts:
        for spec in (False, True):
            t0 = time.perf_counter()
            [r] = engine.generate([GenerationRequest(ids, max_new_tokens, SamplingParams(), eos)], speculative=spec)
            secs[spec] += time.perf_counter() - t0
            toks[spec] += len(r.output_ids)
            outs[spec].append(r.output_ids)
            if spec:
                stats.append(r.stats)
    same = sum(a == b for a, b in zip(outs[True], outs[False]))
    return Speedup(toks[True] / secs[True], toks[False] / secs[False], aggregate_stats(stats).tau, same, len(prompts))
