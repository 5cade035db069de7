"""eagle-doctor --target DIR --head DIR [--draft-type eagle|eagle3] [--prompts FILE] [--max-new-tokens N]
                    [--engine ENGINE] [--json OUT] [--no-measure]
       eagle-doctor export --head DIR --to eagle-repo|specforge|speculators|trtllm OUT [--target DIR]
                    [--verifier-name ORG/NAME]
       eagle-doctor gate --build BUILD --candidate HEAD --requests HELD_OUT.jsonl [--margin M]
(also `python -m doctor ...`)

Says why a draft head's acceptance is low on a target, and where the head loads as it is. Static checks (all
reported at once): the head's format and layout and the engines that load it unchanged; shapes and vocabulary
against the target; d2t/t2d; captured layer ids and their convention; RoPE base and scaling; max positions;
tokenizer identity; chat template; the loader pitfalls of `--engine`. Measured checks (reference engine, a chain of
draft depth 3 on a few prompts): tau and acceptance per draft position, then experiments that name the cause when
acceptance is low (d2t remaps, captured layers moved by one, chat template off, the target's RoPE base).

Exit status: 0 nothing wrong found; 1 problems found (each with cause, evidence and fix); 2 inputs unusable.
Subcommands: `export` moves a head between ecosystems (`eagle-doctor export --help`); `gate` decides whether a
refreshed head may replace the served one (`eagle-doctor gate --help`, docs/adaptive.md).

Inputs:  --target (HF directory with tokenizer), --head (EAGLE-1/2 or EAGLE-3 head directory, any known layout)
Outputs: the report on stdout; --json OUT every finding (check, severity, message, evidence, fix) and the figures
Guide:   docs/low-acceptance.md
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from doctor.findings import EXIT_UNUSABLE, UnusableInput
from doctor.loaders import ENGINES

EXPORTS = ("eagle-repo", "specforge", "speculators", "trtllm")


def _check_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="eagle-doctor",
        usage=__doc__.split("\n\n")[0].removesuffix("\n"),
        description=__doc__.split("\n\n")[1],
        epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--target", type=Path, required=True, help="the target's HF directory (config, weights, "
                    "tokenizer), a .gguf file or pip:<distribution> (as the build's target.model)")
    ap.add_argument("--head", type=Path, required=True, help="the draft head's directory")
    ap.add_argument("--draft-type", choices=("eagle", "eagle3"), help="assert the head type (detected otherwise)")
    ap.add_argument("--prompts", type=Path, help="JSONL prompts (`prompt` or MT-bench `turns`); default: built-in")
    ap.add_argument("--max-new-tokens", type=int, default=48, help="tokens per prompt in the measured runs")
    ap.add_argument("--engine", choices=ENGINES, default="reference",
                    help="the engine you serve on: its loader's pitfalls count as problems")
    ap.add_argument("--max-seq-len", type=int, help="the serving limit (prompt + output); default the target's "
                    "max_position_embeddings")
    ap.add_argument("--json", type=Path, help="write the findings and figures here")
    ap.add_argument("--no-measure", action="store_true", help="static checks only")
    ap.add_argument("--work", type=Path, help="scratch directory for converted checkpoints (default: a temporary one)")
    return ap


def _export_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="eagle-doctor export",
                                 description="Write an EAGLE-3 head in the layout a loader reads, tensors unchanged "
                                 "(doctor/export.py says which fields each loader reads). Exit 2 when the "
                                 "head cannot run there, with the reason.",
                                 epilog="Guide:   docs/low-acceptance.md")
    ap.add_argument("--head", type=Path, required=True, help="the head's directory, in any layout the doctor reads")
    ap.add_argument("--to", choices=EXPORTS, required=True, help="the loader to write for")
    ap.add_argument("--target", type=Path, help="the target's HF directory (needed for eagle-repo when the head "
                    "ships no embedding, and recorded as the speculators verifier)")
    ap.add_argument("--verifier-name", help="--to speculators: the verifier's name_or_path (default: the target "
                    "config's hub id, else null; a local path names it on this machine only)")
    ap.add_argument("out", type=Path, help="the directory to write (config.json + model.safetensors)")
    return ap


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["gate"]:  # the adaptive loop's gate (doctor/gate.py)
        from doctor.gate import main as gate_main

        return gate_main(argv[1:])
    if argv[:1] == ["export"]:
        from doctor.export import export
        from doctor.run import resolve

        args = _export_parser().parse_args(argv[1:])
        try:
            target = resolve(args.target) if args.target is not None else None
            msg = export(args.head, args.to, args.out, target_dir=target, verifier_name=args.verifier_name)
        except UnusableInput as e:
            print(f"error: {e}", file=sys.stderr)
            return EXIT_UNUSABLE
        print(msg)
        return 0
    args = _check_parser().parse_args(argv)
    from doctor import config_check
    from doctor.run import diagnose
    from core.files import InputFileError, writable_file

    prompts = None
    try:  # every argument and input file checked before any work (doctor/config_check.py)
        config_check.check_limits(args.max_new_tokens, args.max_seq_len)
        if args.json is not None:
            writable_file(args.json, "--json")
        if args.prompts is not None:
            prompts = config_check.read_prompts(args.prompts)
        rep = diagnose(args.target, args.head, engine=args.engine, draft_type=args.draft_type,
                       max_seq_len=args.max_seq_len, measure=not args.no_measure, prompts=prompts,
                       max_new_tokens=args.max_new_tokens, work=args.work)
    except (UnusableInput, InputFileError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_UNUSABLE
    print(rep.text())
    if args.json is not None:
        rep.write_json(args.json)
    return rep.exit_code


if __name__ == "__main__":
    sys.exit(main())
