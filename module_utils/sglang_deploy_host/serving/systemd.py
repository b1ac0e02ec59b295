"""Quoting for systemd unit files and environment files.

systemd does its own word splitting, specifier expansion (``%``) and, in ``ExecStart=``, environment
variable expansion (``$``/``${}``). A flag value passes through unchanged only when all three are
escaped; these helpers are the single place that knows how. (Nothing here relies on systemd's
``${}`` expansion: it would put the expanded value, a secret too, in the process's argv.)
"""

from __future__ import annotations

import re
from typing import Optional, Sequence

# Characters that need no quoting in an ExecStart= word. Deliberately small: anything else is quoted.
# Matched whole (fullmatch): "$" would accept a trailing newline.
_SAFE_WORD = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
# Environment variable names as systemd accepts them.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _escape_c(text: str) -> str:
    """C-style escapes systemd understands inside double quotes."""
    return (
        text.replace("\\", "\\\\")
        .replace('"', '\\"')
        .replace("\n", "\\n")
        .replace("\t", "\\t")
    )


def exec_word(word: str) -> str:
    """Quote one argv word for ExecStart=: literal after systemd's splitting and expansions."""
    if word == ";":
        # A lone ';' separates command lines in ExecStart=; escaped it is a literal argument.
        return "\\;"
    escaped = word.replace("%", "%%").replace("$", "$$")
    if _SAFE_WORD.fullmatch(word):
        return escaped
    return '"' + _escape_c(escaped) + '"'


def exec_start(head: Sequence[str], groups: Sequence[Sequence[str]]) -> str:
    """An ``ExecStart=`` value: the command's head on the first line, then one group of words (a flag
    and its values) per continuation line, each word quoted, so the unit reads like a hand-written one."""
    lines = [" ".join(exec_word(w) for w in head)] + ["    " + " ".join(exec_word(w) for w in g) for g in groups]
    return " \\\n".join(lines)


def environment_assignment(name: str, value: str) -> str:
    """The value of one ``Environment=`` line: ``"NAME=value"`` with specifiers escaped."""
    if not ENV_NAME.fullmatch(name):
        raise ValueError(f"not an environment variable name: {name!r}")
    # Environment= expands specifiers but not variables, so only % needs doubling.
    return '"' + _escape_c(f"{name}={value}".replace("%", "%%")) + '"'


def env_file_line(name: str, value: str) -> str:
    """One line of an EnvironmentFile=: single quotes keep everything literal except the quote."""
    if not ENV_NAME.fullmatch(name):
        raise ValueError(f"not an environment variable name: {name!r}")
    if "\n" in value:
        raise ValueError(f"environment value of {name} contains a newline")
    if "'" not in value:
        return f"{name}='{value}'"
    # Double quotes: systemd's env-file parser honours \" \\ \$ \` like a shell.
    escaped = re.sub(r'(["\\$`])', r"\\\1", value)
    return f'{name}="{escaped}"'


# -- reading back what the functions above write ---------------------------------------------------
_C_UNESCAPES = {"n": "\n", "t": "\t"}
_UNIT_LINE = re.compile(r"^([A-Za-z]+)=(.*)$")


def split_words(payload: str) -> list[str]:
    """systemd's word splitting of an ``ExecStart=``/``Environment=`` value: bare words, and
    "double" or 'single' quoted ones in which a backslash escapes (C escapes: \\n \\t)."""
    words: list[str] = []
    current: list[str] = []
    quote = ""
    started = False  # "" is a word too
    index = 0
    while index < len(payload):
        char = payload[index]
        if quote:
            if char == "\\" and index + 1 < len(payload):
                current.append(_C_UNESCAPES.get(payload[index + 1], payload[index + 1]))
                index += 2
                continue
            if char == quote:
                quote = ""
            else:
                current.append(char)
        elif char in "\"'":
            quote, started = char, True
        elif char == "\\" and index + 1 < len(payload):
            current.append(payload[index + 1])
            started = True
            index += 2
            continue
        elif char.isspace():
            if current or started:
                words.append("".join(current))
                current, started = [], False
        else:
            current.append(char)
            started = True
        index += 1
    if current or started:
        words.append("".join(current))
    return words


def _unit_values(unit_text: str, key: str) -> list[str]:
    """The values of every ``key=`` line, continuation lines (a trailing backslash) joined."""
    values: list[str] = []
    lines = unit_text.splitlines()
    index = 0
    while index < len(lines):
        match = _UNIT_LINE.match(lines[index])
        if match and match.group(1) == key:
            value = match.group(2)
            while value.endswith("\\") and index + 1 < len(lines):
                index += 1
                value = value[:-1] + " " + lines[index]
            values.append(value)
        index += 1
    return values


def _exec_argv(value: str) -> list[str]:
    return [w.replace("%%", "%").replace("$$", "$") for w in split_words(value)]


def exec_start_argv(unit_text: str) -> list[str]:
    """The argv systemd runs for a unit file's ``ExecStart=`` (what exec_word wrote, read back)."""
    values = _unit_values(unit_text, "ExecStart")
    if not values:
        raise ValueError("no ExecStart= line in the unit")
    return _exec_argv(values[0])


# ExecStartPre= prefixes (systemd.service(5)): "-" means a failure is ignored; the others change
# privileges or expansion, which nothing the role renders uses.
_EXEC_PREFIXES = "-@:+!"


def exec_start_pre(unit_text: str) -> list[tuple[list[str], bool]]:
    """Every ``ExecStartPre=`` command in order, as ``(argv, failure_ignored)``."""
    commands: list[tuple[list[str], bool]] = []
    for value in _unit_values(unit_text, "ExecStartPre"):
        prefix = value[: len(value) - len(value.lstrip(_EXEC_PREFIXES))]
        if set(prefix) - {"-"}:
            raise ValueError(f"ExecStartPre={value!r}: prefix {prefix!r} is not supported here (only '-')")
        commands.append((_exec_argv(value[len(prefix):]), "-" in prefix))
    return commands


def directive(unit_text: str, key: str) -> str | None:
    """The last value of a plain one-word directive (``WorkingDirectory=``, ``EnvironmentFile=``,
    ``User=``, ``TimeoutStopSec=``...) as the unit file writes it; None when it is absent."""
    values = _unit_values(unit_text, key)
    return values[-1].strip() if values else None


def environment(text: str) -> dict[str, str]:
    """``NAME -> value`` of a unit file's ``Environment=`` lines, or of what ``systemctl show -p
    Environment --value`` prints (the same words without the key; no specifiers left in them)."""
    unit_values = _unit_values(text, "Environment")
    words = (
        [w.replace("%%", "%") for value in unit_values for w in split_words(value)]
        if unit_values
        else [w for line in text.splitlines() for w in split_words(line)]
    )
    found: dict[str, str] = {}
    for word in words:
        name, sep, value = word.partition("=")
        if sep and ENV_NAME.fullmatch(name):
            found[name] = value
    return found


def env_file_values(env_text: str) -> dict[str, str]:
    """``NAME -> value`` of an ``EnvironmentFile=`` as env_file_line writes it: 'literal', or
    "..." in which a backslash escapes " \\ $ ` and stays before anything else."""
    values: dict[str, str] = {}
    for line in env_text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, sep, raw = line.partition("=")
        if not sep:
            continue
        raw = raw.strip()
        if len(raw) >= 2 and raw[0] == raw[-1] == "'":
            raw = raw[1:-1]
        elif len(raw) >= 2 and raw[0] == raw[-1] == '"':
            raw = re.sub(r'\\(["\\$`])', r"\1", raw[1:-1])
        values[name.strip()] = raw
    return values


# -- values of the unit file that are not flags -----------------------------------------------------
# Every other value the sglang_server role puts into its unit (user, paths, limits, hardening) passes
# through unit_settings(): a newline or CR would add a directive of its own, a "../" in the unit
# name would write elsewhere. Names are checked against what systemd, useradd and paths allow.

UNIT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9:_.@-]{0,200}$")
_ACCOUNT = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")  # useradd's NAME_REGEX on Debian, 32 chars
_PATH = re.compile(r"^/[A-Za-z0-9._@+/-]*$")
_DIRECTIVE = re.compile(r"^[A-Z][A-Za-z0-9]+$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class UnitValueError(ValueError):
    """A unit value that could inject directives or escape its directory; names the variable."""


def _fail(variable: str, value: object, want: str) -> UnitValueError:
    return UnitValueError(f"{variable} = {value!r} is not {want}. Fix: correct it in the inventory")


def unit_name(variable: str, value: object) -> str:
    if not isinstance(value, str) or not UNIT_NAME.match(value) or ".." in value:
        raise _fail(variable, value, "a unit name (letters, digits, ':_.@-'; no '/' or '..')")
    return value


def account(variable: str, value: object) -> str:
    if not isinstance(value, str) or not _ACCOUNT.match(value):
        raise _fail(variable, value, "a user or group name (lower case, digits, '_-', at most 32)")
    return value


def absolute_path(variable: str, value: object) -> str:
    """An absolute, normalized path of plain characters (no spaces, quotes, '..' or '//')."""
    if (
        not isinstance(value, str)
        or not _PATH.match(value)
        or value != "/" and value.endswith("/")
        or "//" in value
        or any(part in (".", "..") for part in value.split("/"))
    ):
        raise _fail(variable, value, "an absolute normalized path of plain characters")
    return value


def path_component(variable: str, value: object) -> str:
    """One directory name (a host name under ``render --out``): cannot climb out or nest."""
    if not isinstance(value, str) or not UNIT_NAME.match(value) or value in (".", ".."):
        raise _fail(variable, value, "usable as one directory name (letters, digits, ':_.@-')")
    return value


def count(variable: str, value: object, minimum: int = 0, maximum: Optional[int] = None) -> int:
    """``value`` if it is an integer from ``minimum`` to ``maximum`` (a float that came out of YAML, 1e30 or
    NaN, is not one)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (maximum is not None and value > maximum):
        want = f"an integer from {minimum} to {maximum}" if maximum is not None else f"an integer >= {minimum}"
        raise _fail(variable, value, want)
    return value


def directive_value(variable: str, value: object) -> str:
    """A [Service] value on one line: yes/no for booleans, no control characters."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if not isinstance(value, str) or _CONTROL.search(value) or value != value.strip():
        raise _fail(variable, value, "a one-line value without control characters")
    return value


# The unit's numbers a role may set (the role's variable without its prefix -> the smallest value).
_UNIT_COUNTS = {
    "start_timeout_sec": 1, "stop_timeout_sec": 1, "restart_sec": 0, "start_limit_burst": 1,
    "start_limit_interval_sec": 0, "limit_nofile": 1, "gpu_idle_max_used_mib": 0,
}  # fmt: skip


def unit_settings(values: dict[str, object], prefix: str = "sglang_server_") -> dict[str, object]:
    """The checked values the unit template may use, each named by its variable in errors.

    ``values`` keys are the role's variable names without ``prefix`` (the server's and the router's
    roles both use this); the result adds the unit's and the environment file's paths, built from
    checked parts. A number of ``_UNIT_COUNTS`` is checked when the role has it.
    """

    def var(key: str) -> str:
        return prefix + key

    def get(key: str) -> object:
        if key not in values:
            raise UnitValueError(f"{var(key)} is missing")
        return values[key]

    unknown = sorted(set(values) - set(_UNIT_COUNTS) - {
        "name", "user", "group", "home", "config_dir", "unit_dir", "libexec_dir", "read_write_paths", "hardening"})  # fmt: skip
    if unknown:
        raise UnitValueError(f"unknown unit values: {', '.join(var(k) for k in unknown)}")
    name = unit_name(var("name"), get("name"))
    settings: dict[str, object] = {
        "name": name,
        "user": account(var("user"), get("user")),
        "group": account(var("group"), get("group")),
        "home": absolute_path(var("home"), get("home")),
        "config_dir": absolute_path(var("config_dir"), get("config_dir")),
        "unit_dir": absolute_path(var("unit_dir"), get("unit_dir")),
        "libexec_dir": absolute_path(var("libexec_dir"), get("libexec_dir")),
    }
    for key, minimum in _UNIT_COUNTS.items():
        if key in values:
            settings[key] = count(var(key), values[key], minimum)
    paths = get("read_write_paths")
    if not isinstance(paths, list) or not paths:
        raise _fail(var("read_write_paths"), paths, "a non-empty list of paths")
    settings["read_write_paths"] = [absolute_path(var("read_write_paths"), p) for p in paths]
    hardening = get("hardening")
    if not isinstance(hardening, dict):
        raise _fail(var("hardening"), hardening, "a mapping of [Service] directive -> value")
    checked: dict[str, str] = {}
    for directive, value in hardening.items():
        if not isinstance(directive, str) or not _DIRECTIVE.match(directive):
            raise _fail(var("hardening"), directive, "a directive name (e.g. ProtectSystem)")
        checked[directive] = directive_value(f"{var('hardening')}['{directive}']", value)
    settings["hardening"] = checked
    settings["home_assignment"] = environment_assignment("HOME", str(settings["home"]))
    settings["unit_path"] = f"{settings['unit_dir']}/{name}.service"
    settings["env_file"] = f"{settings['config_dir']}/{name}.env"
    return settings
