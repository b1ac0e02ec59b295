#!/usr/bin/env python3
"""Readings from a running sglang for the planner and the dashboards (scripts/device/glm5-arch.sh).

    server_readings.py activations URL ENV_FILE --lengths 1024,2048,4096,8192 --out FILE.json
        one /generate per length (random token ids, 1 new token), one at a time, and the GPU's used
        memory (nvidia-smi) before the first and after each: PyTorch's caching allocator keeps the
        largest prefill's blocks reserved, so the growth over the idle server is the activation memory
        of a prefill of that many tokens (what the planner's activation term stands for).
    server_readings.py snapshot URL ENV_FILE --out DIR
        DIR/metrics.txt (GET /metrics, the Prometheus page) and DIR/server-info.json (GET /server_info,
        the server's arguments and memory_usage; every secret field redacted).

The API key is read from the unit's 0600 environment file, as the readiness gate does. Every request
has a deadline; the script exits 1 when the server refuses a request or answers without a token.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

from sglang_deploy_host.serving import bench_steps, endpoint, systemd, unit_flags

SMI_TIMEOUT_S = 20
REQUEST_TIMEOUT_S = 300.0
# Random ids drawn below this: any tokenizer of the runs has at least this many entries.
TOKEN_ID_CEILING = 4096


def gpu_used_mib() -> int:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, timeout=SMI_TIMEOUT_S, check=True,
    ).stdout  # fmt: skip
    return int(out.splitlines()[0].strip())


def client(url: str, env_file: str) -> endpoint.Endpoint:
    key = systemd.env_file_values(Path(env_file).read_text()).get(unit_flags.API_KEY_ENV, "")
    return endpoint.Endpoint(url, api_key=key)


def activations(server: endpoint.Endpoint, lengths: list[int]) -> dict:
    rng = random.Random(1)
    idle = gpu_used_mib()
    rows = []
    for length in lengths:
        ids = [rng.randrange(3, TOKEN_ID_CEILING) for _ in range(length)]
        started = time.monotonic()
        answer = server.request(
            "POST", "/generate",
            {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}},
            timeout=REQUEST_TIMEOUT_S,
        )  # fmt: skip
        seconds = time.monotonic() - started
        body = answer.json() if answer.status == 200 else {}
        meta = body.get("meta_info", {}) if isinstance(body, dict) else {}
        if answer.status != 200 or int(meta.get("completion_tokens") or 0) < 1:
            raise SystemExit(f"server_readings: /generate of {length} tokens: HTTP {answer.status}, {answer.text[:300]}")
        used = gpu_used_mib()
        rows.append({
            "prompt_tokens": int(meta.get("prompt_tokens") or length), "seconds": round(seconds, 3),
            "gpu_used_mib": used, "growth_over_idle_mib": used - idle,
        })  # fmt: skip
        print(f"prefill {length:>6} tokens: {seconds:6.2f} s, GPU used {used} MiB (+{used - idle} over idle)", flush=True)
    return {"idle_gpu_used_mib": idle, "prefills": rows}


def snapshot(server: endpoint.Endpoint, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    metrics = server.get("/metrics")
    (out / "metrics.txt").write_text(metrics.text)
    info = server.get("/server_info")
    redacted = bench_steps.redact(info.json(), [server.api_key] if server.api_key else [])
    (out / "server-info.json").write_text(json.dumps(redacted, indent=2) + "\n")
    names = unit_flags.metric_names(metrics.text)
    print(f"/metrics: HTTP {metrics.status}, {len(names)} metric names; /server_info: HTTP {info.status}")
    if metrics.status != 200 or info.status != 200 or not names:
        raise SystemExit("server_readings: /metrics or /server_info did not answer")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    act = sub.add_parser("activations")
    act.add_argument("url")
    act.add_argument("env_file")
    act.add_argument("--lengths", default="1024,2048,4096,8192")
    act.add_argument("--out", type=Path, required=True)
    snap = sub.add_parser("snapshot")
    snap.add_argument("url")
    snap.add_argument("env_file")
    snap.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    server = client(args.url, args.env_file)
    if args.what == "activations":
        lengths = [int(part) for part in args.lengths.split(",")]
        args.out.write_text(json.dumps(activations(server, lengths), indent=2) + "\n")
    else:
        snapshot(server, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
