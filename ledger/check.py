"""Check a build directory against the contract ledger: every emitted name has a row for the config's TensorRT-LLM
version, and every required row is present.

    eagle-ledger-check CONFIG.yaml [--set k=v ...]          (or python -m ledger.check)
    eagle-ledger-check --upstream-report [--version V]

reads `<output_dir>/checkpoint`, `engine` (argv / YAML) and `triton_repo` of a finished build and prints the
problems (exit 1) or the names checked per surface and "all cited" (exit 0). It checks the build against the
ledger's rows (each cited to the upstream source that reads the name), not against an installed TensorRT-LLM.
tests/test_ledger.py runs the same functions on
real builds of every backend and version. --upstream-report lists, per supported version, each row's upstream
citation and when it was last read, oldest first (ledger/report.py): where the next reading starts.

Inputs:  CONFIG.yaml of a finished build (its output_dir is read); nothing for --upstream-report
Outputs: the problems found (exit 1) or the number of names checked (exit 0); the report (exit 0)
Guide:   docs/contracts.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from builders import layout
from builders.config import ConfigError, load_config
from builders.engine import llmapi, trtllm_build
from core import trtllm_versions
from ledger import table as ledger

Emitted = dict[str, set[str]]


def _add(out: Emitted, surface: str, names: set[str]) -> None:
    out.setdefault(surface, set()).update(names)


def checkpoint_names(ckpt: Path) -> Emitted:
    """config.json keys (top level, eagle_net_config, quantization, mapping) and rank-file tensor patterns."""
    from safetensors import safe_open

    conf = json.loads((ckpt / "config.json").read_text())
    out: Emitted = {}
    _add(out, "checkpoint.config", set(conf))
    for block in (conf, conf.get("eagle_net_config") or {}):
        _add(out, "checkpoint.quantization", set(block.get("quantization") or {}))
        _add(out, "checkpoint.mapping", set(block.get("mapping") or {}))
    if "eagle_net_config" in conf:
        _add(out, "checkpoint.eagle_net_config", set(conf["eagle_net_config"]))
    for f in sorted(ckpt.glob("rank*.safetensors")):
        with safe_open(str(f), "pt") as st:
            names = st.keys()  # a safetensors file handle, not a dict: it is not iterable
            _add(out, "checkpoint.tensor", {ledger.tensor_pattern(k) for k in names})
    return out


def eagle3_names(written: dict[str, Any], source: dict[str, Any], surface: str = "eagle3.config") -> Emitted:
    """Keys the converter adds to or changes in the head's (or target's) own config.json (the rest is passed on)."""
    ours = {k for k, v in written.items() if k not in source or source[k] != v}
    return {surface: ours}


def pbtxt_fields(msg: Any, prefix: str = "") -> set[str]:
    """Dotted paths of the fields set in a protobuf message (map fields are leaves)."""
    out: set[str] = set()
    for fd, value in msg.ListFields():
        path = prefix + fd.name
        out.add(path)
        if fd.message_type is None or (fd.message_type.GetOptions().map_entry):
            continue
        items = value if fd.is_repeated else [value]
        for item in items:
            out |= pbtxt_fields(item, path + ".")
    return out


def triton_names(repo: Path, roles: dict[str, str], ensemble_layout: bool = True) -> Emitted:
    """Every config.pbtxt under `repo`; `roles` maps model name -> role (preprocessing, postprocessing, bls, llm,
    ensemble). The llm is the C++ backend when its config says backend tensorrtllm; `ensemble_layout` False = the
    repository is the llmapi layout (its one model is upstream's `tensorrt_llm` llmapi model)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    out: Emitted = {}
    for f in sorted(repo.glob("*/config.pbtxt")):
        cfg = text_format.Parse(f.read_text(), mc.ModelConfig())
        _add(out, "triton.model_config", pbtxt_fields(cfg))
        role = roles.get(cfg.name, "?")
        io = {t.name for t in cfg.input} | {t.name for t in cfg.output}
        if (f.parent / "1" / "model.yaml").is_file() and role == "llm" and not ensemble_layout:
            _add(out, "triton.llmapi.input", {t.name for t in cfg.input})
            _add(out, "triton.llmapi.output", {t.name for t in cfg.output})
            if cfg.parameters:
                _add(out, "triton.llmapi.parameter", set(cfg.parameters))
            continue
        if cfg.backend == "tensorrtllm":
            _add(out, "triton.tensorrt_llm.parameter", set(cfg.parameters))
            _add(out, "triton.tensorrt_llm.input", {t.name for t in cfg.input})
            _add(out, "triton.tensorrt_llm.output", {t.name for t in cfg.output})
            continue
        _add(out, "triton.python.tensor", io)
        surface = {"llm": "triton.python_llm.parameter"}.get(role, f"triton.{role}.parameter")
        if cfg.parameters:
            _add(out, surface, set(cfg.parameters))
    model_yaml = next(iter(repo.glob("*/1/model.yaml")), None)
    if model_yaml is not None:
        doc = yaml.safe_load(model_yaml.read_text())
        _add(out, "llmapi.model_yaml", ({"model", "backend"} & set(doc))
             | ledger.flat_keys({"triton_config": doc["triton_config"]}))
        _add(out, "llmapi.option", ledger.flat_keys({k: v for k, v in doc.items()
                                                     if k not in ("model", "backend", "triton_config")}))
    return out


def build_flags(cfg: Any, ckpt: Path) -> frozenset[str]:
    conf = json.loads((ckpt / "config.json").read_text())
    tree = cfg.static_tree()
    return ledger.flags_of(
        eagle=not cfg.draft.kind.eagle3, w_fp8=cfg.quantization.weights == "fp8",
        kv_fp8=cfg.quantization.kv_cache == "fp8", perf=True, tree=tree is not None and not tree.is_chain(),
        dynamic=cfg.tree.dynamic is not None and cfg.tree.dynamic.top_k > 1,  # top_k 1: written as a chain
        attention_dp=cfg.serving.enable_attention_dp, ep=cfg.serving.moe_expert_parallel_size is not None,
        moe_backend=cfg.serving.moe_backend is not None, cuda_graph=cfg.serving.cuda_graph_max_batch_size is not None,
        drafter_multilayer=int((conf.get("eagle_net_config") or {}).get("num_hidden_layers", 1)) > 1,
        reference=cfg.engine.kind.reference_engine, pytorch=cfg.engine.kind.llmapi_model,
        schedule=cfg.tree.draft_len_schedule is not None, max_concurrency=cfg.tree.max_concurrency is not None,
        acceptance=bool(cfg.tree.acceptance_rate_window_size), penalty=cfg.tree.enable_penalty,
        w_quant=cfg.quantization.weights != "none", w_nvfp4=cfg.quantization.weights == "nvfp4",
        qk_norm=conf.get("architecture") in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"),
        dense_mlp=_mirror(conf) == "native", moe=_mirror(conf) == "generic",
        disaggregated=cfg.version.triton_layout == "llmapi",  # dynamo/ prefill + decode YAMLs
    )


def _mirror(conf: dict[str, Any]) -> str | None:
    """How the checkpoint's target row is quantized with ModelOpt (core/capabilities.py), None when it is not."""
    from core.capabilities import modelopt_mirror
    from core.families import family_of

    row = family_of(conf.get("architecture"))
    return None if row is None else modelopt_mirror(row)


def hf_quant_names(export: Path) -> Emitted:
    """What a quantized current-line target (checkpoint/hf_quantized/) holds for TensorRT-LLM's loader."""
    from safetensors import safe_open

    out: Emitted = {"hf_quant.config": ledger.flat_keys(json.loads((export / "hf_quant_config.json").read_text()))}
    inline = json.loads((export / "config.json").read_text()).get("quantization_config")
    if isinstance(inline, dict):
        out["hf_quant.inline"] = set(inline)
    names: set[str] = set()
    for f in sorted(export.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            names |= {ledger.tensor_pattern(k) for k in st.keys()}  # noqa: SIM118 (a safetensors handle)
    out["hf_quant.tensor"] = names
    return out


def quant_input_problems(cfg: Any, build: Path) -> list[str]:
    """The values a quantized build hands over, which names alone do not show: the current line's ModelOpt export
    checked as the build's export check does (hf_quant_config.json keys as TensorRT-LLM reads them, tensors, scales),
    and every scale of the checkpoint's rank files finite and positive."""
    from safetensors import safe_open

    from builders.convert import hf_quant
    from builders.convert.fp8 import Fp8Error

    q, ckpt, p = cfg.quantization, build / "checkpoint", []
    kind = cfg.engine.kind
    if (q.weights != "none" or q.kv_cache == "fp8") and not cfg.version.engine_flow \
            and kind.loads_hf_target and not kind.reference_engine:
        export = ckpt / layout.HF_QUANTIZED
        try:
            conf = json.loads((export / "config.json").read_text())
            if _mirror({"architecture": (conf.get("architectures") or [None])[0]}) == "generic":
                from builders.convert import hf_quant_generic

                p += hf_quant_generic.loader_problems(export, weights=q.weights, kv_fp8=q.kv_cache == "fp8")
            else:
                p += hf_quant.loader_problems(export, weights=q.weights, kv_fp8=q.kv_cache == "fp8",
                                              layers=int(conf["num_hidden_layers"]))
        except (Fp8Error, OSError, ValueError, KeyError) as e:
            p.append(f"{export}: {e}")
    for f in sorted(ckpt.glob("rank*.safetensors")):
        with safe_open(str(f), "pt") as st:
            scales = {k: st.get_tensor(k) for k in st.keys() if k.rsplit(".", 1)[-1] in hf_quant.SCALES}  # noqa: SIM118
        p += hf_quant.scale_problems(scales, f)
    return p


def check_emitted(emitted: Emitted, version: str, flags: frozenset[str]) -> list[str]:
    return [p for surface, names in sorted(emitted.items()) for p in ledger.check(surface, version, names, flags)]


def build_names(cfg: Any, build: Path) -> Emitted:
    """Everything a finished build directory emitted for TensorRT-LLM and Triton."""
    version = cfg.version
    ckpt = build / "checkpoint"
    # Without the engine flow, TensorRT-LLM never reads the TRT-LLM checkpoint (only the reference engine does).
    out = checkpoint_names(ckpt) if version.engine_flow else {}
    head_config = Path(cfg.draft.model, "config.json")
    if (ckpt / "eagle3" / "config.json").is_file() and head_config.is_file():
        written = json.loads((ckpt / "eagle3" / "config.json").read_text())
        source = json.loads(head_config.read_text())
        from builders.convert.head_layout import flat_config, is_speculators  # loads torch: not for --help

        if is_speculators(source):  # the converter read its flat form (builders/convert/head_layout.py)
            source = flat_config(source, head_config)
        out.update(eagle3_names(written, source))
    for tok in (ckpt / layout.TOKENIZER / "tokenizer_config.json", ckpt / layout.HF_MODEL / "tokenizer_config.json"):
        if tok.is_file():
            _add(out, "tokenizer.config", {"tokenizer_class"} & set(json.loads(tok.read_text())))
    if (ckpt / layout.HF_QUANTIZED / "hf_quant_config.json").is_file():
        out.update(hf_quant_names(ckpt / layout.HF_QUANTIZED))
    hf_model = ckpt / layout.HF_MODEL / "config.json"
    if hf_model.is_file():  # the keys the transformers-4 copy adds to or changes in the target's own config
        out.update(eagle3_names(json.loads(hf_model.read_text()),
                                json.loads((layout.hf_target_dir(build) / "config.json").read_text()),
                                surface="hf_model.config"))
    if cfg.engine.kind.engine_flow:
        _add(out, "trtllm-build.flag", ledger.argv_flags(trtllm_build.trtllm_build_argv(cfg, ckpt, build / "engine")))
    if cfg.engine.kind.llmapi_model:
        _add(
            out, "llmapi.option", ledger.flat_keys(yaml.safe_load((build / "engine" / llmapi.OPTIONS_FILE).read_text()))
        )
        from builders.engine import stage  # loads torch (the converters): not for --help

        serve = json.loads((build / "engine" / stage.SERVE_FILE).read_text())["argv"]
        _add(out, "trtllm-serve.flag", ledger.argv_flags(serve))
    t = cfg.triton
    roles = {t.preprocessing_model: "preprocessing", t.postprocessing_model: "postprocessing", t.bls_model: "bls",
             t.llm_model: "llm", t.ensemble_model: "ensemble"}
    if (build / "dynamo").is_dir():
        for surface, names in dynamo_names(build).items():
            _add(out, surface, names)
    if (build / "triton_repo").is_dir():
        llmapi_layout = version.triton_layout == "llmapi"
        for surface, names in triton_names(build / "triton_repo", roles, not llmapi_layout).items():
            _add(out, surface, names)
    return out


def dynamo_names(build: Path) -> Emitted:
    """What a build's dynamo/ directory emitted for Dynamo and TensorRT-LLM (builders/dynamo/files.py): the worker
    YAMLs' keys beyond the build's LLM API options, launch.sh's and the graphs' flags, the graphs' keys."""
    from dynamo_serve import layout as dl

    d = build / dl.DYNAMO_DIR
    out: Emitted = {}
    agg = ledger.flat_keys(yaml.safe_load((d / dl.ENGINE_DIR / "agg.yaml").read_text()))
    _add(out, "llmapi.option", agg)
    for role in ("prefill", "decode"):
        _add(out, "dynamo.engine_yaml", ledger.flat_keys(yaml.safe_load((d / dl.ENGINE_DIR / f"{role}.yaml")
                                                                        .read_text())) - agg)
    for name in dl.GRAPHS.values():
        doc = yaml.safe_load((d / name).read_text())
        _add(out, "dynamo.graph", {k for k in ledger.flat_keys(doc) if not k.startswith("spec.services.")})
        for svc in doc["spec"]["services"].values():
            _add(out, "dynamo.graph", ledger.flat_keys(svc))
            args = svc["extraPodSpec"]["mainContainer"].get("args", [])
            if args:
                _add(out, "dynamo.trtllm.flag", ledger.argv_flags(args))
    for line in (d / dl.LAUNCH).read_text().splitlines():
        words = line.split()
        if "dynamo.trtllm" in words:
            _add(out, "dynamo.trtllm.flag", ledger.argv_flags(words))
        if "dynamo.frontend" in words:
            _add(out, "dynamo.frontend.flag", ledger.argv_flags(words))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="eagle-ledger-check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", nargs="?", help="the build config (not with --upstream-report)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--upstream-report", action="store_true",
                    help="per version, every row's upstream citation and when it was last read, oldest first")
    ap.add_argument("--version", action="append", choices=list(trtllm_versions.VERSIONS),
                    help="with --upstream-report: only this trtllm_version (repeatable)")
    args = ap.parse_args(argv)
    if args.upstream_report:
        from ledger import report as ledger_report

        if args.config is not None:
            ap.error("--upstream-report reads the ledger, not a build: leave out CONFIG")
        print(ledger_report.render(args.version))
        return 0
    if args.config is None:
        ap.error("give the build CONFIG (or --upstream-report)")
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    build = Path(cfg.output_dir)
    if not (build / "checkpoint" / "config.json").is_file():
        print(f"error: {build}/checkpoint/config.json not found: run the build first", file=sys.stderr)
        return 2
    emitted = build_names(cfg, build)
    problems = check_emitted(emitted, cfg.trtllm_version, build_flags(cfg, build / "checkpoint"))
    problems += quant_input_problems(cfg, build)
    for p in problems:
        print(p)
    print(summary_line(emitted, cfg.trtllm_version, build, problems))
    return 1 if problems else 0


def summary_line(emitted: Emitted, version: str, build: Path, problems: list[str]) -> str:
    """What was checked against what: the names the build wrote, per surface, against the ledger's rows."""
    n = sum(len(v) for v in emitted.values())
    surfaces = ", ".join(f"{s} {len(v)}" for s, v in sorted(emitted.items()))
    verdict = f"{len(problems)} problem(s)" if problems else "all cited"
    return (f"ledger ({version}): {n} names {build} writes ({surfaces}) checked against the contract ledger's rows "
            f"for TensorRT-LLM {version} (ledger/, each cited to the upstream source that reads it; "
            f"docs/contracts.md), not against an installed TensorRT-LLM: {verdict}")


if __name__ == "__main__":
    sys.exit(main())
