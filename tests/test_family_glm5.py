"""GLM-5 (GlmMoeDsaForCausalLM): which layers carry a sparse-attention indexer is read as transformers' GlmMoeDsaConfig
reads it (`indexer_types`, else `index_topk_pattern`, else `index_topk_freq` / `index_skip_topk_offset`), so a
published config without the explicit list is sized with the indexers transformers builds for it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from core.shapes import ShapeError, shape_of_config
from testkit.tiny_families import make_family_target

pytestmark = pytest.mark.usefixtures("one_thread")


def _without_list(cfg: dict[str, Any], **keys: Any) -> dict[str, Any]:
    out = {k: v for k, v in cfg.items() if k != "indexer_types"}
    out.update(keys)
    return out


@pytest.mark.parametrize("keys", [dict(index_topk_pattern="FSFSF"), dict(index_topk_pattern=list("FFSSF")),
                                  dict(index_topk_freq=2, index_skip_topk_offset=1),
                                  dict(index_topk_freq=4, index_skip_topk_offset=3), {}],
                         ids=["pattern", "pattern-list", "freq-2", "freq-4", "defaults"])
def test_indexer_layers_are_the_ones_transformers_builds(keys: dict[str, Any], tmp_path: Path) -> None:
    from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM

    target = make_family_target(tmp_path / "t", "glm_moe_dsa", layers=5, tokenizer=False)
    cfg = json.loads((target / "config.json").read_text())
    keys = {k: ("".join(v) if k == "index_topk_pattern" and isinstance(v, list) else v) for k, v in keys.items()}
    derived = _without_list(cfg, **keys)
    hf_cfg = GlmMoeDsaConfig(**{k: v for k, v in derived.items() if k != "transformers_version"})
    model = GlmMoeDsaForCausalLM(hf_cfg)
    elements = sum(p.numel() for p in model.state_dict().values())
    indexers = sum(1 for layer in model.model.layers if layer.self_attn.indexer is not None)
    shape = shape_of_config(derived, "x")
    assert shape.params == elements, (keys, hf_cfg.indexer_types)
    # KV per token: every layer's MLA latents + index_head_dim keys for each layer that runs its own indexer
    assert shape.kv_per_token == 5 * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) + indexers * cfg["index_head_dim"]
    # the tiny model written by transformers carries the explicit list, which is read as it stands
    assert shape_of_config(cfg, "x").params == sum(t.numel() for t in load_file(str(target / "model.safetensors"))
                                                   .values())


def test_an_indexer_list_of_the_wrong_length_is_named() -> None:
    cfg = {"architectures": ["GlmMoeDsaForCausalLM"], "vocab_size": 8, "hidden_size": 8, "num_hidden_layers": 2,
           "num_attention_heads": 2, "kv_lora_rank": 4, "qk_rope_head_dim": 2, "qk_nope_head_dim": 2,
           "v_head_dim": 2, "q_lora_rank": 4, "index_n_heads": 2, "index_head_dim": 2, "intermediate_size": 8,
           "first_k_dense_replace": 2, "indexer_types": ["full"]}
    with pytest.raises(ShapeError, match=r"x: GlmMoeDsaForCausalLM: indexer_types must give 'full' or 'shared' "
                                         r"for each of the 2 layers, got \['full'\]"):
        shape_of_config(cfg, "x")
