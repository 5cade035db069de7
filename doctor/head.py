"""Reading a draft head in any known layout: its config, tensor names and shapes, draft type and producer layout.

Layouts (the markers each is recognized by; detection reports the markers it saw):
- EAGLE-1/2, SafeAILab/EAGLE (`eagle/model/cnets1.py` Model): `fc.weight` [H, 2H], `layers.{j}.*`, optional
  `embed_tokens.weight` / `fc.bias`; a Llama config.
- EAGLE-3, SafeAILab/EAGLE (`eagle/model/cnets.py` Model): `midlayer.*`, `fc.weight` [H, 3 Ht], own `norm` and
  `lm_head`, `d2t`/`t2d`; no captured layer ids in the config (the loader hard-codes them).
- EAGLE-3, SpecForge / ModelOpt: the same tensors, the layer ids inside an `eagle_config` block; ModelOpt's block
  also carries its architecture switches (`use_aux_hidden_state`, `use_input_layernorm_in_first_layer`, ...).
- EAGLE-3, vLLM speculators: `speculators_model_type: eagle3`, a nested `transformer_layer_config`, `layers.0.*`.
- EAGLE-3, this project (trainer export / TensorRT-LLM normalized head): top-level
  `eagle_aux_hidden_state_layer_ids` and `target_hidden_size`; the converter's output adds an `eagle_deploy` block.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from builders.convert.head_layout import ARCH_FLAGS, is_speculators, speculators_flat
from builders.convert.weights import WeightFileError, WeightSource
from doctor.findings import UnusableInput
from doctor.config_check import read_json_config
from core.draft_heads import mla_head_problem
from core.kinds import DRAFT_KINDS, DraftKind
from core.hfconfig import ModelConfigError, aux_layer_ids, rope_theta_of

EAGLE_CONFIG_FLAGS = {"use_aux_hidden_state": True, "norm_before_fc": False, "eh_proj_before_attn": False,
                      "return_hidden_post_norm": False}  # value = the plain EAGLE-3 network's
MODELOPT_KEYS = (
    "use_aux_hidden_state",
    "use_input_layernorm_in_first_layer",
    "use_last_layernorm",
    "use_mtp_layernorm",
)


@dataclass
class Head:
    dir: Path
    cfg: dict[str, Any]  # the Llama-style config (a speculators head's transformer_layer_config merged in)
    raw: dict[str, Any]  # config.json as written
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, torch.dtype]
    kind: DraftKind  # EAGLE-1/2 or EAGLE-3 (core/kinds.py), detected from the tensors
    layout: str
    markers: list[str]

    @property
    def draft_type(self) -> str:  # how the reports and --draft-type name the kind
        return self.kind.name

    @property
    def mid(self) -> str:
        """The prefix of the EAGLE-3 decoder layer's tensors."""
        return "midlayer" if "midlayer.self_attn.q_proj.weight" in self.shapes else "layers.0"

    def tensor(self, name: str) -> torch.Tensor:
        with WeightSource(self.dir) as src:
            return src.read(name)

    @property
    def layer_ids(self) -> list[int] | None:
        try:
            return aux_layer_ids(self.cfg, self.dir / "config.json")
        except ModelConfigError:
            return None

    @property
    def rope_theta(self) -> float:
        return rope_theta_of(self.cfg, self.dir / "config.json")

    @property
    def switches(self) -> list[str]:
        """Architecture switches that make this head differ from the plain EAGLE-3 network."""
        on = [k for k in ARCH_FLAGS if self.cfg.get(k)]
        block = b if isinstance(b := self.raw.get("eagle_config"), dict) else {}
        on += [
            f"eagle_config.{k}={block[k]}"
            for k, plain in EAGLE_CONFIG_FLAGS.items()
            if k in block and block[k] != plain
        ]
        return on

    @property
    def draft_vocab(self) -> int | None:
        if "lm_head.weight" in self.shapes:
            return self.shapes["lm_head.weight"][0]
        v = self.cfg.get("draft_vocab_size")
        return int(v) if v is not None else None


def _config(head_dir: Path) -> dict[str, Any]:
    """The head's config.json: a bounded regular file, a JSON object, its counts typed and in range
    (doctor/config_check.py); anything else = unusable input (exit 2)."""
    return read_json_config(head_dir, "--head")


def detect(raw: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> tuple[DraftKind, str, list[str]]:
    """(draft kind, layout, markers seen)."""
    eagle12, eagle3 = DRAFT_KINDS["eagle"], DRAFT_KINDS["eagle3"]
    if is_speculators(raw):
        declared = str(raw["speculators_model_type"])
        if DRAFT_KINDS.get(declared) is not eagle3:
            raise UnusableInput(f"speculators_model_type={declared!r}: only eagle3 speculators heads are EAGLE heads")
        return eagle3, "speculators", ["speculators_model_type=eagle3", "transformer_layer_config"]
    eagle3_marks = [n for n in ("midlayer.self_attn.q_proj.weight", "midlayer.hidden_norm.weight",
                                "layers.0.hidden_norm.weight", "d2t") if n in shapes]
    if "fc.weight" not in shapes:
        raise UnusableInput("no fc.weight tensor: not an EAGLE head (EAGLE-1/2 and EAGLE-3 heads all have fc)")
    if not eagle3_marks and "lm_head.weight" not in shapes:
        return eagle12, "eagle-repo", ["fc.weight [H, 2H]", "layers.*", "no lm_head (the target's is used)"]
    marks = eagle3_marks + (["lm_head.weight"] if "lm_head.weight" in shapes else [])
    block = raw.get("eagle_config")
    if isinstance(block, dict):
        opt = [k for k in MODELOPT_KEYS if k in block]
        if opt:
            return eagle3, "modelopt", marks + [f"eagle_config.{k}" for k in opt]
        return eagle3, "specforge", marks + ["eagle_config block"]
    if isinstance(raw.get("eagle_deploy"), dict):
        return eagle3, "trtllm", marks + ["eagle_deploy block (normalized by this project's converter)"]
    if raw.get("eagle_aux_hidden_state_layer_ids") is not None:
        return eagle3, "eagle-deploy", marks + ["top-level eagle_aux_hidden_state_layer_ids"]
    return eagle3, "eagle-repo", marks + ["no captured layer ids in the config"]


def read_head(head_dir: Path) -> Head:
    head_dir = Path(head_dir)
    if not head_dir.is_dir():
        raise UnusableInput(f"--head {head_dir}: not a directory")
    raw = _config(head_dir)
    mla = mla_head_problem(raw, f"--head {head_dir}")
    if mla is not None:  # refused by kind before its tensors are read (core/draft_heads.py)
        raise UnusableInput(mla)
    try:
        with WeightSource(head_dir) as src:
            shapes = {n: tuple(i.shape) for n, i in src.tensors.items()}
            dtypes = {n: i.dtype for n, i in src.tensors.items()}
    except (WeightFileError, ModelConfigError) as e:
        raise UnusableInput(str(e)) from None
    kind, layout, markers = detect(raw, shapes)
    cfg = speculators_flat(raw) if layout == "speculators" else raw
    return Head(head_dir, cfg, raw, shapes, dtypes, kind, layout, markers)
