"""The ml-env lock of a stack lane: resolved with uv from the lane's ``lock:`` inputs, with hashes.

One file per Python the lane names, ``lanes/locks/<lane>-py<python>.txt``, in pip's requirements
format (``name==version`` plus ``--hash`` lines), so ``uv pip sync --require-hashes`` installs it
exactly. Its header records a digest of every input that decides the resolution (requirements,
overrides, Python, platform, index, cut-off date, resolver options), so a lock that no longer
matches its lane is detected without the network (``is_stale``; a unit test runs it in CI).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from sglang_deploy import inputfiles

from sglang_deploy.lanes import catalog
from sglang_deploy_host.stack import lockfile
from sglang_deploy.lanes.catalog import Lane

LOCK_FORMAT = 1
"""Bumped when the header or the resolver options change meaning: every lock becomes stale."""

RESOLVER_OPTIONS: tuple[str, ...] = ("--generate-hashes", "--no-build", "--no-header")
"""uv pip compile options that shape the output (part of the digest). --no-build: wheels only,
so no host ever compiles a package while installing the lock."""

RESOLVE_TIMEOUT_S = 900
"""One resolution (metadata only, no wheels) takes seconds; this bounds a hung index."""

LOCK_MAX_BYTES = 16 << 20
"""A lock is a few hundred KB (every pin with its hashes); one past this is not a lock file."""

_REQUIREMENTS_NAME = "requirements.in"
_OVERRIDES_NAME = "overrides.txt"


class LockError(RuntimeError):
    """A lane that cannot be locked, or a resolution that failed."""


def read_lock(path: Path) -> str | None:
    """The text of the lock file at ``path``, None if nothing is there. Whatever is there must be a
    regular UTF-8 file under LOCK_MAX_BYTES: a FIFO, a directory or a binary blob named like a lock is
    an inputfiles.InputFileError, not a missing lock to write over."""
    if not inputfiles.exists(path):
        return None
    return inputfiles.read_text(path, "lock file", LOCK_MAX_BYTES)


@dataclass(frozen=True)
class LockTarget:
    """One lock file: a lane for one Python."""

    lane: Lane
    python: str

    @property
    def file_name(self) -> str:
        return f"{self.lane.name}-py{self.python}.txt"


def lock_dir() -> Path:
    """Where the committed locks live: ``locks/`` beside the lane files (package data)."""
    return Path(str(catalog._lane_dir())) / "locks"


def lock_path(target: LockTarget) -> Path:
    return lock_dir() / target.file_name


def targets(lane: Lane) -> list[LockTarget]:
    """The lock files a lane has, one per Python; a lane without ``lock:`` cannot be locked."""
    if lane.lock is None:
        raise LockError(f"lane {lane.name} has no lock: section (lanes/{lane.name}.yml)")
    return [LockTarget(lane, python) for python in lane.lock.pythons]


def inputs_digest(target: LockTarget) -> str:
    """sha256 over everything that decides what the resolver returns for this target."""
    spec = target.lane.lock
    assert spec is not None
    inputs = {
        "format": LOCK_FORMAT,
        "lane": target.lane.name,
        # Not a resolver input, but the header carries it to the ml_env role's CUDA check.
        "cuda": target.lane.cuda,
        "python": target.python,
        "platform": spec.platform,
        "index_url": spec.index_url,
        "exclude_newer": spec.exclude_newer,
        "requirements": list(spec.requirements),
        # The reason is documentation; only the requirement changes the resolution.
        "overrides": [o.requirement for o in spec.overrides],
        "resolver_options": list(RESOLVER_OPTIONS),
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def header(target: LockTarget, uv_version: str) -> str:
    spec = target.lane.lock
    assert spec is not None
    return lockfile.format_header(
        lane=target.lane.name,
        python=target.python,
        platform=spec.platform,
        uv_version=uv_version,
        inputs_sha256=inputs_digest(target),
        cuda=target.lane.cuda,
        overrides=[(o.requirement, o.reason) for o in spec.overrides],
    )


def is_stale(target: LockTarget, text: str | None = None) -> str | None:
    """Why the committed lock does not match the lane's inputs, or None when it does."""
    path = lock_path(target)
    if text is None:
        text = read_lock(path)
        if text is None:
            return f"{path} is missing"
    recorded = lockfile.recorded_digest(text)
    if recorded != inputs_digest(target):
        return (
            f"{path.name} was made from other inputs than lanes/{target.lane.name}.yml now holds "
            f"(recorded {recorded or 'no digest'}, expected {inputs_digest(target)})"
        )
    return None


def uv_binary() -> str:
    """uv from the ``uv`` package this project depends on, else from PATH."""
    try:
        from uv import find_uv_bin  # type: ignore[import-not-found,import-untyped]

        return str(find_uv_bin())
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found is None:
            raise LockError("uv not found. Fix: pip install uv (a dependency of sglang-deploy)") from None
        return found


def compile_argv(target: LockTarget, uv: str) -> list[str]:
    """The uv command that resolves ``target``; run in a directory holding the input files."""
    spec = target.lane.lock
    assert spec is not None
    argv = [
        uv, "pip", "compile", _REQUIREMENTS_NAME, *RESOLVER_OPTIONS,
        "--python-version", target.python,
        "--python-platform", spec.platform,
        "--index-url", spec.index_url,
    ]  # fmt: skip
    if spec.exclude_newer:
        argv += ["--exclude-newer", spec.exclude_newer]
    if spec.overrides:
        argv += ["--overrides", _OVERRIDES_NAME]
    return argv


def resolve(target: LockTarget, uv: str | None = None) -> str:
    """Resolve ``target`` now (network: the lane's index) and return the lock file's text."""
    spec = target.lane.lock
    assert spec is not None
    uv = uv or uv_binary()
    version = subprocess.run([uv, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="sglang-deploy-lock-") as scratch:
        work = Path(scratch)
        # Fixed relative names: uv's "# via -r requirements.in" annotations must not hold a temp path.
        (work / _REQUIREMENTS_NAME).write_text("\n".join(spec.requirements) + "\n", encoding="utf-8")
        (work / _OVERRIDES_NAME).write_text(
            "".join(f"{o.requirement}\n" for o in spec.overrides), encoding="utf-8"
        )
        # uv reads no pip configuration; its own must not point it elsewhere either.
        env = {k: v for k, v in os.environ.items() if not k.startswith("UV_") or k == "UV_CACHE_DIR"}
        env["UV_NO_CONFIG"] = "1"
        try:
            proc = subprocess.run(
                compile_argv(target, uv),
                cwd=work,
                capture_output=True,
                text=True,
                timeout=RESOLVE_TIMEOUT_S,
                env=env,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise LockError(
                f"{target.file_name}: uv did not finish resolving in {RESOLVE_TIMEOUT_S} s; "
                f"is {spec.index_url} reachable?"
            ) from None
    if proc.returncode != 0:
        raise LockError(f"{target.file_name}: uv pip compile failed:\n{proc.stderr.strip()}")
    return header(target, version) + proc.stdout


@dataclass(frozen=True)
class LockResult:
    target: LockTarget
    path: Path
    changed: bool
    seconds: float
    problem: str | None = None


def write_lock(target: LockTarget, uv: str | None = None) -> LockResult:
    """Resolve and write the lock file (only when its text changes)."""
    start = time.monotonic()
    path = lock_path(target)
    old = read_lock(path)  # before resolving: a path that is not a lock file stops the run at once
    text = resolve(target, uv)
    if old != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    return LockResult(target, path, old != text, time.monotonic() - start)


def check_lock(target: LockTarget, uv: str | None = None) -> LockResult:
    """Offline digest check, then re-resolve (same cut-off date) and compare the pins and hashes."""
    start = time.monotonic()
    path = lock_path(target)
    committed = read_lock(path)
    problem = is_stale(target, committed) if committed is not None else f"{path} is missing"
    if problem is None:
        fresh = lockfile.body(resolve(target, uv))
        if fresh != lockfile.body(committed):
            problem = f"{path.name}: resolving its inputs again gives other pins or hashes"
    return LockResult(target, path, False, time.monotonic() - start, problem)
