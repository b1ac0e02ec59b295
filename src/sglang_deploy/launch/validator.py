"""Validate an sglang server command line against the pinned sglang version's own argparse.

Why: a renamed flag or a misspelt choice must fail on the control node in seconds, naming the
flag and the valid values, before any host is changed -- not minutes later in a crash-looping
systemd unit. The only faithful judge is sglang's parser itself (``ServerArgs.add_cli_args`` on
a plain ``argparse.ArgumentParser``, as ``sglang serve`` builds it), run by ``_validator_probe.py``
in the lane's validator venv (:mod:`sglang_deploy.launch.validator_venv`) once per validation. This
module turns its answer into FlagProblems: argparse's verdicts, and what sglang accepts but must
not be launched (abbreviations, two spellings of one setting, values out of range).
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sglang_deploy.launch import flagtable
from sglang_deploy.lanes.catalog import DEFAULT_LANE, Lane, LaneError, lane_names, load_lane
from sglang_deploy.launch.validator_venv import ValidatorError, ensure_validator_env, run_probe

FLAGS_VARIABLE = "sglang_server_flags"
"""The inventory variable holding the server flags (flag name without ``--`` -> value)."""

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
    "abbreviation",
    "conflict",
    "out_of_range",
    "other",
]


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
    def from_json(cls, data: Any, segments: int | None = None) -> ProbeAnswer:
        """The answer, every field of the shape the probe writes (and, given ``segments``, one error and one
        value per segment); ValueError naming the first field that is not."""

        def want(ok: bool, what: str) -> None:
            if not ok:
                raise ValueError(f"the probe's answer: {what}")

        def text_or_none(value: Any) -> bool:
            return value is None or isinstance(value, str)

        want(isinstance(data, Mapping), "not a JSON object")
        version, errors, rest, options = (data.get(k) for k in ("sglang_version", "segment_errors", "rest_error", "options"))
        values = data.get("segment_values") or []
        want(isinstance(version, str) and bool(version), "sglang_version is not a version")
        want(isinstance(errors, list) and all(text_or_none(e) for e in errors), "segment_errors is not a list of texts")
        want(text_or_none(rest), "rest_error is not a text")
        want(isinstance(values, list) and all(v is None or isinstance(v, Mapping) for v in values), "segment_values")
        want(segments is None or len(errors) == segments and len(values) in (0, segments), "not one entry per segment")
        want(isinstance(options, list) and all(isinstance(o, Mapping) for o in options), "options is not a list of objects")
        parsed = []
        for option in options:
            strings, choices = option.get("option_strings"), option.get("choices")
            want(isinstance(strings, list) and all(isinstance(t, str) for t in strings), "an option's option_strings")
            want(choices is None or isinstance(choices, list), "an option's choices")
            want(text_or_none(option.get("dest")), "an option's dest")
            parsed.append(Option(tuple(strings), None if choices is None else tuple(map(str, choices)), option.get("dest")))
        return cls(
            sglang_version=version,
            segment_errors=tuple(errors),
            rest_error=rest,
            options=tuple(parsed),
            segment_values=tuple(values),
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


def _ranges() -> dict[str, Range]:
    """Numeric options checked before any host, with no GPU facts needed: the flag table's rows with bounds (every one
    the memory planner reads, the parallel sizes and the ports), under every spelling of every lane. Keyed by option
    name: sglang's ``dest`` for one option differs between releases (tensor_parallel_size in 0.5.10, tp_size in 0.5.23)."""
    ranges: dict[str, Range] = {}
    for spec in flagtable.table().specs:
        if spec.type == "fraction":
            rule = Range(0, 1, True, True, meaning=spec.bounds())
        elif spec.type in ("int", "ints") and spec.minimum is not None:
            rule = Range(spec.minimum, spec.maximum, also=spec.also, meaning=spec.bounds())
        else:
            continue
        ranges.update({name: rule for name in spec.spellings()})
    return ranges


RANGES: dict[str, Range] = _ranges()


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


# --- validation ------------------------------------------------------------------------------------


def validate_flags(
    argv: Sequence[str], lane: Lane, host: str | None = None, *, cache_dir: Path | None = None
) -> ValidationResult:
    """Run ``argv`` (the server's command line, without the program) through ``lane``'s sglang parser.

    ``host`` only names the host in messages. Raises ValidatorError when the venv cannot be built
    or the probe fails; flag problems are returned, never raised.
    """
    env = ensure_validator_env(lane, cache_dir)
    segments = split_segments(argv)

    def read(data: Any) -> tuple[str, tuple[FlagProblem, ...]]:
        # The whole reading, problems included: a kept answer that does not fit these segments is asked again.
        answer = ProbeAnswer.from_json(data, segments=len(segments))
        return answer.sglang_version, problems_from_answer(answer, segments)

    version, problems = run_probe(env, argv, [s.tokens for s in segments], lane.validator.stand_ins, read)
    return ValidationResult(version, lane.name, problems, host)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sglang_deploy.launch.validator [--lane L] [--host H] -- <sglang flags>``: 0 accepted,
    1 rejected, 2 could not validate."""
    args = list(sys.argv[1:] if argv is None else argv)
    own, flags = (
        (args[: args.index("--")], args[args.index("--") + 1 :]) if "--" in args else (args, [])
    )
    parser = argparse.ArgumentParser(
        prog="python -m sglang_deploy.launch.validator",
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
