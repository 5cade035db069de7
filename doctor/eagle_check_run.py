"""The engines `eagle-check` runs a finished build on: TensorRT-LLM when it is installed, else the reference engine.

Both decode the same prompt token ids greedily, once with speculation and once without, and return the generated ids
and the speculative run's acceptance counters.

TensorRT-LLM (NVIDIA/TensorRT-LLM, `tensorrt_llm/llmapi/llm_args.py` read at fcd3f31682808ae56118ae43c1d7864a3a945e6f;
the v1.4.0rc4 tag itself was not readable here):
- `update_llm_args_with_extra_dict(llm_args, llm_args_dict)` is how `trtllm-serve --extra_llm_api_options` and the
  Triton `llmapi` model merge the YAML into the LLM's arguments; `TorchLlmArgs` (aliased `LlmArgs = TorchLlmArgs`) is
  the PyTorch backend's strict pydantic model, whose `speculative_config` validates into `Eagle3DecodingConfig`
  (`decoding_type: Eagle3`). Validating the written options is constructing `TorchLlmArgs(**merged)`.
- `tensorrt_llm/builder.py` `EngineConfig.from_json_file` reads an engine-flow engine's config.json (1.1 / 1.2; the
  same file's `get_model_format` uses it to recognise an engine directory).
- `tensorrt_llm/sampling_params.py` `SamplingParams._greedy_decoding`: `top_k == 1` is greedy on every line;
  `LLM.get_stats(timeout)` rows carry `specDecodingStats.numDraftTokens` / `numAcceptedTokens` /
  `numRequestsWithDraftTokens` when `enable_iter_perf_stats` is on (docs/production-metrics.md cites them).
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from builders.config import BuildConfig


class CheckError(ValueError):
    """The build cannot be run as given (its reference copy fails to build, a prompt is too long); exit 2."""


@dataclass
class Decoded:
    """What one engine produced: the generated ids per prompt, without and with speculation, and the speculative
    run's counters (target forwards, drafted and accepted tokens, accepted per draft position where known)."""

    engine: str
    plain: list[list[int]]
    speculative: list[list[int]]
    stats: dict[str, Any] = field(default_factory=dict)


def trtllm_version() -> tuple[str | None, str | None]:
    """(the installed TensorRT-LLM's `__version__`, None) or (None, why it could not be imported; None when it is
    simply not installed)."""
    import importlib.util

    if importlib.util.find_spec("tensorrt_llm") is None:
        return None, None
    try:
        import tensorrt_llm
    except Exception as e:  # (any import failure is reported as it is: CUDA, MPI, a missing library)
        return None, f"{type(e).__name__}: {str(e)[:300]}"
    return str(getattr(tensorrt_llm, "__version__", "unknown")), None


def trtllm_option_problems(options: dict[str, Any], target_dir: Path) -> list[str]:
    """The written LLM API options validated by the installed release's own classes (module doc)."""
    from tensorrt_llm.llmapi.llm_args import TorchLlmArgs, update_llm_args_with_extra_dict

    try:
        merged = update_llm_args_with_extra_dict({"model": str(target_dir)}, dict(options))
        TorchLlmArgs(**merged)
    except Exception as e:  # (pydantic's ValidationError or the validators' ValueError)
        return [f"TensorRT-LLM refuses the written options: {str(e)[:1500]}"]
    return []


def trtllm_engine_problems(engine_config: Path) -> list[str]:
    from tensorrt_llm.builder import EngineConfig

    try:
        EngineConfig.from_json_file(str(engine_config))
    except Exception as e:
        return [f"TensorRT-LLM cannot read {engine_config}: {str(e)[:1500]}"]
    return []


def trtllm_decode(options: dict[str, Any], target_dir: Path, prompts: list[list[int]], n: int) -> Decoded:
    """Both runs on TensorRT-LLM's LLM API (PyTorch backend) with the build's options; greedy (top_k 1)."""
    from tensorrt_llm import LLM, SamplingParams
    from tensorrt_llm.llmapi.llm_args import update_llm_args_with_extra_dict

    params = SamplingParams(max_tokens=n, top_k=1)
    runs: dict[bool, list[list[int]]] = {}
    stats: dict[str, Any] = {}
    for speculative in (False, True):
        opts = {k: v for k, v in options.items() if speculative or k != "speculative_config"}
        opts["enable_iter_perf_stats"] = True
        llm = LLM(**update_llm_args_with_extra_dict({"model": str(target_dir)}, opts))
        try:
            outs = llm.generate(prompts, params)
            runs[speculative] = [list(o.outputs[0].token_ids) for o in outs]
            if speculative:
                stats = _trtllm_stats(llm.get_stats(timeout=2))
        finally:
            llm.shutdown()
    return Decoded("TensorRT-LLM", runs[False], runs[True], stats)


def _trtllm_stats(rows: list[Any]) -> dict[str, Any]:
    drafted = accepted = forwards = 0
    for row in rows:
        if not isinstance(row, dict) or int(row.get("attentionDpRank") or 0) != 0:
            continue  # attention data parallelism repeats each iteration once per rank
        s = row.get("specDecodingStats") or {}
        drafted += int(s.get("numDraftTokens", 0))
        accepted += int(s.get("numAcceptedTokens", 0))
        forwards += int(s.get("numRequestsWithDraftTokens", 0))
    return {"target_forwards": forwards, "draft_tokens": drafted, "accepted_draft_tokens": accepted,
            "tau": 1.0 + accepted / forwards if forwards else 0.0, "position_acceptance": []}


def reference_build(cfg: BuildConfig, build: Path, work: Path) -> Path:
    """A build directory the reference engine runs: `build` itself when it was built for the reference engine, else
    the same config rebuilt with engine.backend reference in `work` (the checkpoint and engine stages only)."""
    if cfg.engine.kind.reference_engine:
        return build
    from builders.build import main as build_main
    from builders.resolved import dump_resolved

    data = yaml.safe_load(dump_resolved(cfg))
    for record_only in ("derived", "defaults"):
        data.pop(record_only, None)
    for section, key in (("target", "model"), ("draft", "model"), ("draft", "draft_vocab"), ("tree", "schedule_file"),
                         ("monitoring", "calibration_prompts"), ("capture", "dir")):
        holder = data.get(section)
        if isinstance(holder, dict) and isinstance(holder.get(key), str):
            holder[key] = getattr(getattr(cfg, section), key)  # absolute, as the loaded config has them
    data["output_dir"] = str(work / "build")
    data["engine"]["backend"] = "reference"
    cfg_file = work / "reference.yaml"
    cfg_file.write_text(yaml.safe_dump(data, sort_keys=False))
    log = io.StringIO()
    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        try:
            rc = build_main([str(cfg_file), "--only", "checkpoint", "--only", "engine"])
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 2
    if rc != 0:
        raise CheckError(f"the reference engine's copy of this build failed (exit {rc}):\n{log.getvalue()[-3000:]}")
    return work / "build"


def reference_decode(cfg: BuildConfig, build: Path, prompts: list[list[int]], n: int) -> Decoded:
    """Both runs on the reference engine (engines/): the build's checkpoint, head, tree and dtype."""
    from doctor.gate import decode, figures
    from engines.api import ReferenceEngine

    with tempfile.TemporaryDirectory(prefix="eagle-check-") as tmp:
        engine = ReferenceEngine.from_build(reference_build(cfg, build, Path(tmp)))
        eos = [engine.tokenizer.eos_token_id] if engine.tokenizer.eos_token_id is not None else []
        limit = engine.limits.max_input_len
        too_long = [i for i, p in enumerate(prompts) if len(p) > limit]
        if too_long:
            raise CheckError(f"prompt(s) {[i + 1 for i in too_long]} have more than the build's max_input_len "
                             f"{limit} tokens; give shorter prompts")
        n = max(1, min(n, engine.limits.max_seq_len - max(len(p) for p in prompts)))
        plain = decode(engine, prompts, n, eos, False, "eagle-check: target only")
        spec = decode(engine, prompts, n, eos, True, "eagle-check: with speculation")
    return Decoded("reference engine", [r.output_ids for r in plain], [r.output_ids for r in spec], figures(spec))
