"""``sglang-deploy nccl-check``: the NCCL all-reduce check, run with an interpreter that has torch.

The check itself is ``sglang_deploy_host.nccl_check`` (stdlib + torch); this command runs it as a
module with ``--python`` (default: the ml-env), with this checkout's stdlib-only host package on
that interpreter's path.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import sglang_deploy_host

DEFAULT_PYTHON = "/opt/sglang-deploy/ml-env/bin/python3"


def _run(args: argparse.Namespace) -> int:
    python = Path(args.python)
    if not python.exists():
        print(f"nccl-check: {python} does not exist; pass --python with an interpreter that has torch", file=sys.stderr)
        return 2
    check_args = list(args.check_args)
    if check_args[:1] == ["--"]:
        check_args = check_args[1:]
    package_root = str(Path(sglang_deploy_host.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": package_root}
    cmd = [str(python), "-m", "sglang_deploy_host.nccl_check", *check_args]
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
