"""The Prometheus file_sd targets file: written only where it is ours, with targets Prometheus can scrape.

STDLIB ONLY, Python >= 3.9 (the module sglang_file_sd runs it for playbooks/router.yml). A targets file is a
JSON list of groups (``{"targets": ["host:port"], "labels": {...}}``); Prometheus re-reads it whenever it
changes, so a wrong one is a scrape configuration gone, and a path that names somebody else's file would be
overwritten with ours. So:

* every target is ``host:port`` - a host name, an IPv4 address or a bracketed IPv6 address, and a port -
  and every label name and value plain text (nothing that breaks the file or Prometheus' relabelling);
* the path is absolute, of plain characters, ends in ``.json`` (normalized before use) and is a regular file
  (or absent) that is not a link;
* an existing file is replaced only when it is one this writes: a list of groups each labelled ``job`` one
  of :data:`JOBS` (what sglang-deploy's groups carry). Anything else is refused, naming the file.
The new content is written to a temporary file beside it and renamed over it (a reader never sees half).
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import stat
import tempfile
from typing import Any, Dict, List, Optional, Sequence

# The jobs of sglang-deploy's groups (sglang_deploy.fleet.router.file_sd); a file whose groups carry only these is ours.
JOBS = frozenset({"sglang-worker", "sglang-router"})
# A targets file is a few KB; anything far larger at the path is not one.
MAX_BYTES = 4 << 20
_HOSTNAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?")
_LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LABEL_VALUE = re.compile(r"[^\x00-\x1f\x7f\"\\]{0,256}")
_PATH = re.compile(r"/[A-Za-z0-9._/@+-]+\.json")


class FileSdError(ValueError):
    """A target, label or path that cannot be written as asked; the message names it."""


def check_host(value: str, what: str) -> str:
    """``value`` if it is a host a target can name: a host name, an IPv4 or an IPv6 address."""
    text = str(value)
    host = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        ipaddress.ip_address(host)
        return text
    except ValueError:
        pass
    if text != host or not _HOSTNAME.fullmatch(host):
        raise FileSdError(f"{what} = {text!r} is not a host name or an IP address (no quotes, spaces or line breaks)")
    return text


def check_target(target: str, what: str) -> str:
    """``target`` if it is ``host:port`` (IPv6 in brackets) with a port 1-65535."""
    text = str(target)
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 1 <= int(port) <= 65535 or (":" in host and not host.startswith("[")):
        raise FileSdError(f"{what}: target {text!r} is not host:port (an IPv6 address in brackets)")
    check_host(host, what)
    return text


def check_groups(groups: Any) -> List[Dict[str, Any]]:
    """The groups, each target and label checked."""
    if not isinstance(groups, list) or not groups:
        raise FileSdError(f"the targets are not a non-empty list of groups: {groups!r}")
    for number, group in enumerate(groups, 1):
        if not isinstance(group, dict) or set(group) - {"targets", "labels"}:
            raise FileSdError(f"group {number}: not a mapping of targets and labels: {group!r}")
        targets = group.get("targets")
        if not isinstance(targets, list) or not targets:
            raise FileSdError(f"group {number}: no targets")
        for target in targets:
            check_target(target, f"group {number}")
        for name, value in (group.get("labels") or {}).items():
            if not _LABEL_NAME.fullmatch(str(name)) or not isinstance(value, str) or not _LABEL_VALUE.fullmatch(value):
                raise FileSdError(f"group {number}: label {name!r}={value!r} is not a plain label")
    return groups


def check_path(path: str, variable: str) -> str:
    """The path normalized (``{{ playbook_dir }}/../x.json`` is fine), if it is absolute, of plain characters
    (no line break, quote or space) and ends in .json."""
    if not isinstance(path, str) or not _PATH.fullmatch(path):
        raise FileSdError(
            f"{variable} = {path!r} is not an absolute path of plain characters ending in .json. Fix: a file "
            "of its own for sglang-deploy's targets, e.g. /etc/prometheus/file_sd/sglang-targets.json"
        )
    return os.path.normpath(path)


def _ours(text: str) -> bool:
    try:
        groups = json.loads(text)
    except ValueError:
        return False
    return (
        isinstance(groups, list)
        and all(isinstance(g, dict) and isinstance(g.get("labels"), dict) and g["labels"].get("job") in JOBS for g in groups)
    )


def existing(path: str, variable: str) -> Optional[str]:
    """What is at ``path`` now: None (nothing), or the text of a targets file this wrote; FileSdError for
    anything else (a link, a directory, a device, somebody else's file)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode):
        raise FileSdError(f"{variable} = {path}: not a regular file (a link, a directory or a device); not replacing it")
    if info.st_size > MAX_BYTES:
        raise FileSdError(f"{variable} = {path}: {info.st_size:,} bytes, not a targets file; not replacing it")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as handle:
        text = handle.read(MAX_BYTES + 1).decode("utf-8", errors="replace")
    if text.strip() and not _ours(text):
        raise FileSdError(
            f"{variable} = {path} holds a file sglang-deploy did not write (not a list of groups labelled job "
            f"{' or '.join(sorted(JOBS))}); not replacing it. Fix: give sglang-deploy a targets file of its own"
        )
    return text


def render(groups: Sequence[Dict[str, Any]]) -> str:
    return json.dumps(list(groups), indent=2, sort_keys=True) + "\n"


def write(path: str, groups: Any, variable: str, *, dry_run: bool = False) -> Dict[str, Any]:
    """Write ``groups`` to ``path`` when it is ours (or absent); ``changed`` and the before/after text."""
    path = check_path(path, variable)
    content = render(check_groups(groups))
    before = existing(path, variable)
    changed = before != content
    if changed and not dry_run:
        directory = os.path.dirname(path)
        os.makedirs(directory, mode=0o755, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=".sglang-targets.", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                os.fchmod(handle.fileno(), 0o644)
                handle.write(content)
            os.replace(temp, path)
        except BaseException:
            try:
                os.unlink(temp)
            except OSError:
                pass
            raise
    return {"changed": changed, "before": before or "", "after": content}
