"""Concurrency sweep with speculation on and off, on one reference build served by two Triton servers.

    python scripts/spec_sweep.py --build build/demo --prompts FILE.jsonl --out OUT --concurrency 1,2,4 \
        --requests 8 --max-tokens 64 [--threads 1]

The build's repository is served as it is (EAGLE) and, from a copy in OUT/triton_repo_spec_off whose reference LLM
model has its `speculative` parameter false, without speculation: the same engine, weights and batcher. Then
`clients/loadtest.py --baseline-url` runs each concurrency level on both, one after the other, and writes the two
throughput curves and their ratio (OUT/speculation_on_off.png, OUT/comparison.json) next to its usual report.

Inputs:  a finished build with engine.backend reference and the ensemble layout (TensorRT-LLM 1.1/1.2 line)
Outputs: OUT/report.json (EAGLE), OUT/baseline/report.json (speculation off), OUT/comparison.json, the plots
Guide:   docs/load-test.md
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

LLM_MODEL = "tensorrt_llm"


def spec_off_copy(repo: Path, dest: Path, llm_model: str = LLM_MODEL) -> Path:
    """A copy of the repository whose LLM model decodes without speculation (parameter `speculative` = false)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(repo, dest, symlinks=True)
    pbtxt = dest / llm_model / "config.pbtxt"
    cfg = text_format.Parse(pbtxt.read_text(), mc.ModelConfig())
    if "speculative" not in cfg.parameters:
        raise ValueError(f"{repo / llm_model / 'config.pbtxt'} has no `speculative` parameter: it is not a reference "
                         "LLM model of this version; rebuild the repository (python builders/build.py CONFIG "
                         "--only triton_repo --force)")
    cfg.parameters["speculative"].string_value = "false"
    pbtxt.write_text(text_format.MessageToString(cfg))
    return dest


def loadtest_argv(url: str, baseline_url: str, repo: Path, args: argparse.Namespace) -> list[str]:
    return [
        sys.executable, str(REPO / "clients" / "loadtest.py"), "--url", url, "--baseline-url", baseline_url,
        "--repo", str(repo), "--prompts", str(args.prompts), "--out", str(args.out), "--concurrency",
        args.concurrency, "--requests", str(args.requests), "--max-tokens", str(args.max_tokens), "--stream",
        "--no-progress", "--timeout", "900",
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="spec_sweep.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", required=True, type=Path, help="finished reference build (ensemble layout)")
    ap.add_argument("--prompts", required=True, type=Path, help="JSONL prompts")
    ap.add_argument("--out", required=True, type=Path, help="output directory")
    ap.add_argument("--concurrency", default="1,2,4", help="levels, e.g. 1,2,4 (default)")
    ap.add_argument("--requests", type=int, default=8, help="measured requests per level and deployment")
    ap.add_argument("--max-tokens", type=int, default=64, help="max_tokens per request")
    ap.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS for the servers and the client")
    args = ap.parse_args(argv)
    if args.threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    from triton_repo.launch import TritonServer, free_port

    repo = args.build / "triton_repo"
    args.out.mkdir(parents=True, exist_ok=True)
    off = spec_off_copy(repo, args.out / "triton_repo_spec_off")
    servers = [TritonServer(r, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(),
                            log_path=args.out / f"tritonserver-{name}.log") for name, r in (("on", repo), ("off", off))]
    with servers[0] as on_server, servers[1] as off_server:
        argv_ = loadtest_argv(on_server.grpc_url, off_server.grpc_url, repo, args)
        print("$ " + " ".join(argv_), flush=True)
        rc = subprocess.run(argv_, cwd=REPO, check=False).returncode
    return rc


if __name__ == "__main__":
    sys.exit(main())
