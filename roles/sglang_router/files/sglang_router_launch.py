#!/usr/bin/env python3
"""Starts the pinned sglang-router (``sglang_router.launch_router``) with the unit's argv, handing it the
API key in-process so it appears in no argv and no log line.

The key comes from SGLANG_ROUTER_API_KEY (the unit's 0600 EnvironmentFile); it is removed from the
environment before the router starts. The router needs it as its own key (clients send
``Authorization: Bearer <key>``; the worker API /workers needs it too) and sends the same key to the
workers, so it must equal the workers' sglang_server_api_key. ``--api-key`` in argv is refused: that is
exactly the leak this launcher exists to prevent. Installed by the sglang_router role.
"""

from __future__ import annotations

import os
import sys

KEY_VARIABLE = "SGLANG_ROUTER_API_KEY"
FORBIDDEN = ("--api-key", "--control-plane-api-keys", "--oracle-password", "--postgres-db-url", "--redis-url")


def main(argv: list[str]) -> int:
    for arg in argv:
        if arg.split("=", 1)[0] in FORBIDDEN:
            print(f"sglang-router launcher: {arg.split('=', 1)[0]} must not be in argv (secrets go in the env file)", file=sys.stderr)
            return 2
    key = os.environ.pop(KEY_VARIABLE, "")
    from sglang_router.launch_router import launch_router, parse_router_args

    router_args = parse_router_args(argv)
    if key:
        router_args.api_key = key
    launch_router(router_args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
