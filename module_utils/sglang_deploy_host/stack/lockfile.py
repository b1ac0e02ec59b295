"""An ml-env lock file: the header ``sglang-deploy lock`` writes, then ``name==version`` pins with
hashes (uv's ``--generate-hashes`` output). Written and read only here: the lock command formats
the header, the ml_env module and the test suites read it.

    # ml-env lock of stack lane cu128 for Python 3.11 on x86_64-manylinux_2_36.
    # Generated from src/sglang_deploy/lanes/cu128.yml by uv 0.13.9; do not edit.
    # Regenerate: sglang-deploy lock --lane cu128
    # inputs-sha256: <64 hex>
    # cuda: 12.8
    # override: transformers==5.3.0 because ...
    name==1.0 \\
        --hash=sha256:...
"""

from __future__ import annotations

import hashlib
import re
from typing import Dict, Iterable, Optional, Tuple

_FIRST_LINE = re.compile(r"^# ml-env lock of stack lane (\S+) for Python (3\.\d+) on (\S+)\.$", re.MULTILINE)
_FIELD = re.compile(r"^# (inputs-sha256|cuda): (\S+)$", re.MULTILINE)
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")
# Characters of a venv's name taken from the lock's digest.
_VENV_NAME_CHARS = 16


def format_header(
    *,
    lane: str,
    python: str,
    platform: str,
    uv_version: str,
    inputs_sha256: str,
    cuda: str,
    overrides: Iterable[Tuple[str, str]] = (),
) -> str:
    """The header lines, ending in a newline; ``overrides`` are (requirement, reason) pairs."""
    lines = [
        f"# ml-env lock of stack lane {lane} for Python {python} on {platform}.",
        f"# Generated from src/sglang_deploy/lanes/{lane}.yml by {uv_version}; do not edit.",
        f"# Regenerate: sglang-deploy lock --lane {lane}",
        f"# inputs-sha256: {inputs_sha256}",
        f"# cuda: {cuda}",
    ]
    lines += [f"# override: {requirement} because {reason}" for requirement, reason in overrides]
    return "\n".join(lines) + "\n"


def header_fields(text: str) -> Dict[str, str]:
    """What the header records: lane, python, platform, inputs-sha256, cuda (the ones present)."""
    fields = dict(_FIELD.findall(text))
    first = _FIRST_LINE.search(text)
    if first:
        fields.update(lane=first.group(1), python=first.group(2), platform=first.group(3))
    return fields


def recorded_digest(text: str) -> Optional[str]:
    """The inputs digest the header records (None: no header, e.g. a hand-written file)."""
    return header_fields(text).get("inputs-sha256")


def normalize(name: str) -> str:
    """PEP 503 name normalization (Sglang_Kernel == sglang-kernel)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(text: str) -> Dict[str, str]:
    """``name==version`` pins, names normalized (continuation and comment lines skipped)."""
    found: Dict[str, str] = {}
    for line in text.splitlines():
        match = _PIN.match(line)
        if match:
            found[normalize(match.group(1))] = match.group(2)
    return found


def body(text: str) -> str:
    """The lock without its header (whose uv version line may differ between machines)."""
    return "\n".join(line for line in text.splitlines() if not line.startswith("#"))


def venv_name(text: str) -> str:
    """The name of the venv a lock is installed into: the same lock finds its venv again, a changed
    lock builds a new one beside it."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:_VENV_NAME_CHARS]
