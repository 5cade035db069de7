"""The acceptance baseline: the build decodes the calibration prompts of `monitoring.calibration_prompts` with the
reference engine (greedy, speculative, the build's tree) and writes tau and per-position acceptance to
`<triton_repo>/acceptance_baseline.json`; the served models export it as the eagle_llm_baseline_* gauges next to
the live counters (triton_repo/models/spec_metrics.py), and the drift alerts compare the two
(builders/monitoring/rules.py).

Prompts are tokenized as the served preprocessing model tokenizes text (the tokenizer's special tokens, no chat
template) and cut to engine.max_input_len tokens, so the baseline measures what the server will see for the same
text. Per-position acceptance p = accepted[p] / attempts[p] (spec_metrics.position_counts): the share of steps that
reached position p-1 whose path also reached p.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from builders.config import BuildConfig
from triton_repo.models.spec_metrics import BASELINE_FILE, position_counts


def config_problems(cfg: BuildConfig) -> list[str]:
    m = cfg.monitoring
    if m.calibration_prompts is None:
        return []
    p = []
    if not cfg.engine.kind.reference_engine:
        p.append(f"monitoring.calibration_prompts is set but engine.backend={cfg.engine.backend!r}: the baseline is "
                 "measured by the reference engine; build an engine.backend=reference twin of this config with the "
                 "prompts and copy its triton_repo/acceptance_baseline.json into this repository, or unset the field")
    if not Path(m.calibration_prompts).is_file():
        p.append(f"monitoring.calibration_prompts={m.calibration_prompts!r} does not exist; give a JSONL file with a "
                 "`prompt` or `turns` key per line")
    return p


def summary(target_forwards: int, accepted: int, drafted: int, by_depth: list[int]) -> dict[str, Any]:
    """tau and per-position acceptance from summed counters (what the served gauges carry)."""
    attempts, acc = position_counts(target_forwards, by_depth)
    return {
        "tau": 1.0 + accepted / target_forwards if target_forwards else 0.0,
        "position_acceptance": [a / n if n else 0.0 for a, n in zip(acc, attempts)],
        "target_forwards": target_forwards, "accepted_draft_tokens": accepted, "draft_tokens": drafted,
        "position_attempts": attempts, "position_accepted": acc,
    }


def measure(cfg: BuildConfig, build_dir: Path) -> dict[str, Any]:
    """Decode the calibration prompts with the build's reference engine; the baseline document."""
    from clients.prompts import load_prompts
    from engines.api import GenerationRequest, ReferenceEngine, SamplingParams

    m = cfg.monitoring
    assert m.calibration_prompts is not None
    prompts = load_prompts(Path(m.calibration_prompts))[: m.calibration_limit]
    engine = ReferenceEngine.from_build(build_dir)
    tok, limits = engine.tokenizer, engine.limits
    eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
    budget = min(m.calibration_max_new_tokens, limits.max_seq_len - limits.max_input_len)
    reqs = [GenerationRequest(tok.encode(p, add_special_tokens=True)[: limits.max_input_len], budget, SamplingParams(),
                              eos) for p in prompts]
    from builders.convert.fp8 import generate_with_progress  # batches of max_batch_size: greedy tokens do not depend
    # on the batch (engines.session)

    results = generate_with_progress(engine, reqs, f"acceptance baseline ({len(reqs)} calibration prompts x {budget} "
                                                   "tokens, reference engine)", limits.max_batch_size)
    agg = ReferenceEngine.aggregate(results)
    doc = summary(agg.target_forwards, agg.accepted_draft_tokens, agg.draft_tokens, agg.acceptance_by_depth)
    doc.update(prompts=str(m.calibration_prompts), num_prompts=len(prompts), max_new_tokens=budget,
               tree=engine.describe_tree())
    return doc


def write(cfg: BuildConfig, build_dir: Path, repo: Path) -> Path:
    f = repo / BASELINE_FILE
    f.write_text(json.dumps(measure(cfg, build_dir), indent=2) + "\n")
    return f
