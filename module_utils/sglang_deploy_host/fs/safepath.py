"""Directories root manages, reached only through paths nobody but root can change.

STDLIB ONLY, Python >= 3.9 (the module sglang_directory runs it on the hosts; the control node's tests
import it). Root's tasks create, chown and chmod directories: the service's home, the JIT caches' key
directory, the models root, the kept caches. If any directory on the way to one were writable by a
less-trusted user (the service user owns its home and its caches; model code with --trust-remote-code
runs as that user), that user could swap an entry for a symlink between two runs, and root's next
``chown sglang`` / ``chmod 0700`` would land on the link's target (``/etc``). So, for every directory
root manages here:

* every directory on the way is owned by root and writable by root alone (no write bit for others, and
  none for the group unless the group is root's): nobody else can rename or replace an entry in it;
* a symlink on the way is followed only when root owns it (it sits in a directory only root can write,
  so root put it there: an operator's ``/var/lib/sglang/models -> /data/models``), and its target is
  checked the same way, from ``/``;
* the directory itself is created with ``mkdir`` (which never follows a link) or opened with
  ``O_NOFOLLOW | O_DIRECTORY`` and adjusted through that descriptor (``fchown``/``fchmod``).

A directory that is *given* to a less-trusted user (owner ``sglang``) is one of these too; what that
user then creates inside it is its own: root never acts below it (the unit's ``ExecStartPre=`` creates
the caches' subdirectories as the service user).
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
from typing import Any, Dict, List, Optional, Tuple

# Links followed on one path at most (the kernel's own limit is 40).
MAX_LINKS = 16


class UntrustedPathError(ValueError):
    """A path root must not act on; the message names the variable, the path, the entry and the fix."""


def _mode_text(info: os.stat_result) -> str:
    return f"{stat.S_IMODE(info.st_mode):04o}"


def _owner_text(info: os.stat_result) -> str:
    try:
        return pwd.getpwuid(info.st_uid).pw_name
    except KeyError:  # a uid without a passwd entry
        return f"uid {info.st_uid}"


def _check_directory(path: str, info: os.stat_result, variable: str, target: str) -> None:
    """``path`` (a directory on the way to ``target``) can be changed by root alone."""
    others_write = info.st_mode & stat.S_IWOTH
    group_write = info.st_mode & stat.S_IWGRP and info.st_gid != 0
    if info.st_uid != 0 or others_write or group_write:
        raise UntrustedPathError(
            f"{variable} = {target}: {path} on the way is owned by {_owner_text(info)} with mode "
            f"{_mode_text(info)}, so a user other than root can replace what is in it (a link to a system "
            "directory, and root would change that instead). Fix: move the path under directories root owns "
            f"and alone may write (e.g. chown root:root {path} && chmod go-w {path}, if nothing else needs it "
            "writable), or choose another path"
        )


def resolve_trusted(path: str, variable: str, *, anchor: str = "/", _depth: int = 0) -> Tuple[str, List[str]]:
    """The real path of ``path`` when every directory and link on the way is root's alone, and the names
    still missing at its end (``a/b`` missing under the last existing directory -> ``["a", "b"]``).

    UntrustedPathError for a directory writable by others, a link not owned by root, something that is not
    a directory on the way, a relative or unnormalized path, or too many links. ``anchor`` (tests only) is
    where the walk starts, checked itself: a path outside it is refused."""
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        raise UntrustedPathError(f"{variable} = {path!r} is not an absolute path")
    if _depth > MAX_LINKS:
        raise UntrustedPathError(f"{variable} = {path}: more than {MAX_LINKS} links on the way")
    parts = [p for p in path.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise UntrustedPathError(f"{variable} = {path} is not normalized ('.' or '..' in it)")
    top = [p for p in anchor.split("/") if p]
    if parts[: len(top)] != top:
        raise UntrustedPathError(f"{variable} = {path} is outside {anchor}")
    current = "/" + "/".join(top)
    _check_directory(current, os.lstat(current), variable, path)
    for index, name in enumerate(parts[len(top):], len(top)):
        candidate = os.path.join(current, name)
        try:
            info = os.lstat(candidate)
        except FileNotFoundError:
            return current, parts[index:]
        if stat.S_ISLNK(info.st_mode):
            if info.st_uid != 0:
                raise UntrustedPathError(
                    f"{variable} = {path}: {candidate} is a link owned by {_owner_text(info)}, not root; root "
                    "does not follow it. Fix: find out who made it (the service user may write where it sits), "
                    "remove it, and keep the path under directories only root can write"
                )
            target = os.readlink(candidate)
            joined = os.path.normpath(os.path.join(current, target))
            real, missing = resolve_trusted(joined, variable, anchor=anchor, _depth=_depth + 1)
            if missing:
                raise UntrustedPathError(f"{variable} = {path}: the link {candidate} points at {joined}, which does not exist")
            if index < len(parts) - 1:  # a directory on the way, reached through the link: root's alone too
                _check_directory(real, os.lstat(real), variable, path)
            current = real
            continue
        if not stat.S_ISDIR(info.st_mode):
            raise UntrustedPathError(f"{variable} = {path}: {candidate} on the way is not a directory")
        if index < len(parts) - 1:  # the last one is the directory being managed: its owner is the caller's choice
            _check_directory(candidate, info, variable, path)
        current = candidate
    return current, []


def _open_directory(path: str, variable: str) -> int:
    """``path`` opened as a directory, never through a link: a directory swapped for a link (or a file) after
    the walk checked it is refused here, nothing changed."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        if err.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        raise UntrustedPathError(
            f"{variable} = {path} became a link or a file while it was checked (someone else is changing it): "
            "nothing changed. Fix: find out who writes there, then run again"
        ) from None


def ensure_directory(
    path: str, uid: int, gid: int, mode: int, variable: str, *, dry_run: bool = False, anchor: str = "/"
) -> Dict[str, Any]:
    """Make ``path`` a directory owned ``uid:gid`` with ``mode``, through a trusted path (see the module's
    docstring): the missing directories above it are created root:root 0755, ``path`` itself with
    ``mkdir`` and then adjusted through an ``O_NOFOLLOW`` descriptor. Returns ``changed``, the real
    ``path`` acted on, ``created`` (the directories made) and ``before``/``after`` (owner and mode)."""
    if not isinstance(path, str) or path in ("", "/"):
        raise UntrustedPathError(f"{variable} = {path!r}: not a directory root may manage")
    # Every directory above the managed one (the last that exists, when some are missing) is root's alone.
    last_existing, missing = resolve_trusted(path, variable, anchor=anchor)
    real = os.path.join(last_existing, *missing)
    created: List[str] = []
    before: Optional[Dict[str, Any]] = None
    if not missing:
        fd = _open_directory(real, variable)
        try:
            info = os.fstat(fd)
            before = {"uid": info.st_uid, "gid": info.st_gid, "mode": _mode_text(info)}
            changed = (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) != (uid, gid, mode)
            if changed and not dry_run:
                os.fchown(fd, uid, gid)
                os.fchmod(fd, mode)
        finally:
            os.close(fd)
    else:
        changed = True
        current = last_existing
        for number, name in enumerate(missing):
            current = os.path.join(current, name)
            created.append(current)
            if dry_run:
                continue
            last = number == len(missing) - 1
            os.mkdir(current, 0o700)  # never follows a link; the owner and mode come through its descriptor
            fd = _open_directory(current, variable)
            try:
                os.fchown(fd, uid if last else 0, gid if last else 0)
                os.fchmod(fd, mode if last else 0o755)
            finally:
                os.close(fd)
    after = {"uid": uid, "gid": gid, "mode": f"{mode:04o}"}
    return {"changed": changed, "path": real, "created": created, "before": before, "after": after}
