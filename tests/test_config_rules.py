"""The build config's cross-field rules (builders/config.py CROSS_FIELD_RULES): a rule that reads a section which
failed its own validation is skipped (that section's field errors speak for it), and every other exception in a rule
is a bug that propagates instead of passing silently."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from builders import config
from builders.config import BuildConfig, ConfigError, load_config
from tests.test_config_cli import write_cfg


def _missing_attribute(cfg: BuildConfig) -> list[str]:
    return [str(cfg.engine.no_such_field)]  # type: ignore[attr-defined]


def _bad_key(cfg: BuildConfig) -> list[str]:
    return [{"a": 1}[cfg.engine.backend]]  # type: ignore[index]


def _bad_type(cfg: BuildConfig) -> list[str]:
    return [cfg.engine.max_batch_size + "x"]  # type: ignore[operator]


def _on_version(cfg: BuildConfig) -> list[str]:
    return [f"rule saw {cfg.version.key}"]


def _on_engine(cfg: BuildConfig) -> list[str]:
    return [f"rule saw engine.backend {cfg.engine.backend}"]


@pytest.mark.parametrize(("rule", "error"), [(_missing_attribute, AttributeError), (_bad_key, KeyError),
                                             (_bad_type, TypeError)])
@pytest.mark.parametrize("sets", [[], ["tree.choices=[[0], [9, 9, 9, 9, 9, 9]]", "parallel.tp=0"]])
def test_a_rule_with_a_bug_raises(rule: Callable[[BuildConfig], list[str]], error: type[Exception], sets: list[str],
                                  tiny_target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a valid config and on one with field errors (the partial config's pass) alike."""
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, "random", tmp_path / "out")
    monkeypatch.setattr(config, "CROSS_FIELD_RULES", (*config.CROSS_FIELD_RULES, rule))
    with pytest.raises(error):
        load_config(cfg, sets)


@pytest.mark.parametrize(("sets", "field_error", "rule_ran"), [
    (["engine.backend=vllm"], "engine.backend: Input should be", False),
    (["engine.max_batch_size=true"], "engine.max_batch_size: Input should be a valid integer", False),
    (["parallel.tp=0"], "parallel.tp: Input should be greater than or equal to 1", True),  # engine valid: it runs
    (["trtllm_version=1.3"], "trtllm_version=", True),
])
def test_a_rule_reading_an_invalid_section_is_skipped(sets: list[str], field_error: str, rule_ran: bool,
                                                      tiny_target: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, "random", tmp_path / "out")
    monkeypatch.setattr(config, "CROSS_FIELD_RULES", (*config.CROSS_FIELD_RULES, _on_engine))
    with pytest.raises(ConfigError) as e:
        load_config(cfg, sets)
    assert any(field_error in p for p in e.value.problems), e.value.problems
    assert ("rule saw engine.backend reference" in e.value.problems) is rule_ran, e.value.problems


@pytest.mark.parametrize(("sets", "seen"), [(["trtllm_version=1.3"], None), (["trtllm_version=[1]"], None),
                                            (["parallel.tp=0"], "rule saw 1.1")])
def test_a_rule_reading_an_invalid_version_is_skipped(sets: list[str], seen: str | None, tiny_target: Path,
                                                      tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, "random", tmp_path / "out")
    monkeypatch.setattr(config, "CROSS_FIELD_RULES", (*config.CROSS_FIELD_RULES, _on_version))
    with pytest.raises(ConfigError) as e:
        load_config(cfg, sets)
    assert [p for p in e.value.problems if p.startswith("rule saw")] == ([seen] if seen else [])
