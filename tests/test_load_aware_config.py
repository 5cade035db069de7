"""Load-aware speculation in the build config (builders/speculation.py): tree.draft_len_schedule (a mapping or `auto`
from a measured tune_tree run), tree.max_concurrency and the acceptance-rate switch are validated as TensorRT-LLM
validates them, written into the LLM API options of the versions that have them (cited in the ledger), refused with
the reason elsewhere, and handed to the reference engine (reference.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from builders.config import ConfigError, load_config
from builders.engine import llmapi
from builders.engine.reference import reference_spec
from ledger import table as ledger
from tests.engine_cases import make_cfg

HEAD = Path("/builds/golden/checkpoint/eagle3")
CURRENT = Path(__file__).resolve().parent.parent / "configs" / "smollm2-eagle3-current.yaml"
CAPTURE = [1, 15, 28]
E3 = ["trtllm_version=1.4", "draft.type=eagle3", "draft.model=/models/eagle3", "engine.max_num_tokens=null"]
DYN = ["tree.choices=null", "tree.dynamic={top_k: 4, depth: 3, total_draft_tokens: 10}"]


def _spec(*ov: str) -> dict:
    return llmapi.llm_api_options(make_cfg(*E3, "engine.backend=pytorch", *ov), HEAD, CAPTURE, 32)["speculative_config"]


@pytest.mark.parametrize("tree", [["tree.choices=chain-3"], DYN], ids=["chain", "dynamic"])
@pytest.mark.parametrize("schedule", [{1: 3, 2: 2, 4: 1}, {1: 3}, {1: 3, 8: 0, 16: 1}, {1: 3, 64: 3}])
def test_schedule_reaches_the_llm_api_options_as_draft_len_schedule(tree: list[str], schedule: dict) -> None:
    spec = _spec(*tree, "engine.max_batch_size=64", f"tree.draft_len_schedule={json.dumps(schedule)}")
    assert spec["draft_len_schedule"] == schedule and spec["max_draft_len"] == 3
    text = llmapi.dump_options({"speculative_config": spec})
    assert yaml.safe_load(text)["speculative_config"]["draft_len_schedule"] == schedule  # integer keys, as upstream
    names = ledger.flat_keys({"speculative_config": spec})
    flags = ledger.flags_of(schedule=True, dynamic=tree is DYN)
    assert ledger.check("llmapi.option", "1.4", names, flags) == []
    assert ledger.check("llmapi.option", "1.4", names - {"speculative_config.draft_len_schedule"}, flags) == [
        "llmapi.option: required 'speculative_config.draft_len_schedule' is missing (TensorRT-LLM 1.4.0rc4 reads it: "
        "NVIDIA/TensorRT-LLM@v1.4.0rc4:tensorrt_llm/llmapi/llm_args.py DecodingBaseConfig (PR #10860): "
        "draft_len_schedule validate_draft_len_schedule_and_sort / max_concurrency validator; the Eagle3DecodingConfig "
        "API reference of the release)"]


def test_max_concurrency_and_acceptance_switch_are_written_and_cited() -> None:
    spec = _spec("tree.choices=chain-3", "engine.max_batch_size=16", "tree.max_concurrency=8",
                 "tree.acceptance_rate_window_size=32", "tree.acceptance_rate_threshold=0.3")
    assert (spec["max_concurrency"], spec["acceptance_rate_window_size"], spec["acceptance_rate_threshold"]) == (
        8, 32, 0.3)
    assert "draft_len_schedule" not in spec
    flags = ledger.flags_of(max_concurrency=True, acceptance=True)
    assert ledger.check("llmapi.option", "1.4", ledger.flat_keys({"speculative_config": spec}), flags) == []


def test_nothing_is_written_when_unset() -> None:
    spec = _spec("tree.choices=chain-3")
    assert not {"draft_len_schedule", "max_concurrency", "acceptance_rate_window_size"} & set(spec)


@pytest.mark.parametrize(("overrides", "expected"), [
    (["tree.draft_len_schedule={2: 3}"], "must hold batch size 1 (TensorRT-LLM requires it); add 1: 3"),
    (["tree.draft_len_schedule={1: 2, 4: 1}"], "the length at batch size 1 must be max_draft_len = the tree depth 3"),
    (["tree.draft_len_schedule={1: 3, 4: 5}"], "lengths {4: 5} exceed max_draft_len = the tree depth 3"),
    (["tree.draft_len_schedule={1: 3, 0: 1}"], "thresholds must be >= 1 and draft lengths >= 0"),
    (["tree.draft_len_schedule={1: 3, 5: -1}"], "thresholds must be >= 1 and draft lengths >= 0"),
    (["tree.draft_len_schedule=often"], "is neither a mapping of batch-size thresholds to draft lengths"),
    (["tree.draft_len_schedule={1: 3}", "tree.max_concurrency=4"], "are mutually exclusive"),
    (["engine.max_batch_size=8", "tree.draft_len_schedule={1: 3, 16: 1}"],
     "thresholds [16] exceed engine.max_batch_size=8; no batch is ever that large"),
    (["engine.max_batch_size=8", "tree.draft_len_schedule={1: 3, 4: 2, 9: 1, 64: 0}"],
     "thresholds [9, 64] exceed engine.max_batch_size=8"),
    (["engine.max_batch_size=1", "tree.draft_len_schedule={1: 3, 2: 0}"], "thresholds [2] exceed"),
    (["engine.max_batch_size=8", "tree.max_concurrency=9"],
     "tree.max_concurrency=9 exceeds engine.max_batch_size=8: no batch is ever that large"),
    (["tree.max_concurrency=0"], "tree.max_concurrency: Input should be greater than or equal to 1"),
    (["tree.acceptance_rate_threshold=0.5"], "set both (a window of N >= 1 steps and a rate in [0, 1]) or neither"),
    (["tree.acceptance_rate_window_size=16"], "set both"),
    (["tree.acceptance_rate_window_size=16", "tree.acceptance_rate_threshold=1.5"],
     "tree.acceptance_rate_threshold: Input should be less than or equal to 1"),
    (["tree.draft_len_schedule=auto"], "tree.draft_len_schedule=auto needs tree.schedule_file"),
    (["tree.schedule_file=x.json"], "is read only with tree.draft_len_schedule: auto"),
])
def test_bad_values_are_refused_with_the_fix(overrides: list[str], expected: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(
            CURRENT,
            [
                "engine.backend=pytorch",
                "target.dtype=bfloat16",
                "tree.dynamic=null",
                "tree.choices=chain-3",
                *overrides,
            ],
        )
    assert expected in str(e.value)


@pytest.mark.parametrize(("version", "backend"), [("1.2", "pytorch"), ("1.1", "pytorch"), ("1.2", "tensorrt"),
                                                  ("1.1", "tensorrt")])
@pytest.mark.parametrize("field", ["tree.draft_len_schedule={1: 3, 2: 1}", "tree.max_concurrency=4"])
def test_versions_without_the_fields_refuse_them(version: str, backend: str, field: str) -> None:
    with pytest.raises(ValueError) as e:
        make_cfg(f"trtllm_version={version}", f"engine.backend={backend}", "tree.choices=chain-3",
                 "target.dtype=float16", field)
    name = field.split("=")[0]
    if backend == "pytorch":
        assert f"{name} with engine.backend=pytorch is not supported by TensorRT-LLM" in str(e.value)
        assert "set trtllm_version: '1.4'" in str(e.value)
    else:
        assert f"{name} with engine.backend=tensorrt: the engine flow (trtllm-build + the C++ runtime) has no" in str(
            e.value
        )


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_reference_engine_takes_the_schedule_on_every_version(version: str) -> None:
    cfg = make_cfg(f"trtllm_version={version}", "engine.backend=reference", "tree.choices=chain-3",
                   "tree.draft_len_schedule={1: 3, 2: 2, 4: 1}", "tree.acceptance_rate_window_size=8",
                   "tree.acceptance_rate_threshold=0.2")
    spec = reference_spec(cfg, random_head=True)
    assert spec.draft_len_schedule == {1: 3, 2: 2, 4: 1}
    policy = spec.policy()
    assert policy is not None and [policy.draft_len(b, 3) for b in (1, 2, 3, 4, 5)] == [3, 2, 1, 1, 0]
    assert (policy.acceptance_rate_window_size, policy.acceptance_rate_threshold) == (8, 0.2)
    assert policy.describe() == ("draft length per batch size {1: 3, 2: 2, 4: 1} (tree.draft_len_schedule); "
                                 "speculation off for the whole batch once the acceptance rate over 8 steps is below "
                                 "0.2")


def test_what_the_reference_engine_does_on_the_engine_flow_line_is_labelled_ours() -> None:
    """TensorRT-LLM 1.1/1.2 have no load-aware fields; the config says the reference engine's behaviour there is ours
    (docs/config.md is generated from these descriptions)."""
    from builders.speculation import LoadAwareFields

    fields = LoadAwareFields.model_fields
    for name in ("draft_len_schedule", "max_concurrency", "acceptance_rate_window_size", "acceptance_rate_threshold"):
        assert "ours on trtllm_version 1.1/1.2" in (fields[name].description or "").lower(), name
    assert (fields["acceptance_switch_per_sequence"].description or "").startswith("Ours, beyond TensorRT-LLM")
    from core.speculation import SpeculationPolicy

    one = SpeculationPolicy(max_concurrency=1)
    assert one.describe() == "no speculation above 1 sequence (tree.max_concurrency: 1)"
    assert SpeculationPolicy(acceptance_rate_window_size=4, acceptance_rate_threshold=0.5,
                             per_sequence_switch=True).describe() == (
        "speculation off for each sequence on its own once the acceptance rate over 4 steps is below 0.5")


def test_auto_reads_the_measured_schedule(tmp_path: Path) -> None:
    measured = tmp_path / "tuned.json"
    measured.write_text(json.dumps({"schedule": {"draft_len_schedule": {"1": 3, "3": 1, "2": 2}}}))
    cfg_file = tmp_path / "c.yaml"
    base = yaml.safe_load(CURRENT.read_text())
    base["tree"] = {"choices": "chain-3", "draft_len_schedule": "auto", "schedule_file": "tuned.json"}
    base["engine"]["backend"] = "pytorch"
    base["target"]["dtype"] = "bfloat16"  # the PyTorch backend refuses float32
    base["target"]["model"] = "/models/target"
    base["draft"]["model"] = "/models/eagle3"
    cfg_file.write_text(yaml.safe_dump(base))
    cfg = load_config(cfg_file)
    assert cfg.tree.schedule_file == str(measured)
    assert llmapi.load_aware_fields(cfg) == {"draft_len_schedule": {1: 3, 2: 2, 3: 1}}
    measured.write_text(json.dumps({"schedule": {"draft_len_schedule": {"1": 2}}}))
    with pytest.raises(ConfigError, match="the length at batch size 1 must be max_draft_len = the tree depth 3"):
        load_config(cfg_file)
    measured.write_text("{}")
    with pytest.raises(ConfigError, match="not a `tune_tree.py --objective schedule --json` file"):
        load_config(cfg_file)


@pytest.mark.parametrize("overrides", [
    [], ["tree.draft_len_schedule={1: 3, 2: 2, 4: 1}"], ["tree.max_concurrency=2"],
    ["engine.max_batch_size=16", "tree.draft_len_schedule={1: 3, 8: 0, 9: 1}", "tree.acceptance_rate_window_size=16",
     "tree.acceptance_rate_threshold=0.25"],
])
def test_llmapi_mirror_accepts_what_the_build_wrote_and_refuses_a_mismatch(overrides: list[str]) -> None:
    """The 1.4 reference mirror reads model.yaml (LLM API options) and reference.json: written from one config they
    agree; a model.yaml from another config is refused."""
    from triton_repo.models.llmapi_io import check_policy

    cfg = make_cfg(*E3, "engine.backend=reference", "tree.choices=chain-3", *overrides)
    spec = yaml.safe_load(llmapi.dump_options(llmapi.llm_api_options(cfg, HEAD, CAPTURE, 32)))["speculative_config"]
    policy = reference_spec(cfg, random_head=True).policy()
    check_policy(spec, policy)
    with pytest.raises(ValueError, match="does not match the reference engine's load-aware speculation"):
        check_policy({**spec, "max_concurrency": 99}, policy)
