#!/usr/bin/env python3
"""The memory planner's prediction next to what a real sglang logged, one row per server start.

    python scripts/device/planner_vs_sglang.py RESULTS_DIR [--json OUT] [-i inventory/device --host h200]

RESULTS_DIR holds one directory per start with its ``sglang.log`` (what real-sglang.sh and glm5-arch.sh
bring back; tests/fixtures/real-sglang/ keeps them). sglang's readings come from the log
(``sglang_deploy.memory.startlog``): the launch it parsed, the free memory before the load (the planner's F0),
the weights' footprint, the KV pool, the decode-graph capture and ``available_gpu_mem`` at the end.

Two ways to predict, by what RESULTS_DIR holds:
* ``config-dsa.json`` / ``config-mla.json`` (glm5-arch.sh's GLM-5 checkpoints): the planner alone, from
  the launch in the log, GLM-5's shapes in that config and the measured load (``Load weight end``):
  :func:`sglang_deploy.memory.planner.architecture_inputs` with sglang 0.5.17's rules on the GPU of
  ``device-facts.txt``. Each row: KV cell, KV tokens, decode-graph memory (with the fp8 conversion
  copy), free memory after capture, planner against sglang.
* otherwise (real-sglang.sh's tiny Llama): ``sglang-deploy plan -i INVENTORY --host HOST
  --mem-fraction-static F --json`` for the same launch (the inventory's planner inputs).
Prints a Markdown table; --json writes the rows.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
from sglang_deploy.memory import planner, startlog  # noqa: E402  (the repo's src, without installing it)

# The sglang whose rules the GLM-5 runs follow (scripts/device/sglang-0.5.17-bundle.txt).
DEVICE_SGLANG = "0.5.17"
CONFIG_OF_CLASS = {"GlmMoeDsaForCausalLM": "config-dsa.json", "DeepseekV3ForCausalLM": "config-mla.json"}


def _pct(predicted: float, actual: float) -> float:
    return round(100.0 * (predicted - actual) / actual, 2)


def device_gpu(results: Path) -> tuple[int, int]:
    """(memory.total MiB, SM major) from the run's device-facts.txt (nvidia-smi's name, memory, driver, cc)."""
    facts = (results / "device-facts.txt").read_text()
    match = re.search(r", (\d+) MiB, [0-9.]+, (\d+)\.\d", facts)
    if match is None:
        raise SystemExit(f"planner_vs_sglang: {results}/device-facts.txt has no GPU line")
    return int(match.group(1)), int(match.group(2))


def glm5_inputs(log: startlog.StartLog, config: dict[str, Any], gpu_mib: int, sm_major: int) -> tuple[planner.PlanInputs, list[str]]:
    """The planner's inputs for this start: its launch, GLM-5's shapes, the measured load."""
    # 0.5.17 spells the DSA backends as the cu130 lane's sglang does (--dsa-*).
    launch = startlog.launch_settings(log.server_args, "cu130")
    values = planner.inputs_from_settings(launch)
    values.pop("kv_cache_dtype", None)
    derived, notes = planner.architecture_inputs(
        config, launch, sm_major=sm_major, sglang_version=DEVICE_SGLANG, architecture="glm-5"
    )
    values.update(derived)
    values.update(gpu_memory_mib=gpu_mib, weights_gib_per_gpu=log.readings["weights_gib"])
    return planner.PlanInputs(**values), notes


def glm5_row(name: str, log: startlog.StartLog, config: dict[str, Any], gpu_mib: int, sm_major: int) -> dict[str, Any]:
    inputs, notes = glm5_inputs(log, config, gpu_mib, sm_major)
    plan = planner.plan(inputs)
    tokens = int(log.readings["max_total_num_tokens"] or 0)
    free = log.mib("available_gpu_mem_gib")
    graphs = None if log.graphs_gib is None else round(log.graphs_gib * startlog.GIB_MIB, 1)
    graphs_planned = sum(plan.breakdown_mib.get(k, 0.0) for k in ("cuda_graphs", "kv_conversion", "speculative_draft"))
    return {
        "start": name,
        "model_class": log.model_class,
        "mem_fraction_static": inputs.mem_fraction_static,
        "kv_cache_dtype": log.server_args.get("kv_cache_dtype"),
        "attention": log.server_args.get("attention_backend"),
        "dsa_backends": [log.server_args.get("dsa_prefill_backend"), log.server_args.get("dsa_decode_backend")],
        "cuda_graph_max_bs": plan.inputs["effective_cuda_graph_max_bs"],
        "kv_bytes_per_token": {"planner": inputs.kv_bytes_per_token, "sglang": round(log.kv_bytes_per_token or 0, 1)},
        "kv_tokens": {"planner": plan.kv_tokens, "sglang": tokens, "error_pct": _pct(plan.kv_tokens or 0, tokens)},
        "decode_graph_mib": {
            "planner": round(graphs_planned, 1), "sglang": graphs,
            "of_which_kv_conversion_planner": round(plan.breakdown_mib.get("kv_conversion", 0.0), 1),
            "of_which_speculative_planner": round(plan.breakdown_mib.get("speculative_draft", 0.0), 1),
        },
        "draft_weights_gib": {
            "planner": plan.inputs["effective_draft_weights_gib_per_gpu"], "sglang": log.readings["draft_weights_gib"],
        },
        "free_after_capture_mib": {
            "planner": plan.free_after_start_mib, "sglang": free,
            "error_pct": _pct(plan.free_after_start_mib or 0, free) if free else None,
        },
        "planner_activation_mib": plan.breakdown_mib["activations"],
        "planner_safe": plan.safe,
        "planner_notes": notes + plan.reasons,
        "sglang": log.readings,
        "decode_capture_steps": log.capture_steps,
    }


def glm5_rows(results: Path) -> list[dict[str, Any]]:
    gpu_mib, sm_major = device_gpu(results)
    rows = []
    for path in sorted(results.glob("*/sglang.log")):
        log = startlog.parse(path.read_text(encoding="utf-8", errors="replace"))
        if log.readings["max_total_num_tokens"] is None or log.model_class not in CONFIG_OF_CLASS:
            print(f"planner_vs_sglang: {path}: the start did not get to its memory readings", file=sys.stderr)
            continue
        config = json.loads((results / CONFIG_OF_CLASS[log.model_class]).read_text())
        rows.append(glm5_row(path.parent.name, log, config, gpu_mib, sm_major))
    return sorted(rows, key=lambda r: (r["model_class"], r["kv_cache_dtype"], r["mem_fraction_static"], r["start"]))


def glm5_markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| start | f | KV dtype, attention | KV B/token planner / sglang | KV tokens planner / sglang (error) "
        "| decode graphs MiB planner / sglang | free after capture MiB planner / sglang (error) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        kv, cell, graphs, free = r["kv_tokens"], r["kv_bytes_per_token"], r["decode_graph_mib"], r["free_after_capture_mib"]
        lines.append(
            f"| {r['start']} | {r['mem_fraction_static']} | {r['kv_cache_dtype']}, {r['attention']} "
            f"| {cell['planner']:,} / {cell['sglang']:,.0f} | {kv['planner']:,} / {kv['sglang']:,} ({kv['error_pct']:+.2f} %) "
            f"| {graphs['planner']:,.0f} / {graphs['sglang'] or 0:,.0f} | {free['planner']:,.0f} / {free['sglang'] or 0:,.0f} ({free['error_pct'] or 0:+.1f} %) |"
        )
    return "\n".join(lines)


# --- the tiny Llama (real-sglang.sh): the inventory's planner inputs ------------------------------------
def planner_prediction(inventory: str, host: str, fraction: float) -> dict[str, Any]:
    argv = [sys.executable, "-m", "sglang_deploy.cli", "plan", "-i", inventory, "--host", host,
            "--mem-fraction-static", str(fraction), "--json"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode not in (0, 1):
        raise SystemExit(f"planner_vs_sglang: {' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return dict(json.loads(done.stdout))


def inventory_row(name: str, log: startlog.StartLog, plan: dict[str, Any]) -> dict[str, Any]:
    tokens = log.readings["max_total_num_tokens"]
    left = log.mib("available_gpu_mem_gib")
    pool_end, prefill, decode = log.mib("free_after_pool_gib"), log.mib("free_after_prefill_graphs_gib"), log.mib("free_after_decode_graphs_gib")
    return {
        "start": name,
        "mem_fraction_static": log.readings["mem_fraction_static"],
        "f0_mib": {"planner": plan["inputs"]["free_at_start_mib"], "sglang": log.mib("free_before_load_gib")},
        "kv_tokens": {"planner": plan["kv_tokens"], "sglang": tokens,
                      "error_pct": _pct(plan["kv_tokens"], float(tokens)) if tokens else None},  # fmt: skip
        "free_after_capture_mib": {"planner": plan["free_after_start_mib"], "sglang": left,
                                   "error_mib": round(plan["free_after_start_mib"] - left, 1) if left is not None else None},  # fmt: skip
        "capture_mib": {
            "prefill_graphs": round(pool_end - prefill, 1) if pool_end is not None and prefill is not None else None,
            "decode_graphs": round(prefill - decode, 1) if prefill is not None and decode is not None else None,
            "planner_cuda_graphs": plan["breakdown_mib"]["cuda_graphs"],
        },
        "planner_safe": plan["safe"],
        "sglang": log.readings,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("-i", "--inventory", default="inventory/device")
    parser.add_argument("--host", default="h200", help="inventory host whose planner inputs the tiny Llama's rows use")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args(argv)
    if any((args.results / name).is_file() for name in CONFIG_OF_CLASS.values()):
        rows = glm5_rows(args.results)
        print(glm5_markdown(rows))
    else:
        rows = []
        for path in sorted(args.results.glob("*/sglang.log")):
            log = startlog.parse(path.read_text(encoding="utf-8", errors="replace"))
            if log.readings["mem_fraction_static"] is None or log.readings["max_total_num_tokens"] is None:
                print(f"planner_vs_sglang: {path}: the start did not get to its memory readings", file=sys.stderr)
                continue
            plan = planner_prediction(args.inventory, args.host, float(log.readings["mem_fraction_static"]))
            rows.append(inventory_row(path.parent.name, log, plan))
        rows.sort(key=lambda r: (r["mem_fraction_static"], r["start"]))
        print(json.dumps(rows, indent=2))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
