"""Where a command writes on the control node: directories it made, or the invoking user's own.

The control node is a host too: the CLI often runs as root, and a directory another user can change is a way into
root's hands. A starter inventory written into another user's empty directory becomes that user's to rewrite (a
``{{ lookup('pipe', ...) }}`` in hosts.yml, and the operator's next ``render`` runs it as root); a state directory
followed into another user's directory, or a lock file opened through a planted link, makes root create files
wherever the link points. So every directory a command writes - ``init``'s inventory, the state directory and its
artifacts, the fact cache, the validator cache, an ``--out`` - is, before a byte is written:

* **made by the command** (``mkdir``, which never follows a link), or **the invoking user's own** (owned by the
  effective uid, not writable by group or others);
* **reached without following a link another user could have planted**: every directory on the way is owned by
  root or the invoking user and writable by nobody else (a sticky one, like ``/tmp``, keeps each entry its owner's),
  and a link on the way is followed only when root or the invoking user owns it.

A path that fails is refused with one line naming the path, its owner and the fix (:class:`UnsafeDirectoryError`);
the files themselves are created with ``O_EXCL``/``O_NOFOLLOW``. The hosts' own rule (root's directories, the service
user's inside them) is ``sglang_deploy_host.fs.safepath``.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

# Links followed on one path at most (the kernel's own limit is 40).
MAX_LINKS = 16


class UnsafeDirectoryError(ValueError):
    """A directory a command must not write into; the message names the path, its owner and the fix."""


def _owner(info: os.stat_result) -> str:
    try:
        return pwd.getpwuid(info.st_uid).pw_name
    except KeyError:
        return f"uid {info.st_uid}"


def _me() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid {os.geteuid()}"


def _trusted_owner(info: os.stat_result) -> bool:
    return info.st_uid in (0, os.geteuid())


def _others_may_write(info: os.stat_result) -> bool:
    """Another user can add, rename or remove entries: write for others, or for a group that is not root's or ours."""
    return bool(info.st_mode & stat.S_IWOTH) or bool(info.st_mode & stat.S_IWGRP and info.st_gid not in (0, os.getegid()))


def _refuse(path: str, info: os.stat_result, what: str, why: str, fix: str) -> UnsafeDirectoryError:
    return UnsafeDirectoryError(
        f"{what}: {path} is owned by {_owner(info)} with mode {stat.S_IMODE(info.st_mode):04o}: {why}. Fix: {fix}"
    )


def _walk(path: str, what: str, depth: int = 0) -> tuple[str, list[str]]:
    """The real path of the deepest existing directory of ``path`` (links resolved by the rule above) and the names
    still missing below it; UnsafeDirectoryError for a directory or link on the way another user controls."""
    if depth > MAX_LINKS:
        raise UnsafeDirectoryError(f"{what}: {path}: more than {MAX_LINKS} links on the way")
    parts = [p for p in path.split("/") if p]
    current = "/"
    for index, name in enumerate(parts):
        candidate = os.path.join(current, name)
        try:
            info = os.lstat(candidate)
        except FileNotFoundError:
            return current, parts[index:]
        except OSError as err:  # a name too long, a directory root may not search
            raise UnsafeDirectoryError(f"{what}: cannot read {candidate} ({err.strerror}). Fix: name another directory") from None
        parent = os.lstat(current)
        if stat.S_ISLNK(info.st_mode):
            if not _trusted_owner(info) or (_others_may_write(parent) and not parent.st_mode & stat.S_ISVTX):
                raise _refuse(candidate, info, what, f"a link on the way to {path} that {_me()} did not make",
                              f"remove the link and name the real directory, or one of {_me()}'s own")  # fmt: skip
            target = os.path.normpath(os.path.join(current, os.readlink(candidate)))
            rest = "/".join(parts[index + 1 :])
            return _walk(os.path.join(target, rest) if rest else target, what, depth + 1)
        if not stat.S_ISDIR(info.st_mode):
            raise UnsafeDirectoryError(
                f"{what}: {candidate} is a file, not a directory. Fix: name a new directory (or remove the file)"
            )
        last = index == len(parts) - 1
        if not last and (not _trusted_owner(info) or (_others_may_write(info) and not info.st_mode & stat.S_ISVTX)):
            raise _refuse(candidate, info, what, f"another user can replace what lies in it on the way to {path}",
                          f"name a directory under {_me()}'s or root's own, which nobody else may write")  # fmt: skip
        current = candidate
    return current, []


def directory(path: str | os.PathLike[str], what: str, *, mode: int = 0o700, empty: bool = False) -> Path:
    """``path`` as a directory this command may write into (module docstring), made (with its missing parents,
    ``mode``) when it does not exist; with ``empty``, an existing one must hold nothing. The real path."""
    absolute = os.path.abspath(os.fspath(path))
    last, missing = _walk(absolute, what)
    real = os.path.join(last, *missing)
    if not missing:
        info = os.lstat(real)
        if info.st_uid != os.geteuid():
            raise _refuse(real, info, what, f"it is not {_me()}'s own, and {_me()} did not make it",
                          f"name a new directory (this command makes it), or one {_me()} owns")  # fmt: skip
        if info.st_mode & 0o022:
            raise _refuse(real, info, what, "group or other users may write into it",
                          f"chmod go-w {real}, or name a new directory")  # fmt: skip
        if empty and any(os.scandir(real)):
            raise UnsafeDirectoryError(f"{what}: {real} is not empty. Fix: name a new or empty directory")
        return Path(real)
    current = last
    for name in missing:
        current = os.path.join(current, name)
        try:
            os.mkdir(current, mode)
        except FileExistsError:  # made since the walk: by whom is not known
            raise UnsafeDirectoryError(f"{what}: {current} appeared while it was being made. Fix: run the command again") from None
        except OSError as err:
            raise UnsafeDirectoryError(f"{what}: cannot make {current} ({err.strerror}). Fix: name a directory {_me()} may create") from None
    return Path(real)


def parent_of_new_file(path: str | os.PathLike[str], what: str) -> Path:
    """The directory a new file at ``path`` goes into (written to a temporary name and renamed there): reached by the
    rule above, and root's or the invoking user's with nobody else able to write it - or sticky, like ``/tmp``, where
    nobody else can move what this command makes. The absolute path of the file; UnsafeDirectoryError otherwise."""
    absolute = os.path.abspath(os.fspath(path))
    last, missing = _walk(os.path.dirname(absolute), what)
    if missing:
        raise UnsafeDirectoryError(f"{what}: no directory {os.path.join(last, *missing)}. Fix: make it first, or name another")
    info = os.lstat(last)
    if not _trusted_owner(info) or (_others_may_write(info) and not info.st_mode & stat.S_ISVTX):
        raise _refuse(last, info, what, "another user can replace what this command writes in it",
                      f"write into a directory of {_me()}'s own")  # fmt: skip
    return Path(last) / os.path.basename(absolute)


def private_directory(path: str | os.PathLike[str], what: str) -> Path:
    """:func:`directory`, then 0700 through a descriptor that never follows a link: for what holds a run's
    inventory data, journals or results."""
    real = directory(path, what, mode=0o700)
    fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return real


def new_file(path: str | os.PathLike[str], mode: int = 0o600) -> int:
    """A descriptor of a new file at ``path`` (in a directory :func:`directory` vouched for): never an existing
    file, never through a link."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode)


def open_append(path: str | os.PathLike[str], mode: int = 0o600) -> int:
    """A descriptor of ``path`` for appending (a lock file), created if missing, never through a link (one planted
    there is refused naming it: root would otherwise create a file wherever it points)."""
    try:
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode)
    except OSError as err:
        if os.path.islink(path):
            raise UnsafeDirectoryError(
                f"{path} is a link (to {os.readlink(path)}): not opened. Fix: remove it, and find out who made it"
            ) from None
        raise
