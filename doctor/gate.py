"""The gate of the adaptive loop: is a candidate head publishable in place of the served one?

    python -m doctor gate --build BUILD --candidate HEAD --requests HELD_OUT.jsonl [--current HEAD]
                                   [--margin 0.05] [--max-new-tokens 64] [--json OUT]

Both heads decode the held-out captured requests (their prompt token ids, greedy) on the build's reference engine
with the build's own draft tree, and the target decodes them alone. Publishable when all of:
  - healthy: the doctor's static checks find no problem with the candidate on this target, and its first-position
    acceptance is not collapsed (doctor/measure.py COLLAPSED);
  - lossless: both heads' outputs are the target-only outputs, token for token (and those reproduce the captured
    outputs of the greedy requests, a check of the store itself);
  - better: candidate tau >= current tau + margin.
tau and per-position acceptance are written as the served gauges read them (builders/monitoring/baseline.py summary):
a published version exports the candidate's figures as its baseline. Exit 0 publishable, 1 refused, 2 unusable.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from tqdm import tqdm

from doctor.findings import EXIT_FOUND, EXIT_OK, UnusableInput
from doctor.measure import COLLAPSED

DEFAULT_MARGIN, DEFAULT_MAX_NEW_TOKENS = 0.05, 64
MAX_REQUESTS_BYTES = 1 << 30  # a held-out file (token ids only: ~1 KB per request)
MAX_RECORD_BYTES = 16 << 20  # one JSONL line: one captured request
MAX_TOKEN_ID = (1 << 31) - 1


def _ids_problem(value: Any, key: str, *, empty: bool) -> str | None:
    if not isinstance(value, list) or (not empty and not value):
        return f"`{key}` must be a {'' if empty else 'non-empty '}list of token ids"
    bad = [t for t in value if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= MAX_TOKEN_ID]
    if bad:
        return f"`{key}` holds {json.dumps(bad[0])[:40]}; give integers in [0, {MAX_TOKEN_ID}]"
    return None


def record_problem(row: Any) -> str | None:
    """Why a line of --requests is not a captured request the gate can decode (None when it is one): a JSON object
    with `prompt_ids` (non-empty) and `output_ids` lists of token ids and an optional `sampling` object whose
    `temperature` is a number, as the capture store writes them (triton_repo/models/capture.py)."""
    if not isinstance(row, dict):
        return f"is a JSON {type(row).__name__}, not an object with prompt_ids and output_ids"
    problems = [p for key, empty in (("prompt_ids", False), ("output_ids", True))
                if (p := _ids_problem(row.get(key), key, empty=empty))]
    sampling = row.get("sampling", {})
    temp = sampling.get("temperature", 0) if isinstance(sampling, dict) else None
    if isinstance(temp, bool) or not isinstance(temp, (int, float)):
        problems.append("`sampling` must be an object whose `temperature` is a number")
    return "; ".join(problems) or None


def read_records(path: Path) -> list[dict[str, Any]]:
    """The held-out requests: a bounded regular JSONL file (no FIFO, no directory), every line a captured request
    (record_problem); the first bad line is refused by number (exit 2) before any model is loaded."""
    from core.files import parse_json, text_lines

    out = []
    for n, line in text_lines(path, "--requests", MAX_REQUESTS_BYTES, MAX_RECORD_BYTES):
        if not line.strip():
            continue
        row = parse_json(line, f"--requests {path}: line {n}")
        if problem := record_problem(row):
            raise UnusableInput(f"--requests {path}: line {n} {problem}")
        out.append(row)
    if not out:
        raise UnusableInput(f"--requests {path}: no requests (one captured record per line, as held_out.jsonl)")
    return out


def check_inputs(build: Path, heads: dict[str, Path | None], json_out: Path | None) -> None:
    """Every path the gate reads or writes checked before any work: --json a writable file path, --build a finished
    reference build, each head a directory with a config.json."""
    from core.files import writable_file
    from core.spec import read_spec

    if json_out is not None:
        writable_file(json_out, "--json")
    if not build.is_dir():
        raise UnusableInput(f"--build {build}: no such directory; give the build's output_dir")
    read_spec(build)  # FileNotFoundError naming the file and the command to run when it is not a finished build
    for flag, head in heads.items():
        if head is not None and not (head / "config.json").is_file():
            raise UnusableInput(f"{flag} {head}: not a head directory (no config.json); give the head's directory")


def normalize(head: Path, build_dir: Path, out: Path) -> Path:
    """`head` (any layout the converter takes) in the normalized layout the reference engine loads."""
    from builders import layout
    from builders.convert.eagle3 import resolve_layer_ids, write_eagle3_head
    from builders.convert.llama import Provenance
    from core.hfconfig import ModelConfigError, llama_spec, read_config

    if (head / "config.json").is_file() and "eagle_deploy" in read_config(head):
        return head  # already normalized (a checkpoint's eagle3/ or a published version's draft_head/)
    target_dir = layout.hf_target_dir(build_dir)
    try:
        ids = resolve_layer_ids(read_config(head), None, head)
        prov = Provenance(random_head=False, target_source=str(target_dir), head_source=str(head))
        write_eagle3_head(head, llama_spec(target_dir, require_arch=False), out, dtype=_dtype(build_dir),
                          layer_ids=ids, prov=prov)
    except ModelConfigError as e:
        raise UnusableInput(f"--candidate {head}: {e}") from None
    return out


def _dtype(build_dir: Path) -> str:
    from core.spec import read_spec

    return read_spec(build_dir).dtype


def engine_with(build_dir: Path, head: Path) -> Any:
    """The build's reference engine (checkpoint, tree, dtype) drafting with `head` (normalized)."""
    from core.spec import read_spec
    from engines.api import ReferenceEngine

    spec = read_spec(build_dir)
    if not spec.kind.eagle3:
        raise UnusableInput(f"{build_dir} serves an {spec.draft_type} head; the gate compares EAGLE-3 heads")
    return ReferenceEngine.from_build(build_dir, eagle3_head_dir=head)


def decode(engine: Any, prompts: list[list[int]], n: int, eos: list[int], speculative: bool,
           desc: str) -> list[Any]:
    from engines.api import GenerationRequest, SamplingParams

    b, out = engine.limits.max_batch_size, []
    reqs = [GenerationRequest(p, n, SamplingParams(), eos) for p in prompts]
    for i in tqdm(range(0, len(reqs), b), desc=desc, unit="batch"):
        out += engine.generate(reqs[i:i + b], speculative=speculative)
    return out


def figures(results: list[Any]) -> dict[str, Any]:
    from builders.monitoring.baseline import summary
    from engines.api import aggregate_stats

    s = aggregate_stats([r.stats for r in results])
    return summary(s.target_forwards, s.accepted_draft_tokens, s.draft_tokens, list(s.acceptance_by_depth))


def healthy_findings(build_dir: Path, candidate: Path) -> list[str]:
    """The doctor's static problems with the candidate on the build's target (empty = none)."""
    from builders import layout
    from doctor.run import diagnose

    rep = diagnose(layout.hf_target_dir(build_dir), candidate, engine="reference", draft_type="eagle3",
                   max_seq_len=None, measure=False)
    return [f"{f.check}: {f.message}" for f in rep.problems]


def gate(build_dir: Path, current: Path, candidate: Path, records: list[dict[str, Any]], *, margin: float,
         max_new_tokens: int) -> dict[str, Any]:
    """The gate's verdict and figures (module doc)."""
    if not records:
        raise UnusableInput("no held-out requests to measure on")
    problems = healthy_findings(build_dir, candidate)
    with tempfile.TemporaryDirectory(prefix="gate-") as tmp:
        cur = engine_with(build_dir, normalize(current, build_dir, Path(tmp) / "current"))
        limits, tok = cur.limits, cur.tokenizer
        n = max(1, min(max_new_tokens, limits.max_seq_len - limits.max_input_len))
        prompts = [[int(t) for t in r["prompt_ids"]][: limits.max_input_len] for r in records]
        eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
        base = decode(cur, prompts, n, eos, False, "gate: target only")
        got_cur = decode(cur, prompts, n, eos, True, "gate: current head")
        del cur
        cand = engine_with(build_dir, normalize(candidate, build_dir, Path(tmp) / "candidate"))
        got_cand = decode(cand, prompts, n, eos, True, "gate: candidate head")
    want = [r.output_ids for r in base]
    lossless = all(r.output_ids == w for r, w in zip(got_cur, want)) and all(
        r.output_ids == w for r, w in zip(got_cand, want))
    greedy = [(r, w) for r, w in zip(records, want) if float(r.get("sampling", {}).get("temperature", 0)) == 0.0
              and len(r["prompt_ids"]) <= limits.max_input_len]
    reproduced = sum(1 for r, w in greedy if [int(t) for t in r["output_ids"]][: len(w)] == w[: len(r["output_ids"])])
    return verdict(problems, lossless, figures(got_cur), figures(got_cand), current, candidate, margin=margin) | {
        "requests": len(records), "max_new_tokens": n, "captured_greedy": len(greedy),
        "captured_outputs_reproduced": reproduced}


def verdict(problems: list[str], lossless: bool, f_cur: dict[str, Any], f_cand: dict[str, Any], current: Path,
            candidate: Path, *, margin: float) -> dict[str, Any]:
    """The rule both gates apply (measured on the engine here, replayed in adaptive/replay.py): publishable
    when the candidate is healthy (its first position has not collapsed), lossless, and beats the current head's tau
    by `margin`."""
    problems = list(problems)
    if f_cand["position_acceptance"] and f_cand["position_acceptance"][0] < COLLAPSED:
        problems.append(f"first-position acceptance {f_cand['position_acceptance'][0]:.3f} < {COLLAPSED}: collapsed")
    better = f_cand["tau"] >= f_cur["tau"] + margin
    return {
        "publishable": not problems and lossless and better, "healthy": not problems, "problems": problems,
        "lossless": lossless, "better": better, "margin": margin,
        "current": dict(f_cur, head=str(current)), "candidate": dict(f_cand, head=str(candidate)),
        "tau_gain": f_cand["tau"] - f_cur["tau"],
    }


def verdict_text(g: dict[str, Any]) -> str:
    c, k = g["current"], g["candidate"]
    replay = g.get("method") == "replay"
    how = (f"replayed from the target's features, up to {g['max_new_tokens']} tokens each" if replay
           else f"{g['max_new_tokens']} tokens each, greedy")
    lossless = (f"  lossless (candidate = target only on {g['lossless_requests']} requests decoded on the engine): "
                if replay else "  lossless (both heads = target only): ")
    lines = [f"gate on {g['requests']} held-out captured requests ({how}):",
             *(f"  {name:<9} tau {f['tau']:.3f}  acceptance per position "
               f"{[round(p, 3) for p in f['position_acceptance']]}" for name, f in (("current", c), ("candidate", k))),
             f"{lossless}{g['lossless']}; captured greedy outputs reproduced: "
             f"{g['captured_outputs_reproduced']}/{g['captured_greedy']}",
             f"  healthy: {g['healthy']}" + "".join(f"\n    - {p}" for p in g["problems"])]
    need = c["tau"] + g["margin"]
    if g["publishable"]:
        lines.append(f"publishable: candidate tau {k['tau']:.3f} >= {need:.3f} (current + margin {g['margin']})")
    else:
        why = ([] if g["healthy"] else ["not healthy"]) + ([] if g["lossless"] else ["not lossless"]) + (
            [] if g["better"] else [f"tau {k['tau']:.3f} < {need:.3f} (current + margin {g['margin']})"])
        lines.append(f"refused: {'; '.join(why)}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="eagle-doctor gate", description=__doc__.split("\n\n")[0],
                                 epilog="Guide:   docs/adaptive.md",
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=Path, required=True, help="the build directory (engine.backend reference)")
    ap.add_argument("--candidate", type=Path, required=True, help="the candidate head's directory")
    ap.add_argument("--current", type=Path, help="the served head (default: the build's, checkpoint/eagle3)")
    ap.add_argument("--requests", type=Path, required=True, help="JSONL of captured records (held_out.jsonl of a "
                    "refresh run)")
    ap.add_argument("--margin", type=float, default=DEFAULT_MARGIN, help="tau the candidate must gain")
    ap.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS, help="tokens per request")
    ap.add_argument("--json", type=Path, help="write the verdict and figures here")
    args = ap.parse_args(argv)
    from builders import layout
    from doctor.findings import EXIT_UNUSABLE

    try:
        records = read_records(args.requests)
        current = args.current or args.build / layout.CHECKPOINT / layout.EAGLE3_HEAD
        check_inputs(args.build, {"--candidate": args.candidate, "--current": current}, args.json)
        g = gate(args.build, current, args.candidate, records, margin=args.margin,
                 max_new_tokens=args.max_new_tokens)
    except (UnusableInput, OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_UNUSABLE
    print(verdict_text(g))
    if args.json is not None:
        args.json.write_text(json.dumps(g, indent=2) + "\n")
    return EXIT_OK if g["publishable"] else EXIT_FOUND
