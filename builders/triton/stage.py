"""TRITON_STAGE: `<build>/checkpoint/` + `<build>/engine/` -> `<build>/triton_repo/` (the model repository).

Serve it with `python triton_repo/launch.py --repo <build>/triton_repo`.
"""

from __future__ import annotations

import os
from pathlib import Path

from builders.config import BuildConfig
from builders.layout import CHECKPOINT, ENGINE, TRITON_REPO
from builders.monitoring import baseline, rules
from builders.pipeline import Output, Stage, StageContext, StageError
from builders.triton import render
from core.spec import read_spec
from triton_repo.models.capture import SETTINGS_FILE
from triton_repo.models.spec_metrics import BASELINE_FILE

STAGE_NAME = TRITON_REPO


def _inputs(cfg: BuildConfig) -> list[Path]:
    """The user's files the repository is made from."""
    return [Path(p)] if (p := cfg.monitoring.calibration_prompts) else []


def _sources(cfg: BuildConfig) -> list[Path]:
    """The project's files the rendered repository copies or is rendered by: a change to any of them re-renders it
    (not the user's inputs: --dry-run does not list them)."""
    serve = render.SERVE_PACKAGE
    here = Path(__file__).resolve().parent
    return [serve / "contract.py", serve / "llmapi_contract.py", here / "pbtxt.py", Path(render.__file__).resolve(),
            here / "render_llmapi.py", *sorted(render.MODELS_SRC.glob("*.py"))]


def limits_problems(cfg: BuildConfig, build_dir: Path) -> list[str]:
    """The reference models take their limits from the engine's reference.json; config.pbtxt's max_batch_size (and
    model.yaml's copies) come from the config. Refuse to render a repository where the two disagree."""
    if not cfg.engine.kind.reference_engine:
        return []
    spec = read_spec(build_dir)
    return [
        f"engine.{k}={getattr(cfg.engine, k)} but the engine stage's reference.json has {getattr(spec, k)}: rebuild "
        "the engine stage with this config (python builders/build.py CONFIG --only engine --force)"
        for k in ("max_batch_size", "max_input_len", "max_seq_len") if getattr(cfg.engine, k) != getattr(spec, k)
    ]


def run(ctx: StageContext) -> None:
    problems = limits_problems(ctx.cfg, ctx.build_dir)
    if problems:
        raise StageError("; ".join(problems))
    try:
        written = render.render(ctx.cfg, ctx.build_dir, ctx.out)
    except render.RenderError as e:
        raise StageError(str(e)) from e
    (ctx.out / rules.RULES_FILE).write_text(rules.rules_yaml(ctx.cfg.monitoring))  # Triton ignores plain files here
    if ctx.cfg.capture.enabled:  # the served LLM model records finished requests (docs/adaptive.md)
        from builders.capture_settings import store_dir, write_settings
        from triton_repo.models.capture import dir_problem

        if problem := dir_problem(Path(os.path.abspath(store_dir(ctx.cfg)))):  # never followed nor chmod'ed
            raise StageError(problem)
        ctx.notes["capture"] = write_settings(ctx.cfg, ctx.final, ctx.out).name
    if ctx.cfg.monitoring.calibration_prompts is not None:
        ctx.notes["acceptance_baseline"] = baseline.write(ctx.cfg, ctx.build_dir, ctx.out).name
    ctx.notes["models"] = sorted(
        {p.relative_to(ctx.out).parts[0] for p in written if len(p.relative_to(ctx.out).parts) > 1}
    )
    ctx.notes["serve"] = f"python triton_repo/launch.py --repo {ctx.final}"


def plan_outputs(cfg: BuildConfig) -> list[Output]:
    t = cfg.triton
    server, client = "tritonserver (triton_repo/launch.py --repo)", "the clients (clients/schema.py from_repository)"
    if render.layout(cfg) == "llmapi":
        out = [Output(f"{t.llm_model}/", "the LLM API model: config.pbtxt, 1/model.yaml (LLM options), 1/model.py",
                      server)]
    else:
        names = [t.preprocessing_model, t.llm_model, t.postprocessing_model, t.ensemble_model, t.bls_model]
        out = [Output(f"{n}/", "a Triton model (config.pbtxt, 1/)", server) for n in names]
    out += [Output(render.CLIENT_FILE, "what a client sends and reads", client),
            Output(rules.RULES_FILE, "Prometheus alerting rules", f"Prometheus ({rules.DOCS})")]
    if cfg.capture.enabled:
        out.append(Output(SETTINGS_FILE, "the capture settings", "the served LLM model (docs/adaptive.md)"))
    if cfg.monitoring.calibration_prompts is not None:
        out.append(Output(BASELINE_FILE, "acceptance measured at build time", f"the served models' metrics and "
                          f"the Prometheus rules ({rules.DOCS})"))
    return out


TRITON_STAGE = Stage(
    name=STAGE_NAME,
    description="Triton model repository: preprocessing, tensorrt_llm, postprocessing, ensemble, tensorrt_llm_bls "
    "(TensorRT-LLM 1.1/1.2), or the one `tensorrt_llm` llmapi model (the current line)",
    external_inputs=_inputs,
    source_files=_sources,
    depends_on=(CHECKPOINT, ENGINE),
    run=run,
    preflight=lambda cfg: render.config_problems(cfg) + baseline.config_problems(cfg),
    plan_outputs=plan_outputs,
)
