"""What a decoding step costs with each candidate tree on this device (the `speed` objective of measure/tune_tree.py).

A step's wall time is measured around `Session.step()` (measure/costs.py `profile_cycles`), the prefill excluded, and
divided by the target forwards it made: one per step, each verifying the whole tree. The candidates and target-only
decoding run round-robin, `rounds` times over the same prompts, so a change of load on a shared machine reaches them
alike. The prompts only need to be real text: a step's cost depends on the tree's shape and the context length, little
on which drafts are accepted.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TypeVar

from tqdm import tqdm

from core.laps import NO_LAPS
from engines.api import GenerationRequest, ReferenceEngine, SamplingParams
from measure.costs import profile_cycles

K = TypeVar("K", bound=Hashable)


def step_ms(
    engines: dict[K, tuple[ReferenceEngine, bool]],
    prompts: list[list[int]],
    max_new_tokens: int,
    eos: list[int],
    rounds: int,
) -> dict[K, float]:
    """Wall ms per decoding step of each `(engine, speculative)`, over `rounds` round-robin passes of `prompts`."""
    if rounds < 1 or not prompts:
        raise ValueError(f"need at least one round and one prompt (rounds={rounds}, prompts={len(prompts)})")
    seconds = {k: 0.0 for k in engines}
    steps = {k: 0 for k in engines}
    with tqdm(total=rounds * len(engines) * len(prompts), desc="step costs", unit="run") as bar:
        for _ in range(rounds):
            for k, (engine, speculative) in engines.items():
                for ids in prompts:
                    session = engine.session(capacity=1, max_len=len(ids) + max_new_tokens, speculative=speculative)
                    req = GenerationRequest(ids, max_new_tokens, SamplingParams(), eos)
                    prof = profile_cycles(session, [req], NO_LAPS)
                    seconds[k] += prof.decode_s
                    steps[k] += sum(r.stats.target_forwards for r in prof.results)
                    bar.update()
    for k, n in steps.items():
        if n == 0:
            raise ValueError(f"{k}: no decoding step was made (every prompt stopped at its first token); "
                             "use longer prompts or more --max-new-tokens")
    return {k: 1e3 * seconds[k] / steps[k] for k in engines}
