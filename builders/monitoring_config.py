"""The `monitoring` section of the build config: the acceptance baseline the build measures and the thresholds of
the Prometheus alerts it writes (builders/monitoring/). Its own module so builders.monitoring can import the config
without a cycle."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, PositiveInt


class MonitoringConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    calibration_prompts: str | None = Field(
        default=None,
        description="JSONL prompt file (`prompt` or MT-bench `turns` per line; relative to the config file) the "
        "build decodes to measure the acceptance baseline (tau and per-position acceptance), written into the Triton "
        "repository and exported by the server as eagle_llm_baseline_* gauges. Unset: no baseline (the drift alerts "
        "stay silent). Needs engine.backend=reference (the reference engine measures acceptance).",
    )
    calibration_limit: PositiveInt | None = Field(
        default=None, description="Decode only the first N calibration prompts (unset: all of them).")
    calibration_max_new_tokens: PositiveInt = Field(
        default=64, description="Tokens generated per calibration prompt (greedy).")
    tau_drop_fraction: float = Field(
        default=0.2, gt=0, lt=1,
        description="EagleTauBelowBaseline fires when live tau < baseline tau x (1 - this) over `window`.")
    position_collapse_fraction: float = Field(
        default=0.5, gt=0, lt=1,
        description="EaglePositionAcceptanceCollapsed fires when one position's live acceptance < its baseline x "
        "(1 - this) over `window`.")
    window: str = Field(
        default="10m", pattern=r"^[0-9]+(ms|s|m|h)$",
        description="Prometheus range the live rates are taken over (recording rules), e.g. 10m.")
    alert_for: str = Field(
        default="10m", pattern=r"^[0-9]+(ms|s|m|h)$",
        description="How long a condition must hold before its alert fires (the rules' `for`).")
