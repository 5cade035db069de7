"""core/kinds.py: one class per draft kind and per backend, chosen by the config's own fields; every value the
config accepts has its class, and the stages keyed by the class cover every backend."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest

from core import kinds
from builders.config import DraftConfig, EngineConfig, load_config
from builders.engine.stage import STEPS
from tests.deploy_files import _tensorrt_config


def test_every_accepted_value_has_its_class() -> None:
    assert set(kinds.BACKENDS) == set(get_args(EngineConfig.model_fields["backend"].annotation))
    assert set(kinds.DRAFT_KINDS) == set(get_args(DraftConfig.model_fields["type"].annotation))
    assert set(STEPS) == {type(b) for b in kinds.BACKENDS.values()}
    assert all(k.name == name for name, k in {**kinds.BACKENDS, **kinds.DRAFT_KINDS}.items())


@pytest.mark.parametrize("backend", ["tensorrt", "pytorch", "reference"])
def test_a_loaded_config_carries_its_kinds(tmp_path: Path, tiny_target: Path, eagle_head: Path, backend: str) -> None:
    kind = ["draft.type=eagle3", "trtllm_version='1.4'"] if backend == "pytorch" else []
    cfg = load_config(_tensorrt_config(tmp_path, tiny_target, eagle_head), [f"engine.backend={backend}", *kind])
    assert cfg.engine.kind is kinds.BACKENDS[backend] and cfg.draft.kind is kinds.DRAFT_KINDS[cfg.draft.type]
    assert "kind" not in cfg.model_dump()["engine"] and "kind" not in cfg.model_dump()["draft"]  # not a config field


def test_the_traits_that_decide_serving() -> None:
    t, p, r = (kinds.BACKENDS[n] for n in ("tensorrt", "pytorch", "reference"))
    assert [b.name for b in (t, p, r) if b.engine_flow] == ["tensorrt"] == [b.name for b in (t, p, r)
                                                                            if b.cpp_triton_model]
    assert (t.world_size(_Par(2, 2)), p.world_size(_Par(2, 2)), r.world_size(_Par(2, 1))) == (4, 1, 1)
    assert [b.name for b in (t, p, r) if b.runs_trtllm] == ["tensorrt", "pytorch"]
    assert (t.python_llm_model, p.python_llm_model, r.python_llm_model) == (None, "llmapi_llm.py", "reference_llm.py")
    assert r.parallel_problems(_Par(1, 2)) == ["parallel.pp=2: the reference engine runs tp only; set pp=1"]
    assert t.parallel_problems(_Par(1, 2)) == []


class _Par:
    def __init__(self, tp: int, pp: int) -> None:
        self.tp, self.pp = tp, pp
