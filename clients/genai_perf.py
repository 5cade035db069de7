"""The genai-perf command for a served model (pure: returns argv; running it is the caller's business).

    python -m clients.genai_perf --repo <build>/triton_repo --http-url localhost:8000 [--max-tokens 128]

Which `--endpoint-type` fits (perf_analyzer's genai-perf, genai_perf/config/endpoint_config.py and
inputs/converters/):
- our ensemble / BLS (TensorRT-LLM 1.1/1.2 repositories): `kserve` (gRPC), whose payload names (`text_input`,
  `max_tokens`, `stream`, `exclude_input_in_output`) are the ensemble's own;
- upstream's `llmapi` model (the current line): `generate` (HTTP `v2/models/<m>/generate`). `kserve` sends tensors the
  llmapi config does not declare (`max_tokens`, `exclude_input_in_output`), which Triton refuses ("unexpected
  inference input"); the generate extension maps JSON keys that name model inputs onto them, so the output length
  goes in as `--extra-inputs sampling_param_max_tokens:N`, and `sampling_param_exclude_input_from_output:true` keeps
  the prompt out of the counted text. Not streamed: the llmapi model streams the text generated so far in every
  response, and genai-perf joins streamed responses as deltas (llm_profile_data_parser), which overcounts output
  tokens. (The `generate` type posts to `.../generate` even with `--streaming`, which only adds a JSON `stream` key the
  model does not declare; a streamed run needs `--endpoint v2/models/<m>/generate_stream --extra-inputs
  streaming:true`.) So genai-perf's time_to_first_token here is the request latency; clients.loadtest measures TTFT.
  scripts/genai_perf_run.sh runs this command for real and checks the counted tokens.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from clients import schema as sch

GENAI_PERF = "genai-perf"


def genai_perf_argv(schema: sch.Schema, *, grpc_url: str, http_url: str, tokenizer: str, max_tokens: int,
                    concurrency: int = 1, requests: int = 32, input_tokens: int = 128) -> list[str]:
    common = ["-m", schema.model, "--tokenizer", tokenizer, "--concurrency", str(concurrency),
              "--request-count", str(requests), "--synthetic-input-tokens-mean", str(input_tokens)]
    if schema.dialect is sch.LLMAPI:
        return [GENAI_PERF, "profile", *common, "--endpoint-type", "generate", "-u", http_url,
                "--extra-inputs", f"{sch.LLMAPI.max_tokens}:{max_tokens}",
                "--extra-inputs", f"{sch.LLMAPI.exclude_input}:true"]
    return [GENAI_PERF, "profile", *common, "--endpoint-type", "kserve", "-u", grpc_url, "--streaming",
            "--output-tokens-mean", str(max_tokens), "--output-tokens-mean-deterministic"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="eagle-genai-perf", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Inputs:  a rendered triton_repo (its client.json) of a served build\n"
               "Outputs: the genai-perf command line on stdout (nothing is run)\n"
               "Guide:   docs/load-test.md")
    ap.add_argument("--repo", type=Path, required=True, help="rendered repository (its client.json)")
    ap.add_argument("--model", default=None, help="model (default: the one the build's client.json names)")
    ap.add_argument("--grpc-url", default="localhost:8001")
    ap.add_argument("--http-url", default="localhost:8000")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--requests", type=int, default=32)
    args = ap.parse_args(argv)
    try:
        schema = sch.from_repository(args.repo, args.model)
    except sch.SchemaError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if schema.tokenizer is None:
        print("error: the repository names no tokenizer; pass one to genai-perf with --tokenizer", file=sys.stderr)
        return 2
    print(" ".join(genai_perf_argv(schema, grpc_url=args.grpc_url, http_url=args.http_url, tokenizer=schema.tokenizer,
                                   max_tokens=args.max_tokens, concurrency=args.concurrency, requests=args.requests)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
