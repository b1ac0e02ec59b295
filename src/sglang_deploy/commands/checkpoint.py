"""``sglang-deploy checkpoint DIR [--json]``: what a local checkpoint holds, from its headers alone.

A thin wrapper around :mod:`sglang_deploy_host.model.inspection`, the stdlib-only inspection that the
sglang_server role also runs on the host before the unit starts; the verdicts and exit statuses are
documented there.
"""

from __future__ import annotations

import argparse

from sglang_deploy_host.model import inspection


def cmd_checkpoint(args: argparse.Namespace) -> int:
    return inspection.run(args.directory, args.json)


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "checkpoint",
        help="inspect a local checkpoint: its MTP draft layer, expert dtypes (headers only, no tensor data)",
        description=(
            "Inspect a local checkpoint from config.json, the safetensors index and each shard's header (never "
            "its tensor data): the architecture, whether the MTP draft layer sglang's speculative decoding loads "
            "is there and unquantized (usable, missing, wrong-dtype), and whether the shared and routed experts "
            "share a dtype. Exit status: 0 the checkpoint was read (whatever the verdict), 2 it could not be "
            "read (missing, truncated or malformed), with one line saying why."
        ),
    )
    inspection.add_arguments(parser)
    parser.set_defaults(func=cmd_checkpoint)
