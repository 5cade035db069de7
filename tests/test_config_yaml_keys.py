"""A key written twice in one YAML mapping is refused by both config loaders (core/config_input.py `_UniqueKeys`):
PyYAML would keep the last value silently. Merge keys (`<<: *base`) and a key overriding a merged one still load."""

from __future__ import annotations

from pathlib import Path

import pytest

from builders import build
from core.config_input import ConfigError, load_yaml
from tests.test_config_cli import write_cfg
from training.config import load_train_config

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("text", "says"), [
    ("name: a\nname: b\n", "duplicate key 'name' at line 2 (first at line 1)"),
    ("engine:\n  max_batch_size: 4\n  max_batch_size: 64\n", "duplicate key 'max_batch_size' at line 3 (first at "
                                                              "line 2)"),
    ("tree: {choices: chain-3, choices: chain-4}\n", "duplicate key 'choices' at line 1 (first at line 1)"),
    ("engine: {}\nname: x\nengine:\n  backend: reference\n", "duplicate key 'engine' at line 3 (first at line 1)"),
    ("a: 1\n1: x\n'1': y\nb: [{k: 1, k: 2}]\n", "duplicate key 'k' at line 4"),
])
def test_duplicate_keys_are_refused_naming_both_lines(text: str, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_yaml(text, "c.yaml")
    assert says in str(e.value) and "the later value would silently replace the earlier one; keep one" in str(e.value)


def test_merge_keys_and_overrides_of_merged_keys_still_load() -> None:
    data = load_yaml("base: &b {x: 1, y: 2}\nother:\n  <<: *b\n  y: 3\nints: {1: a, '1': b}\n", "c.yaml")
    assert data["other"] == {"x": 1, "y": 3} and data["ints"] == {1: "a", "1": "b"}


def test_the_build_cli_refuses_a_second_section(tiny_target: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, "random", tmp_path / "out")
    cfg.write_text(cfg.read_text() + "engine:\n  backend: tensorrt\n")
    assert build.main([str(cfg), "--dry-run"]) == 2
    assert "duplicate key 'engine' at line" in capsys.readouterr().err


def test_the_trainer_refuses_duplicate_keys_and_so_does_set(tmp_path: Path) -> None:
    text = (REPO / "configs" / "train" / "smollm2-eagle.yaml").read_text()
    text = text.replace("turns: first", "turns: first\n  offset: 5")
    cfg = tmp_path / "t.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match="duplicate key 'offset' at line"):
        load_train_config(cfg)
    with pytest.raises(ConfigError, match="--set 'name={a: 1, a: 2}': duplicate key 'a' at line 1"):
        build.load_config(str(REPO / "configs" / "demo.yaml"), ["name={a: 1, a: 2}"])
