"""Atomic replacement of a file: every snapshot, pointer and offsets file vidrec writes.

A writer that crashes half-way must leave the old file or the new one, never
half of one: the new content goes to a temporary file in the same directory
(so the rename cannot cross filesystems), is fsynced, renamed over the target
with :func:`os.replace`, and the directory is fsynced so the rename itself
survives a power cut.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, TextIO


@contextmanager
def atomic_text(path: Path) -> Iterator[TextIO]:
    """A UTF-8 text file whose content replaces ``path`` atomically when the block ends.

    The content is streamed (a snapshot of a million videos is never held as
    one string). If the block raises, the temporary file is removed and
    ``path`` is left as it was. The directory must exist.
    """
    with _atomic(path, "w") as out:
        yield out  # type: ignore[misc]  # opened in text mode: a TextIO


@contextmanager
def atomic_binary(path: Path) -> Iterator[IO[bytes]]:
    """:func:`atomic_text` for bytes."""
    with _atomic(path, "wb") as out:
        yield out


def atomic_write(path: Path, data: str | bytes) -> None:
    """Replace ``path`` with ``data`` (text as UTF-8) atomically and durably."""
    if isinstance(data, bytes):
        with atomic_binary(path) as out:
            out.write(data)
    else:
        with atomic_text(path) as text:
            text.write(data)


def atomic_json(path: Path, data: object, **dump_options: Any) -> None:
    """Replace ``path`` with ``data`` as JSON (``dump_options`` go to :func:`json.dump`)."""
    with atomic_text(path) as out:
        json.dump(data, out, **dump_options)


@contextmanager
def _atomic(path: Path, mode: str) -> Iterator[IO[Any]]:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (POSIX; a no-op where unsupported)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)
