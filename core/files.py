"""Input files checked before they are read: a regular file (never a directory, FIFO, socket or device: a FIFO would
block the reader forever), of at most a given size, read with that bound; text lines bounded one by one. Every
refusal is an `InputFileError` (a ValueError) naming the file, what was found and the limit, so a command can turn
it into `error: ...` and its usage exit status instead of a traceback or a hang.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MIB = 1 << 20


class InputFileError(ValueError):
    """An input file that is not a regular file, is too large, or has a line too long; the message says which."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def regular_file(path: Path, what: str, max_bytes: int) -> int:
    """`path`'s size after checking it is an existing regular file (symlinks followed) of at most `max_bytes`."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputFileError(f"{what} {path}: no such file") from None
    except OSError as e:
        raise InputFileError(f"{what} {path}: cannot be read ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputFileError(f"{what} {path}: is {_kind(st.st_mode)}; give a regular file")
    if st.st_size > max_bytes:
        raise InputFileError(f"{what} {path}: {st.st_size} bytes > the limit of {max_bytes} ({max_bytes / MIB:g} MiB)")
    return st.st_size


def read_bytes(path: Path, what: str, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most `max_bytes` (read with that bound: a file that grows meanwhile too)."""
    regular_file(path, what, max_bytes)
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise InputFileError(f"{what} {path}: more than the limit of {max_bytes} bytes")
    return data


def read_text(path: Path, what: str, max_bytes: int) -> str:
    """read_bytes, as strict UTF-8."""
    data = read_bytes(path, what, max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputFileError(f"{what} {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def text_lines(path: Path, what: str, max_bytes: int, max_line_bytes: int) -> Iterator[tuple[int, str]]:
    """(line number, line) of a regular UTF-8 text file of at most `max_bytes`, each line of at most
    `max_line_bytes`: a line is refused from its length before it is decoded or parsed."""
    regular_file(path, what, max_bytes)
    seen = 0
    with open(path, "rb") as f:
        for n, raw in enumerate(iter(lambda: f.readline(max_line_bytes + 2), b""), 1):
            seen += len(raw)
            if seen > max_bytes:
                raise InputFileError(f"{what} {path}: more than the limit of {max_bytes} bytes")
            if len(raw.rstrip(b"\r\n")) > max_line_bytes:
                raise InputFileError(f"{what} {path}: line {n} has more than {max_line_bytes} bytes "
                                     f"({max_line_bytes / MIB:g} MiB), the limit of one line")
            try:
                yield n, raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise InputFileError(f"{what} {path}: line {n} is not UTF-8 ({e.reason} at byte {e.start})") from None


def parse_json(text: str | bytes, where: str) -> Any:
    """`text` as JSON, every way it can fail an InputFileError naming `where` (a file, or a file and line): invalid
    JSON, and nesting deeper than the parser's recursion allows (`[[[[...` of 100,000 levels raises RecursionError,
    not ValueError)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise InputFileError(f"{where}: JSON nested too deeply to read (arrays or objects inside each other "
                             "thousands of levels deep); give the file the program wrote") from None
    except ValueError as e:
        raise InputFileError(f"{where}: not valid JSON ({str(e)[:200]})") from None


def writable_file(path: Path, what: str) -> None:
    """An output file path: absent or a regular file, in an existing directory (checked before any work)."""
    p = Path(path)
    if p.is_symlink():
        raise InputFileError(f"{what} {p}: is a symbolic link; give a plain file path")
    if p.exists() and not p.is_file():
        try:
            kind = _kind(os.stat(p).st_mode)
        except OSError:
            kind = "not a regular file"
        raise InputFileError(f"{what} {p}: is {kind}; give a file path")
    if not p.parent.is_dir():
        raise InputFileError(f"{what} {p}: directory {p.parent} does not exist")


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (one owned by another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True
