"""The EAGLE-3 head layouts the convert stage reads, as the one flat layout its checks and converter take.

vLLM's speculators layout (the `speculators` 0.9.0 package, speculators/models/eagle3: Eagle3SpeculatorConfig,
Eagle3DraftModel) nests the decoder layer's Llama keys in `transformer_layer_config` and keeps the EAGLE-3 keys
(`draft_vocab_size`, `target_hidden_size`, `eagle_aux_hidden_state_layer_ids`, the architecture switches) at the top;
its tensors are `layers.0.*`, which the converter renames to `midlayer.*` like any other spelling. Every other layout
the doctor reads (SafeAILab, SpecForge, ModelOpt, this project's) is already flat.

`flat_head(dir)` yields a directory the converter reads: the head itself when it is flat, else a temporary view of
it (the flat config.json beside links to the head's weight files: nothing is copied).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from core.hfconfig import read_config, rope_theta_of

SPECULATORS_KEY = "speculators_model_type"
# Architecture switches some producers set (a loader that does not implement one computes another network).
ARCH_FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


def is_speculators(raw: dict[str, Any]) -> bool:
    return raw.get(SPECULATORS_KEY) is not None


def speculators_flat(raw: dict[str, Any]) -> dict[str, Any]:
    """A speculators config as the flat Llama-style config the other layouts use."""
    cfg = dict(raw.get("transformer_layer_config") or {})
    for k in ("draft_vocab_size", "target_hidden_size", "eagle_aux_hidden_state_layer_ids"):
        if raw.get(k) is not None:
            cfg[k] = raw[k]
    # A switch that is off is the plain network, which a flat config states by leaving it out.
    cfg.update({k: raw[k] for k in ARCH_FLAGS if raw.get(k)})
    return cfg


def flat_config(raw: dict[str, Any], path: Path) -> dict[str, Any]:
    """speculators_flat plus what a flat EAGLE-3 head's config states: its class, one decoder layer and a top-level
    rope_theta (the nested config keeps it in rope_parameters)."""
    cfg = speculators_flat(raw)
    cfg.update(architectures=["LlamaForCausalLMEagle3"], num_hidden_layers=1)
    cfg["rope_theta"] = rope_theta_of(cfg, path)
    return cfg


@contextmanager
def flat_head(head_dir: Path) -> Iterator[Path]:
    """`head_dir` when its config is flat; for a speculators head, a temporary flat view of it (removed on exit)."""
    head_dir = Path(head_dir)
    raw = read_config(head_dir)
    if not is_speculators(raw):
        yield head_dir
        return
    with tempfile.TemporaryDirectory(prefix="eagle3-flat-") as tmp:
        view = Path(tmp) / head_dir.name
        view.mkdir()
        (view / "config.json").write_text(json.dumps(flat_config(raw, head_dir / "config.json"), indent=2) + "\n")
        for name in WEIGHT_FILES:
            if (head_dir / name).is_file():
                (view / name).symlink_to((head_dir / name).resolve())
        index = next((head_dir / n for n in WEIGHT_FILES if n.endswith(".json") and (head_dir / n).is_file()), None)
        if index is not None:  # the shards an index names
            for shard in sorted(set(json.loads(index.read_text()).get("weight_map", {}).values())):
                if not (view / shard).exists():
                    (view / shard).symlink_to((head_dir / shard).resolve())
        yield view


def named_as_given(text: str, view: Path, head_dir: Path) -> str:
    """A message about the flat view, naming the head directory the user gave instead of the temporary view."""
    return text.replace(str(view), f"{head_dir} (speculators layout)") if view != head_dir else text
