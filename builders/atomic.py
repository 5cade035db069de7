"""One way to write a directory: build it beside its final place, then rename it into place.

A crash therefore never leaves a half-written directory that a later run would trust: readers see either the old
complete directory or the new complete one (a rename within one filesystem is atomic).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_dir(final: Path, *, keep: tuple[str, ...] = ()) -> Iterator[Path]:
    """Yield an empty temporary directory next to `final`; on normal exit it replaces `final`, on an exception it
    is removed and `final` is left as it was. Files named in `keep` that exist in the old `final` (e.g. a
    hand-written model card) are copied into the new one unless it wrote its own."""
    final = Path(final)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        for name in keep:
            if (final / name).is_file() and not (tmp / name).exists():
                shutil.copy2(final / name, tmp / name)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # Remove the old output only once the new one is complete.
    if final.exists():
        trash = final.with_name(f".{final.name}.old-{os.getpid()}")
        shutil.rmtree(trash, ignore_errors=True)
        final.rename(trash)
        tmp.rename(final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        tmp.rename(final)
