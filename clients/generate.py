"""Send one prompt to a Triton LLM deployment and print the answer as it arrives, then the speculative stats.

    python clients/generate.py --url localhost:8001 --prompt "Write a haiku about GPUs" --stream --max-tokens 64
    python clients/generate.py --url localhost:8001 --prompt "Hi" --chat        # apply the model's chat template
    python clients/generate.py --url localhost:8001 --prompt "Hi" --chat --thinking off   # Qwen3: no reasoning

The model, its request schema and its tokenizer come from the build's contract with `--repo BUILD/triton_repo` (its
client.json), else from the server's model config (the model: `--model`, else `ensemble` or `tensorrt_llm`, the
entry models builds name by default). Output tokens are counted with that tokenizer (or `--tokenizer DIR|whitespace`).

Inputs:  a served deployment (--url host:grpc_port), --prompt
Outputs: the answer on stdout as it arrives, then tokens, tau and acceptance
Guide:   docs/load-test.md
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# Run as a file (`python clients/generate.py`), Python would put clients/ first on sys.path, where a
# module can shadow an installed package (builders/triton: `triton`): run as the module, as its command does.
if __name__ == "__main__" and not __package__:
    os.execv(sys.executable, [sys.executable, "-m", "clients.generate", *sys.argv[1:]])

from clients import schema as sch
from clients.client import DEFAULT_TIMEOUT_S, GenerationError, GenerationStats, LLMClient, sampling_of
from clients.prompts import chat_prompt
from clients.stats import tau_of
from clients.tokens import TokenCounter, make_counter


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="eagle-generate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--url", default="localhost:8001", help="gRPC endpoint host:port (default localhost:8001)")
    ap.add_argument("--model", default=None,
                    help="model to call (default: the one the build's client.json names with --repo, else the "
                    "server's `ensemble` or, for a current-line llmapi build, `tensorrt_llm`)")
    ap.add_argument("--repo", type=Path, default=None, help="rendered repository: read the schema from its client.json")
    ap.add_argument("--prompt", required=True, help="prompt text")
    ap.add_argument("--max-tokens", type=int, default=128, help="tokens to generate (default 128)")
    ap.add_argument("--stream", action="store_true", help="print text as it is generated")
    ap.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    ap.add_argument("--thinking", choices=("on", "off"), default=None,
                    help="with --chat: the template's thinking switch (Qwen3's enable_thinking; default: as the "
                    "template has it)")
    ap.add_argument("--tokenizer", default=None,
                    help="HF tokenizer dir or `whitespace`, to count output tokens and for --chat (default: the "
                    "build's, with --repo; without --repo, the `tokenizer_dir` the served model config names when it "
                    "is a path on this machine, else tokens are not counted)")
    ap.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: server's)")
    ap.add_argument("--top-p", type=float, default=None, help="top-p (default: server's)")
    ap.add_argument("--top-k", type=int, default=None, help="top-k (default: server's)")
    ap.add_argument("--seed", type=int, default=None, help="sampling seed (default: server's)")
    ap.add_argument("--stop", action="append", default=None, help="stop word (repeatable)")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="request deadline in seconds")
    return ap


def stats_lines(text: str, stats: GenerationStats, counter: TokenCounter | None) -> list[str]:
    """Human-readable summary: timing, tokens and speculative-decoding statistics."""
    e2e = stats.e2e or 0.0
    ttft = stats.ttft or 0.0
    lines = [f"responses: {stats.responses}, time to first response: {ttft * 1e3:.1f} ms, total: {e2e * 1e3:.1f} ms"]
    tokens = None if counter is None else counter.count(text)
    if tokens is None or counter is None:
        lines.append("output tokens: not counted (the server names no tokenizer on this machine: pass --repo "
                     "BUILD/triton_repo or --tokenizer DIR)")
    else:
        rate = tokens / e2e if e2e > 0 else 0.0
        lines.append(f"output tokens: {tokens} ({counter.name}), {rate:.1f} tokens/s")
    if stats.accepted_draft_tokens is None or stats.draft_tokens is None:
        lines.append("speculative stats: not reported by the server")
    else:
        acc, drafted = stats.accepted_draft_tokens, stats.draft_tokens
        rate_txt = f"{acc / drafted:.3f}" if drafted else "n/a"
        line = f"speculative: accepted {acc} of {drafted} draft tokens (acceptance {rate_txt})"
        tau = None if tokens is None else tau_of(tokens, acc)
        if tau is not None:
            line += f", tau {tau:.2f} tokens per target forward"  # stats.py: the engine's and the metrics' definition
        lines.append(line)
    return lines


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.thinking is not None and not args.chat:
        print("error: --thinking switches the chat template's reasoning: add --chat", file=sys.stderr)
        return 2
    try:
        schema = sch.from_repository(args.repo, args.model) if args.repo else sch.fetch_schema(args.url, args.model)
        tok_spec = args.tokenizer or schema.tokenizer
        counter = make_counter(tok_spec) if tok_spec else None
        prompt = chat_prompt(tok_spec, args.prompt, args.thinking) if args.chat else args.prompt
        sampling = sampling_of({"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k,
                                "seed": args.seed, "stop_words": args.stop})
        with LLMClient(args.url, schema=schema, timeout_s=args.timeout) as client:
            pieces = []
            for chunk in client.stream(prompt, args.max_tokens, stream=args.stream, **sampling):
                pieces.append(chunk.text)
                print(chunk.text, end="", flush=True)
            print(flush=True)
            text, stats = "".join(pieces), client.last_stats
    except (sch.SchemaError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except GenerationError as e:
        print(f"\nerror: request failed: {e}", file=sys.stderr)
        return 1
    print("---", file=sys.stderr)
    if stats is None:  # the client records them for every request it completes
        print("error: the client recorded no statistics for the request", file=sys.stderr)
        return 1
    for line in stats_lines(text, stats, counter):
        print(line, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
