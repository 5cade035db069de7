"""The TensorRT-LLM versions this toolkit writes for, as a table of capabilities, and the container they are pinned
to (builders/versions.py holds the rest of that record and the checks against it).

A config's `trtllm_version` is checked against this table once, when the config is read; from then on code asks the
entry (`cfg.version`), never the string. This module imports nothing of the project, so every layer may read it.

Adding a version = one `TrtllmVersion` entry here + its rows in the ledger (ledger/*.py). Every
rule that depends on the version (builders/trtllm/rules.py) and every output that differs by version (LLM API YAML,
Triton model repository) reads these fields, never a version number.

How each capability was established is recorded in docs/contracts.md ("Sources"): which upstream files were read,
at which commit, and what could not be verified.
"""

from __future__ import annotations

from dataclasses import dataclass

# ---- the pin (builders/versions.py: the images built from it; tests/test_docker.py: every file naming it) ---------
TRITON_RELEASE = "25.12"  # NGC release (yy.mm) of nvcr.io/nvidia/tritonserver:<release>-trtllm-python-py3
TRTLLM_VERSION = "1.1.0"  # TensorRT-LLM inside that image (builders/versions.py: the compatibility matrix)
TRITON_IMAGE = f"nvcr.io/nvidia/tritonserver:{TRITON_RELEASE}-trtllm-python-py3"



@dataclass(frozen=True)
class TrtllmVersion:
    key: str  # the value of `trtllm_version` in a build config
    series: tuple[int, int]  # installed TensorRT-LLM releases of this series match this entry
    release: str  # the release the ledger was checked against
    tag: str  # upstream NVIDIA/TensorRT-LLM tag cited by the ledger rows of this version
    triton_image: str | None  # the NGC image that ships it (None: build the backend yourself)
    transformers_major: int  # the transformers major TensorRT-LLM pins: it reads every directory we hand it
    engine_flow: bool  # convert_checkpoint format + trtllm-build + the Triton C++ `tensorrtllm` backend
    pytorch_eagle3: bool  # EAGLE-3 heads on the PyTorch backend (LLM API / trtllm-serve)
    pytorch_static_tree: bool  # `eagle_choices` on the PyTorch backend (else: chains only)
    pytorch_dynamic_tree: bool  # `use_dynamic_tree` on the PyTorch backend
    eagle3_layers_to_capture: bool  # the LLM API field exists (proven in the ledger)
    max_total_draft_tokens: bool  # the LLM API field exists
    load_aware_speculation: bool  # speculative_config.draft_len_schedule / max_concurrency / acceptance_rate_* exist
    eagle12_heads: bool  # EAGLE-1/2 heads run at all (engine flow); False: EAGLE-3 only
    static_trees: bool  # any static tree (`eagle_choices`) exists in this version, on some backend
    decoding_type: str  # speculative_config.decoding_type that selects the EAGLE-3 worker
    speculative_model_key: str  # the field naming the head directory
    # `eagle3_one_model: false` selects the two-model EAGLE-3 path (1.1 / 1.2, where we write the key). The current
    # line still accepts the key, but false no longer runs two-model: it was overridden to one-model with a warning
    # (NVIDIA/TensorRT-LLM PR #17366) and the two-model path was then removed (PR #18721), so we never write it there.
    eagle3_one_model_field: bool
    speculative_penalties: bool  # speculative_config.enable_penalty exists (occurrence penalties, one-model, chains)
    triton_layout: str  # "ensemble" (our preprocessing/tensorrt_llm/postprocessing/ensemble/BLS) | "llmapi"
    max_draft_len_limit: int  # builder.py build(): EAGLE max_draft_len bound
    eagle_max_batch_size: int  # builder.py build(): EAGLE max_batch_size bound (engine flow)
    summary: str  # one line for `--help`, the README and errors

    @property
    def name(self) -> str:
        return f"TensorRT-LLM {self.release}"


VERSIONS: dict[str, TrtllmVersion] = {
    "1.1": TrtllmVersion(
        key="1.1",
        series=(1, 1),
        release=TRTLLM_VERSION,
        tag="v1.1.0",
        triton_image=TRITON_IMAGE,
        transformers_major=4,
        engine_flow=True,
        pytorch_eagle3=True,
        pytorch_static_tree=False,
        pytorch_dynamic_tree=False,
        eagle3_layers_to_capture=False,
        max_total_draft_tokens=False,
        load_aware_speculation=False,
        eagle12_heads=True,
        static_trees=True,
        decoding_type="Eagle",
        speculative_model_key="speculative_model_dir",
        eagle3_one_model_field=True,
        speculative_penalties=False,
        triton_layout="ensemble",
        max_draft_len_limit=256,
        eagle_max_batch_size=512,
        summary="the pinned NGC image: engine flow (EAGLE-1/2, static trees, Triton C++ backend); PyTorch backend "
        "EAGLE-3 with chains only, on the head's default capture layers",
    ),
    "1.2": TrtllmVersion(
        key="1.2",
        series=(1, 2),
        release="1.2.0",
        tag="v1.2.0",
        triton_image=None,
        transformers_major=4,
        engine_flow=True,
        pytorch_eagle3=True,
        pytorch_static_tree=True,
        pytorch_dynamic_tree=False,
        eagle3_layers_to_capture=True,
        max_total_draft_tokens=True,
        load_aware_speculation=False,  # the 1.2 line's copy names the switch acceptance_window; not read at v1.2.0
        eagle12_heads=True,
        static_trees=True,
        decoding_type="Eagle",
        speculative_model_key="speculative_model_dir",
        eagle3_one_model_field=True,
        speculative_penalties=False,  # PR #17701 added it 2026-08-14, after 1.2.1 (NGC 26.07); not read at v1.2.0
        triton_layout="ensemble",
        max_draft_len_limit=256,
        eagle_max_batch_size=512,
        summary="the last series with trtllm-build: engine flow as 1.1; PyTorch backend EAGLE-3 with static trees "
        "(eagle_choices) and any capture layers",
    ),
    # The current line (docs/contracts.md "Sources": the 1.4.0rc docs pages and the pull requests that removed the
    # engine flow, the engine-based Triton backend and eagle_choices). No NGC tritonserver image carries it yet.
    "1.4": TrtllmVersion(
        key="1.4",
        series=(1, 4),
        release="1.4.0rc4",
        tag="v1.4.0rc4",
        triton_image=None,
        transformers_major=5,  # TensorRT-LLM PR #12829 moved to transformers 5.3.0 before the 1.4 line
        engine_flow=False,
        pytorch_eagle3=True,
        pytorch_static_tree=False,
        pytorch_dynamic_tree=True,
        eagle3_layers_to_capture=True,
        max_total_draft_tokens=True,
        load_aware_speculation=True,
        eagle12_heads=False,
        static_trees=False,
        decoding_type="Eagle3",
        speculative_model_key="speculative_model",
        eagle3_one_model_field=False,
        speculative_penalties=True,  # Eagle3DecodingConfig.enable_penalty in the 1.3.0rc27 .. 1.4.0rc4 API reference
        triton_layout="llmapi",
        max_draft_len_limit=256,
        eagle_max_batch_size=512,
        summary="the current line: LLM API only (no trtllm-build, no C++ Triton backend), EAGLE-3 heads only, "
        "one-model, chains or dynamic trees (no eagle_choices), served by Triton's `llmapi` model",
    ),
}

DEFAULT_VERSION = "1.4"  # new configs target the current line (EAGLE-3, LLM API, Triton's llmapi model)
PINNED_VERSION = "1.1"  # the pinned NGC image's TensorRT-LLM (the pin above): engine flow, EAGLE-1/2


class UnknownVersion(ValueError):
    """A `trtllm_version` the registry does not hold; the message lists the supported ones."""


def supported_help() -> str:
    return "; ".join(f"'{v.key}' ({v.name}: {v.summary})" for v in VERSIONS.values())


def get(key: str) -> TrtllmVersion:
    try:
        return VERSIONS[key]
    except KeyError:
        raise UnknownVersion(
            f"trtllm_version={key!r} is not supported; use one of {', '.join(repr(k) for k in VERSIONS)} "
            f"(default {DEFAULT_VERSION!r} = the current line; {PINNED_VERSION!r} = the pinned image). A new version "
            "needs a registry entry and its ledger "
            "rows (docs/build.md: 'Checking a new TensorRT-LLM version')"
        ) from None


def for_installed(release: str) -> TrtllmVersion | None:
    """The registry entry whose series an installed TensorRT-LLM release belongs to (None: not supported)."""
    from packaging.version import InvalidVersion, Version

    try:
        major_minor = tuple(Version(release).release[:2])
    except InvalidVersion:
        return None
    return next((v for v in VERSIONS.values() if v.series == major_minor), None)


def lowest(predicate_name: str) -> TrtllmVersion | None:
    """The first (oldest) version with a capability, for error messages ("needs TensorRT-LLM >= X")."""
    return next((v for v in VERSIONS.values() if getattr(v, predicate_name)), None)


def installed_mismatch(key: str, installed_release: str | None) -> list[str]:
    """Start-up check: the installed TensorRT-LLM must be of the series the config's outputs are written for."""
    if installed_release is None:
        return []
    want = get(key)
    have = for_installed(installed_release)
    if have is not None and have.key == want.key:
        return []
    if have is None:
        fix = (f"run in the pinned image {VERSIONS[PINNED_VERSION].triton_image}, or check that version against the "
               "ledger first (docs/build.md: 'Checking a new TensorRT-LLM version')")
    else:
        fix = f"set trtllm_version: '{have.key}' and rebuild, or install TensorRT-LLM {want.release}"
    return [f"trtllm_version '{want.key}': the outputs are written for {want.name}, but the installed TensorRT-LLM is "
            f"{installed_release}; {fix}"]
