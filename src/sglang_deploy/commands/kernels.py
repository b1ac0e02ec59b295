"""``sglang-deploy kernels PATH... [--require ARCH] [--json] [--cubins]``: the kernel proof.

A thin wrapper around :mod:`sglang_deploy_host.gpu.fatbin`, the stdlib-only parser that the ml_env role
also copies to target hosts; the rules (what meets ``--require``, exit statuses) are documented
there.
"""

from __future__ import annotations

import argparse

from sglang_deploy_host.gpu import fatbin


def cmd_kernels(args: argparse.Namespace) -> int:
    return fatbin.run(args.paths, args.require, args.json, cubins=args.cubins)


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "kernels",
        help="list the SM archs of the CUDA cubins in shared objects (no GPU needed)",
        description=(
            "List the SM architectures of the cubins (and PTX) embedded in the .nv_fatbin sections "
            "of shared objects. Exit status: 0 ok, 1 a required arch is missing, 2 unreadable or "
            "malformed input, 3 --require given but no device code found."
        ),
    )
    fatbin.add_arguments(parser)
    parser.set_defaults(func=cmd_kernels)
