"""`python docker/serve.py BUILD_DIR [--host H] [--http-port P] ... [--print-argv]`

What `docker/entrypoint.sh serve BUILD_DIR` runs: checks that BUILD_DIR is a finished build that this container can
serve, then replaces itself (exec) with `triton_repo/launch.py` on the build's model repository, so SIGTERM from
`docker stop` / Kubernetes reaches the launcher, which stops tritonserver cleanly.

Everything comes from the build itself (one source of truth): the resolved config `BUILD_DIR/config.resolved.yaml`
written by builders/build.py gives the backend and the parallel sizes; the model repository is the output
directory of the Triton stage (its `Stage.name`).

Nothing is written into BUILD_DIR: a build serves from a read-only mount (the Kubernetes manifests mount it so).
TensorRT-LLM's own llmapi model (the current line on a GPU) is imported by the build's model from where the image
has it (`$TRTLLM_LLMAPI_MODEL_DIR`), not copied into the build; this command only checks it is there.

Inputs:  BUILD_DIR, a finished build (config.resolved.yaml, triton_repo/)
Outputs: a running tritonserver on the given ports (exec of triton_repo/launch.py)
Guide:   docs/deploy.md
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

from builders.config import BuildConfig
from builders.layout import MANIFEST
from builders.layout import RESOLVED_CONFIG as RESOLVED
from builders.resolved import load_resolved
from builders.startup import startup_problems, trtllm_import_problems
from builders.versions import installed_trtllm
from triton_repo.launch import TRITON_PORTS  # re-exported: the image's ports

EXIT_PROBLEM = 2


class ServeError(RuntimeError):
    """The build directory cannot be served; `problems` says why and what to do."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(f"  - {p}" for p in problems))


def load_build_config(build_dir: Path) -> BuildConfig:
    """The validated config the build was made with, read where the build is now (builders/resolved.py)."""
    path = build_dir / RESOLVED
    if not path.is_file():
        raise ServeError([f"{path} not found: {build_dir} is not a finished build; run `entrypoint.sh build CONFIG`"])
    try:
        return load_resolved(build_dir)
    except ValueError as e:
        raise ServeError([f"{path} cannot be read as a build config: {e}"]) from None


def repository_stage_name() -> str:
    """Name of the stage whose output directory is the Triton model repository."""
    from builders.triton.stage import TRITON_STAGE

    return TRITON_STAGE.name


def world_size(cfg: BuildConfig) -> int:
    """Server processes to start. A TensorRT engine has tp*pp ranks, one tritonserver per rank under mpirun
    (tensorrtllm_backend launch_triton_server.py). The LLM-API (`pytorch`) model takes tensor_parallel_size from
    its model.yaml and spawns its workers inside one server, launched with the default world size 1
    (tensorrtllm_backend docs/llmapi.md); the reference engine runs in one server too."""
    return cfg.engine.kind.world_size(cfg.parallel)


def check_build(build_dir: Path, cfg: BuildConfig, repo_stage: str) -> list[str]:
    problems = list(startup_problems(cfg.engine.backend, cfg.trtllm_version))
    if not problems and cfg.engine.kind.runs_trtllm and installed_trtllm() is not None:
        problems += trtllm_import_problems(cfg.trtllm_version)  # the image's install, before Triton starts
    repo = build_dir / repo_stage
    if not (repo / MANIFEST).is_file():
        problems.append(
            f"{repo}/{MANIFEST} not found: the Triton stage `{repo_stage}` has not finished; rerun the build"
        )
    return problems + upstream_llmapi_problems(cfg, repo)


UPSTREAM_LLMAPI_ENV = "TRTLLM_LLMAPI_MODEL_DIR"  # overrides where upstream's llmapi model.py / helpers.py are taken


def upstream_llmapi_model(cfg: BuildConfig, repo: Path) -> tuple[Path, dict[str, Path]] | None:
    """The current line on a GPU (llmapi layout, engine.backend pytorch): the repository holds our config.pbtxt,
    model.yaml and the metrics bridge (model.py); the model code is TensorRT-LLM's own
    triton_backend/all_models/llmapi/tensorrt_llm/1/{model,helpers}.py from the image, model.py copied as
    upstream_model.py (builders/triton/render_llmapi.py UPSTREAM_FILES). Returns (source dir, {upstream name: file to
    write}) or None when nothing is needed."""
    from builders.triton.render import layout
    from builders.triton.render_llmapi import UPSTREAM_FILES, UPSTREAM_MODEL_DIR

    if layout(cfg) != "llmapi" or not cfg.engine.kind.llmapi_model:
        return None
    src = Path(os.environ.get(UPSTREAM_LLMAPI_ENV, UPSTREAM_MODEL_DIR))
    dest = repo / cfg.triton.llm_model / "1"
    return src, {name: dest / to for name, to in UPSTREAM_FILES.items() if not (dest / to).is_file()}


def upstream_llmapi_problems(cfg: BuildConfig, repo: Path) -> list[str]:
    found = upstream_llmapi_model(cfg, repo)
    if found is None:
        return []
    src, missing = found
    absent = [name for name in missing if not (src / name).is_file()]
    if not absent:
        return []
    return [f"TensorRT-LLM's llmapi Triton model ({', '.join(absent)}) not found in {src}: serve in an image built by "
            "tensorrtllm_backend's Dockerfile for this TensorRT-LLM (docs/deploy.md, 'Which image'), or set "
            f"{UPSTREAM_LLMAPI_ENV} to TensorRT-LLM's triton_backend/all_models/llmapi/tensorrt_llm/1"]


def install_upstream_llmapi_model(cfg: BuildConfig, repo: Path) -> None:
    """Copy upstream's files into a writable repository as `upstream_model.py` / `helpers.py` (the bridge prefers a
    copy next to it). Serving does not need it (the bridge imports the image's files); for a repository that must
    carry its own copy."""
    import shutil

    found = upstream_llmapi_model(cfg, repo)
    if found is None:
        return
    for name, to in found[1].items():
        shutil.copyfile(found[0] / name, to)


def serve_argv(
    build_dir: Path,
    cfg: BuildConfig,
    repo_stage: str,
    *,
    python: str,
    host: str,
    http_port: int,
    grpc_port: int,
    metrics_port: int,
    log: str,
    timeout_s: float,
    model_control: str = "none",
) -> list[str]:
    """The launcher command (pure: computed from the build's config). `model_control` explicit: the server loads
    model versions on request (what adaptive/refresh.py --publish / --rollback use on every replica)."""
    return [
        python, str(REPO / "triton_repo" / "launch.py"),
        "--repo", str(build_dir / repo_stage),
        "--world-size", str(world_size(cfg)),
        "--host", host,
        "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port),
        "--log", log,
        "--timeout", str(timeout_s),
        *(["--model-control", model_control] if model_control != "none" else []),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="serve.py", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("build_dir", type=Path, help="a finished build directory (config output_dir)")
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (the entrypoint passes 0.0.0.0)")
    ap.add_argument("--http-port", type=int, default=TRITON_PORTS["http"], help="HTTP port (/v2/health/ready)")
    ap.add_argument("--grpc-port", type=int, default=TRITON_PORTS["grpc"], help="gRPC port (clients, load test)")
    ap.add_argument("--metrics-port", type=int, default=TRITON_PORTS["metrics"], help="Prometheus port (/metrics)")
    ap.add_argument("--log", default="/dev/stdout", help="tritonserver log file")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait until every model is loaded")
    ap.add_argument("--model-control", choices=("none", "explicit"), default="none",
                    help="explicit: load model versions on request through Triton's model-repository API (the admin "
                    "key's endpoints), so a published head reaches this server without a restart")
    ap.add_argument("--print-argv", action="store_true", help="print the launcher command and exit")
    args = ap.parse_args(argv)
    build_dir = args.build_dir.resolve()
    try:
        cfg = load_build_config(build_dir)
        stage = repository_stage_name()
        problems = check_build(build_dir, cfg, stage)
        if problems:
            raise ServeError(problems)
    except ServeError as e:
        print(f"error: cannot serve {build_dir}:\n{e}", file=sys.stderr)
        return EXIT_PROBLEM
    cmd = serve_argv(
        build_dir, cfg, stage, python=sys.executable, host=args.host, http_port=args.http_port,
        grpc_port=args.grpc_port, metrics_port=args.metrics_port, log=args.log, timeout_s=args.timeout,
        model_control=args.model_control,
    )
    print(" ".join(cmd), flush=True)
    if args.print_argv:
        return 0
    os.execv(cmd[0], cmd)
    return 0  # not reached: execv replaces this process


if __name__ == "__main__":
    sys.exit(main())
