"""The flag validator's venv: built once per sglang version, cached, and the probe run in it.

A small CPU-only venv (sglang ``--no-deps``, a CPU torch, triton and the few packages
``sglang.srt.server_args`` imports) at ``validator_dir``, built under a file lock in a staging
directory and swapped in whole (``ensure_validator_env``); ``run_probe`` runs
``_validator_probe.py`` in it. What the probe's answer means is :mod:`sglang_deploy.launch.validator`'s.

The venv's torch comes from the first of these sources that works (``torch_sources``), each
failure said in one line; the one used is recorded in the venv's marker (``torch_source``):
    1. the lane's CPU index (``validator.torch_index``), if it answers within a few seconds;
    2. a CPU (``+cpu``) torch wheel for the venv's Python and this machine in pip's configured
       find-links and indexes (``pip config list``, PIP_* variables included): the lane's
       version if there is one, else the newest;
    3. the lane's torch through pip's own configuration: usually PyPI's CUDA build, several GB.

Environment (POSIX control nodes only: the build lock uses ``fcntl``):
    SGLANG_DEPLOY_CACHE                  cache root (default ~/.cache/sglang-deploy)
    SGLANG_DEPLOY_VALIDATOR_TORCH        pip requirement for the venv's torch; when it or the index
                                         below is set, it is the only source tried, and the venv is
                                         a separate one (validator_dir)
    SGLANG_DEPLOY_VALIDATOR_TORCH_INDEX  index that torch is installed from (pip --index-url);
                                         empty = pip's own configuration. Default: the lane's index,
                                         or empty when SGLANG_DEPLOY_VALIDATOR_TORCH is set.
    SGLANG_DEPLOY_VALIDATOR_PYTHON       interpreter the venv is made from (default: this one)
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import fcntl
import hashlib
import http.client
import json
import os
import platform
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, TypeVar

from packaging.requirements import Requirement
from packaging.tags import platform_tags
from packaging.utils import parse_wheel_filename
from packaging.version import Version

from sglang_deploy import ownpath
from sglang_deploy_host.fs import files
from sglang_deploy.lanes.catalog import Lane

ENV_CACHE = "SGLANG_DEPLOY_CACHE"
ENV_TORCH = "SGLANG_DEPLOY_VALIDATOR_TORCH"
ENV_TORCH_INDEX = "SGLANG_DEPLOY_VALIDATOR_TORCH_INDEX"
ENV_PYTHON = "SGLANG_DEPLOY_VALIDATOR_PYTHON"

_PROBE = Path(__file__).with_name("_validator_probe.py")
_MARKER = "sglang-deploy-validator.json"
_MARKER_FORMAT = 2
_MARKER_TORCH_SOURCE = "torch_source"
_PROBE_TIMEOUT_S = 300
# The probe's answers, kept inside the validator venv that gave them (a rebuilt venv starts with none): the
# same request to the same sglang, probe and environment gets the same answer, so a re-run, `render` after
# `validate`, or each host of one inventory costs a file read instead of importing sglang (~6 s).
_ANSWERS_DIR = "probe-answers"
_ANSWER_MAX_BYTES = 4 * 1024 * 1024
# Environment variables that may change what sglang's parser or its imports do: part of an answer's key.
_ANSWER_ENV_PREFIXES = ("SGLANG", "SGL_", "HF_", "TRANSFORMERS", "TORCH", "CUDA")
_OUTPUT_TAIL_LINES = 40
_REACH_TIMEOUT_S = 5
"""How long an index or find-links page may take to answer before its source is skipped."""
_TORCH_PIP_NETWORK = ("--timeout", "20", "--retries", "2")
"""Keeps pip's retry loop on a failing torch source short, so the next one is tried soon."""


class ValidatorError(RuntimeError):
    """The validator venv could not be built, or the probe in it failed (not a flag problem)."""


@dataclass(frozen=True)
class BuildSpec:
    """Everything the validator venv is built from; recorded in its marker file, so a changed
    lane or override rebuilds it instead of silently validating with a stale one.

    ``torch`` and ``torch_index`` are the lane's (the first torch source) unless
    ``torch_explicit``: then they come from the environment and are the only source.
    """

    python: str
    python_version: str
    sglang: str
    torch: str
    torch_index: str
    torch_explicit: bool
    packages: tuple[str, ...]

    def marker(self) -> dict[str, Any]:
        """What identifies a built venv. Not the interpreter's path: a project venv's python and
        the base python it links to build the same venv, and must not rebuild it in turn."""
        fields = asdict(self)
        del fields["python"]
        return {"format": _MARKER_FORMAT, **fields, "packages": list(self.packages)}

    def matches(self, marker: Mapping[str, Any] | None) -> bool:
        """Whether a venv with ``marker`` was built from this spec. Which torch source won does
        not count: the venv would otherwise be rebuilt whenever a network comes or goes."""
        if marker is None:
            return False
        return {k: v for k, v in marker.items() if k != _MARKER_TORCH_SOURCE} == self.marker()


@dataclass(frozen=True)
class TorchSource:
    """One place the validator venv's torch can come from (see ``torch_sources``).

    ``label`` names it in progress lines, errors and the venv's marker; ``pip_args`` is what
    ``pip install`` gets (index options and a requirement, or a wheel's path or URL); ``skipped``
    says why it is not tried at all (an unreachable index, no fitting wheel), None when it is.
    """

    label: str
    pip_args: tuple[str, ...]
    skipped: str | None = None


@dataclass(frozen=True)
class PipConfig:
    """What pip's install command is configured with, as far as finding a torch goes."""

    find_links: tuple[str, ...]
    indexes: tuple[str, ...]
    """index-url (only when configured: pip's default, PyPI, has no ``+cpu`` builds since it
    refuses local versions) and every extra-index-url."""
    cert: str
    proxy: str

    @classmethod
    def of(cls, python: str) -> PipConfig:
        """``python -m pip config list``: pip's files and PIP_* variables, merged as pip does
        (global, then the install section, then the environment)."""
        command = [python, "-m", "pip", "config", "list"]
        done = subprocess.run(command, check=False, capture_output=True, text=True)
        if done.returncode != 0:
            raise ValidatorError(
                f"reading pip's configuration failed ({' '.join(command)}, exit "
                f"{done.returncode}):\n{_tail(done.stderr)}\nFix: correct pip's configuration "
                "(`pip config debug` names its files) or the PIP_* variables."
            )
        values: dict[str, str] = {}
        for section in ("global", "install", ":env:"):
            for line in done.stdout.splitlines():
                key, _, value = line.partition("=")
                if key.startswith(f"{section}.") and value:
                    values[key.removeprefix(f"{section}.")] = str(ast.literal_eval(value))
        return cls(
            find_links=tuple(values.get("find-links", "").split()),
            indexes=tuple(values.get("index-url", "").split())
            + tuple(values.get("extra-index-url", "").split()),
            cert=values.get("cert", ""),
            proxy=values.get("proxy", ""),
        )


# --- the validator venv --------------------------------------------------------------------------


# Every progress line of the validator's build starts with this (the CLI's progress view shows
# Ansible's output lines that do).
PROGRESS_PREFIX = "sglang-deploy: "


def _print_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# Where progress goes: stderr for the CLI's own commands; Ansible's Display inside a play
# (action_plugins/sglang_validate_flags.py), where a worker's stderr would become a warning.
_progress: Callable[[str], None] = _print_progress


@contextlib.contextmanager
def progress_to(callback: Callable[[str], None]) -> Iterator[None]:
    """Send the validator's progress lines to ``callback`` while the block runs."""
    global _progress
    previous, _progress = _progress, callback
    try:
        yield
    finally:
        _progress = previous


def say(message: str) -> None:
    _progress(f"{PROGRESS_PREFIX}{message}")


def build_spec(lane: Lane, environ: Mapping[str, str]) -> BuildSpec:
    """The lane's validator spec with the environment's overrides applied.

    An overridden torch requirement drops the lane's index unless an index is given too: the
    override usually names a wheel that pip already finds through its own configuration.
    """
    python = environ.get(ENV_PYTHON) or sys.executable
    torch = environ.get(ENV_TORCH) or lane.validator.torch
    default_index = "" if environ.get(ENV_TORCH) else lane.validator.torch_index
    return BuildSpec(
        python=python,
        python_version=_python_version(python),
        sglang=lane.sglang,
        torch=torch,
        torch_index=environ.get(ENV_TORCH_INDEX, default_index),
        torch_explicit=bool(environ.get(ENV_TORCH)) or ENV_TORCH_INDEX in environ,
        packages=lane.validator.packages,
    )


def _python_version(python: str) -> str:
    if python == sys.executable:
        return f"{sys.version_info.major}.{sys.version_info.minor}"
    code = "import sys; print('%d.%d' % sys.version_info[:2])"
    try:
        return subprocess.run(
            [python, "-c", code], check=True, capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as exc:
        raise ValidatorError(
            f"{ENV_PYTHON}={python} is not a working Python interpreter: {exc}"
        ) from exc


def cache_root(cache_dir: Path | None) -> Path:
    root = cache_dir or os.environ.get(ENV_CACHE) or Path.home() / ".cache" / "sglang-deploy"
    return Path(root).expanduser()


def _venv_python(env: Path) -> Path:
    return env / "bin" / "python"


def validator_dir(spec: BuildSpec, cache_dir: Path | None = None) -> Path:
    """Where ``spec``'s venv lives: ``<cache>/validators/sglang-<version>-py<major.minor>`` for the
    default torch discovery (the path existing caches have), with ``-torch-<hash of the requirement
    and index>`` when the environment forces a source. One path for both would have two processes
    with different sources rebuild it in turn (minutes each, the other waiting on its lock)."""
    name = f"sglang-{spec.sglang}-py{spec.python_version}"
    if spec.torch_explicit:
        source = json.dumps([spec.torch, spec.torch_index]).encode()
        name += f"-torch-{hashlib.sha256(source).hexdigest()[:8]}"
    return cache_root(cache_dir) / "validators" / name


def ensure_validator_env(lane: Lane, cache_dir: Path | None = None) -> Path:
    """The venv that runs ``lane``'s sglang parser, built once (about two minutes) and then reused.

    Lives at ``validator_dir``. Built under a file lock in a temporary directory beside it and
    renamed into place only after the probe ran in it and its marker is written, so a concurrent,
    failed or killed build never leaves a half-built venv at the final path.
    """
    spec = build_spec(lane, os.environ)
    final = validator_dir(spec, cache_dir)
    validators_directory(final.parent)
    with exclusive_lock(final.with_name(final.name + ".lock")):
        if not spec.matches(_read_marker(final)) or not _venv_python(final).exists():
            _build(spec, final, lane.validator.stand_ins)
    return final


def validators_directory(path: Path) -> Path:
    """The cache's validators/ directory, made by this command or the user's own and reached through no link another
    user planted (a validator venv is code the CLI runs: sglang_deploy.ownpath). ValidatorError otherwise."""
    try:
        return ownpath.directory(path, f"the validator cache ({ENV_CACHE})", mode=0o755)
    except ownpath.UnsafeDirectoryError as err:
        raise ValidatorError(str(err)) from None


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    with os.fdopen(ownpath.open_append(path), "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for another process to finish building {path.stem} ...")
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _read_marker(env: Path) -> dict[str, Any] | None:
    try:
        marker: dict[str, Any] = json.loads((env / _MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return marker


def torch_source(env: Path) -> str | None:
    """Where the torch of the validator venv ``env`` came from (a TorchSource label), or None
    for a venv without a marker that says."""
    source = (_read_marker(env) or {}).get(_MARKER_TORCH_SOURCE)
    return source if isinstance(source, str) else None


def new_staging(final: Path) -> Path:
    """A new temporary sibling of ``final`` to build into, after removing what killed builds left
    (the caller holds ``final``'s lock, so no build is running)."""
    for leftover in final.parent.glob(f".{final.name}.*"):
        shutil.rmtree(leftover, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".building", dir=final.parent))


def _build(spec: BuildSpec, final: Path, stand_ins: Sequence[str]) -> None:
    """Build into a temporary sibling, check it, then swap it in (see ensure_validator_env)."""
    say(f"building the sglang {spec.sglang} flag validator in {final} (once; about two minutes)")
    started = time.monotonic()
    staging = new_staging(final)
    try:
        run_step(f"creating a venv with {spec.python}", [spec.python, "-m", "venv", str(staging)])
        source = _install_torch(spec, staging)
        # sglang's import dependencies, then sglang itself without its (GPU) dependencies; after
        # torch, so nothing here pulls the CUDA build.
        pip = _pip_install(staging)
        run_step(f"installing {len(spec.packages)} import dependencies", [*pip, *spec.packages])
        run_step(
            f"installing sglang=={spec.sglang} (--no-deps)",
            [*pip, "--no-deps", f"sglang=={spec.sglang}"],
        )
        say("checking that sglang's parser loads")
        version = run_probe(staging, [], [], stand_ins, lambda answer: str(answer["sglang_version"]))
        if version != spec.sglang:
            raise ValidatorError(f"the validator venv has sglang {version}, expected {spec.sglang}")
        marker = {**spec.marker(), _MARKER_TORCH_SOURCE: source.label}
        (staging / _MARKER).write_text(json.dumps(marker, indent=2), encoding="utf-8")
        swap_in(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    say(f"validator ready in {time.monotonic() - started:.0f} s (torch from {source.label})")


def _pip_install(venv: Path) -> list[str]:
    return [
        str(_venv_python(venv)),
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--no-input",
    ]


def _install_torch(spec: BuildSpec, venv: Path) -> TorchSource:
    """Install torch from the first source that works; raise with every attempt when none does."""
    sources = torch_sources(spec, str(_venv_python(venv)))
    attempts: list[str] = []
    for number, source in enumerate(sources, 1):
        reason = source.skipped
        if reason is None:
            step = f"installing torch from {source.label}"
            failed = _try_step(step, [*_pip_install(venv), *_TORCH_PIP_NETWORK, *source.pip_args])
            if failed is None:
                return source
            reason = f"pip failed (exit {failed.returncode}): {_pip_error(failed.stdout)}"
        attempts.append(f"  {number}. {source.label}: {reason}")
        more = "; trying the next source" if number < len(sources) else ""
        say(f"  torch source {number}/{len(sources)}, {source.label}: not used, {reason}{more}")
    if spec.torch_explicit:
        fix = (
            f"correct {ENV_TORCH} / {ENV_TORCH_INDEX}, or unset both to let the validator find "
            "a CPU torch by itself."
        )
    else:
        tag = _cpython_tag(spec.python_version)
        fix = (
            f"put a CPU torch wheel for Python {spec.python_version} on {platform.machine()} "
            f"(torch-<version>+cpu-{tag}-{tag}-<platform>.whl, e.g. from "
            f"{spec.torch_index or 'https://download.pytorch.org/whl/cpu'}/torch/) into a "
            "directory and run `pip config set global.find-links DIR`; or let pip reach that "
            f"index (pip's proxy setting, HTTPS_PROXY); or set {ENV_TORCH} to a pip requirement "
            f"for a CPU torch (and {ENV_TORCH_INDEX} to its index)."
        )
    raise ValidatorError(
        f"building the flag validator failed: no torch source worked for Python "
        f"{spec.python_version} on {platform.machine()}:\n" + "\n".join(attempts) + f"\nFix: {fix}"
    )


def run_step(step: str, command: list[str]) -> None:
    failed = _try_step(step, command)
    if failed is not None:
        raise ValidatorError(
            f"building the flag validator failed while {step} (exit {failed.returncode}):\n"
            f"{_tail(failed.stdout)}"
        )


def _try_step(step: str, command: list[str]) -> subprocess.CompletedProcess[str] | None:
    """Run one build command with progress lines: None when it worked, else the failed run
    (stdout holds its output, stderr included)."""
    say(f"  {step} ...")
    started = time.monotonic()
    # A process group of its own, to be killed whole (pip and what pip starts) with this process.
    with subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, preexec_fn=_dies_with_parent(),
    ) as proc, _step_dies_with_us(proc):  # fmt: skip
        output, _ = proc.communicate()
    if proc.returncode != 0:
        return subprocess.CompletedProcess(command, proc.returncode, output)
    say(f"  {step}: done in {time.monotonic() - started:.0f} s")
    return None


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _dies_with_parent() -> Callable[[], None] | None:
    """(Linux) A preexec_fn after which the kernel SIGKILLs the child when this process dies, even of
    a SIGKILL (a subprocess timeout, the CLI's kill of a run that did not stop), when no handler runs."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before prctl: no signal would come
            os._exit(1)

    return preexec


@contextlib.contextmanager
def _step_dies_with_us(proc: subprocess.Popen[str]) -> Iterator[None]:
    """Kill ``proc``'s process group however this process leaves the step: any exception (an
    Ansible task's timeout alarm, KeyboardInterrupt, the CLI's Interrupted) and SIGTERM, SIGINT or
    SIGHUP before the handler this process had (Ansible's worker kills only its own group; the
    default ends the process with no cleanup). Without this, a validate cut off mid-build left pip
    building on."""

    def kill() -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    def on_signal(signum: int, frame: Any) -> None:
        previous = handlers[signum]
        if previous == signal.SIG_IGN:
            return  # this process ignores it: its build goes on too
        kill()
        if callable(previous):
            previous(signum, frame)
        else:  # SIG_DFL (or set outside Python): end as the signal would have ended us
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        # A handler that returned: the step is killed, so the build must not go on as if it failed.
        raise ValidatorError(
            f"building the flag validator was interrupted by {signal.Signals(signum).name}; "
            "nothing was kept. Fix: run it again"
        )

    handlers: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():  # where handlers can be set
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            handlers[signum] = signal.signal(signum, on_signal)
    try:
        yield
    except BaseException:
        kill()
        raise
    finally:
        for signum, previous in handlers.items():
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)


def _pip_error(output: str) -> str:
    """pip's verdict in one line: its first ERROR line, else its last line."""
    lines = output.strip().splitlines() or ["(no output)"]
    return next((line for line in lines if line.startswith("ERROR:")), lines[-1])


def swap_in(staging: Path, final: Path) -> None:
    """Replace ``final`` by ``staging`` with renames, so readers see the old or the new venv."""
    if final.exists():
        retired = final.with_name(f".{final.name}.{os.getpid()}.retired")
        final.rename(retired)
        staging.rename(final)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        staging.rename(final)


def _tail(output: str) -> str:
    return "\n".join(output.rstrip().splitlines()[-_OUTPUT_TAIL_LINES:])


# --- where the validator's torch comes from ------------------------------------------------------

_FETCH_ERRORS = (OSError, http.client.HTTPException, ValueError)
"""What opening a page can raise: URLError, HTTPError, SSL errors and timeouts are OSErrors;
ValueError is a malformed URL."""


def torch_sources(spec: BuildSpec, python: str) -> list[TorchSource]:
    """Where ``spec``'s torch can come from, in the order they are tried, for the venv whose
    interpreter is ``python`` (its pip's configuration is the one read).

    An explicit override is the only source. Otherwise: the lane's CPU index, if it answers; a
    CPU wheel in pip's find-links and indexes that fits the venv's Python and this machine; the
    lane's torch through pip's own configuration (PyPI's CUDA build, several GB: the last resort).
    """
    if spec.torch_explicit:
        where = spec.torch_index or "pip's own configuration"
        index = ("--index-url", spec.torch_index) if spec.torch_index else ()
        label = f"{spec.torch} from {where} (set by {ENV_TORCH} / {ENV_TORCH_INDEX})"
        return [TorchSource(label, (*index, spec.torch))]
    config = PipConfig.of(python)
    sources: list[TorchSource] = []
    if spec.torch_index:
        sources.append(
            TorchSource(
                f"the lane's CPU index {spec.torch_index}",
                ("--index-url", spec.torch_index, spec.torch),
                _unreachable(_project_page(spec.torch_index), config),
            )
        )
    sources.append(_cpu_wheel(spec, config))
    sources.append(
        TorchSource(
            f"PyPI's build of {spec.torch} through pip's own configuration "
            "(the last resort: a CUDA build, several GB of nvidia-* wheels)",
            (spec.torch,),
        )
    )
    return sources


def _cpu_wheel(spec: BuildSpec, config: PipConfig) -> TorchSource:
    """The CPU torch wheel in pip's find-links and indexes that fits the venv's Python and this
    machine: the lane's version if there is one, else the newest (find-links first on a tie)."""
    python_tag = _cpython_tag(spec.python_version)
    platforms = set(platform_tags())
    places = [(f"find-links {place}", place, True) for place in config.find_links]
    places += [(f"index {index}", _project_page(index), False) for index in config.indexes]
    found: list[tuple[Version, str, str]] = []
    looked: list[str] = []
    for where, place, listing in places:
        try:
            links = _links(place, listing, config)
        except _FETCH_ERRORS as exc:
            looked.append(f"{place} ({_fetch_error(exc)})")
            continue
        looked.append(place)
        for name, location in links:
            version = _cpu_torch_version(name, python_tag, platforms)
            if version is not None:
                found.append((version, location, where))
    label = "a CPU torch wheel in pip's find-links and indexes"
    if not found:
        missing = (
            f"none for Python {spec.python_version} ({python_tag}) on {platform.machine()} in "
            f"{', '.join(looked)}"
            if looked
            else "pip has no find-links or index-url/extra-index-url configured"
        )
        return TorchSource(label, (), missing)
    wanted = Requirement(spec.torch).specifier
    _, location, where = max(found, key=lambda f: (wanted.contains(f[0], prereleases=True), f[0]))
    return TorchSource(f"the CPU wheel {location} in pip's {where}", (location,))


def _cpu_torch_version(name: str, python_tag: str, platforms: set[str]) -> Version | None:
    """The version of the CPU (``+cpu``) torch wheel file ``name`` if its tags fit the venv's
    CPython and this machine's platform; None for any other file."""
    try:
        project, version, _, tags = parse_wheel_filename(name)
    except ValueError:  # not a wheel, or a malformed name
        return None
    fits = any(
        tag.interpreter == python_tag
        and tag.abi in (python_tag, "abi3", "none")
        and tag.platform in platforms
        for tag in tags
    )
    cpu = (version.local or "").split(".")[0] == "cpu"
    return version if project == "torch" and cpu and fits else None


def _cpython_tag(python_version: str) -> str:
    return "cp" + python_version.replace(".", "")


def _project_page(index: str) -> str:
    """An index's page for torch (PEP 503)."""
    return index.rstrip("/") + "/torch/"


def _links(place: str, listing: bool, config: PipConfig) -> list[tuple[str, str]]:
    """(file name, local path or URL) of every file ``place`` links to: a local directory's
    files when ``listing`` (a find-links directory), else the anchors of the page it is."""
    path = _local_path(place)
    if listing and path is not None and path.is_dir():
        return [(child.name, str(child)) for child in sorted(path.iterdir())]
    page = _page_url(place)
    anchors = _Anchors()
    with _open(page, config) as response:
        anchors.feed(response.read().decode("utf-8", "replace"))
    links: list[tuple[str, str]] = []
    for href in anchors.hrefs:
        url = urllib.parse.urljoin(page, href)
        name = urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
        local = _local_path(url)
        links.append((name, url if local is None else str(local)))
    return links


class _Anchors(HTMLParser):
    """The href of every ``<a>`` on a page: a PEP 503 project page or a find-links page."""

    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.hrefs.append(href)


def _local_path(location: str) -> Path | None:
    """The local path a find-links entry, index or link means (a path or file:// URL), or None
    for a remote URL."""
    parts = urllib.parse.urlsplit(location)
    if parts.scheme == "file":
        return Path(urllib.request.url2pathname(parts.path))
    if parts.scheme:
        return None
    return Path(location).expanduser().absolute()


def _page_url(place: str) -> str:
    """The URL to read for ``place``; a local directory means its index.html, as pip reads a
    file:// index."""
    path = _local_path(place)
    if path is None:
        return place
    return (path / "index.html" if path.is_dir() else path).as_uri()


def _unreachable(url: str, config: PipConfig) -> str | None:
    """Why ``url`` does not answer within _REACH_TIMEOUT_S; None when it does. Checked before
    pip is run, so an unreachable index costs seconds, not pip's retry loop."""
    try:
        with _open(_page_url(url), config):
            return None
    except _FETCH_ERRORS as exc:
        return f"cannot read {url} ({_fetch_error(exc)})"


def _open(url: str, config: PipConfig) -> Any:
    """Open ``url`` with pip's cert and proxy settings where it has them, else the environment's
    (SSL_CERT_FILE, HTTPS_PROXY, NO_PROXY), within _REACH_TIMEOUT_S."""
    context = ssl.create_default_context(cafile=config.cert or None)
    handlers: list[urllib.request.BaseHandler] = [urllib.request.HTTPSHandler(context=context)]
    if config.proxy:
        handlers.append(urllib.request.ProxyHandler({"http": config.proxy, "https": config.proxy}))
    return urllib.request.build_opener(*handlers).open(url, timeout=_REACH_TIMEOUT_S)


def _fetch_error(exc: Exception) -> str:
    """An _open failure in a few words: "HTTP 404 Not Found", "[Errno 111] Connection refused"."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    if isinstance(exc, urllib.error.URLError):
        return str(exc.reason)
    return str(exc) or type(exc).__name__


# --- the probe in the venv -----------------------------------------------------------------------


_Answer = TypeVar("_Answer")


def run_probe(
    env: Path,
    argv: Sequence[str],
    segments: Sequence[Sequence[str]],
    stand_ins: Sequence[str],
    read: Callable[[Any], _Answer],
) -> _Answer:
    """Run ``_validator_probe.py`` in the venv ``env`` on ``argv`` cut into ``segments``; ``read``
    turns its JSON answer into the caller's (raising ValueError, KeyError or TypeError on one it
    does not expect). One subprocess: ``-I`` keeps the caller's PYTHONPATH and this package's
    directory out."""
    request = {
        "argv": list(argv),
        "segments": [list(s) for s in segments],
        "stand_ins": list(stand_ins),
    }
    kept = _kept_answer_file(env, request)
    answer = _kept_answer(kept, read)
    if answer is not None:
        return answer
    try:
        done = subprocess.run(
            [str(_venv_python(env)), "-I", str(_PROBE)],
            check=False,
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        raise ValidatorError(f"sglang's parser did not answer within {_PROBE_TIMEOUT_S} s") from exc
    if done.returncode != 0:
        raise ValidatorError(
            f"the flag probe failed (exit {done.returncode}):\n{_tail(done.stderr)}"
        )
    try:
        answer = read(json.loads(done.stdout))
    except Exception as exc:  # whatever ``read`` makes of an answer of another shape: a one-line error
        raise ValidatorError(
            f"the flag probe answered something unexpected ({exc}):\n{_tail(done.stdout)}"
        ) from exc
    _keep_answer(kept, done.stdout)
    return answer


def _kept_answer_file(env: Path, request: Mapping[str, Any]) -> Path | None:
    """Where the answer to ``request`` is kept in ``env``: keyed by the venv's marker (its sglang, torch
    and build), the probe's source, the request and the environment's sglang/torch/CUDA variables. None
    for a venv without a marker (one being built: its first probe is the build's own check)."""
    try:
        marker = files.read_regular_file(env / _MARKER, _ANSWER_MAX_BYTES)
        probe = _PROBE.read_bytes()
    except (OSError, files.UnreadableFileError):
        return None
    environment = sorted((k, v) for k, v in os.environ.items() if k.startswith(_ANSWER_ENV_PREFIXES))
    key = hashlib.sha256()
    for part in (marker, probe, json.dumps([request, environment], sort_keys=True).encode()):
        key.update(hashlib.sha256(part).digest())
    return env / _ANSWERS_DIR / f"{key.hexdigest()}.json"


def _kept_answer(path: Path | None, read: Callable[[Any], _Answer]) -> _Answer | None:
    """The kept answer at ``path`` as ``read`` makes it, or None: none kept, or anything but a regular file of
    a bounded size (a FIFO there is not waited on) holding an answer ``read`` takes - the parser is asked
    again, and its answer replaces what was there."""
    if path is None:
        return None
    try:
        return read(json.loads(files.read_regular_file(path, _ANSWER_MAX_BYTES)))
    except Exception:  # a kept answer is a shortcut only: whatever is wrong with it, ask the parser
        return None


def _keep_answer(path: Path | None, text: str) -> None:
    """Keep ``text`` at ``path`` (atomically: a concurrent reader sees the whole answer or none); a
    read-only cache only loses the shortcut."""
    if path is None or len(text.encode()) > _ANSWER_MAX_BYTES:
        return
    temporary = None
    try:
        path.parent.mkdir(exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp", encoding="utf-8") as out:
            temporary = out.name
            out.write(text)
        os.replace(temporary, path)
    except OSError:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)

