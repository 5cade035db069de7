"""The tiny reference build (2-layer Llama + EAGLE-1 head, topk-2-2 tree) served by a real tritonserver, shared by
the server test modules: one build and one server per test session (tests/conftest.py `triton_build_dir`,
`triton_server`); modules that need other settings start servers of their own."""

from __future__ import annotations

from pathlib import Path

from builders.build import main as build_main
from tests.triton_servers import server_on
from triton_repo.launch import TritonServer

MAX_BATCH, MAX_QUEUE, MAX_INPUT, MAX_SEQ = 4, 48, 48, 400


def build(root: Path, tiny_target: Path, eagle_head: Path) -> Path:
    cfg = root / "tiny.yaml"
    cfg.write_text(
        f"name: tiny-triton\ntrtllm_version: '1.1'\noutput_dir: {root / 'build'}\n"
        f"target: {{model: {tiny_target}, dtype: float32}}\n"
        f"draft: {{type: eagle, model: {eagle_head}}}\n"
        "tree: {choices: topk-2-2}\n"
        f"engine: {{backend: reference, device: cpu, max_batch_size: {MAX_BATCH}, max_input_len: {MAX_INPUT}, "
        f"max_seq_len: {MAX_SEQ}}}\n"
        f"triton: {{max_queue_size: {MAX_QUEUE}}}\n"
    )
    assert build_main([str(cfg)]) == 0
    return root / "build"


def start_server(repo: Path, log_dir: Path) -> TritonServer:
    """A real tritonserver on `repo`, free loopback ports, its log in `log_dir`."""
    return server_on(repo, log_dir / "tritonserver.log").start(timeout_s=240)
