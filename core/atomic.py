"""One way to write a directory: build it beside its final place, then rename it into place.

A crash therefore never leaves a half-written directory that a later run would trust: readers see either the old
complete directory or the new complete one (a rename within one filesystem is atomic). A single file is written the
same way (`atomic_write_text`): `.<name>.tmp-<pid>` beside it, renamed into place; a failed write (a full disk:
ENOSPC, a file size limit: EFBIG, any exception) removes its temporary file before the error goes on.

The temporary `.<name>.tmp-<pid>` and the replaced `.<name>.old-<pid>` carry TEMP_MARKER from the moment they
exist, so a later build removes only directories that it wrote (builders/build_dir.py `dead_temp_dirs`); a
directory of that name without the marker is someone else's and is never removed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TEMP_MARKER = ".eagle-deploy-temp"


def is_marked(d: Path) -> bool:
    """A real directory (not a link) holding the marker as a regular file."""
    return d.is_dir() and not d.is_symlink() and (d / TEMP_MARKER).is_file() and not (d / TEMP_MARKER).is_symlink()


def _mark(d: Path) -> None:
    (d / TEMP_MARKER).write_text("temporary directory of an eagle-deploy build; removed when its build ends\n")


def _clear(d: Path) -> None:
    """Remove a leftover of our own pid; refuse one we did not write."""
    if not d.exists() and not d.is_symlink():
        return
    if not is_marked(d):
        raise FileExistsError(f"{d} exists and was not written by this build (no {TEMP_MARKER}); move it away")
    shutil.rmtree(d)


@contextmanager
def atomic_dir(final: Path, *, keep: tuple[str, ...] = ()) -> Iterator[Path]:
    """Yield an empty temporary directory next to `final`; on normal exit it replaces `final`, on an exception it
    is removed and `final` is left as it was. Files named in `keep` that exist in the old `final` (e.g. a
    hand-written model card) are copied into the new one unless it wrote its own."""
    final = Path(final)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    trash = final.with_name(f".{final.name}.old-{os.getpid()}")
    _clear(tmp)
    _clear(trash)
    tmp.mkdir(parents=True)
    _mark(tmp)
    try:
        yield tmp
        for name in keep:
            if (final / name).is_file() and not (tmp / name).exists():
                shutil.copy2(final / name, tmp / name)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    (tmp / TEMP_MARKER).unlink()
    # Remove the old output only once the new one is complete.
    if final.exists():
        final.rename(trash)
        _mark(trash)
        tmp.rename(final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        tmp.rename(final)


def temp_name(final: Path) -> Path:
    """The temporary path `atomic_write_text` writes `final` through: `.<name>.tmp-<pid>` in the same directory."""
    return final.with_name(f".{final.name}.tmp-{os.getpid()}")


def atomic_write_text(final: Path, text: str, mode: int = 0o644) -> None:
    """Write `text` to `final` through `temp_name(final)` and rename it into place: a link or a hard link at `final`
    is replaced, never written through (O_NOFOLLOW, O_EXCL on a fresh name). On any failure the temporary file is
    removed and `final` is left as it was."""
    final = Path(final)
    tmp = temp_name(final)
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def sha256_file(path: Path) -> str:
    """The file's SHA-256, read in 1 MiB chunks (weights may be larger than memory)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
