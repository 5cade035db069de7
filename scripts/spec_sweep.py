"""Concurrency sweep with speculation on and off, on one reference build served by two Triton servers.

    python scripts/spec_sweep.py --build build/demo --prompts FILE.jsonl --out OUT --concurrency 1,2,4 \
        --requests 8 --max-tokens 64 [--threads 1] [--rounds 3] [--chat]

The build's repository is served as it is (EAGLE) and, from a copy in OUT/triton_repo_spec_off, without speculation:
the same engine, weights and batcher. In the ensemble layout (TensorRT-LLM 1.1/1.2 line) the copy's reference LLM
model has its `speculative` parameter false; in the llmapi layout (current line) the copy's model.yaml has no
`speculative_config`, which is how TensorRT-LLM's LLM API is told not to speculate. The copy's paths are rewritten to
name the build's engine, checkpoint and tokenizer (builders/triton/relocate.py), so OUT can be anywhere.
Then `clients/loadtest.py --baseline-url` runs each concurrency level on both, one after the other, and writes the
two throughput curves and their ratio (speculation_on_off.png, comparison.json) next to its usual report. With
--rounds R > 1 each round goes to OUT/round-K/, every second round runs speculation off first at each level (its
report then has the speculation-off server as `url` and EAGLE as the baseline), and OUT/sweep.json holds every
round's EAGLE / speculation-off ratio per level and their median: on a machine whose load changes, the median of
rounds in both orders is the figure to read. It also compares the answers (the load tester records each request's
text): per level, the prompts whose answers with speculation are the same text as without it (greedy decoding is
lossless: every one should be; a difference is listed by prompt index in sweep.json).

Inputs:  a finished build with engine.backend reference (either layout)
Outputs: OUT[/round-K]/report.json (EAGLE), .../baseline/report.json (speculation off), .../comparison.json, the
         plots; OUT/sweep.json (the ratios of every round)
Guide:   docs/load-test.md
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from collections.abc import Callable
from typing import Any

REPO = Path(__file__).resolve().parent.parent

LLM_MODEL = "tensorrt_llm"
MODEL_YAML = "model.yaml"


def layout_of(repo: Path, llm_model: str = LLM_MODEL) -> str:
    """`ensemble` (a reference LLM model with the `speculative` parameter) or `llmapi` (model.yaml with a
    speculative_config); anything else is refused with what to do."""
    import yaml
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    pbtxt = repo / llm_model / "config.pbtxt"
    if not pbtxt.is_file():
        raise ValueError(f"{pbtxt} not found: --build must be a finished build (BUILD/triton_repo/{llm_model})")
    cfg = text_format.Parse(pbtxt.read_text(), mc.ModelConfig())
    if "speculative" in cfg.parameters:
        return "ensemble"
    options = repo / llm_model / "1" / MODEL_YAML
    if "build_dir" in cfg.parameters and options.is_file():
        if not (yaml.safe_load(options.read_text()) or {}).get("speculative_config"):
            raise ValueError(f"{options} has no speculative_config: this repository does not speculate")
        return "llmapi"
    raise ValueError(f"{pbtxt} has no `speculative` parameter: it is not a reference LLM model of this version; "
                     "rebuild the repository (python builders/build.py CONFIG --only triton_repo --force)")


def spec_off_copy(repo: Path, dest: Path, llm_model: str = LLM_MODEL) -> Path:
    """A copy of the repository at `dest` whose LLM model decodes without speculation, its paths naming the build's
    files (builders/triton/relocate.py)."""
    import yaml
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    from builders.triton.relocate import relocate

    layout = layout_of(repo, llm_model)
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(repo, dest, symlinks=True)
    relocate(repo, dest)
    if layout == "ensemble":
        pbtxt = dest / llm_model / "config.pbtxt"
        cfg = text_format.Parse(pbtxt.read_text(), mc.ModelConfig())
        cfg.parameters["speculative"].string_value = "false"
        pbtxt.write_text(text_format.MessageToString(cfg))
    else:
        for f in sorted((dest / llm_model).glob(f"*/{MODEL_YAML}")):  # every version the model may serve
            doc = yaml.safe_load(f.read_text())
            doc.pop("speculative_config", None)
            f.write_text(yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=120))
    return dest


def served_model(repo: Path, llm_model: str = LLM_MODEL) -> str:
    """The model the load test sends to: the ensemble, or the llmapi layout's one model."""
    return "ensemble" if layout_of(repo, llm_model) == "ensemble" else llm_model


def loadtest_argv(url: str, baseline_url: str, repo: Path, out: Path, args: argparse.Namespace) -> list[str]:
    return [
        sys.executable, str(REPO / "clients" / "loadtest.py"), "--url", url, "--baseline-url", baseline_url,
        "--model", served_model(repo), "--repo", str(repo), "--prompts", str(args.prompts), "--out", str(out),
        "--concurrency", ",".join(map(str, args.concurrency)), "--requests", str(args.requests), "--max-tokens",
        str(args.max_tokens), "--stream", "--no-progress", "--timeout", "900", *(["--chat"] if args.chat else []),
    ]


def off_first(k: int) -> bool:
    """Round k (0-based) runs speculation off first at each level: every second round."""
    return k % 2 == 1


def answers(report_dir: Path) -> dict[float, dict[int, set[str]]]:
    """level -> prompt index -> the texts its completed requests answered (loadtest's requests.jsonl)."""
    out: dict[float, dict[int, set[str]]] = {}
    for line in (report_dir / "requests.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["status"] == "OK" and rec.get("text") is not None:
            out.setdefault(float(rec["level"]), {}).setdefault(int(rec["prompt_index"]), set()).add(rec["text"])
    return out


def identical(round_dir: Path, level: float) -> dict[str, Any]:
    """Per level of one round: the prompts whose every answer with speculation equals every answer without it
    (one and the same text on both servers), and those that differ."""
    a, b = answers(round_dir).get(level, {}), answers(round_dir / "baseline").get(level, {})
    both = sorted(set(a) & set(b))
    differ = [p for p in both if len(a[p] | b[p]) != 1]
    empty = [p for p in both if a[p] | b[p] == {""}]  # the model ended at once on both: identical, but say so
    return {"prompts": len(both), "identical": len(both) - len(differ), "differ": differ, "empty": empty}


def summarize(rounds: list[Path]) -> dict[str, Any]:
    """Every round's EAGLE / speculation-off ratio per level (comparison.json; the rounds run off first are read
    the other way round), their median, and per round whether the answers on and off were the same texts."""
    docs = [json.loads((r / "comparison.json").read_text()) for r in rounds]
    levels = [row["level"] for row in docs[0]["levels"]]
    out = []
    for i, level in enumerate(levels):
        on, off = [], []
        for k, d in enumerate(docs):
            row = d["levels"][i]
            a, b = row["on_tokens_per_s"], row["off_tokens_per_s"]
            on.append(b if off_first(k) else a)
            off.append(a if off_first(k) else b)
        ratios = [a / b for a, b in zip(on, off, strict=True) if b]
        same = [identical(r, float(level)) for r in rounds]
        out.append({"level": level, "ratios": ratios, "median_ratio": statistics.median(ratios) if ratios else None,
                    "on_tokens_per_s": on, "off_tokens_per_s": off, "outputs": same,
                    "outputs_identical": sum(x["identical"] for x in same),
                    "outputs_compared": sum(x["prompts"] for x in same),
                    "outputs_empty": sum(len(x["empty"]) for x in same)})
    return {"rounds": [str(r) for r in rounds], "off_first": [off_first(k) for k in range(len(rounds))],
            "levels": out}


def concurrency_levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--concurrency {text!r}: comma-separated integers, e.g. 1,2,4") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"--concurrency {text!r}: every level must be >= 1")
    return levels


def positive_int(name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} {text!r}: an integer") from None
        if v < 1:
            raise argparse.ArgumentTypeError(f"{name} {text}: must be >= 1")
        return v
    return parse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="eagle-spec-sweep", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_build_prompts_out(ap, "output directory (anywhere)")
    ap.add_argument("--concurrency", default=[1, 2, 4], type=concurrency_levels, help="levels, e.g. 1,2,4 (default)")
    ap.add_argument("--requests", type=positive_int("--requests"), default=8,
                    help="measured requests per level and deployment")
    ap.add_argument("--max-tokens", type=positive_int("--max-tokens"), default=64, help="max_tokens per request")
    ap.add_argument("--rounds", type=positive_int("--rounds"), default=1,
                    help="repeat the whole sweep on the same two servers (default 1); ratios per round in sweep.json")
    ap.add_argument("--threads", type=positive_int("--threads"), default=None,
                    help="OMP_NUM_THREADS for the servers and the client")
    ap.add_argument("--chat", action="store_true",
                    help="send the prompts inside the model's chat template (loadtest.py --chat), as chat clients do")
    args = ap.parse_args(argv)
    check_prompts_and_build(ap, args)
    return args


def add_build_prompts_out(ap: argparse.ArgumentParser, out_help: str) -> None:
    """--build, --prompts and --out, as the sweep and the served benchmark take them (check_prompts_and_build)."""
    ap.add_argument("--build", required=True, type=Path, help="finished reference build (either layout)")
    ap.add_argument("--prompts", required=True, type=Path, help="JSONL prompts")
    ap.add_argument("--out", required=True, type=Path, help=out_help)


def check_prompts_and_build(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--prompts is a file and --build holds a rendered repository of either layout: checked before a server loads
    anything (the parser's usage error otherwise)."""
    if not args.prompts.is_file():
        ap.error(f"--prompts {args.prompts}: no such file")
    try:
        layout_of(args.build / "triton_repo")
    except ValueError as e:
        ap.error(f"--build {args.build}: {e}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    from triton_repo.launch import TritonServer, free_port

    repo = args.build / "triton_repo"
    args.out.mkdir(parents=True, exist_ok=True)
    off = spec_off_copy(repo, args.out / "triton_repo_spec_off")
    servers = [TritonServer(r, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(),
                            log_path=args.out / f"tritonserver-{name}.log") for name, r in (("on", repo), ("off", off))]
    outs = [args.out] if args.rounds == 1 else [args.out / f"round-{k + 1}" for k in range(args.rounds)]
    with servers[0] as on_server, servers[1] as off_server:
        for k, out in enumerate(outs):
            first, second = (off_server, on_server) if off_first(k) else (on_server, off_server)
            argv_ = loadtest_argv(first.grpc_url, second.grpc_url, repo, out, args)
            print("$ " + " ".join(argv_), flush=True)
            rc = subprocess.run(argv_, cwd=REPO, check=False).returncode
            if rc != 0:
                return rc
    summary = summarize(outs)
    (args.out / "sweep.json").write_text(json.dumps(summary, indent=2) + "\n")
    for row in summary["levels"]:
        ratios = " ".join(f"{r:.2f}x" for r in row["ratios"]) or "-"
        median = "-" if row["median_ratio"] is None else f"{row['median_ratio']:.2f}x"
        print(f"concurrency {row['level']}: on/off {ratios} (median {median}); answers identical on and off: "
              f"{row['outputs_identical']}/{row['outputs_compared']} prompts ({row['outputs_empty']} of them empty "
              "on both)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
