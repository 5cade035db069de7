"""The refresh's gate by replay (docs/adaptive.md, "The gate"): both heads' figures on the held-out captured requests
replayed from the features the refresh computed (measure/replay.py), losslessness checked on the reference engine
for a few of them, and the doctor's verdict rules (doctor/gate.py: healthy, lossless, better by a margin).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from adaptive.dataset import Captured
from measure.replay import Replayable, Runtime, lossless_check, replay_stats, runtime_for


def replayable(records: list[Captured], aux: list[torch.Tensor], max_input_len: int) -> tuple[list[Replayable], int]:
    """(the greedy requests that fit, how many were left out). aux[i] holds the features of records[i]'s prompt +
    output (cut to the refresh's max_seq_len: the output is cut with it)."""
    out, left = [], 0
    for c, a in zip(records, aux):
        n_out = min(len(c.output_ids), a.shape[0] - len(c.prompt_ids))
        if not c.greedy or len(c.prompt_ids) > max_input_len or n_out < 1:
            left += 1
            continue
        out.append(Replayable(c.prompt_ids, c.output_ids[:n_out], a))
    return out, left


def replay_figures(rt: Runtime, requests: list[Replayable], max_new_tokens: int, eos: list[int]) -> dict[str, Any]:
    """The gate's figures (builders/monitoring/baseline.py summary) of rt's head on `requests`, replayed."""
    from builders.monitoring.baseline import summary

    s = replay_stats(rt, requests, max_new_tokens, eos)
    return summary(s.target_forwards, s.accepted_draft_tokens, s.draft_tokens, list(s.acceptance_by_depth))


def replay_gate(build_dir: Path, current: Path, candidate: Path, records: list[Captured], aux: list[torch.Tensor],
                *, margin: float, max_new_tokens: int, engine_requests: int) -> dict[str, Any]:
    """The gate's verdict (doctor/gate.py, same keys) with both heads' figures replayed on the held-out
    requests and losslessness checked on the engine for the first `engine_requests` of them."""
    import tempfile

    from doctor.findings import UnusableInput
    from doctor.gate import healthy_findings, normalize, verdict
    from engines.api import ReferenceEngine

    problems = healthy_findings(build_dir, candidate)
    with tempfile.TemporaryDirectory(prefix="gate-") as tmp:
        rt = runtime_for(build_dir, normalize(current, build_dir, Path(tmp) / "current"))
        limits, tok = ReferenceEngine(rt).limits, rt.tokenizer
        n = max(1, min(max_new_tokens, limits.max_seq_len - limits.max_input_len))
        eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
        reqs, left = replayable(records, aux, limits.max_input_len)
        if not reqs:
            raise UnusableInput(f"none of the {len(records)} held-out requests is greedy with a prompt of at most "
                                f"{limits.max_input_len} tokens: nothing to replay (refresh.gate: engine measures "
                                "sampled requests too)")
        f_cur = replay_figures(rt, reqs, n, eos)
        del rt
        rt = runtime_for(build_dir, normalize(candidate, build_dir, Path(tmp) / "candidate"))
        f_cand = replay_figures(rt, reqs, n, eos)
        checked = reqs[:engine_requests]
        lossless, reproduced = lossless_check(rt, checked, n, eos)
    return verdict(problems, lossless, f_cur, f_cand, current, candidate, margin=margin) | {
        "requests": len(reqs), "max_new_tokens": n, "method": "replay", "left_out": left,
        "lossless_requests": len(checked), "captured_greedy": len(checked), "captured_outputs_reproduced": reproduced}
