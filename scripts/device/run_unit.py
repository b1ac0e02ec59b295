#!/usr/bin/env python3
"""Run a rendered sglang unit where there is no systemd (the device machine): the same argv and
environment systemd would use, read from the unit file with sglang_deploy_host.serving.systemd's readers.

    run_unit.py show  UNIT [--env-file ENV]      argv, environment (secrets masked), cwd, endpoint
    run_unit.py start UNIT --log LOG --pid-file PID [--skip-pre] [--env-file ENV]
    run_unit.py stop  UNIT --pid-file PID

``start`` runs every ``ExecStartPre=`` (a failure stops the start unless the line has the ``-``
prefix), then ``ExecStart=`` in a new session with stdout and stderr appended to LOG, and returns at
once (the readiness gate is the caller's: ``python3 -m sglang_deploy_host.serving.endpoint wait-ready``).
``stop`` does what ``KillMode=control-group`` + ``KillSignal=SIGTERM`` + ``TimeoutStopSec=`` +
``SendSIGKILL=yes`` do: SIGTERM to every process of the session, SIGKILL after the timeout.

The environment is what systemd gives a system service of ``User=`` with these lines: its base
(PATH, LANG), HOME/USER/LOGNAME of that user (HOME = ``WorkingDirectory=``, the service home the
sglang_server role makes), every ``Environment=``, then the ``EnvironmentFile=`` (it wins). Besides
that, only the device machine's own NVLink-multicast switches and CUDA_VISIBLE_DEVICES pass through
from this process's environment (they must stay set for every program there). What this runner does
not do: switch to ``User=`` (it runs as the caller, root on the device), or apply the unit's
sandboxing (ProtectSystem=, SystemCallFilter=, ...) - those are checked under systemd in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sglang_deploy_host.serving import sglang_launcher, systemd, unit_flags

# systemd's PATH for system services (without /snap/bin), and the locale of a minimal host.
SYSTEMD_BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
# Kept from this process's environment: the device machine's rule (NVLink multicast off in NCCL,
# PyTorch and NVSHMEM, also for programs started with an environment of their own) and GPU selection.
PASS_THROUGH = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS", "CUDA_VISIBLE_DEVICES")
DEFAULT_STOP_TIMEOUT_S = 90.0


class UnitError(RuntimeError):
    """The unit cannot be run as systemd would (a missing file, a failed ExecStartPre=)."""


def unit_environment(
    unit_text: str, environ: dict[str, str] | None = None, env_file: Path | None = None
) -> dict[str, str]:
    """The environment systemd would give the unit's ExecStart= (see the module docstring);
    ``env_file`` reads the EnvironmentFile= from another place (a render directory)."""
    env = dict(SYSTEMD_BASE_ENV)
    user = systemd.directive(unit_text, "User")
    home = systemd.directive(unit_text, "WorkingDirectory")
    if user:
        env.update({"USER": user, "LOGNAME": user})
    if home:
        env["HOME"] = home
    env.update(systemd.environment(unit_text))
    named = systemd.directive(unit_text, "EnvironmentFile")
    if named:
        optional = named.startswith("-")
        path = env_file or Path(named.lstrip("-"))
        try:
            env.update(systemd.env_file_values(path.read_text(encoding="utf-8")))
        except FileNotFoundError:
            if not optional:
                raise UnitError(f"EnvironmentFile={path} does not exist (install the rendered .env there, 0600)") from None
    source = os.environ if environ is None else environ
    env.update({name: source[name] for name in PASS_THROUGH if name in source})
    return env


def _secret_names(unit_text: str) -> set[str]:
    """Variables the launcher hands to sglang as secrets (``--env-flag FLAG=NAME``)."""
    _, env_flags = sglang_launcher.split_command_line(systemd.exec_start_argv(unit_text))
    return set(env_flags.values())


def show(unit_path: Path, env_file: Path | None = None) -> dict[str, object]:
    text = unit_path.read_text(encoding="utf-8")
    secrets = _secret_names(text)
    env = unit_environment(text, env_file=env_file)
    flag_words, _ = sglang_launcher.split_command_line(systemd.exec_start_argv(text))
    flags = unit_flags.flags_from_argv(flag_words)
    return {
        "exec_start_pre": [argv for argv, _ in systemd.exec_start_pre(text)],
        "exec_start": systemd.exec_start_argv(text),
        "working_directory": systemd.directive(text, "WorkingDirectory"),
        "environment": {k: ("********" if k in secrets else v) for k, v in sorted(env.items())},
        "url": unit_flags.base_url(flags),
        "model": unit_flags.served_model_name(flags),
    }


def start(unit_path: Path, log: Path, pid_file: Path, run_pre: bool = True, env_file: Path | None = None) -> int:
    text = unit_path.read_text(encoding="utf-8")
    env = unit_environment(text, env_file=env_file)
    cwd = systemd.directive(text, "WorkingDirectory") or "/"
    Path(cwd).mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        if run_pre:
            for argv, ignore_failure in systemd.exec_start_pre(text):
                out.write(f"run_unit: ExecStartPre={' '.join(argv)}\n".encode())
                out.flush()
                done = subprocess.run(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, check=False)
                if done.returncode != 0 and not ignore_failure:
                    raise UnitError(f"ExecStartPre={' '.join(argv)} exited {done.returncode} (see {log})")
        argv = systemd.exec_start_argv(text)
        out.write(f"run_unit: ExecStart={' '.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    pid_file.write_text(f"{proc.pid}\n")
    return proc.pid


def _alive(pgid: int) -> bool:
    try:  # reap the leader if this process started it (start() and stop() in one process): no zombie
        os.waitpid(pgid, os.WNOHANG)
    except ChildProcessError:
        pass
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop(unit_path: Path, pid_file: Path) -> str:
    text = unit_path.read_text(encoding="utf-8")
    timeout = float(systemd.directive(text, "TimeoutStopSec") or DEFAULT_STOP_TIMEOUT_S)
    pgid = int(pid_file.read_text().split()[0])
    if not _alive(pgid):
        return f"session {pgid} had already exited"
    os.killpg(pgid, signal.SIGTERM)
    ends = time.monotonic() + timeout
    while time.monotonic() < ends:
        if not _alive(pgid):
            return f"session {pgid} stopped on SIGTERM"
        time.sleep(0.5)
    os.killpg(pgid, signal.SIGKILL)
    return f"session {pgid} did not stop within TimeoutStopSec={timeout:g}: SIGKILL"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="run_unit.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_show = sub.add_parser("show", help="print what would run (JSON, secrets masked)")
    p_show.add_argument("unit", type=Path)
    p_show.add_argument("--env-file", type=Path, help="read EnvironmentFile= from here instead")
    p_start = sub.add_parser("start", help="ExecStartPre=, then ExecStart= in the background")
    p_start.add_argument("unit", type=Path)
    p_start.add_argument("--log", type=Path, required=True)
    p_start.add_argument("--pid-file", type=Path, required=True)
    p_start.add_argument("--skip-pre", action="store_true", help="do not run ExecStartPre=")
    p_start.add_argument("--env-file", type=Path, help="read EnvironmentFile= from here instead")
    p_stop = sub.add_parser("stop", help="SIGTERM the unit's processes, SIGKILL after TimeoutStopSec=")
    p_stop.add_argument("unit", type=Path)
    p_stop.add_argument("--pid-file", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "show":
            print(json.dumps(show(args.unit, args.env_file), indent=2))
        elif args.command == "start":
            print(start(args.unit, args.log, args.pid_file, run_pre=not args.skip_pre, env_file=args.env_file))
        else:
            print(stop(args.unit, args.pid_file))
    except (UnitError, ValueError, OSError) as err:
        print(f"run_unit.py {args.command}: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
