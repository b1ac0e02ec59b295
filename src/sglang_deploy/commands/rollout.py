"""``sglang-deploy rollout``: a rolling restart of the sglang workers behind their routers, losing no
request.

  sglang-deploy rollout -i INVENTORY [-l HOSTS] [--serial N] [--drain-timeout S] [--artifacts DIR]

Runs playbooks/rolling.yml: SERIAL workers at a time (default 1; at most workers - 1, so one always
serves), max_fail_percentage 0. Each worker is taken out of every router of sglang_routers (the router's
worker API), drained until its in-flight requests reach 0, restarted, gated on /health_generate, checked
with the correctness probes, put back and waited for until every router lists it healthy. The first
failure stops the rollout; the workers not yet touched keep serving. Then the Prometheus file_sd targets
file is rewritten (when configured).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sglang_deploy.commands.common import missing_role_defaults, role_defaults, usage_error
from sglang_deploy.playbook.runner import InventoryError, run_playbook, serving_hosts

PLAYBOOK = "playbooks/rolling.yml"
ROUTER_GROUP = "sglang_routers"


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "rollout",
        help="rolling restart of the workers behind the routers (drain, restart, gate, probe, rejoin)",
        description=__doc__.split("\n\n", 1)[0] if __doc__ else None,
    )
    parser.add_argument("-i", "--inventory", action="append", required=True, help="inventory path (repeatable)")
    parser.add_argument("-l", "--limit", help="roll only these workers (Ansible pattern); the routers are always used")
    # The role's default is the one (roles/sglang_rolling/defaults/main.yml).
    serial = role_defaults("sglang_rolling").get("sglang_rolling_serial")
    parser.add_argument(
        "--serial", type=_positive_int, default=serial, help=f"workers restarted at a time (default {serial}; at most workers - 1)"
    )
    parser.add_argument(
        "--drain-timeout", type=_positive_int, help="seconds to wait for a worker's in-flight requests to reach 0 (default 300)"
    )
    parser.add_argument("--artifacts", help="ansible-runner artifacts directory (default: artifacts/)")
    parser.set_defaults(func=run)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def run(args: argparse.Namespace) -> int:
    refused = missing_role_defaults("rollout", "sglang_rolling", {"--serial": args.serial})
    if refused is not None:
        return refused
    inventories = list(args.inventory)
    workers = serving_hosts(inventories, args.limit)  # a bad inventory or limit stops here (exit 2)
    try:
        routers = serving_hosts(inventories, None, pattern=ROUTER_GROUP)
    except InventoryError:
        return usage_error(
            "rollout",
            f"no hosts in {ROUTER_GROUP} in {', '.join(inventories)}: a rolling restart without a router would drop "
            "requests. Fix: list the router host(s) under sglang_routers (see inventory/multi_host)",
        )
    every = serving_hosts(inventories)
    if len(every) < 2:
        return usage_error("rollout", "fewer than 2 workers: a rolling restart would stop serving (nothing was changed)")
    # A batch of `serial` rolled workers leaves the routers together; the workers -l leaves out keep
    # serving. The run's limit adds the routers, so a router that is also a worker rolls too.
    rolling = set(workers) | (set(routers) & set(every)) if args.limit else set(every)
    staying = len(every) - len(rolling)
    if min(args.serial, len(rolling)) >= len(every):
        return usage_error(
            "rollout",
            f"--serial {args.serial} would take all {len(every)} workers out of the routers at once "
            f"({len(rolling)} rolling, {staying} staying in service) and stop serving; the largest allowed serial "
            f"is {len(every) - 1} (workers - 1). Fix: --serial {len(every) - 1} or less (nothing was changed)",
        )
    extravars: dict[str, object] = {"sglang_rolling_serial": args.serial}
    if args.drain_timeout is not None:
        extravars["sglang_rolling_drain_timeout"] = args.drain_timeout
    print(f"rolling {', '.join(workers)} behind {', '.join(routers)}, {args.serial} at a time", file=sys.stderr)
    result = run_playbook(
        PLAYBOOK,
        inventories,
        extravars=extravars,
        limit=None if args.limit is None else f"{args.limit}:{ROUTER_GROUP}:localhost",
        artifacts_dir=Path(args.artifacts) if args.artifacts else None,
        title=f"sglang-deploy rollout {','.join(workers)}",
    )
    print(f"artifacts: {result.artifacts}", file=sys.stderr)
    return 0 if result.rc == 0 else 1
