"""The ordered list of build stages. Adding a stage = one `Stage` in its own module + one line here."""

from __future__ import annotations

from builders.config import BuildConfig
from builders.pipeline import Stage


def stages_for(cfg: BuildConfig) -> list[Stage]:
    from builders.convert.stage import CONVERT_STAGE
    from builders.engine.stage import ENGINE_STAGE
    from builders.dynamo.stage import DYNAMO_STAGE, applies
    from builders.triton.stage import TRITON_STAGE

    return [CONVERT_STAGE, ENGINE_STAGE, TRITON_STAGE, *([DYNAMO_STAGE] if applies(cfg) else [])]
