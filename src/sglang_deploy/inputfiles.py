"""Reading a file a command was given: a regular file, of bounded size, text where text is expected.

Every command that reads an operator's file (a log for ``doctor``, a baseline or run for ``bench``, GPU
facts or a model config for ``plan``, an API key file) reads it through :func:`read_text` or
:func:`read_json`, so ``/dev/zero``, a FIFO, a directory, a 4 GB file or a binary blob is one clear line
(:class:`InputFileError`, the CLI's exit 2), never a hang, a kill by the OOM killer or a traceback.
A stream (``doctor -`` reads stdin) has no size to check first: :func:`read_stream_text` reads at most
the cap and one byte more, and refuses the stream when that byte is there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, BinaryIO

from sglang_deploy_host.fs import files

# What a command reads at most, unless it says otherwise: server logs are the largest (a day of journal).
DEFAULT_MAX_BYTES = 64 << 20
JSON_MAX_BYTES = 16 << 20


class InputFileError(ValueError):
    """A file that cannot be used; the message names the option, the file and what is wrong with it."""


def read_bytes(path: str | os.PathLike[str], what: str, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """The whole file, if it is a regular file of at most ``max_bytes`` (checked on the open file, and
    never more than ``max_bytes + 1`` bytes read: a file that grows meanwhile is refused too).

    The open does not wait: a FIFO without a writer is refused, not waited on (``O_NONBLOCK``)."""
    try:
        return files.read_regular_file(path, max_bytes)
    except files.UnreadableFileError as err:
        problem = f"{err}; give a file" if "regular" in str(err) or "directory" in str(err) else str(err)
        raise InputFileError(f"{what} {path}: {problem}") from None
    except OSError as err:
        raise InputFileError(f"{what} {path}: cannot open it ({err.strerror})") from None


def read_text(path: str | os.PathLike[str], what: str, max_bytes: int = DEFAULT_MAX_BYTES) -> str:
    """The file as UTF-8 text; a NUL byte or bytes that are not UTF-8 mean it is not text."""
    return _text(read_bytes(path, what, max_bytes), f"{what} {path}", "file")


def read_json(path: str | os.PathLike[str], what: str, max_bytes: int = JSON_MAX_BYTES) -> Any:
    """The file's JSON value (any type: the caller checks the shape)."""
    text = read_text(path, what, max_bytes)
    try:
        return json.loads(text)
    except ValueError as err:
        raise InputFileError(f"{what} {path}: not JSON ({err})") from None


def read_stream_text(stream: BinaryIO, what: str, max_bytes: int = DEFAULT_MAX_BYTES) -> str:
    """A binary stream (``sys.stdin.buffer``) to its end as UTF-8 text, if it ends within ``max_bytes``:
    at most ``max_bytes + 1`` bytes are read, so ``/dev/zero`` or an endless pipe is refused at the cap."""
    try:
        data = files.read_limited(stream, max_bytes)
    except files.UnreadableFileError as err:
        raise InputFileError(f"{what}: {err}") from None
    except OSError as err:
        raise InputFileError(f"{what}: cannot read it ({err.strerror or err})") from None
    return _text(data, what, "stream")


def _text(data: bytes, where: str, noun: str) -> str:
    if b"\0" in data:
        raise InputFileError(f"{where}: a binary {noun} (NUL bytes), not text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputFileError(f"{where}: not UTF-8 text (byte {err.start})") from None


def exists(path: str | os.PathLike[str]) -> bool:
    """Whether anything is at ``path`` (a spec is a path rather than a name)."""
    return Path(path).exists() or Path(path).is_symlink()
