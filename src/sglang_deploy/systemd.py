"""Quoting for systemd unit files and environment files.

systemd does its own word splitting, specifier expansion (``%``) and, in ``ExecStart=``, environment
variable expansion (``$``/``${}``). A flag value passes through unchanged only when all three are
escaped; these helpers are the single place that knows how.
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


def exec_env_reference(name: str) -> str:
    """A word that systemd replaces with the value of environment variable ``name`` at start."""
    if not ENV_NAME.match(name):
        raise ValueError(f"not an environment variable name: {name!r}")
    return "${" + name + "}"


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
