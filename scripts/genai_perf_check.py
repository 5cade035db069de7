"""Check a genai-perf run against the llmapi repository: are the output tokens it counted the tokens the server
generated? Prints genai-perf's figures and the check; exits 1 on a mismatch.

    python scripts/genai_perf_check.py ARTIFACT_DIR --repo BUILD/triton_repo --max-tokens N

Truth: the reference engine (the one the server runs) decodes every prompt genai-perf sent, greedily, target only
(EAGLE is lossless, so the served answer is the same text). Each request's `text_output` in perf_analyzer's export must
be that text exactly (no prompt echoed, not several cumulative copies), and genai-perf's mean output sequence length
must equal that text re-tokenized as genai-perf does; the generated token count is printed next to it (a text
that re-tokenizes differently is the one way genai-perf's count differs from the engine's).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

FIGURES = ("request_throughput", "output_token_throughput", "request_latency", "output_sequence_length",
           "input_sequence_length", "time_to_first_token", "inter_token_latency")


def _one(artifacts: Path, name: str) -> Path:
    found = sorted(artifacts.rglob(name))
    if len(found) != 1:
        raise SystemExit(f"error: expected one {name} under {artifacts}, found {len(found)}")
    return found[0]


def exchanges(export: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """(prompt, [text_output of each response]) per request of perf_analyzer's profile export."""
    out = []
    for exp in export["experiments"]:
        for req in exp["requests"]:
            prompt = " ".join(json.loads(req["request_inputs"]["payload"])["text_input"])
            texts = [json.loads(event.removeprefix("data: "))["text_output"] for r in req["response_outputs"]
                     for event in r["response"].split("\n\n") if event.strip()]  # SSE when streamed
            out.append((prompt, texts))
    return out


def reference_outputs(build: Path, prompts: list[str], max_tokens: int) -> list[tuple[str, int]]:
    """(text, generated token count) of target-only greedy decoding, per prompt."""
    from engines.api import GenerationRequest, ReferenceEngine, SamplingParams

    eng = ReferenceEngine.from_build(build, device="cpu")
    tok = eng.tokenizer
    out = []
    for p in prompts:  # one at a time: the build's max_batch_size bounds a batch
        req = GenerationRequest(prompt_ids=tok.encode(p), max_new_tokens=max_tokens,
                                sampling=SamplingParams(temperature=0.0), stop_token_ids=[tok.eos_token_id])
        (res,) = eng.generate([req], speculative=False)
        out.append((tok.decode(res.output_ids, skip_special_tokens=True), len(res.output_ids)))
    return out


def recounted(tokenizer_dir: str, texts: list[str]) -> list[int]:
    """Tokens in each text counted as genai-perf counts them (llm_profile_data_parser._get_output_token_counts_batch:
    "!" + text without special tokens, minus the "!")."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    return [len(ids) - 1 for ids in tok(["!" + t for t in texts], add_special_tokens=False)["input_ids"]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="eagle-genai-perf-check",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Inputs:  genai-perf's artifact directory and the served llmapi repository\n"
               "Outputs: genai-perf's figures on stdout; exit 1 if a response or a token count is wrong\n"
               "Guide:   docs/deploy.md")
    ap.add_argument("artifacts", type=Path, help="genai-perf's --artifact-dir")
    ap.add_argument("--repo", type=Path, required=True, help="the served repository (BUILD/triton_repo)")
    ap.add_argument("--max-tokens", type=int, required=True)
    args = ap.parse_args(argv)
    stats = json.loads(_one(args.artifacts, "profile_export_genai_perf.json").read_text())
    for key in FIGURES:
        if key in stats:
            s = stats[key]
            print(f"{key:26s} avg {s['avg']:10.2f}  p50 {s.get('p50', s['avg']):10.2f}  {s['unit']}")
    pairs = exchanges(json.loads(_one(args.artifacts, "profile_export.json").read_text()))
    truth = reference_outputs(args.repo.parent, [p for p, _ in pairs], args.max_tokens)
    bad = [(i, texts, want) for i, ((_, texts), (want, _)) in enumerate(zip(pairs, truth)) if texts != [want]]
    mean_generated = sum(n for _, n in truth) / len(truth)
    recount = recounted(str(args.repo.parent / "checkpoint" / "tokenizer"), [want for want, _ in truth])
    mean_recount = sum(recount) / len(recount)
    counted = stats["output_sequence_length"]["avg"]
    print(f"requests {len(pairs)}: responses equal to the generated text {len(pairs) - len(bad)}/{len(pairs)}; "
          f"output tokens per request: generated {mean_generated:.2f}, that text re-tokenized {mean_recount:.2f}, "
          f"genai-perf counted {counted:.2f}")
    for i, texts, want in bad[:3]:
        print(f"  request {i}: {len(texts)} response(s) {texts!r}\n  generated {want!r}")
    if all(len(texts) == 1 for _, texts in pairs):
        print("one response per request (not streamed): genai-perf's time_to_first_token is the request latency")
    return 0 if not bad and abs(counted - mean_recount) < 1e-6 else 1


if __name__ == "__main__":
    sys.exit(main())
