"""Probe run *inside* the validator venv: parse a command line with the pinned sglang's own argparse.

This file is executed by path with the validator venv's interpreter, which has sglang but not
sglang-deploy installed, so it imports nothing from this package and only the standard library
besides sglang. It reads one JSON request on stdin and writes one JSON answer on stdout:

    request: {"argv": [...], "segments": [[flag, value...], ...], "stand_ins": [package, ...]}
    answer:  {"sglang_version": str,
              "segment_errors": [str | null, ...],  # one per segment; all null when argv parses
              "rest_error": str | null,              # argv less the failing segments
              "segment_values": [{dest: value} | null, ...],  # what each segment sets, typed
              "options": [{"option_strings": [...], "dest": str, "choices": [...] | null}, ...]}

Why segments: argparse stops at the first error; re-parsing each flag with its values on its own
reports every problem of a command line in one subprocess call.
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import importlib.metadata
import importlib.util
import json
import sys
from collections.abc import Sequence
from typing import Any, NoReturn


class _ParseError(Exception):
    """argparse's error message, raised instead of printing usage and exiting."""


class _CapturingParser(argparse.ArgumentParser):
    """sglang's parser (default settings, so prefix matching like ``--tp`` still works) that raises."""

    def error(self, message: str) -> NoReturn:
        raise _ParseError(message)


class _StandIn:
    """Stand-in for a package sglang imports at module level but uses only while serving
    (0.5.10's ``from torchvision.io import decode_jpeg``): PyPI has only CUDA builds of it, which do
    not load next to a CPU torch, and the parser never calls it. Attributes are stand-ins too;
    calling one fails loudly."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> _StandIn:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _StandIn(f"{self._name}.{attr}")

    def __call__(self, *_args: Any, **_kwargs: Any) -> NoReturn:
        raise RuntimeError(f"{self._name} is a stand-in in the sglang flag validator")


def _install_stand_ins(packages: Sequence[str]) -> None:
    """Answer sglang's own imports of the missing ``packages`` with stand-ins.

    Only imports made by ``sglang.*`` modules are answered and nothing enters ``sys.modules``, so
    libraries that probe for the package (transformers' ``find_spec("torchvision")``) still find it
    absent and take their no-torchvision paths. Installed packages are left alone.
    """
    missing = frozenset(p for p in packages if importlib.util.find_spec(p) is None)
    real_import = builtins.__import__

    def import_(
        name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
    ) -> Any:
        importer = str((globals or {}).get("__name__", ""))
        if level == 0 and name.split(".")[0] in missing and importer.partition(".")[0] == "sglang":
            return _StandIn(name if fromlist else name.split(".")[0])
        return real_import(name, globals, locals, fromlist, level)

    builtins.__import__ = import_


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """The error sglang's parser reports for ``argv``, or None when it accepts it."""
    try:
        parser.parse_args(argv)
    except _ParseError as exc:
        return str(exc)
    except SystemExit as exc:  # an action such as --help exits the parser
        return f"the parser exits (status {exc.code}) instead of serving"
    except Exception as exc:  # noqa: BLE001 -- sglang's own actions raise, e.g. ValueError for a removed flag
        return f"{type(exc).__name__}: {exc}"
    return None


def _sglang_parser(*, relaxed: bool) -> argparse.ArgumentParser:
    """sglang's parser; ``relaxed`` drops required-ness so that one flag parses on its own."""
    from sglang.srt.server_args import ServerArgs  # type: ignore[import-not-found]

    parser = _CapturingParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    if relaxed:
        for action in parser._actions:
            action.required = False
        for group in parser._mutually_exclusive_groups:
            group.required = False
    return parser


def _options(parser: argparse.ArgumentParser) -> list[dict[str, Any]]:
    """Every option's strings, destination and choices, so the caller can list valid values,
    suggest names and find two spellings of one option (same ``dest``)."""
    return [
        {
            "option_strings": list(action.option_strings),
            "dest": action.dest,
            "choices": None if action.choices is None else [str(c) for c in action.choices],
        }
        for action in parser._actions
        if action.option_strings
    ]


class _Unset:
    """Default of every option while a segment is parsed alone: what it still holds was not set."""


def _plain(value: Any) -> Any:
    """A parsed value as JSON can carry it (numbers stay numbers for the range checks)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return str(value)


def _segment_values(parser: argparse.ArgumentParser, segment: list[str]) -> dict[str, Any] | None:
    """``dest -> value`` that one segment sets, as sglang's parser typed it (``128k`` -> 128000);
    None when the segment does not parse on its own."""
    try:
        parsed = vars(parser.parse_args(segment))
    except (SystemExit, Exception):  # noqa: BLE001 -- _parse reports why
        return None
    return {dest: _plain(value) for dest, value in parsed.items() if not isinstance(value, _Unset)}


def _unset_defaults(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    for action in parser._actions:
        if action.option_strings and action.default is not argparse.SUPPRESS:
            action.default = _Unset()
    return parser


def probe(request: dict[str, Any]) -> dict[str, Any]:
    """Parse the whole command line; only if that fails, parse each segment on its own (which
    finds every bad flag) and then the command line without the bad segments (which finds what
    concerns the whole line, e.g. a missing required option)."""
    _install_stand_ins(request["stand_ins"])
    parser = _sglang_parser(relaxed=False)
    segments: list[list[str]] = request["segments"]
    segment_errors: list[str | None] = [None] * len(segments)
    rest_error = None
    alone = _unset_defaults(_sglang_parser(relaxed=True))
    segment_values = [_segment_values(alone, segment) for segment in segments]
    if _parse(parser, request["argv"]) is not None:
        relaxed = _sglang_parser(relaxed=True)
        segment_errors = [_parse(relaxed, segment) for segment in segments]
        rest = [
            token
            for segment, error in zip(segments, segment_errors)
            if error is None
            for token in segment
        ]
        rest_error = _parse(parser, rest)
    return {
        "sglang_version": importlib.metadata.version("sglang"),
        "segment_errors": segment_errors,
        "rest_error": rest_error,
        "segment_values": segment_values,
        "options": _options(parser),
    }


def main() -> None:
    """Keep stdout for the JSON answer: sglang may print while it is imported."""
    request = json.load(sys.stdin)
    with contextlib.redirect_stdout(sys.stderr):
        answer = probe(request)
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
