"""``sglang-deploy lock [--lane L]... [--check]``: (re)write or check the lanes' ml-env locks."""

from __future__ import annotations

import argparse
import sys

from sglang_deploy import inputfiles
from sglang_deploy.lanes.catalog import lane_names, load_lane
from sglang_deploy.lanes.lock import LockError, LockTarget, check_lock, targets, write_lock


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "lock",
        help="resolve the lanes' ml-env locks with uv (pinned, with hashes)",
        description=(
            "Resolve each lane's lock: inputs into lanes/locks/<lane>-py<python>.txt, one file per "
            "Python the lane names. --check writes nothing: it fails when a lock is stale against its "
            "lane file or when resolving again (same cut-off date) gives other pins or hashes."
        ),
    )
    parser.add_argument(
        "--lane",
        action="append",
        choices=lane_names(),
        help="lane to lock (repeatable); default: every lane that has a lock: section",
    )
    parser.add_argument("--check", action="store_true", help="check the committed locks, write nothing")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    names = args.lane or [name for name in lane_names() if load_lane(name).lock is not None]
    failed = False
    try:
        todo: list[LockTarget] = [t for name in names for t in targets(load_lane(name))]
        for target in todo:
            result = check_lock(target) if args.check else write_lock(target)
            if result.problem:
                failed = True
                print(f"STALE {result.path}: {result.problem}. Fix: sglang-deploy lock --lane {target.lane.name}")
            else:
                state = "ok" if args.check else ("written" if result.changed else "unchanged")
                print(f"{state} {result.path} ({result.seconds:.1f} s)")
    except LockError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except inputfiles.InputFileError as err:  # a lock path that holds no lock file: bad input
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 1 if failed else 0
