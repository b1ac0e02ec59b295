"""Validate an sglang server command line against the pinned sglang version's own argparse.

Why: a renamed flag or a misspelt choice must fail on the control node in seconds, naming the
flag and the valid values, before any host is changed -- not minutes later in a crash-looping
systemd unit. The only faithful judge is sglang's parser itself (``ServerArgs.add_cli_args`` on
a plain ``argparse.ArgumentParser``, as ``sglang serve`` builds it), so this module keeps a small
CPU-only venv per sglang version (sglang ``--no-deps``, a CPU torch, triton and the few packages
``sglang.srt.server_args`` imports) and runs ``_validator_probe.py`` in it, once per validation.

Environment (POSIX control nodes only: the build lock uses ``fcntl``):
    SGLANG_DEPLOY_CACHE                  cache root (default ~/.cache/sglang-deploy)
    SGLANG_DEPLOY_VALIDATOR_TORCH        pip requirement for the venv's torch (default: the lane's)
    SGLANG_DEPLOY_VALIDATOR_TORCH_INDEX  index the torch step installs from (pip --index-url);
                                         empty = pip's own configuration. Default: the lane's index,
                                         or empty when SGLANG_DEPLOY_VALIDATOR_TORCH is set.
    SGLANG_DEPLOY_VALIDATOR_PYTHON       interpreter the venv is made from (default: this one)
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from sglang_deploy.lanes import DEFAULT_LANE, Lane, LaneError, lane_names, load_lane

ENV_CACHE = "SGLANG_DEPLOY_CACHE"
ENV_TORCH = "SGLANG_DEPLOY_VALIDATOR_TORCH"
ENV_TORCH_INDEX = "SGLANG_DEPLOY_VALIDATOR_TORCH_INDEX"
ENV_PYTHON = "SGLANG_DEPLOY_VALIDATOR_PYTHON"

FLAGS_VARIABLE = "sglang_server_flags"
"""The inventory variable holding the server flags (flag name without ``--`` -> value)."""

_PROBE = Path(__file__).with_name("_validator_probe.py")
_MARKER = "sglang-deploy-validator.json"
_MARKER_FORMAT = 1
_PROBE_TIMEOUT_S = 300
_OUTPUT_TAIL_LINES = 40
_SUGGESTION_CUTOFF = 0.7
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")  # argparse treats these as values

ProblemKind = Literal[
    "unknown_flag",
    "invalid_choice",
    "invalid_value",
    "missing_value",
    "unexpected_value",
    "ambiguous_flag",
    "missing_required",
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
        if self.suggestion is None:
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
    """One action of sglang's parser: its option strings and, if fixed, its choices."""

    option_strings: tuple[str, ...]
    choices: tuple[str, ...] | None


@dataclass(frozen=True)
class ProbeAnswer:
    """The probe's JSON answer (see ``_validator_probe.py``)."""

    sglang_version: str
    segment_errors: tuple[str | None, ...]
    rest_error: str | None
    options: tuple[Option, ...]

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
                )
                for o in data["options"]
            ),
        )


@dataclass(frozen=True)
class BuildSpec:
    """Everything the validator venv is built from; recorded in its marker file, so a changed
    lane or override rebuilds it instead of silently validating with a stale one."""

    python: str
    python_version: str
    sglang: str
    torch: str
    torch_index: str
    packages: tuple[str, ...]

    def marker(self) -> dict[str, Any]:
        """What identifies a built venv. Not the interpreter's path: a project venv's python and
        the base python it links to build the same venv, and must not rebuild it in turn."""
        fields = asdict(self)
        del fields["python"]
        return {"format": _MARKER_FORMAT, **fields, "packages": list(self.packages)}


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
    """Every problem: one per failing segment, then whole-line ones (a missing required option)
    about flags not already reported."""
    problems = [
        problem_from_message(error, answer.options, segment)
        for segment, error in zip(segments, answer.segment_errors, strict=True)
        if error is not None
    ]
    if answer.rest_error is not None:
        reported = {problem.flag for problem in problems}
        problems += [p for p in line_problems(answer.rest_error) if p.flag not in reported]
    return tuple(problems)


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


def _say(message: str) -> None:
    print(f"sglang-deploy: {message}", file=sys.stderr, flush=True)


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


def _cache_root(cache_dir: Path | None) -> Path:
    root = cache_dir or os.environ.get(ENV_CACHE) or Path.home() / ".cache" / "sglang-deploy"
    return Path(root).expanduser()


def _venv_python(env: Path) -> Path:
    return env / "bin" / "python"


def ensure_validator_env(lane: Lane, cache_dir: Path | None = None) -> Path:
    """The venv that runs ``lane``'s sglang parser, built once (about a minute) and then reused.

    Lives at ``<cache>/validators/sglang-<version>-py<major.minor>``. Built under a file lock in a
    temporary directory beside it and renamed into place only after the probe ran in it, so a
    concurrent or failed build never leaves a half-built venv at the final path.
    """
    spec = build_spec(lane, os.environ)
    final = _cache_root(cache_dir) / "validators" / f"sglang-{spec.sglang}-py{spec.python_version}"
    final.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(final.with_name(final.name + ".lock")):
        if _read_marker(final) != spec.marker() or not _venv_python(final).exists():
            _build(spec, final, lane.validator.stand_ins)
    return final


@contextlib.contextmanager
def _exclusive_lock(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say(f"waiting for another process to finish building {path.stem} ...")
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _read_marker(env: Path) -> dict[str, Any] | None:
    try:
        marker: dict[str, Any] = json.loads((env / _MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return marker


def _build(spec: BuildSpec, final: Path, stand_ins: Sequence[str]) -> None:
    """Build into a temporary sibling, check it, then swap it in (see ensure_validator_env)."""
    for leftover in final.parent.glob(f".{final.name}.*"):  # from a killed build; we hold the lock
        shutil.rmtree(leftover, ignore_errors=True)
    _say(f"building the sglang {spec.sglang} flag validator in {final} (once; about a minute)")
    started = time.monotonic()
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".building", dir=final.parent))
    try:
        for step, command in _build_steps(spec, staging):
            _run_step(step, command)
        _say("checking that sglang's parser loads")
        answer = _run_probe(_venv_python(staging), [], [], stand_ins)
        if answer.sglang_version != spec.sglang:
            raise ValidatorError(
                f"the validator venv has sglang {answer.sglang_version}, expected {spec.sglang}"
            )
        (staging / _MARKER).write_text(json.dumps(spec.marker(), indent=2), encoding="utf-8")
        _swap_in(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _say(f"validator ready in {time.monotonic() - started:.0f} s")


def _build_steps(spec: BuildSpec, venv: Path) -> list[tuple[str, list[str]]]:
    """torch first (from its own index, so nothing later pulls the CUDA build), then sglang's
    import dependencies, then sglang itself without its (GPU) dependencies."""
    pip = [
        str(_venv_python(venv)),
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--no-input",
    ]
    index = ["--index-url", spec.torch_index] if spec.torch_index else []
    where = f" from {spec.torch_index}" if spec.torch_index else ""
    return [
        (f"creating a venv with {spec.python}", [spec.python, "-m", "venv", str(venv)]),
        (f"installing {spec.torch}{where}", [*pip, *index, spec.torch]),
        (f"installing {len(spec.packages)} import dependencies", [*pip, *spec.packages]),
        (
            f"installing sglang=={spec.sglang} (--no-deps)",
            [*pip, "--no-deps", f"sglang=={spec.sglang}"],
        ),
    ]


def _run_step(step: str, command: list[str]) -> None:
    _say(f"  {step} ...")
    started = time.monotonic()
    done = subprocess.run(
        command, check=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    if done.returncode != 0:
        raise ValidatorError(
            f"building the flag validator failed while {step} (exit {done.returncode}):\n{_tail(done.stdout)}\n"
            f"A CPU torch can be pointed at with {ENV_TORCH} / {ENV_TORCH_INDEX}."
        )
    _say(f"  {step}: done in {time.monotonic() - started:.0f} s")


def _swap_in(staging: Path, final: Path) -> None:
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
