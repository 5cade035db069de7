"""`eagle-check BUILD [--prompts FILE] [--max-new-tokens N] [--expect JSON] [--json OUT]`

First contact with a finished build on the machine that will serve it. In order:
  1. the build: its validated config (config.resolved.yaml) and the manifests of its checkpoint and engine stages;
  2. TensorRT-LLM: imported if installed, and whether its version is the release the build was written for
     (trtllm_version, core/trtllm_versions.py);
  3. the written options (the LLM API YAML of the current line; the engine's config.json of the 1.1 / 1.2 engine
     flow): checked against the contract ledger and, with TensorRT-LLM installed, by that release's own classes
     (TorchLlmArgs / Eagle3DecodingConfig, EngineConfig: doctor/eagle_check_run.py cites them);
  4. the build run on a few prompts with and without speculation, greedy: the outputs must be identical (EAGLE is
     lossless), and the acceptance of the speculative run (tau, drafted and accepted tokens) is reported;
  5. with --expect, the outputs must also equal those of an earlier check (its --json), e.g. the reference
     engine's outputs of the same prompts at the same dtype.
Without TensorRT-LLM every step runs on the reference engine (engines/) and the output says so: that checks the
build's files and its speculation, not TensorRT-LLM's kernels.

Exit status: 0 all checks passed; 1 a check failed (outputs differ, options refused, another TensorRT-LLM release);
2 the input is unusable (no build, not a finished build, a corrupt manifest or config, bad prompts).

Inputs:  BUILD (a build's output_dir), --prompts (JSONL `prompt` or MT-bench `turns`; default: four built-in)
Outputs: the report on stdout; --json OUT the same as data (outputs per prompt: an --expect file)
Guide:   docs/deploy.md ("First contact on your GPU")
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from builders import layout
from builders.config import BuildConfig
from core import trtllm_versions
from core.files import InputFileError, MIB, parse_json, read_text, writable_file

EXIT_OK, EXIT_MISMATCH, EXIT_UNUSABLE = 0, 1, 2
DEFAULT_MAX_NEW_TOKENS = 32
MAX_MANIFEST_BYTES = 64 * MIB
STAGES = (layout.CHECKPOINT, layout.ENGINE)


class UnusableBuild(ValueError):
    """BUILD or another input cannot be checked at all (exit 2); the message says what to give instead."""


@dataclass
class Build:
    dir: Path
    cfg: BuildConfig
    version: trtllm_versions.TrtllmVersion
    manifests: dict[str, dict[str, Any]]


def _manifest(build: Path, stage: str) -> dict[str, Any]:
    d = build / stage
    f = d / "manifest.json"
    if not d.is_dir():
        raise UnusableBuild(f"{d}: missing; {build} is not a finished build: run `eagle-build CONFIG` first")
    try:
        data = parse_json(read_text(f, "manifest", MAX_MANIFEST_BYTES), str(f))
    except InputFileError as e:
        raise UnusableBuild(f"{e}; the {stage} stage's manifest is damaged: rerun `eagle-build CONFIG --only {stage} "
                            "--force`") from None
    if not isinstance(data, dict) or data.get("stage") != stage or not isinstance(data.get("outputs"), list):
        raise UnusableBuild(f"{f}: not a manifest of the {stage} stage (no `stage: {stage}` or no `outputs` list); "
                            f"rerun `eagle-build CONFIG --only {stage} --force`")
    return data


def read_build(build: Path) -> Build:
    """The finished build in `build`: its config and its stage manifests, each checked (UnusableBuild)."""
    from builders.resolved import load_resolved, resolved_file

    if not build.is_dir():
        raise UnusableBuild(f"BUILD {build}: no such directory; give the output_dir of a finished build")
    if not resolved_file(build).exists():
        raise UnusableBuild(f"BUILD {build}: no {layout.RESOLVED_CONFIG}, so not a build directory; give the "
                            "output_dir of a finished build (`eagle-build CONFIG` writes it)")
    try:
        cfg = load_resolved(build)
    except (ValueError, OSError) as e:
        raise UnusableBuild(f"{resolved_file(build)}: {str(e)[:1500]}; rerun `eagle-build CONFIG`") from None
    manifests = {s: _manifest(build, s) for s in STAGES}
    return Build(build, cfg, cfg.version, manifests)


def written_options(b: Build) -> tuple[Path | None, dict[str, Any] | None]:
    """(the file, the LLM API options in it) the build wrote for TensorRT-LLM; (config.json, None) for an engine-flow
    engine; (None, None) when it wrote none (a reference build of the 1.1 / 1.2 ensemble layout)."""
    from builders.engine import llmapi

    if b.cfg.engine.kind.llmapi_model:
        f = b.dir / layout.ENGINE / llmapi.OPTIONS_FILE
    elif b.version.triton_layout == "llmapi":
        f = b.dir / "triton_repo" / b.cfg.triton.llm_model / "1" / "model.yaml"
    elif b.cfg.engine.kind.engine_flow:
        return b.dir / layout.ENGINE / "config.json", None
    else:
        return None, None
    try:
        data = yaml.safe_load(read_text(f, "options", MAX_MANIFEST_BYTES))
    except (InputFileError, yaml.YAMLError, RecursionError) as e:
        raise UnusableBuild(f"{f}: {str(e)[:500]}; rerun the build") from None
    if not isinstance(data, dict):
        raise UnusableBuild(f"{f}: not a mapping of LLM API options; rerun the build")
    data.pop("triton_config", None)  # read by the llmapi model itself, not passed to LLM(...)
    return f, data


def ledger_problems(b: Build) -> list[str]:
    """Every name the build wrote for TensorRT-LLM and Triton has its ledger row for the build's release."""
    from ledger.check import build_flags, build_names, check_emitted

    try:
        return check_emitted(build_names(b.cfg, b.dir), b.cfg.trtllm_version,
                             build_flags(b.cfg, b.dir / layout.CHECKPOINT))
    except (OSError, ValueError, KeyError) as e:
        return [f"the written files could not be read for the ledger check: {str(e)[:500]}"]


def version_line(b: Build, installed: str | None, error: str | None) -> tuple[str, list[str]]:
    """What to say about the installed TensorRT-LLM, and the problem when it is not the build's release."""
    from builders.startup import same_release

    want = f"{b.version.name} (trtllm_version '{b.version.key}')"
    if installed is None and error is None:
        return (f"TensorRT-LLM: not installed in this Python. Every step below runs on the REFERENCE ENGINE "
                f"(engines/, PyTorch), not on TensorRT-LLM: it checks the build's files and its speculation, not "
                f"TensorRT-LLM's kernels. The build was written for {want}; install it and rerun on the GPU."), []
    if installed is None:
        return (f"TensorRT-LLM: installed but `import tensorrt_llm` fails ({error}); the steps below run on the "
                "reference engine instead"), [f"`import tensorrt_llm` fails: {error}; check the GPU and the driver "
                                              "(nvidia-smi) and the install"]
    if same_release(installed, b.version.release):
        return f"TensorRT-LLM {installed}: the release the build was written for, {want}", []
    problem = (f"the installed TensorRT-LLM is {installed}, the build was written for {want}; install that release "
               "or rebuild with the trtllm_version of this one")
    return f"TensorRT-LLM {installed}: NOT the release the build was written for: {problem}", [problem]


def differences(got: list[list[int]], want: list[list[int]], what: str) -> list[str]:
    """One line per prompt whose ids differ: the first differing position and the tokens there."""
    out = []
    if len(got) != len(want):
        return [f"{what}: {len(got)} outputs, expected {len(want)}"]
    for i, (g, w) in enumerate(zip(got, want), 1):
        if g == w:
            continue
        at = next((k for k, (a, c) in enumerate(zip(g, w)) if a != c), min(len(g), len(w)))
        out.append(f"{what}: prompt {i} differs from token {at} on: {g[at:at + 5]} vs {w[at:at + 5]} "
                   f"({len(g)} and {len(w)} tokens)")
    return out


def read_expected(path: Path, n_prompts: int) -> list[list[int]]:
    """The speculative outputs of an earlier check's --json, one per prompt (UnusableBuild when it is not one)."""
    try:
        doc = parse_json(read_text(path, "--expect", MAX_MANIFEST_BYTES), f"--expect {path}")
    except InputFileError as e:
        raise UnusableBuild(str(e)) from None
    outs = doc.get("outputs") if isinstance(doc, dict) else None
    ids: list[list[int]] = []
    for o in outs if isinstance(outs, list) else []:
        x = o.get("speculative") if isinstance(o, dict) else None
        if isinstance(x, list) and all(type(t) is int for t in x):
            ids.append(x)
    if len(ids) != n_prompts or not isinstance(outs, list) or len(outs) != n_prompts:
        raise UnusableBuild(f"--expect {path}: not the --json of an eagle-check of {n_prompts} prompt(s) (an "
                            "`outputs` list of objects with `speculative` token ids); give such a file")
    return ids


def prompt_ids(b: Build, prompts: list[str]) -> list[list[int]]:
    from engines.api import load_tokenizer

    tok = load_tokenizer(b.dir / layout.CHECKPOINT / layout.TOKENIZER)
    return [list(tok.encode(p)) for p in prompts]


def check(b: Build, prompts: list[str], max_new_tokens: int, expect: Path | None) -> dict[str, Any]:
    """Every step of the module doc; the report as data (`problems` empty = passed)."""
    from doctor import eagle_check_run as run

    installed, error = run.trtllm_version()
    line, problems = version_line(b, installed, error)
    on_trtllm = installed is not None
    options_file, options = written_options(b)
    problems += ledger_problems(b)
    target_dir = layout.trtllm_model_dir(b.dir)
    if on_trtllm and options is not None:
        problems += run.trtllm_option_problems(options, target_dir)
    elif on_trtllm and options_file is not None:
        problems += run.trtllm_engine_problems(options_file)
    ids = prompt_ids(b, prompts)
    want = read_expected(expect, len(prompts)) if expect is not None else None
    if on_trtllm and options is not None:
        decoded = run.trtllm_decode(options, target_dir, ids, max_new_tokens)
    else:
        decoded = run.reference_decode(b.cfg, b.dir, ids, max_new_tokens)
    mismatches = differences(decoded.speculative, decoded.plain, "with speculation vs without")
    if want is not None:
        mismatches += differences(decoded.speculative, want, f"with speculation vs --expect {expect}")
    return {
        "build": str(b.dir), "name": b.cfg.name, "trtllm_version": b.version.key, "written_for": b.version.release,
        "backend": b.cfg.engine.backend, "installed_trtllm": installed, "tensorrt_llm": line, "engine": decoded.engine,
        "options_file": None if options_file is None else str(options_file.relative_to(b.dir)),
        "max_new_tokens": max_new_tokens, "stats": decoded.stats,
        "identical": decoded.speculative == decoded.plain,
        "mismatches": mismatches, "problems": problems + mismatches,
        "outputs": [{"prompt": p, "plain": a, "speculative": s}
                    for p, a, s in zip(prompts, decoded.plain, decoded.speculative)],
    }


def text(r: dict[str, Any]) -> str:
    s = r["stats"]
    ident = sum(1 for o in r["outputs"] if o["plain"] == o["speculative"])
    out = [f"build {r['build']}: {r['name']}, engine.backend {r['backend']}, written for TensorRT-LLM "
           f"{r['written_for']} (trtllm_version '{r['trtllm_version']}')", r["tensorrt_llm"],
           f"options: {r['options_file'] or 'none written for TensorRT-LLM (a reference build of the ensemble layout)'}"
           + (f" (checked against the contract ledger and by TensorRT-LLM {r['installed_trtllm']}'s own classes)"
              if r["installed_trtllm"] and r["options_file"] else " (checked against the contract ledger only)"),
           f"decoding on the {r['engine']}: {len(r['outputs'])} prompt(s), up to {r['max_new_tokens']} tokens, greedy",
           f"  with speculation = without: {ident}/{len(r['outputs'])} prompts identical",
           f"  acceptance: tau {s.get('tau', 0.0):.3f}, {s.get('accepted_draft_tokens', 0)} of "
           f"{s.get('draft_tokens', 0)} drafted tokens accepted in {s.get('target_forwards', 0)} target forwards"
           + (f", per draft position {[round(p, 3) for p in s['position_acceptance']]}"
              if s.get("position_acceptance") else "")]
    out += [f"  - {p}" for p in r["problems"]]
    out.append(f"{len(r['problems'])} problem(s) found" if r["problems"] else "all checks passed")
    return "\n".join(out)


def _parser() -> argparse.ArgumentParser:
    doc = __doc__ or ""
    ap = argparse.ArgumentParser(prog="eagle-check", description=doc.split("\n\n")[1],
                                 epilog=doc.split("\n\n", 2)[2], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build", type=Path, metavar="BUILD", help="the output_dir of a finished build")
    ap.add_argument("--prompts", type=Path, help="JSONL prompts (`prompt` or MT-bench `turns`); default: four built-in")
    ap.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS, help="tokens per prompt and run")
    ap.add_argument("--expect", type=Path, help="an earlier check's --json: the outputs must also equal its outputs")
    ap.add_argument("--json", type=Path, help="write the report here as JSON")
    return ap


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = _parser().parse_args(argv)
    from doctor import config_check
    from doctor.findings import UnusableInput
    from doctor.measure import PROMPTS
    from doctor.eagle_check_run import CheckError

    try:  # every input checked before any model is loaded
        config_check.check_limits(args.max_new_tokens, None)
        if args.json is not None:
            writable_file(args.json, "--json")
        prompts = config_check.read_prompts(args.prompts) if args.prompts is not None else list(PROMPTS)
        b = read_build(args.build)
        if args.expect is not None:
            read_expected(args.expect, len(prompts))
        report = check(b, prompts, args.max_new_tokens, args.expect)
    except (UnusableBuild, UnusableInput, InputFileError, CheckError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_UNUSABLE
    print(text(report))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return EXIT_MISMATCH if report["problems"] else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
