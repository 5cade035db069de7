"""What the reference engine needs to run a build, recorded by the engine stage as `<build>/engine/reference.json`.

Triton's reference model, `measure.verify`, the tree tuner and the load tools load the engine from the build
directory alone through this file. Paths are relative to the build directory so the directory can be moved
(e.g. mounted into a container).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from core.kinds import DRAFT_KINDS, DraftKind
from core.speculation import SpeculationPolicy
from core.trees import DraftTree, Tree

ENGINE_DIR = "engine"  # the engine stage's directory inside a build directory
SPEC_FILE = "reference.json"


class ReferenceSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    checkpoint_dir: str = Field(description="TRT-LLM checkpoint dir, relative to the build dir.")
    tokenizer_dir: str = Field(description="Tokenizer dir (HF files), relative to the build dir.")
    draft_type: Literal["eagle", "eagle3"] = Field(description="Head kind.")
    eagle3_head_dir: str | None = Field(description="Normalized EAGLE-3 head dir (eagle3 only), relative.")
    random_head: bool = Field(description="True when the head is randomly initialized (label it everywhere).")
    tree: Tree = Field(description="The draft tree: {kind: static, paths} or {kind: dynamic, top_k, depth, "
                                   "total_draft_tokens} (validated when read).")
    dtype: Literal["float16", "bfloat16", "float32"] = Field(description="Compute dtype.")
    device: Literal["auto", "cpu", "cuda"] = Field(description="`auto` = CUDA when present, else CPU.")
    tp: int = Field(ge=1, description="Tensor-parallel size of the checkpoint.")
    max_batch_size: int = Field(ge=1, description="Max sequences per engine batch.")
    max_input_len: int = Field(ge=1, description="Max prompt tokens.")
    max_seq_len: int = Field(ge=1, description="Max prompt + generated tokens.")
    hf_target_dir: str | None = Field(
        default=None,
        description="Absolute HF directory the convert stage resolved target.model to (the oracle of measure.verify).",
    )
    draft_vocab: list[int] | None = Field(
        default=None,
        description="EAGLE-1/2 only: target token ids the head drafts over (most frequent first; None = all).",
    )

    draft_len_schedule: dict[int, int] | None = Field(
        default=None, description="Batch-size threshold -> draft length per step (engines/schedule.py); None = off."
    )
    max_concurrency: int | None = Field(default=None, ge=1, description="No speculation above this many sequences.")
    acceptance_rate_window_size: int = Field(default=0, ge=0, description="Steps in the acceptance window (0 = off).")
    acceptance_rate_threshold: float | None = Field(
        default=None, ge=0, le=1, description="Speculation stops once the window's mean acceptance rate is below this."
    )
    acceptance_switch_per_sequence: bool = Field(
        default=False, description="Ours: the acceptance window and threshold apply to each sequence on its own."
    )

    @property
    def kind(self) -> DraftKind:  # the head's kind (core/kinds.py), as `draft_type` names it
        return DRAFT_KINDS[self.draft_type]

    def policy(self) -> SpeculationPolicy | None:
        p = SpeculationPolicy(self.draft_len_schedule, self.max_concurrency, self.acceptance_rate_window_size,
                              self.acceptance_rate_threshold, self.acceptance_switch_per_sequence)
        return None if p.is_static else p

    @model_validator(mode="before")
    @classmethod
    def _two_tree_fields(cls, data: Any) -> Any:
        """reference.json files written before the tree was one field hold `tree_choices` (static paths) or
        `dynamic_tree`: read them as the one `tree`, so builds already on disk keep loading."""
        if isinstance(data, dict) and "tree" not in data and ("tree_choices" in data or "dynamic_tree" in data):
            data = dict(data)
            choices, dynamic = data.pop("tree_choices", None), data.pop("dynamic_tree", None)
            if (choices is None) == (dynamic is None):
                raise ValueError("set exactly one of tree_choices or dynamic_tree (or the one field `tree`)")
            if choices is not None:
                data["tree"] = DraftTree.from_choices(choices)
            else:
                data["tree"] = {**dynamic, "kind": "dynamic"} if isinstance(dynamic, dict) else dynamic
        return data

    def path(self, build_dir: Path, rel: str) -> Path:
        return (build_dir / rel).resolve()


def read_spec(build_dir: Path) -> ReferenceSpec:
    f = build_dir / ENGINE_DIR / SPEC_FILE
    if not f.is_file():
        raise FileNotFoundError(
            f"{f} not found: {build_dir} is not a finished build with engine.backend=reference; "
            "run `python builders/build.py CONFIG` first"
        )
    return ReferenceSpec.model_validate_json(f.read_text())


def write_spec(spec: ReferenceSpec, engine_dir: Path) -> Path:
    f = engine_dir / SPEC_FILE
    f.write_text(spec.model_dump_json(indent=2) + "\n")
    return f
