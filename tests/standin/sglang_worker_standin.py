#!/usr/bin/env python3
"""STAND-IN for one sglang worker behind a router: tests/standin/sglang_server_standin.py (imported
from the same directory, unchanged) plus what a rolling restart reads from a real sglang 0.5.10.post1
worker: ``GET /v1/loads`` (``srt/entrypoints/v1_loads.py``: ``{"timestamp", "version",
"dp_rank_count", "loads": [{"dp_rank", "num_running_reqs", "num_waiting_reqs", "num_total_reqs", ...}],
"aggregate": {...}}``) and the deprecated ``GET /get_load`` (``srt/entrypoints/http_server.py``: a
list with one ``{"dp_rank", "num_reqs", "num_waiting_reqs", "num_tokens", "ts_tic"}`` per rank).
Running requests are the generation requests being answered right now (counted around every POST
to a generation route), so a drain can wait for them to reach 0.
Like every route but /health*, it needs ``Authorization: Bearer <--api-key>`` when a key is set.
Same argv and environment as the server stand-in.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import sglang_server_standin as standin  # noqa: E402 - path set just above

_base_make_handler = standin.make_handler


def make_handler(state: Any) -> type:
    base = _base_make_handler(state)
    lock = threading.Lock()
    in_flight = [0]

    class WorkerHandler(base):  # type: ignore[misc,valid-type]
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            route = self.path.split("?", 1)[0]
            if route in ("/v1/loads", "/get_load"):
                if not self._authorized():
                    self._send(401, {"error": "Unauthorized"})
                    return
                with lock:
                    count = in_flight[0]
                if route == "/get_load":
                    self._send(200, [{"dp_rank": 0, "num_reqs": count, "num_waiting_reqs": 0, "num_tokens": 0,
                                      "ts_tic": time.time()}])
                    return
                load = {"dp_rank": 0, "num_running_reqs": count, "num_waiting_reqs": 0, "num_total_reqs": count}
                self._send(200, {
                    "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "version": "standin",
                    "dp_rank_count": 1, "loads": [load],
                    "aggregate": {"total_running_reqs": count, "total_waiting_reqs": 0, "total_reqs": count},
                })
                return
            super().do_GET()

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            counted = self.path in standin.GENERATION_ROUTES
            if counted:
                with lock:
                    in_flight[0] += 1
            try:
                super().do_POST()
            finally:
                if counted:
                    with lock:
                        in_flight[0] -= 1

    return WorkerHandler


def main(argv: Optional[list[str]] = None) -> int:
    standin.make_handler = make_handler
    return standin.main(argv)


if __name__ == "__main__":
    sys.exit(main())
