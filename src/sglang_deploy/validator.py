"""Validate an sglang server command line against the pinned sglang version's own argparse.

Why: a renamed flag or a misspelt choice must fail on the control node in seconds, naming the
flag and the valid values, before any host is changed -- not minutes later in a crash-looping
systemd unit. The only faithful judge is sglang's parser itself (``ServerArgs.add_cli_args`` on
a plain ``argparse.ArgumentParser``, as ``sglang serve`` builds it), so this module keeps a small
CPU-only venv per sglang version (sglang ``--no-deps``, a CPU torch, triton and the few packages
``sglang.srt.server_args`` imports) and runs ``_validator_probe.py`` in it, once per validation.

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

import argparse
import ast
import contextlib
import ctypes
import difflib
import fcntl
import hashlib
import http.client
import json
import os
import platform
import re
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
from typing import Any, Literal

from packaging.requirements import Requirement
from packaging.tags import platform_tags
from packaging.utils import parse_wheel_filename
from packaging.version import Version

from sglang_deploy.lanes import DEFAULT_LANE, Lane, LaneError, lane_names, load_lane

ENV_CACHE = "SGLANG_DEPLOY_CACHE"
ENV_TORCH = "SGLANG_DEPLOY_VALIDATOR_TORCH"
ENV_TORCH_INDEX = "SGLANG_DEPLOY_VALIDATOR_TORCH_INDEX"
ENV_PYTHON = "SGLANG_DEPLOY_VALIDATOR_PYTHON"

FLAGS_VARIABLE = "sglang_server_flags"
"""The inventory variable holding the server flags (flag name without ``--`` -> value)."""

_PROBE = Path(__file__).with_name("_validator_probe.py")
_MARKER = "sglang-deploy-validator.json"
_MARKER_FORMAT = 2
_MARKER_TORCH_SOURCE = "torch_source"
_PROBE_TIMEOUT_S = 300
_OUTPUT_TAIL_LINES = 40
_SUGGESTION_CUTOFF = 0.7
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")  # argparse treats these as values
_REACH_TIMEOUT_S = 5
"""How long an index or find-links page may take to answer before its source is skipped."""
_TORCH_PIP_NETWORK = ("--timeout", "20", "--retries", "2")
"""Keeps pip's retry loop on a failing torch source short, so the next one is tried soon."""

ProblemKind = Literal[
    "unknown_flag",
    "invalid_choice",
    "invalid_value",
    "missing_value",
    "unexpected_value",
    "ambiguous_flag",
    "missing_required",
    "abbreviation",
    "conflict",
    "out_of_range",
    "other",
]


class ValidatorError(RuntimeError):
    """The validator venv could not be built, or the probe in it failed (not a flag problem)."""


@dataclass(frozen=True)
class FlagProblem:
    """One thing sglang's parser rejects.

    ``flag`` is the option as written (``--tp`` stays ``--tp``), or "" when there is none;
    ``message`` is argparse's verdict; ``choices`` the flag's valid values, when it has a fixed set;
    ``suggestion`` the closest known flag (unknown flag) or choice (invalid choice).
    """

    flag: str
    value: str | None
    message: str
    choices: list[str] | None
    kind: ProblemKind = "other"
    suggestion: str | None = None

    def format(self, sglang_version: str, host: str | None = None) -> str:
        """One line naming host, flag, value, sglang version, what is wrong and the fix."""
        where = f"host {host}: " if host else ""
        subject = self.flag or "the command line"
        if self.value is not None:
            subject += f" {self.value!r}"
        text = f"{where}sglang {sglang_version} rejects {subject}: {self.message}"
        if self.suggestion is None or self.kind == "abbreviation":
            text += "."
        elif self.kind == "invalid_choice":
            text += f"; did you mean {self.suggestion!r}?"
        else:
            text += f"; did you mean {self.suggestion}?"
        if self.choices:
            text += f" Valid choices: {', '.join(self.choices)}."
        return f"{text} Fix: {self._fix()}"

    def _fix(self) -> str:
        inventory = "in inventory (host_vars/group_vars)"
        key = self.flag.lstrip("-")
        ref = f"{FLAGS_VARIABLE}['{key}']"
        if not key:
            return f"correct {FLAGS_VARIABLE} {inventory}."
        if self.kind == "unknown_flag":
            rename = (
                f"rename {ref} to '{self.suggestion.lstrip('-')}' or " if self.suggestion else ""
            )
            return f"{rename}remove {ref} {inventory}, or use a lane whose sglang has {self.flag}."
        fixes: dict[ProblemKind, str] = {
            "invalid_choice": f"set {ref} to one of these {inventory}.",
            "missing_value": f"give {ref} a value (not true: it is no bare switch) {inventory}.",
            "unexpected_value": f"set {ref} to true (a bare switch) {inventory}.",
            "ambiguous_flag": f"spell {ref} out as one of the full flag names {inventory}.",
            "missing_required": f"set {ref} {inventory}.",
            "abbreviation": f"rename {ref} to '{(self.suggestion or '').lstrip('-')}' {inventory}.",
            "conflict": f"keep one of the two keys {inventory} (to replace a profile value use "
            "sglang_server_flags_override with the same key).",
            "out_of_range": f"set {ref} to a value in that range {inventory}.",
        }
        return fixes.get(self.kind, f"correct {ref} {inventory}.")


@dataclass(frozen=True)
class ValidationResult:
    """What the lane's sglang says about one command line."""

    sglang_version: str
    lane: str
    problems: tuple[FlagProblem, ...]
    host: str | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def format(self, host: str | None = None) -> str:
        """Human lines, one per problem; ``host`` overrides the host given to validate_flags."""
        host = host or self.host
        if self.ok:
            where = f"host {host}: " if host else ""
            return (
                f"{where}sglang {self.sglang_version} (lane {self.lane}) accepts the command line."
            )
        return "\n".join(problem.format(self.sglang_version, host) for problem in self.problems)


@dataclass(frozen=True)
class Segment:
    """One option with the values that follow it: the unit the probe re-parses on its own."""

    tokens: tuple[str, ...]

    @property
    def flag(self) -> str:
        """The option as written, without an ``=value``; "" for values that follow no option."""
        first = self.tokens[0]
        return first.split("=", 1)[0] if _is_option(first) else ""

    @property
    def value(self) -> str | None:
        """The value(s) as written, space-joined; None for a bare switch."""
        first, *rest = self.tokens
        if not _is_option(first):
            rest = list(self.tokens)
        elif "=" in first:
            rest.insert(0, first.split("=", 1)[1])
        return " ".join(rest) if rest else None


@dataclass(frozen=True)
class Option:
    """One action of sglang's parser: its option strings, if fixed its choices, and the ``dest``
    its value lands in (two spellings of one setting share it)."""

    option_strings: tuple[str, ...]
    choices: tuple[str, ...] | None
    dest: str | None = None


@dataclass(frozen=True)
class ProbeAnswer:
    """The probe's JSON answer (see ``_validator_probe.py``)."""

    sglang_version: str
    segment_errors: tuple[str | None, ...]
    rest_error: str | None
    options: tuple[Option, ...]
    segment_values: tuple[Mapping[str, Any] | None, ...] = ()
    """Per segment, ``dest -> value`` as sglang's parser typed it (None: it does not parse)."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProbeAnswer:
        return cls(
            sglang_version=str(data["sglang_version"]),
            segment_errors=tuple(data["segment_errors"]),
            rest_error=data["rest_error"],
            options=tuple(
                Option(
                    tuple(o["option_strings"]),
                    None if o["choices"] is None else tuple(o["choices"]),
                    o.get("dest"),
                )
                for o in data["options"]
            ),
            segment_values=tuple(data.get("segment_values") or ()),
        )


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


# --- the command line -> segments -> problems (pure) -------------------------------------------


def _is_option(token: str) -> bool:
    return token.startswith("-") and token != "-" and not _NEGATIVE_NUMBER.match(token)


def split_segments(argv: Sequence[str]) -> list[Segment]:
    """Cut ``argv`` into option-plus-values segments, in order, covering every token."""
    groups: list[list[str]] = []
    for token in argv:
        if _is_option(token) or not groups:
            groups.append([token])
        else:
            groups[-1].append(token)
    return [Segment(tuple(group)) for group in groups]


_ARGUMENT = re.compile(r"^argument (?P<names>[^:]+): (?P<detail>.*)$", re.DOTALL)
_INVALID_TYPE = re.compile(r"^invalid (?P<type>.+?) value: ")
_EXPECTED = re.compile(r"^expected (one|at least one|at most one|\d+) arguments?$")
_AMBIGUOUS = re.compile(
    r"^ambiguous option: (?P<option>\S+) could match (?P<matches>.*)$", re.DOTALL
)
_UNRECOGNIZED = "unrecognized arguments: "
_REQUIRED = "the following arguments are required: "


def problems_from_answer(
    answer: ProbeAnswer, segments: Sequence[Segment]
) -> tuple[FlagProblem, ...]:
    """Every problem: one per failing segment, whole-line ones (a missing required option) about
    flags not already reported, then what sglang accepts but must not be launched: abbreviations,
    two spellings of one setting, and values out of range."""
    problems = [
        problem_from_message(error, answer.options, segment)
        for segment, error in zip(segments, answer.segment_errors, strict=True)
        if error is not None
    ]
    if answer.rest_error is not None:
        reported = {problem.flag for problem in problems}
        problems += [p for p in line_problems(answer.rest_error) if p.flag not in reported]
    parsed = [s for s, error in zip(segments, answer.segment_errors, strict=True) if error is None]
    problems += spelling_problems(parsed, answer.options)
    problems += range_problems(segments, answer.segment_values, answer.options)
    return tuple(problems)


def resolve_option(flag: str, options: Sequence[Option]) -> tuple[Option | None, bool]:
    """The option ``flag`` (as written, without ``=value``) names, and whether it is spelt out.

    argparse also accepts any unique prefix of a long option: ``--mem-fraction`` is
    ``--mem-fraction-static`` there. (None, False) when nothing or several options match.
    """
    for option in options:
        if flag in option.option_strings:
            return option, True
    if not flag.startswith("--"):
        return None, False
    matches = [o for o in options if any(name.startswith(flag) for name in o.option_strings)]
    return (matches[0], False) if len(matches) == 1 else (None, False)


def spelling_problems(segments: Sequence[Segment], options: Sequence[Option]) -> list[FlagProblem]:
    """Flags sglang accepts that still must not be launched.

    An abbreviation is refused: it hides the setting from everything that reads the flags by
    name (the memory planner reads ``mem-fraction-static``, not ``mem-fraction``), and a new flag
    with the same prefix would make it ambiguous. Two flags that land in the same ``dest`` (a
    second spelling, an abbreviation next to the full name) are a conflict: argparse keeps the
    last one silently, whatever the planner judged.
    """
    problems: list[FlagProblem] = []
    first_by_dest: dict[str, Segment] = {}
    for segment in segments:
        option, spelt_out = resolve_option(segment.flag, options)
        if option is None:
            continue
        # The full name the flag abbreviates (--tp -> --tp-size, not --tensor-parallel-size).
        long_names = [n for n in option.option_strings if n.startswith("--")]
        canonical = next((n for n in long_names if n.startswith(segment.flag)), long_names[0])
        if not spelt_out:
            problems.append(
                FlagProblem(
                    segment.flag, segment.value, f"an abbreviation of {canonical}", None,
                    "abbreviation", canonical,
                )
            )
        dest = option.dest or canonical
        if dest in first_by_dest:
            first = first_by_dest[dest]
            problems.append(
                FlagProblem(
                    segment.flag, segment.value,
                    f"sets the same option as {first.flag} ({canonical}); sglang would keep only "
                    "the last of the two",
                    None, "conflict",
                )
            )
        else:
            first_by_dest[dest] = segment
    return problems


@dataclass(frozen=True)
class Range:
    """The values a numeric sglang option may take for a server that can start."""

    low: float
    high: float | None = None
    low_open: bool = False  # low itself is excluded
    high_open: bool = False
    also: tuple[float, ...] = ()  # special values outside the range (-1: "off")
    meaning: str = ""

    def holds(self, value: float) -> bool:
        if value in self.also:
            return True
        if value < self.low or (self.low_open and value == self.low):
            return False
        if self.high is not None and (value > self.high or (self.high_open and value == self.high)):
            return False
        return True


_COUNT = Range(1, meaning="an integer >= 1")
_PORT = Range(1, 65535, meaning="a TCP port, 1-65535")
# Numeric options checked before any host, with no GPU facts needed: every one the memory planner
# reads, the parallel sizes and the ports. Keyed by option name: sglang's ``dest`` for one option
# differs between releases (tensor_parallel_size in 0.5.10, tp_size in 0.5.23).
RANGES: dict[str, Range] = {
    "tp-size": _COUNT,
    "pp-size": _COUNT,
    "dp-size": _COUNT,
    "ep-size": _COUNT,
    "nnodes": _COUNT,
    "mem-fraction-static": Range(0, 1, True, True, meaning="a fraction between 0 and 1 (or auto)"),
    "port": _PORT,
    "nccl-port": _PORT,
    "chunked-prefill-size": Range(1, also=(-1,), meaning="a token count >= 1, or -1 (no chunking)"),
    "max-prefill-tokens": _COUNT,
    "cuda-graph-max-bs": _COUNT,
    "cuda-graph-bs": _COUNT,
    "max-running-requests": _COUNT,
    "max-total-tokens": _COUNT,
    "page-size": _COUNT,
    "context-length": _COUNT,
}


def _range_of(option: Option) -> Range | None:
    return next((RANGES[n[2:]] for n in option.option_strings if n[2:] in RANGES), None)


def range_problems(
    segments: Sequence[Segment],
    values: Sequence[Mapping[str, Any] | None],
    options: Sequence[Option],
) -> list[FlagProblem]:
    """Values sglang's parser accepts (right type) that no server can start with: a TP size of
    0, a fraction of 1.5, port 70000. Checked on the values as sglang typed them (``128k``)."""
    problems: list[FlagProblem] = []
    for segment, parsed in zip(segments, values):
        option, _ = resolve_option(segment.flag, options)
        rule = None if option is None else _range_of(option)
        if option is None or rule is None or not parsed or option.dest not in parsed:
            continue
        value = parsed[option.dest]
        items = value if isinstance(value, list) else [value]
        numbers = [v for v in items if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if any(not (v == v and rule.holds(v)) for v in numbers):  # v != v: NaN
            problems.append(
                FlagProblem(
                    segment.flag, segment.value, f"out of range: want {rule.meaning}", None,
                    "out_of_range",
                )
            )
    return problems


def problem_from_message(message: str, options: Sequence[Option], segment: Segment) -> FlagProblem:
    """Map argparse's error for one segment (its only error) to a structured problem."""
    flag, value = segment.flag, segment.value
    if message.startswith(_UNRECOGNIZED):
        return _unrecognized(message.removeprefix(_UNRECOGNIZED), options, segment)
    if ambiguous := _AMBIGUOUS.match(message):
        return FlagProblem(
            flag,
            value,
            f"ambiguous abbreviation, could match {ambiguous['matches']}",
            None,
            "ambiguous_flag",
        )
    argument = _ARGUMENT.match(message)
    if argument is None:
        return FlagProblem(flag, value, message, None)
    detail = argument["detail"]
    if detail.startswith("invalid choice: "):
        choices = _choices(argument["names"].split("/"), options)
        close = difflib.get_close_matches(value or "", choices or [], n=1)
        return FlagProblem(
            flag, value, "invalid choice", choices, "invalid_choice", close[0] if close else None
        )
    if invalid := _INVALID_TYPE.match(detail):
        return FlagProblem(flag, value, f"invalid {invalid['type']} value", None, "invalid_value")
    if _EXPECTED.match(detail):
        return FlagProblem(flag, value, detail, None, "missing_value")
    if detail.startswith("ignored explicit argument"):
        return FlagProblem(flag, value, "a bare switch takes no value", None, "unexpected_value")
    if detail.startswith("not allowed with argument"):
        return FlagProblem(flag, value, detail, None)
    return FlagProblem(flag, value, detail, None, "invalid_value")  # a type function's own message


def _unrecognized(extras: str, options: Sequence[Option], segment: Segment) -> FlagProblem:
    """An unknown option (with a close known one, if any), or extra values after a known one."""
    if not segment.flag:
        return FlagProblem("", segment.value, "values that follow no flag", None)
    if segment.tokens[0] not in extras.split(" "):
        return FlagProblem(
            segment.flag, segment.value, f"too many values (extra: {extras})", None, "invalid_value"
        )
    known = [name for option in options for name in option.option_strings if name.startswith("--")]
    close = difflib.get_close_matches(segment.flag, known, n=1, cutoff=_SUGGESTION_CUTOFF)
    return FlagProblem(
        segment.flag,
        segment.value,
        "unrecognized flag",
        None,
        "unknown_flag",
        close[0] if close else None,
    )


def line_problems(message: str) -> list[FlagProblem]:
    """Map an error about the command line as a whole (no segment to blame)."""
    if message.startswith(_REQUIRED):
        names = message.removeprefix(_REQUIRED).split(", ")
        return [
            FlagProblem(name.split("/")[0], None, "is required", None, "missing_required")
            for name in names
        ]
    if argument := _ARGUMENT.match(message):
        return [FlagProblem(argument["names"].split("/")[0], None, argument["detail"], None)]
    return [FlagProblem("", None, message, None)]


def _choices(names: Sequence[str], options: Sequence[Option]) -> list[str] | None:
    for option in options:
        if set(names) & set(option.option_strings):
            return None if option.choices is None else list(option.choices)
    return None


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
    final.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(final.with_name(final.name + ".lock")):
        if not spec.matches(_read_marker(final)) or not _venv_python(final).exists():
            _build(spec, final, lane.validator.stand_ins)
    return final


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
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
        answer = _run_probe(_venv_python(staging), [], [], stand_ins)
        if answer.sglang_version != spec.sglang:
            raise ValidatorError(
                f"the validator venv has sglang {answer.sglang_version}, expected {spec.sglang}"
            )
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


# --- validation ------------------------------------------------------------------------------------


def _run_probe(
    python: Path, argv: Sequence[str], segments: Sequence[Segment], stand_ins: Sequence[str]
) -> ProbeAnswer:
    """One subprocess: ``-I`` keeps the caller's PYTHONPATH and this package's directory out."""
    request = {
        "argv": list(argv),
        "segments": [list(s.tokens) for s in segments],
        "stand_ins": list(stand_ins),
    }
    try:
        done = subprocess.run(
            [str(python), "-I", str(_PROBE)],
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
        return ProbeAnswer.from_json(json.loads(done.stdout))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValidatorError(
            f"the flag probe answered something unexpected ({exc}):\n{_tail(done.stdout)}"
        ) from exc


def validate_flags(
    argv: Sequence[str], lane: Lane, host: str | None = None, *, cache_dir: Path | None = None
) -> ValidationResult:
    """Run ``argv`` (the server's command line, without the program) through ``lane``'s sglang parser.

    ``host`` only names the host in messages. Raises ValidatorError when the venv cannot be built
    or the probe fails; flag problems are returned, never raised.
    """
    env = ensure_validator_env(lane, cache_dir)
    segments = split_segments(argv)
    answer = _run_probe(_venv_python(env), argv, segments, lane.validator.stand_ins)
    return ValidationResult(
        answer.sglang_version, lane.name, problems_from_answer(answer, segments), host
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sglang_deploy.validator [--lane L] [--host H] -- <sglang flags>``: 0 accepted,
    1 rejected, 2 could not validate."""
    args = list(sys.argv[1:] if argv is None else argv)
    own, flags = (
        (args[: args.index("--")], args[args.index("--") + 1 :]) if "--" in args else (args, [])
    )
    parser = argparse.ArgumentParser(
        prog="python -m sglang_deploy.validator",
        description="Check sglang server flags with the lane's own sglang parser; flags follow '--'.",
    )
    parser.add_argument(
        "--lane",
        default=DEFAULT_LANE,
        choices=lane_names(),
        help="stack lane (default: %(default)s)",
    )
    parser.add_argument("--host", help="host name to put in messages")
    options = parser.parse_args(own)
    try:
        result = validate_flags(flags, load_lane(options.lane), options.host)
    except (LaneError, ValidatorError) as exc:
        print(f"sglang-deploy: cannot validate: {exc}", file=sys.stderr)
        return 2
    print(result.format())
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
