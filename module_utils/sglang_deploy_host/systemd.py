"""Quoting for systemd unit files and environment files.

systemd does its own word splitting, specifier expansion (``%``) and, in ``ExecStart=``, environment
variable expansion (``$``/``${}``). A flag value passes through unchanged only when all three are
escaped; these helpers are the single place that knows how. (Nothing here relies on systemd's
``${}`` expansion: it would put the expanded value, a secret too, in the process's argv.)
"""

from __future__ import annotations

import re

# Characters that need no quoting in an ExecStart= word. Deliberately small: anything else is quoted.
_SAFE_WORD = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")
# Environment variable names as systemd accepts them.
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


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
    if _SAFE_WORD.match(word):
        return escaped
    return '"' + _escape_c(escaped) + '"'


def environment_assignment(name: str, value: str) -> str:
    """The value of one ``Environment=`` line: ``"NAME=value"`` with specifiers escaped."""
    if not ENV_NAME.match(name):
        raise ValueError(f"not an environment variable name: {name!r}")
    # Environment= expands specifiers but not variables, so only % needs doubling.
    return '"' + _escape_c(f"{name}={value}".replace("%", "%%")) + '"'


def env_file_line(name: str, value: str) -> str:
    """One line of an EnvironmentFile=: single quotes keep everything literal except the quote."""
    if not ENV_NAME.match(name):
        raise ValueError(f"not an environment variable name: {name!r}")
    if "\n" in value:
        raise ValueError(f"environment value of {name} contains a newline")
    if "'" not in value:
        return f"{name}='{value}'"
    # Double quotes: systemd's env-file parser honours \" \\ \$ \` like a shell.
    escaped = re.sub(r'(["\\$`])', r"\\\1", value)
    return f'{name}="{escaped}"'


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


def count(variable: str, value: object, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _fail(variable, value, f"an integer >= {minimum}")
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


def unit_settings(values: dict[str, object], prefix: str = "sglang_server_") -> dict[str, object]:
    """The checked values the unit template may use, each named by its variable in errors.

    ``values`` keys are the role's variable names without ``prefix``; the result adds the unit's
    and the environment file's paths, built from checked parts.
    """

    def var(key: str) -> str:
        return prefix + key

    def get(key: str) -> object:
        if key not in values:
            raise UnitValueError(f"{var(key)} is missing")
        return values[key]

    name = unit_name(var("name"), get("name"))
    settings: dict[str, object] = {
        "name": name,
        "user": account(var("user"), get("user")),
        "group": account(var("group"), get("group")),
        "home": absolute_path(var("home"), get("home")),
        "config_dir": absolute_path(var("config_dir"), get("config_dir")),
        "unit_dir": absolute_path(var("unit_dir"), get("unit_dir")),
        "libexec_dir": absolute_path(var("libexec_dir"), get("libexec_dir")),
        "start_timeout_sec": count(var("start_timeout_sec"), get("start_timeout_sec"), 1),
        "stop_timeout_sec": count(var("stop_timeout_sec"), get("stop_timeout_sec"), 1),
        "restart_sec": count(var("restart_sec"), get("restart_sec")),
        "start_limit_burst": count(var("start_limit_burst"), get("start_limit_burst"), 1),
        "start_limit_interval_sec": count(var("start_limit_interval_sec"), get("start_limit_interval_sec")),
        "limit_nofile": count(var("limit_nofile"), get("limit_nofile"), 1),
        "gpu_idle_max_used_mib": count(var("gpu_idle_max_used_mib"), get("gpu_idle_max_used_mib")),
    }
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
    settings["unit_path"] = f"{settings['unit_dir']}/{name}.service"
    settings["env_file"] = f"{settings['config_dir']}/{name}.env"
    return settings
