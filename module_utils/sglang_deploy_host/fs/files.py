"""Opening and reading a file someone named: a regular file, of bounded size, or not at all.

STDLIB ONLY, Python >= 3.9 (hosts run it; the control node's ``sglang_deploy.inputfiles`` builds on it).
``/dev/zero``, a FIFO, a socket, a directory or a file over the cap is refused before a byte is read,
and a read never takes more than the cap and one byte: nothing hangs, nothing fills memory.
"""

from __future__ import annotations

import os
import stat
from typing import BinaryIO, Union

_CHUNK = 1 << 20
PathLike = Union[str, "os.PathLike[str]"]


class UnreadableFileError(ValueError):
    """Not a regular file (a device, FIFO, socket or directory), or larger than the cap: never read.
    The message says which, without the path (the caller names it)."""


def open_regular_file(path: PathLike, max_bytes: int) -> BinaryIO:
    """``path`` open for reading, if it is a regular file of at most ``max_bytes`` (checked on the open
    file). The open does not wait on a FIFO without a writer (``O_NONBLOCK``, which means nothing for
    the regular file it then must be). OSError if it cannot be opened."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file (a device, pipe or socket)"
            raise UnreadableFileError(kind)
        if info.st_size > max_bytes:
            raise UnreadableFileError(f"{info.st_size:,} bytes, more than the {max_bytes:,} this reads")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_limited(handle: BinaryIO, max_bytes: int) -> bytes:
    """What ``handle`` holds up to its end, if that is at most ``max_bytes`` (a file that grows while it
    is read, or an endless stream, is refused at the cap)."""
    chunks, total = [], 0
    while total <= max_bytes:
        chunk = handle.read(min(_CHUNK, max_bytes + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    if total > max_bytes:
        raise UnreadableFileError(f"more than the {max_bytes:,} bytes this reads")
    return b"".join(chunks)


def read_regular_file(path: PathLike, max_bytes: int) -> bytes:
    """The whole of a regular file of at most ``max_bytes``."""
    with open_regular_file(path, max_bytes) as handle:
        return read_limited(handle, max_bytes)
