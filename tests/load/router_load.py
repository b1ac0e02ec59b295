#!/usr/bin/env python3
"""Bounded load generator for the router proof (molecule/sglang_router): C threads send streamed
chat requests through one URL until a stop file appears (or --max-seconds pass), each request with a
total deadline, and write a JSON summary. Stdlib only.

A request counts as OK only with status 200 and a complete stream (the ``data: [DONE]`` event); any
other status, a cut stream, a timeout or a connection error is a failure, recorded with its time.
The summary: sent, ok, failed, latency of the OK requests (p50_s, p99_s, max_s: nearest rank), the
failures (time, reason), and the per-second outcome counts, so a
caller can say how long failures lasted after an event (``--mark NAME`` files hold a time stamp).

  router_load.py --url http://127.0.0.1:18510 --model m --key K --concurrency 8 \
      --stop-file /tmp/stop --out /tmp/summary.json [--max-seconds 600] [--max-tokens 16]
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import sys
import threading
import time
import urllib.parse
from typing import Any

PROMPTS = ("What is the capital of France?", "What is 17 + 25?", "Write a Python function add.")


def one_request(url: urllib.parse.SplitResult, model: str, key: str, prompt: str, max_tokens: int, timeout: float) -> str | None:
    """None when the request succeeded, else why it failed."""
    body = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
         "stream": True, "ignore_eos": True, "temperature": 0}
    ).encode()
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port or 80, timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", body=body, headers=headers)
        answer = conn.getresponse()
        if answer.status != 200:
            return f"HTTP {answer.status}: {answer.read(200)!r}"
        done = False
        while True:
            line = answer.readline()
            if not line:
                break
            if line.strip() == b"data: [DONE]":
                done = True
        return None if done else "stream ended without [DONE]"
    except (OSError, http.client.HTTPException) as err:
        return f"{type(err).__name__}: {err}"
    finally:
        conn.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--key", default=os.environ.get("ROUTER_LOAD_KEY", ""))
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--max-seconds", type=float, default=600.0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if not 1 <= args.concurrency <= 256:
        parser.error("--concurrency must be 1..256")
    url = urllib.parse.urlsplit(args.url)
    start = time.time()
    lock = threading.Lock()
    outcomes: list[tuple[float, float, str | None]] = []

    def worker(index: int) -> None:
        n = index
        while not os.path.exists(args.stop_file) and time.time() - start < args.max_seconds:
            began = time.time()
            problem = one_request(url, args.model, args.key, PROMPTS[n % len(PROMPTS)], args.max_tokens, args.timeout)
            with lock:
                outcomes.append((began, time.time(), problem))
            n += 1

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(args.concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(args.max_seconds + args.timeout + 5)
    end = time.time()
    failures = [{"at": round(b - start, 3), "ended": round(e - start, 3), "reason": p} for b, e, p in outcomes if p]
    per_second: dict[int, list[int]] = {}
    for began, _, problem in outcomes:
        slot = per_second.setdefault(int(began - start), [0, 0])
        slot[1 if problem else 0] += 1
    latencies = sorted(e - b for b, e, p in outcomes if not p)

    def percentile(q: float) -> float | None:
        # Nearest rank over the requests that succeeded (None when none did).
        if not latencies:
            return None
        return round(latencies[min(len(latencies) - 1, max(0, math.ceil(q * len(latencies)) - 1))], 3)

    summary: dict[str, Any] = {
        "url": args.url,
        "concurrency": args.concurrency,
        "started": start,
        "seconds": round(end - start, 3),
        "sent": len(outcomes),
        "ok": len(outcomes) - len(failures),
        "failed": len(failures),
        "p50_s": percentile(0.50),
        "p99_s": percentile(0.99),
        "max_s": round(latencies[-1], 3) if latencies else None,
        "failures": failures[:200],
        "per_second_ok_failed": {str(k): v for k, v in sorted(per_second.items())},
    }
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=1)
    print(json.dumps({k: summary[k] for k in ("sent", "ok", "failed", "seconds", "p50_s", "p99_s")}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
