"""ENGINE_STAGE: `<build>/checkpoint/` -> `<build>/engine/`, by backend.

- tensorrt: checks TensorRT-LLM's constraints, runs `trtllm-build` (only where the command and an NVIDIA GPU are
  present; otherwise stops naming what is missing) and cross-checks the engine's config.json against the config.
- pytorch: writes the LLM API options YAML and the `trtllm-serve` command (trtllm_serve.json).
- reference: writes reference.json for engines/ (the project's PyTorch engine).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from builders import layout
from core import kinds
from builders.config import BuildConfig
from builders.convert.hf_compat import needs_transformers4_copy
from builders.engine import crosscheck, llmapi, reference, trtllm_build
from builders.pipeline import Output, Stage, StageContext, StageError
from core.spec import write_spec

SERVE_FILE = "trtllm_serve.json"
NGC_HINT = "run the build inside the NGC container instead: see docker/ngc/README.md"


# ---- tool / GPU discovery (separate from the pure argv functions) --------------------------------------------------


def gpu_compute_capabilities() -> list[tuple[int, int]]:
    """Compute capability of each visible NVIDIA GPU via nvidia-smi; [] when there is none."""
    if shutil.which("nvidia-smi") is None:
        return []
    proc = subprocess.run(
        ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True, text=True
    )
    if proc.returncode != 0:
        return []
    caps = []
    for line in proc.stdout.split():
        major, _, minor = line.strip().partition(".")
        caps.append((int(major), int(minor or 0)))
    return caps


def tensorrt_environment_problems(cfg: BuildConfig, caps: list[tuple[int, int]], have_trtllm_build: bool) -> list[str]:
    p = []
    if not have_trtllm_build:
        p.append(f"`{trtllm_build.TRTLLM_BUILD}` is not on PATH (TensorRT-LLM is not installed here)")
    world = cfg.parallel.tp * cfg.parallel.pp
    if not caps:
        p.append("no NVIDIA GPU found (`nvidia-smi` missing or lists no GPU)")
    elif len(caps) < world:
        p.append(f"parallel.tp*pp={world} needs {world} GPUs, nvidia-smi lists {len(caps)}")
    fp8 = cfg.quantization.weights == "fp8" or cfg.quantization.kv_cache == "fp8"
    if caps and fp8 and min(caps) < trtllm_build.FP8_MIN_COMPUTE_CAPABILITY:
        p.append(f"FP8 needs compute capability >= 8.9 (Ada/Hopper); this GPU has {min(caps)[0]}.{min(caps)[1]}")
    return p


# ---- per-backend runs ------------------------------------------------------------------------------------------


def run_tensorrt(ctx: StageContext) -> None:
    cfg = ctx.cfg
    have_build = shutil.which(trtllm_build.TRTLLM_BUILD) is not None
    env = tensorrt_environment_problems(cfg, gpu_compute_capabilities(), have_build)
    if env:
        argv = trtllm_build.trtllm_build_argv(cfg, ctx.stage_dir(layout.CHECKPOINT), ctx.final)
        raise StageError(
            "cannot build the TensorRT engine here: " + "; ".join(env)
            + f". The command would be:\n  {' '.join(argv)}\n"
            f"Either {NGC_HINT}, or set engine.backend=reference to run on this machine."
        )
    ctx.run_command(trtllm_build.trtllm_build_argv(cfg, ctx.stage_dir(layout.CHECKPOINT), ctx.out))
    bad = crosscheck.crosscheck_engine_dir(ctx.out, cfg)
    if bad:
        raise StageError("built engine disagrees with the config:\n  - " + "\n  - ".join(bad))
    ctx.notes["crosscheck"] = "engine config.json matches the config"


def target_architecture(checkpoint_dir: Path) -> str:
    """The converted target's architecture (the Hugging Face name: builders/convert/llama.py target_config_json)."""
    f = checkpoint_dir / "config.json"
    try:
        return str(json.loads(f.read_text())["architecture"])
    except (OSError, ValueError, KeyError) as e:
        raise StageError(f"cannot read the target architecture from {f}: {e}") from e


def eagle3_capture(cfg: BuildConfig, checkpoint_dir: Path) -> tuple[list[int], int]:
    """(TensorRT-LLM's output-indexed layers to capture, number of target layers)."""
    head_cfg_file = checkpoint_dir / layout.EAGLE3_HEAD / "config.json"
    target_cfg_file = checkpoint_dir / "config.json"
    try:
        head_cfg = json.loads(head_cfg_file.read_text())
        n_layers = int(json.loads(target_cfg_file.read_text())["num_hidden_layers"])
    except (OSError, ValueError, KeyError) as e:
        raise StageError(f"cannot read the EAGLE-3 head / target config in {checkpoint_dir}: {e}") from e
    return llmapi.layers_to_capture(llmapi.resolve_input_layer_ids(cfg, head_cfg), n_layers), n_layers


def _target_dir(ctx: StageContext, for_trtllm: bool = False) -> Path:
    """The resolved HF target; `for_trtllm`: the directory TensorRT-LLM loads it from (a transformers-4 copy on the
    versions that need one: builders/convert/hf_compat.py)."""
    try:
        return layout.trtllm_model_dir(ctx.build_dir) if for_trtllm else layout.hf_target_dir(ctx.build_dir)
    except layout.LayoutError as e:
        raise StageError(str(e)) from e


def run_pytorch(ctx: StageContext) -> None:
    cfg = ctx.cfg
    ckpt = ctx.stage_dir(layout.CHECKPOINT)
    try:
        capture, n_layers = eagle3_capture(cfg, ckpt)
        options = llmapi.llm_api_options(cfg, ckpt / layout.EAGLE3_HEAD, capture, n_layers, target_architecture(ckpt))
    except llmapi.LlmApiError as e:
        raise StageError(str(e)) from e
    (ctx.out / llmapi.OPTIONS_FILE).write_text(llmapi.dump_options(options))
    version = cfg.version
    argv = llmapi.trtllm_serve_argv(_target_dir(ctx, for_trtllm=True), ctx.final / llmapi.OPTIONS_FILE,
                                    backend_flag=version.engine_flow)
    serve = {
        "argv": argv,
        "trtllm_version": version.key,
        "llm_api": f"{version.name} (tensorrt_llm/llmapi/llm_args.py)",
    }
    (ctx.out / SERVE_FILE).write_text(json.dumps(serve, indent=2) + "\n")
    ctx.notes["serve"] = " ".join(argv)


def run_reference(ctx: StageContext) -> None:
    try:
        random_head = reference.random_head_flag(ctx.stage_dir(layout.CHECKPOINT))
    except reference.ReferenceSpecError as e:
        raise StageError(str(e)) from e
    write_spec(reference.reference_spec(ctx.cfg, random_head, _target_dir(ctx)), ctx.out)
    ctx.notes["random_head"] = random_head


def run(ctx: StageContext) -> None:
    _steps(ctx.cfg).run(ctx)


# ---- plan (dry run) and preflight --------------------------------------------------------------------------------


def plan_commands(cfg: BuildConfig, build_dir: Path) -> list[list[str]]:
    return _steps(cfg).commands(cfg, build_dir)


def tensorrt_commands(cfg: BuildConfig, build_dir: Path) -> list[list[str]]:
    return [trtllm_build.trtllm_build_argv(cfg, build_dir / layout.CHECKPOINT, build_dir / layout.ENGINE)]


def pytorch_commands(cfg: BuildConfig, build_dir: Path) -> list[list[str]]:
    # Pure: a pip:/.gguf target is extracted only when the stage runs, so show what it will be.
    target = Path(cfg.target.model) if Path(cfg.target.model).is_dir() else f"<HF dir of {cfg.target.model}>"
    if needs_transformers4_copy(cfg):  # the convert stage's copy for TensorRT-LLM's transformers 4
        target = build_dir / layout.CHECKPOINT / layout.HF_MODEL
    return [llmapi.trtllm_serve_argv(Path(str(target)), build_dir / layout.ENGINE / llmapi.OPTIONS_FILE,
                                     backend_flag=cfg.version.engine_flow)]


def preflight(cfg: BuildConfig) -> list[str]:
    from builders.convert.fp8 import fp8_problems

    # TensorRT-LLM's limits were checked when the config was loaded (builders/trtllm/rules.py).
    return fp8_problems(cfg)


def plan_outputs(cfg: BuildConfig) -> list[Output]:
    return _steps(cfg).outputs(cfg)


def tensorrt_outputs(cfg: BuildConfig) -> list[Output]:
    server = "the Triton tensorrtllm backend (config.pbtxt gpt_model_path)"
    return [Output("config.json", "the engine's build config", f"{server}, the cross-check of this stage")] + [
        Output(f"rank{r}.engine", "TensorRT engine of one rank", server)
        for r in range(cfg.engine.kind.world_size(cfg.parallel))]


def pytorch_outputs(cfg: BuildConfig) -> list[Output]:
    return [Output(llmapi.OPTIONS_FILE, "the LLM API options", "trtllm-serve --extra_llm_api_options; the Triton "
                   "stage (model.yaml)"),
            Output(SERVE_FILE, "the trtllm-serve command line", "users (docs/build.md); ledger/check.py")]


def reference_outputs(cfg: BuildConfig) -> list[Output]:
    return [Output(layout.REFERENCE_SPEC, "what the reference engine loads (core/spec.py)",
                   "the reference engine (Triton models, measure/ and the doctor's gate)")]


def no_commands(cfg: BuildConfig, build_dir: Path) -> list[list[str]]:
    return []  # the reference engine's stage writes reference.json itself


@dataclass(frozen=True)
class EngineSteps:
    """What the engine stage does for one backend: run it, the commands it runs (pure argv), what it writes."""

    run: Callable[[StageContext], None]
    commands: Callable[[BuildConfig, Path], list[list[str]]]
    outputs: Callable[[BuildConfig], list[Output]]


STEPS: dict[type[kinds.Backend], EngineSteps] = {
    kinds.TensorrtEngine: EngineSteps(run_tensorrt, tensorrt_commands, tensorrt_outputs),
    kinds.PytorchLlmApi: EngineSteps(run_pytorch, pytorch_commands, pytorch_outputs),
    kinds.ReferenceEngine: EngineSteps(run_reference, no_commands, reference_outputs),
}


def _steps(cfg: BuildConfig) -> EngineSteps:
    return STEPS[type(cfg.engine.kind)]


ENGINE_STAGE = Stage(
    name=layout.ENGINE,
    description="engine: trtllm-build (tensorrt) / LLM API YAML (pytorch) / reference.json (reference)",
    external_inputs=lambda cfg: [],
    depends_on=(layout.CHECKPOINT,),
    run=run,
    plan_commands=plan_commands,
    preflight=preflight,
    plan_outputs=plan_outputs,
)
