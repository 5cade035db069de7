"""DYNAMO_STAGE: every current-line build (trtllm_version '1.4') -> `<build>/dynamo/`, an NVIDIA Dynamo deployment
(dynamo_serve/layout.py lists the files; builders/dynamo/files.py makes them).

Run it on this machine with the reference engine as the worker: `eagle-dynamo serve <build>`; on a GPU machine with
TensorRT-LLM: `bash <build>/dynamo/launch.sh` or `kubectl apply -f <build>/dynamo/deploy-agg.yaml` (docs/deploy.md).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

from builders import layout
from builders.config import BuildConfig
from builders.dynamo import files
from builders.engine.llmapi import OPTIONS_FILE, LlmApiError, dump_options
from builders.pipeline import Output, Stage, StageContext, StageError
from dynamo_serve import layout as D

STAGE_NAME = D.DYNAMO_DIR
CARD_FILES = ("config.json", "generation_config.json")  # from the HF target; the tokenizer's files come with them


def applies(cfg: BuildConfig) -> bool:
    """Every build of the current line writes a Dynamo deployment."""
    return cfg.version.triton_layout == "llmapi"


def options_of(cfg: BuildConfig, build_dir: Path) -> dict:
    """The LLM API options the build already wrote (the engine stage's file, or the llmapi model's)."""
    from builders.triton import render_llmapi

    try:
        return render_llmapi.llm_options(cfg, build_dir, build_dir / layout.ENGINE / OPTIONS_FILE)
    except (OSError, LlmApiError) as e:
        raise StageError(f"LLM API options for the Dynamo worker: {e}") from e


def write_card(build_dir: Path, out: Path) -> None:
    """The model card directory: the target's Hugging Face config (register_model reads config.json) and the
    tokenizer the build uses."""
    out.mkdir(parents=True)
    try:
        target = layout.hf_target_dir(build_dir)
    except layout.LayoutError as e:
        raise StageError(str(e)) from e
    if not (target / "config.json").is_file():
        raise StageError(f"{target}/config.json not found: the model card needs the target's Hugging Face config")
    for name in CARD_FILES:
        if (target / name).is_file():
            shutil.copy2(target / name, out / name)
    tok = build_dir / layout.CHECKPOINT / layout.TOKENIZER
    for f in sorted(tok.iterdir()):
        if f.is_file():
            shutil.copy2(f, out / f.name)


def run(ctx: StageContext) -> None:
    cfg, out = ctx.cfg, ctx.out
    options = options_of(cfg, ctx.build_dir)
    try:
        yamls = files.engine_yamls(options, cfg.request_limits().max_input_len)
    except files.DynamoRefusal as e:
        raise StageError(str(e)) from e
    write_card(ctx.build_dir, out / D.MODEL_DIR)
    (out / D.ENGINE_DIR).mkdir()
    for role, doc in yamls.items():
        (out / D.ENGINE_DIR / f"{role}.yaml").write_text(dump_options(doc))
    # The GPU commands name the directory TensorRT-LLM loads the target from (hf_compat: a transformers-4 copy on
    # the versions that need one), relative to this directory when it lies inside the build.
    model_path = str(layout.trtllm_model_dir(ctx.build_dir))
    (out / D.LAUNCH).write_text(files.launch_script(model_path, cfg.name, D.ENGINE_DIR))
    gpus = cfg.parallel.tp * cfg.parallel.pp
    for kind, name in D.GRAPHS.items():
        doc = files.graph(f"{cfg.name}-{kind}", model_path, cfg.name, f"/workspace/{D.ENGINE_DIR}",
                          disaggregated=kind == "disagg", gpus_per_worker=gpus)
        (out / name).write_text(yaml.safe_dump(doc, sort_keys=False))
    deployment = {"served_model_name": cfg.name, "kv_block_size": files.KV_BLOCK_SIZE, "namespace": D.NAMESPACE,
                  "dynamo_version": D.DYNAMO_VERSION, "engine_yamls": {r: f"{D.ENGINE_DIR}/{r}.yaml" for r in yamls}}
    (out / D.DEPLOYMENT).write_text(json.dumps(deployment, indent=2) + "\n")
    ctx.notes["serve"] = f"eagle-dynamo serve {ctx.build_dir}"


def plan_outputs(cfg: BuildConfig) -> list[Output]:
    gpu = "dynamo.trtllm --extra-engine-args (a GPU machine)"
    return [
        Output(D.DEPLOYMENT, "served model name, KV block size, namespace", "eagle-dynamo serve (dynamo_serve/)"),
        Output(f"{D.MODEL_DIR}/", "the model card directory (HF config.json + tokenizer)",
               "register_model (the reference worker; dynamo.frontend reads the tokenizer through it)"),
        Output(f"{D.ENGINE_DIR}/", "LLM API YAMLs: agg, prefill, decode (EAGLE speculative_config)", gpu),
        Output(D.LAUNCH, "dynamo.frontend + dynamo.trtllm commands", "bash on a GPU machine"),
        *(Output(n, "a DynamoGraphDeployment", "the Dynamo Kubernetes operator") for n in D.GRAPHS.values()),
    ]


DYNAMO_STAGE = Stage(
    name=STAGE_NAME,
    description="NVIDIA Dynamo deployment: model card, TensorRT-LLM worker YAMLs (aggregated, prefill/decode), "
    "launch commands, DynamoGraphDeployments (the current line)",
    external_inputs=lambda cfg: [],
    source_files=lambda cfg: [Path(files.__file__).resolve(), Path(__file__).resolve(), Path(D.__file__).resolve()],
    depends_on=(layout.CHECKPOINT, layout.ENGINE),
    run=run,
    plan_outputs=plan_outputs,
)
