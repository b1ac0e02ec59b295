#!/usr/bin/env python3
"""Start the sglang server (or the router, smg) with secrets that appear neither in its argv nor in its log.

STDLIB ONLY, Python >= 3.9: the sglang_server and sglang_router roles install this file on the host
(sglang_host_files) and the unit's ``ExecStart=`` runs it with the venv's interpreter::

    python3 sglang_launcher.py --module sglang.launch_server --env-flag api-key=SGLANG_API_KEY -- FLAGS...
    python3 sglang_launcher.py --module smg.launch_router --strip-ansi \
        --env-flag api-key=SGLANG_ROUTER_API_KEY -- FLAGS...

* ``--env-flag FLAG=NAME``: the value of the environment variable NAME (which systemd reads from the
  unit's 0600 ``EnvironmentFile=``) is handed to sglang as ``--FLAG VALUE`` inside the process, in
  ``sys.argv``. The process's own argv (``/proc/PID/cmdline``, readable by every local user) only
  ever holds the variable's name, and the variable is removed from the environment, so sglang's
  worker processes do not inherit it.
* sglang logs its whole ``ServerArgs``, ``api_key`` included, from the main process and from the
  scheduler workers. So the launcher forks: the child runs sglang with stdout and stderr on pipes;
  this process (the unit's main PID) copies both streams to its own with every secret value
  replaced by ``********``, then exits with the child's status. It ignores SIGTERM/SIGINT/SIGHUP:
  systemd signals every process of the unit (``KillMode=control-group``), sglang drains and exits,
  and the last lines still get masked; a second signal would make sglang's server skip its drain.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import runpy
import selectors
import signal
import sys
import time
import traceback
import urllib.parse
from typing import Dict, List, Optional, Sequence, Tuple

MASK = b"********"
# A terminal control sequence (CSI: colours, cursor moves). The router (smg) may colour its log whatever the
# environment says (NO_COLOR, RUST_LOG_STYLE); --strip-ansi keeps the journal plain text.
_CSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]")
# Longest stretch without a newline held back before it is masked and written out anyway.
_MAX_LINE = 64 * 1024
# After sglang exits, how long straggling writers (its killed workers) may keep the pipes open.
_DRAIN_AFTER_EXIT_S = 10.0
_FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class LaunchError(Exception):
    """A launch that cannot start (exit 2, one line)."""


def parse_env_flags(specs: Sequence[str], environ: Dict[str, str]) -> List[Tuple[str, str, str]]:
    """``FLAG=NAME`` specs -> ``(flag, name, value)``; the value must be set and non-empty."""
    parsed = []
    for spec in specs:
        flag, sep, name = spec.partition("=")
        if not sep or not flag or not name or flag.startswith("-"):
            raise LaunchError(f"--env-flag {spec!r}: want FLAG=ENV_NAME, e.g. api-key=SGLANG_API_KEY")
        value = environ.get(name, "")
        if not value:
            raise LaunchError(
                f"--env-flag {spec}: the environment variable {name} is not set (it comes from the "
                "unit's EnvironmentFile=; re-run the sglang_server role to write it)"
            )
        parsed.append((flag, name, value))
    return parsed


def secret_forms(value: str) -> List[bytes]:
    """Every way sglang (or a library under it) can print ``value``: as it is, inside a Python
    ``repr`` (``ServerArgs(api_key='...')``: backslashes, quotes, tabs escaped; either quote style),
    inside JSON (``/server_info``-style dumps, ASCII-escaped or not) and URL-encoded (a query string).
    A key of letters, digits and ``._~-`` has one form; the role refuses anything that needs escaping,
    and these forms cover a key set by other means. Longest first: one form can lie inside another
    (``\\x`` inside the repr's ``\\\\x``), and a replacement in this order masks the longer whole."""
    text = repr(value)
    body = text[1:-1]
    if text[0] == "'":  # the body inside '...'; the same string inside "..." escapes the other quote
        single, double = body, body.replace("\\'", "'").replace('"', '\\"')
    else:
        single, double = body.replace('\\"', '"').replace("'", "\\'"), body
    forms = {value, single, double, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1],
             urllib.parse.quote(value, safe=""), urllib.parse.quote_plus(value, safe="")}  # fmt: skip
    return sorted((form.encode("utf-8") for form in forms if form), key=len, reverse=True)


class Masker:
    """Masks secrets in a byte stream that arrives in arbitrary chunks.

    Output is written per line; a secret cut in two by a chunk boundary is still found, because
    at most ``len(longest secret) - 1`` bytes are carried over to the next chunk.
    """

    def __init__(self, secrets: Sequence[bytes], strip_ansi: bool = False) -> None:
        self._secrets = sorted({s for s in secrets if s}, key=len, reverse=True)
        self._keep = max((len(s) for s in self._secrets), default=1) - 1
        self._pending = b""
        self._strip_ansi = strip_ansi

    def _mask(self, data: bytes) -> bytes:
        if self._strip_ansi:  # first: a colour code inside a secret's line must not hide the secret
            data = _CSI.sub(b"", data)
        for secret in self._secrets:
            data = data.replace(secret, MASK)
        return data

    def feed(self, chunk: bytes) -> bytes:
        """What can be written now for ``chunk``."""
        data = self._mask(self._pending + chunk)
        end = data.rfind(b"\n") + 1
        if end == 0 and len(data) > _MAX_LINE:
            end = len(data) - self._keep
        self._pending = data[end:]
        return data[:end]

    def flush(self) -> bytes:
        """The rest, at end of stream."""
        data, self._pending = self._mask(self._pending), b""
        return data


def _write_all(fd: int, data: bytes) -> None:
    while data:
        try:
            data = data[os.write(fd, data) :]
        except OSError:  # the journal went away: nothing left to write to
            return


def _exit_status(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def relay(pipes: Dict[int, int], masker_secrets: Sequence[bytes], child: int, strip_ansi: bool = False) -> int:
    """Copy ``pipes`` (read fd -> output fd) with secrets masked (and terminal control sequences
    removed with ``strip_ansi``) until every writer is gone or the child exited and the drain time
    passed; return the child's exit status."""
    for signum in _FORWARDED_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    maskers = {fd: Masker(masker_secrets, strip_ansi) for fd in pipes}
    selector = selectors.DefaultSelector()
    for fd in pipes:
        selector.register(fd, selectors.EVENT_READ)
    status: Optional[int] = None
    deadline: Optional[float] = None
    while selector.get_map():
        timeout = 1.0 if deadline is None else max(0.0, deadline - time.monotonic())
        for key, _ in selector.select(timeout):
            fd = key.fd
            chunk = os.read(fd, 65536)
            if chunk:
                _write_all(pipes[fd], maskers[fd].feed(chunk))
            else:
                _write_all(pipes[fd], maskers[fd].flush())
                selector.unregister(fd)
                os.close(fd)
        if status is None:
            pid, raw = os.waitpid(child, os.WNOHANG)
            if pid == child:
                status = _exit_status(raw)
                deadline = time.monotonic() + _DRAIN_AFTER_EXIT_S
        elif deadline is not None and time.monotonic() >= deadline:
            break
    for fd in list(selector.get_map()):
        _write_all(pipes[fd], maskers[fd].flush())
    if status is None:
        status = _exit_status(os.waitpid(child, 0)[1])
    return status


def command_line(
    python: str,
    launcher: str,
    module: str,
    env_flags: Sequence[Tuple[str, str]],
    flags: Sequence[str],
    strip_ansi: bool = False,
) -> List[str]:
    """The argv that runs the server through this launcher: ``env_flags`` are (flag, variable NAME)
    pairs, never values. The unit's ExecStart= is rendered from this (sglang_deploy.launch)."""
    named = [word for flag, name in env_flags for word in ("--env-flag", f"{flag}={name}")]
    plain = ["--strip-ansi"] if strip_ansi else []
    return [python, launcher, "--module", module, *plain, *named, "--", *flags]


def split_command_line(argv: Sequence[str]) -> Tuple[List[str], Dict[str, str]]:
    """Back from :func:`command_line` (or a plain ``python -m MODULE FLAGS``): the server's flags,
    and ``{flag: variable}`` of those the launcher adds from the environment."""
    words = list(argv)
    if len(words) > 2 and words[1] == "-m":
        return words[3:], {}
    if "--" not in words:
        return words[1:], {}
    cut = words.index("--")
    head = words[1:cut]
    env_flags = {}
    for index, word in enumerate(head[:-1]):
        if word == "--env-flag":
            flag, _, name = head[index + 1].partition("=")
            env_flags[flag] = name
    return words[cut + 1 :], env_flags


def run_module(module: str, argv: List[str]) -> None:
    """Run ``module`` as ``python -m module`` would, with ``argv`` as its arguments."""
    sys.argv = [module, *argv]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def _child(module: str, argv: List[str]) -> int:
    """The server side of the fork: run sglang, turn how it ended into an exit status."""
    code: object = 0
    try:
        run_module(module, argv)
    except SystemExit as done:
        code = done.code
    except BaseException:  # noqa: BLE001 -- the traceback goes out through the masking pipe
        traceback.print_exc()
        code = 1
    if not isinstance(code, int):
        if code is not None:  # sys.exit("message") prints the message and exits 1
            print(code, file=sys.stderr)
        code = 0 if code is None else 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sglang_launcher.py", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--module", default="sglang.launch_server", help="module to run as __main__")
    parser.add_argument("--env-flag", action="append", default=[], metavar="FLAG=NAME",
                        help="pass --FLAG with the value of environment variable NAME (repeatable)")
    parser.add_argument("--strip-ansi", action="store_true",
                        help="remove terminal control sequences (colours) from the output")
    parser.add_argument("flags", nargs=argparse.REMAINDER, help="the server's flags, after --")
    args = parser.parse_args(argv)
    flags = args.flags[1:] if args.flags[:1] == ["--"] else list(args.flags)
    try:
        env_flags = parse_env_flags(args.env_flag, dict(os.environ))
    except LaunchError as err:
        print(f"sglang_launcher: {err}", file=sys.stderr)
        return 2
    for _, name, _ in env_flags:
        os.environ.pop(name, None)  # sglang's workers inherit the environment
    server_argv = flags + [word for flag, _, value in env_flags for word in (f"--{flag}", value)]
    if not env_flags and not args.strip_ansi:
        run_module(args.module, server_argv)
        return 0

    sys.stdout.flush()
    sys.stderr.flush()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(out_r)
        os.close(err_r)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.close(out_w)
        os.close(err_w)
        os._exit(_child(args.module, server_argv))
    os.close(out_w)
    os.close(err_w)
    secrets = [form for _, _, value in env_flags for form in secret_forms(value)]
    return relay({out_r: 1, err_r: 2}, secrets, child, args.strip_ansi)


if __name__ == "__main__":
    sys.exit(main())
