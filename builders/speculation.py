"""Load-aware speculation in the build config: `tree.draft_len_schedule` (or `auto`), `tree.max_concurrency` and the
acceptance-rate switch; their rules, the measured schedule file of `auto`, and the LLM API keys they become.

The fields are TensorRT-LLM's DecodingBaseConfig fields (tensorrt_llm/llmapi/llm_args.py; the Eagle3DecodingConfig
API reference of each release; PR #10860), cited per version in ledger/llmapi.py. Their runtime
semantics live in engines/schedule.py, which the reference engine follows step by step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator

from core import trees

PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
Schedule = dict[int, int] | Literal["auto"] | None  # a mapping, `auto`, or unset (values: schedule_problems)


class LoadAwareFields(BaseModel):
    """The `tree` section's load-aware speculation fields (builders/config.py TreeConfig inherits them)."""

    draft_len_schedule: Schedule = Field(
        default=None,
        description="Load-aware speculation: batch-size threshold -> draft length (tree levels) per step. A step of B "
        "sequences drafts the length of the smallest threshold >= B; above the largest one it drafts nothing "
        "(speculation off). Must hold 1: <tree depth>. `auto` = the schedule measured by `python "
        "measure/tune_tree.py --objective schedule --json FILE` (give FILE in tree.schedule_file). Written as "
        "speculative_config.draft_len_schedule for the versions that have it (1.4); the reference engine follows it "
        "on every version. Ours on trtllm_version 1.1/1.2: TensorRT-LLM has no such field there (the engine flow's "
        "C++ runtime drafts the whole tree at every batch size), so there it is the reference engine's own "
        "behaviour, not upstream's. None = always the whole tree.",
    )
    schedule_file: str | None = Field(
        default=None,
        description="With draft_len_schedule: auto, the tune_tree.py --json output holding the measured schedule. "
        "Relative paths are relative to the config file.",
    )
    max_concurrency: PositiveInt | None = Field(
        default=None,
        description="No speculation when more than this many sequences decode together (TensorRT-LLM 1.4 turns it "
        "into {N: max_draft_len}); exclusive with draft_len_schedule. Ours on trtllm_version 1.1/1.2: TensorRT-LLM "
        "has no such field there, so on that line it is the reference engine's own behaviour. None = speculation "
        "at every batch size.",
    )
    acceptance_rate_window_size: NonNegativeInt | None = Field(
        default=None,
        description="Steps (that speculate) in the rolling window of acceptance rates (accepted / drafted tokens); "
        "set together with acceptance_rate_threshold (TensorRT-LLM 1.4's acceptance switch; ours on "
        "trtllm_version 1.1/1.2, where TensorRT-LLM has no such switch). None or 0 = no acceptance switch.",
    )
    acceptance_rate_threshold: float | None = Field(
        default=None, ge=0, le=1,
        description="Speculation turns off for good once the window's mean acceptance rate drops below this "
        "(TensorRT-LLM 1.4's switch; ours on trtllm_version 1.1/1.2).",
    )
    acceptance_switch_per_sequence: bool = Field(
        default=False,
        description="Ours, beyond TensorRT-LLM (engine.backend reference only): the acceptance window and threshold "
        "apply to each sequence on its own, so a sequence whose own acceptance is low stops drafting while the others "
        "keep drafting. False = TensorRT-LLM's one switch for the whole batch.",
    )

    @field_validator("draft_len_schedule", mode="before")
    @classmethod
    def _schedule_shape(cls, v: object) -> object:
        """A mapping of integers (keys written as strings, as JSON must, are read as integers) or `auto`."""
        if v is None or v == "auto":
            return v
        if isinstance(v, dict):
            out = {_int(k): _int(n) for k, n in v.items()}
            if None not in out and None not in out.values():
                return out
        raise ValueError(f"{v!r} is neither a mapping of batch-size thresholds to draft lengths (integers, e.g. "
                         "{1: 3, 2: 2, 4: 1}) nor `auto`")


def _int(x: object) -> int | None:
    if isinstance(x, int) and not isinstance(x, bool):
        return x
    if isinstance(x, str) and x.strip().lstrip("-").isdigit():
        return int(x)
    return None


SCHEDULE_KEY = "schedule"  # tune_tree.py --objective schedule --json: {"schedule": {"draft_len_schedule": {...}}}


def read_schedule(path: Path) -> dict[int, int]:
    """The measured schedule of a `tune_tree.py --objective schedule --json` file, sorted by threshold."""
    try:
        data = json.loads(path.read_text())
        raw = data[SCHEDULE_KEY]["draft_len_schedule"]
        schedule = {int(k): int(v) for k, v in raw.items()}
    except OSError as e:
        raise ValueError(f"cannot read it ({e.strerror}); write it with `python measure/tune_tree.py --objective "
                         "schedule --json FILE`") from None
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ValueError("not a `tune_tree.py --objective schedule --json` file (no schedule.draft_len_schedule "
                         "mapping of integers); rerun the tuner with --objective schedule") from None
    return dict(sorted(schedule.items()))


def speculation_problems(cfg: Any) -> list[str]:  # a builders.config.BuildConfig (no import: no cycle)
    """draft_len_schedule / max_concurrency / the acceptance switch, as TensorRT-LLM validates them
    (DecodingBaseConfig.validate_draft_len_schedule_and_sort and the max_concurrency validator in
    tensorrt_llm/llmapi/llm_args.py; docs/contracts.md)."""
    t = cfg.tree
    p: list[str] = []
    if t.draft_len_schedule == "auto" and t.schedule_file is None:
        p.append("tree.draft_len_schedule=auto needs tree.schedule_file: the --json output of `python "
                 "measure/tune_tree.py --build BUILD --prompts FILE --objective schedule --json FILE`")
    if t.schedule_file is not None and t.draft_len_schedule != "auto":
        p.append(f"tree.schedule_file={t.schedule_file!r} is read only with tree.draft_len_schedule: auto; set it or "
                 "remove tree.schedule_file")
    if t.draft_len_schedule is not None and t.max_concurrency is not None:
        p.append(f"tree.max_concurrency={t.max_concurrency} and tree.draft_len_schedule are mutually exclusive "
                 "(TensorRT-LLM refuses both); a schedule already turns speculation off above its largest threshold")
    window, threshold = t.acceptance_rate_window_size, t.acceptance_rate_threshold
    if (threshold is None) != (not window):
        p.append(f"tree.acceptance_rate_window_size={window} and tree.acceptance_rate_threshold={threshold}: set both "
                 "(a window of N >= 1 steps and a rate in [0, 1]) or neither")
    if t.max_concurrency is not None and t.max_concurrency > cfg.engine.max_batch_size:
        p.append(f"tree.max_concurrency={t.max_concurrency} exceeds engine.max_batch_size={cfg.engine.max_batch_size}: "
                 "no batch is ever that large, so speculation would never turn off; lower it or remove it")
    if t.acceptance_switch_per_sequence:
        if not window or threshold is None:
            p.append("tree.acceptance_switch_per_sequence needs tree.acceptance_rate_window_size and "
                     "tree.acceptance_rate_threshold (the window and threshold each sequence applies to itself)")
        if not cfg.engine.kind.reference_engine:
            p.append(f"tree.acceptance_switch_per_sequence is ours (the reference engine's), not TensorRT-LLM's: "
                     f"engine.backend {cfg.engine.backend} has only the switch for the whole batch; set it false")
    if t.draft_len_schedule is None or (t.draft_len_schedule == "auto" and t.schedule_file is None):
        return p
    try:
        depth = cfg.draft_tree.depth
    except (trees.TreeError, AssertionError, AttributeError):
        return p  # the tree rule reports it
    try:
        schedule = cfg.draft_len_schedule()
    except (OSError, ValueError) as e:
        return [*p, f"tree.schedule_file={t.schedule_file!r}: {e}"]
    assert schedule is not None
    p += schedule_problems(schedule, depth)
    top = cfg.engine.max_batch_size
    if unreachable := sorted(b for b in schedule if b > top):
        p.append(f"tree.draft_len_schedule={schedule}: thresholds {unreachable} exceed engine.max_batch_size={top}; "
                 "no batch is ever that large, so they would never apply: remove them (or raise "
                 "engine.max_batch_size)")
    return p


def schedule_problems(schedule: dict[int, int], depth: int) -> list[str]:
    """A schedule TensorRT-LLM accepts: thresholds >= 1 including 1, lengths 0..max_draft_len (= the tree depth),
    the smallest threshold's length = max_draft_len."""
    where = f"tree.draft_len_schedule={schedule}"
    if not schedule:
        return [f"{where}: give at least {{1: {depth}}}"]
    p = []
    if min(schedule) < 1 or min(schedule.values()) < 0:
        p.append(f"{where}: thresholds must be >= 1 and draft lengths >= 0")
    if 1 not in schedule:
        p.append(f"{where}: must hold batch size 1 (TensorRT-LLM requires it); add 1: {depth}")
    elif schedule[1] != depth:
        p.append(f"{where}: the length at batch size 1 must be max_draft_len = the tree depth {depth} (TensorRT-LLM "
                 f"requires it); set 1: {depth}, or change the tree")
    over = {b: n for b, n in schedule.items() if n > depth}
    if over:
        p.append(f"{where}: lengths {over} exceed max_draft_len = the tree depth {depth}; lower them")
    return p
