"""NCCL all-reduce check: the collective sglang's tensor parallelism depends on, under a given environment.

Run it ON the GPU box with the server's own interpreter (the ml-env has torch), before trusting a new
NCCL environment or after a driver/topology change::

    sglang-deploy nccl-check -- --env-from-unit sglang --compare-p2p-disable

(that is ``/opt/sglang-deploy/ml-env/bin/python3 -m sglang_deploy_host.gpu.nccl_check ...`` with this
package on the path: it reads unit files with the package's own systemd module).
One process per GPU (``torch.multiprocessing``, NCCL backend, rendezvous on 127.0.0.1). Each rank fills
its buffer with ``rank + 1``; after ``all_reduce(SUM)`` every element must equal ``n(n+1)/2``, so a wrong
transport shows up as a wrong sum, not as a slow benchmark. Bus bandwidth is reported the way
nccl-tests does (``algbw * 2(n-1)/n``). With ``NCCL_DEBUG=INFO`` the script collects the lines where NCCL
says which transport each channel uses (P2P, SHM, NET), so an operator can see whether P2P was tried.

Stdlib + torch only: it runs with the ml-env's interpreter, which has torch but not this project.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..fs import files
from ..serving.systemd import environment

DEFAULT_SIZES_MIB = (1, 16, 128, 512)
# An env file or a rendered unit is kilobytes; what is larger is not one.
ENV_FILE_MAX_BYTES = 1 << 20
# Largest buffer per GPU (MiB): a typo like 1e9 must not try to allocate petabytes.
MAX_SIZE_MIB = 64 * 1024
# Lines in NCCL_DEBUG=INFO output that name the transport chosen between ranks.
_TRANSPORT_LINE = re.compile(r"(via (P2P|SHM|NET)[^\s]*|Connected all rings|Using network \w+)")


@dataclass
class SizeResult:
    size_bytes: int
    correct: bool
    time_us: float
    algbw_gbps: float
    busbw_gbps: float


@dataclass
class VariantResult:
    name: str
    env: dict[str, str]
    world_size: int
    ok: bool
    results: list[SizeResult] = field(default_factory=list)
    transports: list[str] = field(default_factory=list)
    error: str = ""


def env_from_unit(unit: str) -> dict[str, str]:
    """The environment systemd gives ``unit`` (its Environment= lines; EnvironmentFile= holds secrets only)."""
    proc = subprocess.run(
        ["systemctl", "show", "--property=Environment", "--value", unit],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return environment(proc.stdout)


def bus_bandwidth(size_bytes: int, seconds: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for an all-reduce, as nccl-tests defines them."""
    if seconds <= 0:
        return 0.0, 0.0
    algbw = size_bytes / seconds / 1e9
    # One rank moves nothing over a link: nccl-tests reports busbw 0 there too.
    return algbw, algbw * 2 * (world_size - 1) / world_size


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _worker(rank: int, world_size: int, port: int, sizes: list[int], iters: int, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
        device_id=torch.device("cuda", rank),
    )
    expected = world_size * (world_size + 1) / 2
    results = []
    for size in sizes:
        numel = size // 4
        buf = torch.empty(numel, dtype=torch.float32, device="cuda")
        # Warm-up builds the communicator's channels for this size.
        buf.fill_(rank + 1)
        dist.all_reduce(buf)
        correct = bool(torch.all(buf == expected).item())
        torch.cuda.synchronize()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        elapsed = (time.perf_counter() - start) / iters
        results.append({"size_bytes": numel * 4, "correct": correct, "seconds": elapsed})
    dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))


def _run_variant_child(args: argparse.Namespace) -> int:
    """Inside the child process (environment already applied): spawn one worker per GPU."""
    import torch
    import torch.multiprocessing as mp

    world_size = args.gpus or torch.cuda.device_count()
    if world_size < 1:
        print("no CUDA device visible", file=sys.stderr)
        return 2
    sizes = [int(mib * 1024 * 1024) for mib in args.sizes_mib]
    port = _free_port()
    mp.spawn(_worker, args=(world_size, port, sizes, args.iters, args.child_out), nprocs=world_size, join=True)
    per_rank = [json.loads(Path(args.child_out, f"rank{r}.json").read_text()) for r in range(world_size)]
    summary = []
    for i, first in enumerate(per_rank[0]):
        seconds = max(rank[i]["seconds"] for rank in per_rank)
        algbw, busbw = bus_bandwidth(first["size_bytes"], seconds, world_size)
        summary.append(
            asdict(
                SizeResult(
                    size_bytes=first["size_bytes"],
                    correct=all(rank[i]["correct"] for rank in per_rank),
                    time_us=seconds * 1e6,
                    algbw_gbps=algbw,
                    busbw_gbps=busbw,
                )
            )
        )
    Path(args.child_out, "summary.json").write_text(json.dumps({"world_size": world_size, "results": summary}))
    return 0


def run_variant(name: str, env: dict[str, str], args: argparse.Namespace) -> VariantResult:
    """One all-reduce run in a fresh process with exactly ``env`` layered over the current environment."""
    with tempfile.TemporaryDirectory(prefix="nccl-check-") as out_dir:
        child_env = {**os.environ, **env, "NCCL_DEBUG": env.get("NCCL_DEBUG", "INFO")}
        # As a module: it imports the unit-file reader beside it (sglang-deploy nccl-check sets the path).
        cmd = [sys.executable, "-m", __spec__.name, "--_child", out_dir, "--iters", str(args.iters)]
        cmd += ["--sizes-mib", *[str(s) for s in args.sizes_mib]]
        if args.gpus:
            cmd += ["--gpus", str(args.gpus)]
        proc = subprocess.run(cmd, env=child_env, capture_output=True, text=True, timeout=args.timeout, check=False)
        log = proc.stdout + proc.stderr
        transports = sorted({m.group(0) for m in _TRANSPORT_LINE.finditer(log)})
        summary_path = Path(out_dir, "summary.json")
        if proc.returncode != 0 or not summary_path.exists():
            tail = "\n".join(log.splitlines()[-30:])
            return VariantResult(name, env, 0, False, transports=transports, error=f"exit {proc.returncode}\n{tail}")
        summary = json.loads(summary_path.read_text())
        results = [SizeResult(**r) for r in summary["results"]]
        ok = all(r.correct for r in results)
        return VariantResult(name, env, summary["world_size"], ok, results, transports)


def format_variant(result: VariantResult) -> str:
    lines = [f"== {result.name}: world size {result.world_size}, {'OK' if result.ok else 'FAILED'}"]
    nccl_env = {k: v for k, v in result.env.items() if k.startswith("NCCL_") or k == "OMP_NUM_THREADS"}
    lines.append("   env: " + (" ".join(f"{k}={v}" for k, v in sorted(nccl_env.items())) or "(none)"))
    if result.error:
        lines.append("   error: " + result.error)
    lines.append(f"   {'size':>10} {'correct':>8} {'time us':>10} {'algbw GB/s':>11} {'busbw GB/s':>11}")
    for r in result.results:
        lines.append(
            f"   {r.size_bytes / 2**20:>8.0f}Mi {str(r.correct):>8} {r.time_us:>10.1f}"
            f" {r.algbw_gbps:>11.2f} {r.busbw_gbps:>11.2f}"
        )
    if result.transports:
        lines.append("   transports: " + "; ".join(result.transports))
    return "\n".join(lines)


def p2p_counterpart(env: dict[str, str]) -> tuple[str, dict[str, str]]:
    """The same environment with NCCL's P2P transport switched the other way, for comparison."""
    if env.get("NCCL_P2P_DISABLE") == "1":
        allowed = {k: v for k, v in env.items() if k != "NCCL_P2P_DISABLE"}
        return "unit environment without NCCL_P2P_DISABLE (P2P allowed)", allowed
    return "unit environment + NCCL_P2P_DISABLE=1", {**env, "NCCL_P2P_DISABLE": "1"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--env-from-unit", metavar="UNIT", help="use the Environment= of this systemd unit")
    source.add_argument("--env-from-file", metavar="FILE", help="KEY=VALUE lines or a rendered unit file")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="add/override a variable")
    parser.add_argument("--compare-p2p-disable", action="store_true", help="run again with NCCL's P2P switched the other way")
    parser.add_argument("--gpus", type=int, default=0, help="world size (default: every visible GPU)")
    parser.add_argument("--sizes-mib", type=float, nargs="+", default=list(DEFAULT_SIZES_MIB))
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--timeout", type=int, default=600, help="seconds per variant before it is killed")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--_child", dest="child_out", help=argparse.SUPPRESS)
    return parser


class UsageError(ValueError):
    """Arguments or an environment source the check cannot run with (exit 2, one line)."""


def _check_numbers(args: argparse.Namespace) -> None:
    """Sizes, counts and budgets a run can use: no NaN, infinities, zero or negative values."""
    if args.gpus < 0:
        raise UsageError(f"--gpus {args.gpus}: want 0 (every visible GPU) or a GPU count")
    for name in ("iters", "timeout"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} {getattr(args, name)}: want a positive integer")
    for size in args.sizes_mib:
        if not math.isfinite(size) or size <= 0 or size > MAX_SIZE_MIB:
            raise UsageError(f"--sizes-mib {size}: want a size in MiB between 0 and {MAX_SIZE_MIB}")


def _load_env(args: argparse.Namespace) -> dict[str, str]:
    """The environment to check with: from the unit, a file, then --env KEY=VALUE on top."""
    env: dict[str, str] = {}
    if args.env_from_unit:
        try:
            env = env_from_unit(args.env_from_unit)
        except (OSError, subprocess.SubprocessError) as err:
            detail = getattr(err, "stderr", None) or err
            raise UsageError(
                f"--env-from-unit {args.env_from_unit}: systemctl could not show its environment "
                f"({' '.join(str(detail).split())}). Fix: run on the GPU host, or use --env-from-file"
            ) from None
    elif args.env_from_file:
        try:
            text = files.read_regular_file(args.env_from_file, ENV_FILE_MAX_BYTES).decode("utf-8")
        except (OSError, UnicodeDecodeError, files.UnreadableFileError) as err:
            raise UsageError(f"--env-from-file {args.env_from_file}: cannot read it as text ({err})") from None
        env = environment(text)
        if not env:
            raise UsageError(
                f"--env-from-file {args.env_from_file}: no Environment= lines or KEY=VALUE pairs. Fix: "
                "pass the rendered unit (sglang-deploy render) or an env file"
            )
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise UsageError(f"--env {item!r}: expected KEY=VALUE")
        env[key] = value
    return env


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.child_out:
        return _run_variant_child(args)
    try:
        _check_numbers(args)
        env = _load_env(args)
    except UsageError as err:
        print(f"nccl-check: {err}", file=sys.stderr)
        return 2
    variants = [("unit environment", env)]
    if args.compare_p2p_disable:
        variants.append(p2p_counterpart(env))
    results = [run_variant(name, variant_env, args) for name, variant_env in variants]
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
    else:
        print("\n".join(format_variant(r) for r in results))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
