"""The tiny reference build (2-layer Llama + EAGLE-1 head, topk-2-2 tree) served by a real tritonserver, shared by
the server test modules: one build and one server per test session (tests/conftest.py `triton_build_dir`,
`triton_server`); modules that need other settings start servers of their own."""

from __future__ import annotations

from pathlib import Path

from testkit.triton_servers import server_on, tiny_reference_repo
from triton_repo.launch import TritonServer

MAX_BATCH, MAX_QUEUE, MAX_INPUT, MAX_SEQ = 4, 48, 48, 400  # batch and input length: tiny_reference_repo's


def build(root: Path, tiny_target: Path, eagle_head: Path) -> Path:
    """The build directory (its triton_repo/ inside)."""
    # Internal models exposed: the server tests call them directly (tests/test_triton_guard.py: guarded default)
    repo = tiny_reference_repo(root, "tiny-triton", tiny_target, eagle_head, max_seq_len=MAX_SEQ,
                               max_queue_size=MAX_QUEUE, expose_internal=True)
    return repo.parent


def start_server(repo: Path, log_dir: Path) -> TritonServer:
    """A real tritonserver on `repo`, free loopback ports, its log in `log_dir`."""
    return server_on(repo, log_dir / "tritonserver.log").start(timeout_s=240)
