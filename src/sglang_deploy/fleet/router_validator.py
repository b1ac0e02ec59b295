"""The router's flags through the pinned router's (smg's) own parser, before any host is touched.

The same idea as :mod:`sglang_deploy.launch.validator` for the server, with a much smaller venv: the role's
hashed lock (one per Python, ``roles/sglang_router/files/locks/``; the role passes its path) installed
with ``--require-hashes`` into ``<cache>/validators/smg-<version>-<lock digest>-py<X.Y>`` once, then
``smg.launch_router.parse_router_args`` run on the argv the unit would get. A bad flag, a
value of the wrong type or a choice the router does not know fails with argparse's own words, the
host and the variable to fix.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from sglang_deploy.fleet.router import PACKAGE
from sglang_deploy.launch.validator_venv import (
    ValidatorError,
    cache_root,
    exclusive_lock,
    new_staging,
    run_step,
    say,
    swap_in,
    validators_directory,
)

# What the probe prints for a clean parse; argparse's error text otherwise.
_PROBE = r"""
import contextlib, io, json, sys
from importlib.metadata import version
from smg.launch_router import parse_router_args
err = io.StringIO()
sys.argv[0] = "smg"
try:
    with contextlib.redirect_stderr(err):
        args = parse_router_args(sys.argv[1:])
except SystemExit as exc:
    print(json.dumps({"ok": False, "version": version("smg"), "error": err.getvalue().strip(), "code": exc.code}))
else:
    print(json.dumps({"ok": True, "version": version("smg"), "policy": args.policy}))
"""
# A lock's line that pins the router itself.
_PIN_PREFIX = f"{PACKAGE}=="
# Seconds one parse may take (the router's Python wrapper imports quickly).
_PROBE_TIMEOUT_S = 120


@dataclass(frozen=True)
class RouterVerdict:
    """The pinned router's answer to one argv."""

    version: str
    error: str | None

    def format(self, host: str) -> str:
        """One problem line naming the host, what was wrong and the fix."""
        return (
            f"host {host}: {PACKAGE} {self.version} refuses the router's flags: {self.error}. "
            "Fix: the sglang_router_* variable behind that flag, or sglang_router_extra_flags "
            f"(the router's own list: python -m smg.launch_router --help in its venv)"
        )


def lock_path(lock_dir: Path, python: str) -> Path:
    """The role's lock for Python ``python`` (X.Y) in ``lock_dir`` (roles/sglang_router/files/locks)."""
    return lock_dir / f"{PACKAGE}-py{python}.txt"


def pinned_version(lock: Path) -> str:
    """The router version ``lock`` pins."""
    try:
        text = lock.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValidatorError(f"cannot read the router lock {lock}: {exc}") from exc
    for line in text.splitlines():
        word = line.strip().split(" ", 1)[0]
        if word.startswith(_PIN_PREFIX):
            return word.removeprefix(_PIN_PREFIX)
    raise ValidatorError(f"the router lock {lock} pins no {_PIN_PREFIX}<version>")


def ensure_router_validator(lock: Path, cache_dir: Path | None = None) -> Path:
    """A venv with exactly ``lock`` installed (hashes required), built once per lock content."""
    version = pinned_version(lock)
    digest = hashlib.sha256(lock.read_bytes()).hexdigest()[:12]
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    final = cache_root(cache_dir) / "validators" / f"{PACKAGE}-{version}-{digest}-py{python}"
    validators_directory(final.parent)
    with exclusive_lock(final.with_name(final.name + ".lock")):
        if not (final / "bin" / "python").exists():
            _build(lock, version, final)
    return final


def _build(lock: Path, version: str, final: Path) -> None:
    say(f"building the {PACKAGE} {version} flag validator in {final} (once; seconds)")
    started = time.monotonic()
    staging = new_staging(final)
    try:
        run_step(f"creating a venv with {sys.executable}", [sys.executable, "-m", "venv", str(staging)])
        run_step(
            f"installing {lock.name} (hashes required)",
            [str(staging / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             "--require-hashes", "--no-deps", "--only-binary=:all:", "-r", str(lock)],
        )  # fmt: skip
        answer = _probe(staging, ["--worker-urls", "http://127.0.0.1:1"])
        if answer.version != version or answer.error is not None:
            raise ValidatorError(f"the router validator venv does not parse as {PACKAGE} {version}: {answer}")
        swap_in(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    say(f"router validator ready in {time.monotonic() - started:.0f} s")


def _probe(venv: Path, argv: Sequence[str]) -> RouterVerdict:
    try:
        done = subprocess.run(
            [str(venv / "bin" / "python"), "-c", _PROBE, *argv],
            capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ValidatorError(f"the router validator in {venv} did not run: {exc}") from exc
    lines = done.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1])
    except (IndexError, ValueError) as exc:
        raise ValidatorError(f"the router validator in {venv} gave no answer: {done.stderr.strip()[-500:]}") from exc
    error = None if answer.get("ok") else (answer.get("error") or f"exit {answer.get('code')}")
    if error:
        # argparse's usage block is long; its last line says what is wrong.
        error = error.strip().splitlines()[-1]
    return RouterVerdict(version=str(answer.get("version")), error=error)


def validate_router_argv(argv: Sequence[str], lock: Path, cache_dir: Path | None = None) -> RouterVerdict:
    """``argv`` (the unit's flags, without the API key) through the router that ``lock`` pins."""
    return _probe(ensure_router_validator(lock, cache_dir), [str(word) for word in argv])
