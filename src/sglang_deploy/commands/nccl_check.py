"""``sglang-deploy nccl-check``: the NCCL all-reduce check, run with an interpreter that has torch.

The check itself is ``sglang_deploy_host.gpu.nccl_check`` (stdlib + torch); this command runs it as a
module with ``--python`` (default: the ml-env), with this checkout's stdlib-only host package on
that interpreter's path.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import sglang_deploy_host
from sglang_deploy import inputfiles
from sglang_deploy_host.gpu import nccl_check as host_check

DEFAULT_PYTHON = "/opt/sglang-deploy/ml-env/bin/python3"
ENV_FILE_MAX_BYTES = host_check.ENV_FILE_MAX_BYTES


def _check_env_file(check_args: list[str]) -> None:
    """Refuse an --env-from-file that is not a regular text file under ENV_FILE_MAX_BYTES before the
    check's interpreter starts. The check's own parser finds the option, however it is spelled
    (``--env-from-file=F``, an abbreviation); arguments it refuses are left to the check to report."""
    parser = host_check.build_parser()
    parser.exit_on_error = False
    try:  # quietly: the check prints its own usage errors and --help
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            known, _ = parser.parse_known_args(check_args)
    except (argparse.ArgumentError, SystemExit):
        return
    if known.env_from_file:
        inputfiles.read_text(known.env_from_file, "--env-from-file", ENV_FILE_MAX_BYTES)


def _run(args: argparse.Namespace) -> int:
    python = Path(args.python)
    if not python.exists():
        print(f"nccl-check: {python} does not exist; pass --python with an interpreter that has torch", file=sys.stderr)
        return 2
    check_args = list(args.check_args)
    if check_args[:1] == ["--"]:
        check_args = check_args[1:]
    try:
        _check_env_file(check_args)
    except inputfiles.InputFileError as err:
        print(f"nccl-check: {err}", file=sys.stderr)
        return 2
    package_root = str(Path(sglang_deploy_host.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": package_root}
    cmd = [str(python), "-m", "sglang_deploy_host.gpu.nccl_check", *check_args]
    return subprocess.run(cmd, check=False, env=env).returncode


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "nccl-check",
        help="all-reduce over every GPU with the unit's NCCL environment (run on the GPU host)",
        description=(
            "Runs an NCCL all-reduce over every visible GPU, one process per GPU, checks the sums and reports "
            "bus bandwidth and the transports NCCL chose. Arguments after -- go to the check, e.g. "
            "sglang-deploy nccl-check -- --env-from-unit sglang --compare-p2p-disable"
        ),
    )
    parser.add_argument("--python", default=DEFAULT_PYTHON, help=f"interpreter with torch (default {DEFAULT_PYTHON})")
    parser.add_argument("check_args", nargs=argparse.REMAINDER, help="arguments for the check (after --)")
    parser.set_defaults(func=_run)
