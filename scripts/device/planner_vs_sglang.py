#!/usr/bin/env python3
"""The memory planner's prediction next to what a real sglang logged, one row per server start.

    python scripts/device/planner_vs_sglang.py RESULTS_DIR [-i inventory/device --host h200] [--json OUT]

RESULTS_DIR holds one directory per start with its ``sglang.log`` (real-sglang.sh's results). For each
log: the --mem-fraction-static of its ``server_args=`` line, sglang's readings (the free memory before
the load = the planner's F0, ``#tokens`` of the KV pool, the free memory at "Memory pool end", after the
prefill and decode CUDA-graph captures, and ``available_gpu_mem`` at the end of the start), and
``sglang-deploy plan -i INVENTORY --host HOST --mem-fraction-static F --json`` for the same launch
(planner inputs: the host's flags and sglang_server_memory_plan). sglang's "GB" are GiB
(``get_available_gpu_memory`` divides by 1 << 30). Prints a Markdown table; --json writes the rows.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

GIB_MIB = 1024.0
_PATTERNS = {
    "mem_fraction_static": r"server_args=ServerArgs\(.*?\bmem_fraction_static=([0-9.]+)",
    "free_before_load_gib": r"Load weight begin\. avail mem=([0-9.]+) GB",
    "free_after_load_gib": r"Load weight end\..*?avail mem=([0-9.]+) GB",
    "kv_tokens": r"KV Cache is allocated\..*?#tokens: (\d+)",
    "free_after_pool_gib": r"Memory pool end\. avail mem=([0-9.]+) GB",
    "free_after_prefill_graphs_gib": r"Capture target prefill CUDA graph end\..*?avail mem=([0-9.]+) GB",
    "free_after_decode_graphs_gib": r"Capture target decode CUDA graph end\..*?avail mem=([0-9.]+) GB",
    "max_total_num_tokens": r"max_total_num_tokens=(\d+)",
    "available_gpu_mem_gib": r"max_total_num_tokens=.*?available_gpu_mem=([0-9.]+) GB",
    "context_len": r"max_total_num_tokens=.*?context_len=(\d+)",
}


def sglang_readings(log_text: str) -> dict[str, float | int | None]:
    """The first match of each reading in a server log (None when the start did not get there)."""
    out: dict[str, float | int | None] = {}
    for key, pattern in _PATTERNS.items():
        match = re.search(pattern, log_text)
        if match is None:
            out[key] = None
        elif key in ("kv_tokens", "max_total_num_tokens", "context_len"):
            out[key] = int(match.group(1))
        else:
            out[key] = float(match.group(1))
    return out


def planner_prediction(inventory: str, host: str, fraction: float) -> dict[str, Any]:
    argv = [sys.executable, "-m", "sglang_deploy.cli", "plan", "-i", inventory, "--host", host,
            "--mem-fraction-static", str(fraction), "--json"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode not in (0, 1):
        raise SystemExit(f"planner_vs_sglang: {' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return dict(json.loads(done.stdout))


def _pct(predicted: float, actual: float) -> float:
    return round(100.0 * (predicted - actual) / actual, 2)


def row(name: str, sglang: dict[str, Any], plan: dict[str, Any]) -> dict[str, Any]:
    mib = {k: (round(v * GIB_MIB) if isinstance(v, float) and k.endswith("_gib") else v) for k, v in sglang.items()}
    f0_planner = plan["inputs"]["free_at_start_mib"]
    f0_sglang = mib["free_before_load_gib"]
    tokens = sglang["max_total_num_tokens"]
    left = mib["available_gpu_mem_gib"]
    return {
        "start": name,
        "mem_fraction_static": sglang["mem_fraction_static"],
        "f0_mib": {"planner": f0_planner, "sglang": f0_sglang, "error_mib": round(f0_planner - f0_sglang, 1)},
        "kv_tokens": {
            "planner": plan["kv_tokens"], "sglang": tokens,
            "error_pct": _pct(plan["kv_tokens"], tokens) if tokens else None,
        },
        "outside_pool_mib": {  # F0 * (1 - f): what the pool leaves
            "planner": plan["available_mib"], "sglang_at_pool_end": mib["free_after_pool_gib"],
        },
        "free_after_capture_mib": {
            "planner": plan["free_after_start_mib"], "sglang": left,
            "error_mib": round(plan["free_after_start_mib"] - left, 1) if left is not None else None,
        },
        "capture_mib": {
            "prefill_graphs": (mib["free_after_pool_gib"] - mib["free_after_prefill_graphs_gib"])
            if mib["free_after_prefill_graphs_gib"] is not None else None,
            "decode_graphs": (mib["free_after_prefill_graphs_gib"] - mib["free_after_decode_graphs_gib"])
            if mib["free_after_decode_graphs_gib"] is not None else None,
            "planner_cuda_graphs": plan["breakdown_mib"]["cuda_graphs"],
        },
        "planner_safe": plan["safe"],
        "sglang": sglang,
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| start | f | F0 MiB planner / sglang | KV tokens planner / sglang (error) | free after capture MiB "
        "planner / sglang (error) | prefill-graph capture MiB | decode-graph capture MiB (planner) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        kv, fa, cap = r["kv_tokens"], r["free_after_capture_mib"], r["capture_mib"]
        lines.append(
            f"| {r['start']} | {r['mem_fraction_static']} | {r['f0_mib']['planner']:,.0f} / {r['f0_mib']['sglang']:,} "
            f"| {kv['planner']:,} / {kv['sglang']:,} ({kv['error_pct']:+.2f} %) "
            f"| {fa['planner']:,.0f} / {fa['sglang']:,} ({fa['error_mib']:+,.0f}) "
            f"| {cap['prefill_graphs']:,} | {cap['decode_graphs']:,} ({cap['planner_cuda_graphs']:,.0f}) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("-i", "--inventory", default="inventory/device")
    parser.add_argument("--host", default="h200", help="inventory host whose flags the planner reads")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args(argv)
    rows = []
    for log in sorted(args.results.glob("*/sglang.log")):
        readings = sglang_readings(log.read_text(encoding="utf-8", errors="replace"))
        if readings["mem_fraction_static"] is None or readings["max_total_num_tokens"] is None:
            print(f"planner_vs_sglang: {log}: the start did not get to its memory readings", file=sys.stderr)
            continue
        plan = planner_prediction(args.inventory, args.host, float(readings["mem_fraction_static"]))
        rows.append(row(log.parent.name, readings, plan))
    rows.sort(key=lambda r: (r["mem_fraction_static"], r["start"]))
    print(markdown(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
