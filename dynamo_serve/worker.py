"""The reference engine as a Dynamo worker: a `dynamo.runtime` endpoint that takes the frontend's preprocessed token
requests and streams the accepted tokens of every decoding step back (dynamo_serve/bridge.py), registered with
`register_model` the way Dynamo's TensorRT-LLM worker registers itself (ai-dynamo/dynamo v1.6.1
components/src/dynamo/trtllm/workers/llm_worker.py: tokens in, `worker_type` by role, a prefill worker's
`ModelType.Prefill` marker and its decode peer in `needs`).

    python -m dynamo_serve.worker BUILD_DIR [--role aggregated|prefill|decode] [--namespace NS] [--threads N]

Runs under the Python that has Dynamo installed (scripts/setup_dynamo.sh); the planes come from Dynamo's own
environment variables (DYN_DISCOVERY_BACKEND, DYN_FILE_KV, DYN_REQUEST_PLANE, DYN_EVENT_PLANE), which
`eagle-dynamo serve` sets.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import torch

from dynamo_serve import layout
from dynamo_serve.serve import READY_ENV
from dynamo_serve.bridge import EngineBridge, SpecCounters, check_handoff, respond
from engines.api import ReferenceEngine

ROLES = ("aggregated", "prefill", "decode")
COMPONENT = {"aggregated": "backend", "prefill": "prefill", "decode": "backend"}  # dynamo/trtllm/args.py defaults
ENDPOINT = "generate"
MAX_QUEUE_SIZE = 64


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m dynamo_serve.worker", description=__doc__.split("\n\n")[0],
                                epilog="Inputs:  a build directory with dynamo/; Dynamo's DYN_* environment\n"
                                "Outputs: a registered Dynamo worker serving token requests until SIGTERM\n"
                                "Guide:   docs/deploy.md (section \"NVIDIA Dynamo\")",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("build_dir", type=Path, help="a build directory with dynamo/ (written by builders/build.py)")
    p.add_argument("--role", choices=ROLES, default="aggregated",
                   help="aggregated: prefill and decode; prefill/decode: one side of a disaggregated pair")
    p.add_argument("--namespace", default=layout.NAMESPACE, help="the Dynamo namespace to register in")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads of this worker")
    return p.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    from dynamo._core import DistributedRuntime
    from dynamo.llm import ModelInput, ModelRuntimeConfig, ModelType, WorkerType, register_model

    torch.set_num_threads(args.threads)
    card = layout.read_card(args.build_dir)
    engine = ReferenceEngine.from_build(args.build_dir)
    limits = engine.limits
    session = engine.session(limits.max_batch_size, limits.max_seq_len, speculative=engine.has_draft)
    counters = SpecCounters()
    bridge = EngineBridge(session, max_queue_size=MAX_QUEUE_SIZE, counters=counters)

    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(loop, os.environ.get("DYN_DISCOVERY_BACKEND", "file"),
                                 os.environ.get("DYN_REQUEST_PLANE", "tcp"),
                                 event_plane=os.environ.get("DYN_EVENT_PLANE", "zmq"))
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, runtime.shutdown)
    endpoint = runtime.endpoint(f"{args.namespace}.{COMPONENT[args.role]}.{ENDPOINT}")
    rc = ModelRuntimeConfig()
    rc.context_length = limits.max_seq_len
    rc.max_num_seqs = limits.max_batch_size
    rc.max_num_batched_tokens = limits.max_seq_len
    rc.enable_eagle = engine.has_draft
    if args.role == "prefill":
        model_type, worker_type, needs = ModelType.Prefill, WorkerType.Prefill, [[WorkerType.Decode]]
    elif args.role == "decode":
        model_type, worker_type = ModelType.Chat | ModelType.Completions, WorkerType.Decode
        needs = [[WorkerType.Prefill]]
    else:
        model_type, worker_type, needs = ModelType.Chat | ModelType.Completions, WorkerType.Aggregated, []
    await register_model(ModelInput.Tokens, model_type, endpoint, str(card.model_dir), card.served_model_name,
                         worker_type=worker_type, needs=needs, kv_cache_block_size=card.kv_block_size,
                         runtime_config=rc)
    endpoint.metrics.register_prometheus_expfmt_callback(lambda: counters.exposition(args.role))
    if ready := os.environ.get(READY_ENV):  # eagle-dynamo serve waits for every worker's file
        Path(ready).touch()
    prefill_only = args.role == "prefill"

    async def generate(request: dict[str, Any], context: Any) -> AsyncIterator[dict[str, Any]]:
        if args.role == "decode" and (problem := check_handoff(request)) is not None:
            yield {"token_ids": [], "finish_reason": {"error": problem}}
            return
        def stopped() -> bool:
            return bool(context.is_stopped() or context.is_killed())

        async for chunk in respond(bridge, request, stopped, prefill_only=prefill_only, rid=str(context.id())):
            yield chunk

    logging.info("eagle reference worker (%s) serving %s", args.role, card.served_model_name)
    try:
        await endpoint.serve_endpoint(generate, graceful_shutdown=False)
    finally:
        bridge.close()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s worker %(levelname)s %(message)s")
    import uvloop

    uvloop.run(serve(args))


if __name__ == "__main__":
    main()
