"""EAGLE-3 capture layers by default (core/hfconfig.py eagle3_default_layer_ids): TensorRT-LLM's own default where it
has one, distinct layers inside the target at every depth, and the trainer filling `eagle3.layer_ids` from the
target it loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from builders.trtllm.rules import default_capture
from core.hfconfig import eagle3_default_layer_ids
from training.config import load_train_config, with_layer_ids

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("layers", range(1, 130))
def test_distinct_layers_inside_the_target_at_every_depth(layers: int) -> None:
    ids = eagle3_default_layer_ids(layers)
    assert len(set(ids)) == len(ids) == min(layers, 3) and all(0 <= j < layers for j in ids)
    if layers >= 7:  # TensorRT-LLM's (1, L//2 - 1, L - 4), counted as layer outputs: id j = output of layer j - 1
        assert [j - 1 for j in ids] == default_capture(layers)


def test_the_shipped_recipes_name_the_default_for_their_targets() -> None:
    assert eagle3_default_layer_ids(30) == [2, 15, 27]  # SmolLM2-135M: configs/train/smollm2-eagle3.yaml
    assert eagle3_default_layer_ids(32) == [2, 16, 29]  # Llama-3.1-8B
    assert eagle3_default_layer_ids(36) == [2, 18, 33]  # Qwen3-8B
    assert eagle3_default_layer_ids(4) == [1, 2, 3]  # not [2, 2, 1]
    assert eagle3_default_layer_ids(6) == [1, 3, 5]  # upstream's would repeat a layer ({1, 2, 2})
    with pytest.raises(ValueError, match="at least one decoder layer"):
        eagle3_default_layer_ids(0)


def test_the_trainer_fills_layer_ids_from_the_target(tmp_path: Path) -> None:
    text = (REPO / "configs/train/smollm2-eagle3.yaml").read_text()
    lines = [line for line in text.splitlines() if not line.strip().startswith("layer_ids:")]
    cfg_file = tmp_path / "t.yaml"
    cfg_file.write_text("\n".join(lines) + "\n")  # the recipe without its layer_ids (paths need not exist here)
    cfg = load_train_config(cfg_file)
    assert cfg.eagle3 is not None and cfg.eagle3.layer_ids is None
    for layers, want in ((4, [1, 2, 3]), (30, [2, 15, 27])):
        got, note = with_layer_ids(cfg, layers)
        assert got.eagle3 is not None and got.eagle3.layer_ids == want
        assert note is not None and note.startswith(f"eagle3.layer_ids: {want} for this {layers}-layer target")
    explicit = load_train_config(REPO / "configs/train/smollm2-eagle3.yaml")
    assert with_layer_ids(explicit, 4) == (explicit, None)  # a config that names them keeps them
