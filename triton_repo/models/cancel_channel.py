"""Cancellation of ensemble streams, carried from the postprocessing model to the python LLM model.

Why it is needed: Triton cancels an ensemble's composing requests only for the steps it schedules after the client
cancelled (core r24.10 and main, ensemble_scheduler.cc EnsembleContext::ScheduleSteps calls Cancel() on the next
step's request), so the LLM model's request, already running, never reads is_cancelled() true and would hold its
sequence slot to the end. The postprocessing steps scheduled for the LLM model's later responses do carry the flag:
with no dynamic batcher in front of postprocessing (whose queue would drop them unseen, scheduler_utils.cc
PriorityQueue::PolicyQueue::ApplyPolicy), the python backend executes them and `is_cancelled()` is true.

So every response of a python LLM model carries its sequence's cancel handle (`cancel_handle`,
contract.CANCEL_HANDLE_OUTPUT), the ensemble passes it to postprocessing, and postprocessing, given a cancelled
request, sends the handle's token to the LLM model instance named in it, which stops the sequence at its next step.

The channel is a Linux abstract-namespace UNIX datagram socket per LLM model instance: no file (works under a
read-only root filesystem), reachable only from the same network namespace (the server's stubs). A handle is
`eagle-cancel-<32 hex>/<32 hex>` (the instance's address, the sequence's token): 128 random bits each, so only
whoever holds one of a sequence's responses can cancel it.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import socket
import threading
from collections.abc import Callable

_HEX = "[0-9a-f]{32}"
HANDLE_RE = re.compile(f"(eagle-cancel-{_HEX})/({_HEX})")
TOKEN_RE = re.compile(_HEX)


def _socket() -> socket.socket:
    return socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)


class Listener:
    """The LLM model's end: `handle()` gives a new sequence its handle and token; a token received calls
    `on_cancel(token)` on the listener's thread."""

    def __init__(self, on_cancel: Callable[[str], object]) -> None:
        self.address = f"eagle-cancel-{secrets.token_hex(16)}"
        self._on_cancel = on_cancel
        self._sock = _socket()
        self._sock.bind("\0" + self.address)
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="llm-cancel-listener", daemon=True)
        self._thread.start()

    def handle(self) -> tuple[str, str]:
        """(handle, token) for a new sequence."""
        token = secrets.token_hex(16)
        return f"{self.address}/{token}", token

    def _loop(self) -> None:
        while not self._closed:
            try:
                data = self._sock.recv(64)
            except OSError:
                return  # closed
            token = data.decode("ascii", "replace")
            if TOKEN_RE.fullmatch(token):
                self._on_cancel(token)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked recv
        self._sock.close()
        self._thread.join(timeout=5)


def send_cancel(handle: str) -> bool:
    """Postprocessing's end: ask the LLM model instance named in `handle` to stop the handle's sequence. False when
    the handle is malformed (never sent) or its instance is gone; the LLM model ignores tokens it does not know."""
    m = HANDLE_RE.fullmatch(handle)
    if m is None:
        return False
    with _socket() as s:
        try:
            s.sendto(m.group(2).encode("ascii"), "\0" + m.group(1))
        except OSError:
            return False
    return True
