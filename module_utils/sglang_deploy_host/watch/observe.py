"""What one tick of the watchdog observes (the watchdog program is ``sglang_deploy_host.watchdog``): the server
unit's state, the GPUs (nvidia-smi) and the kernel's Xid lines, who holds the server's port, one generation
through sglang's native ``/generate``, and the server's progress from ``/metrics``. STDLIB ONLY, Python >= 3.9.

Every outside command and request has its own bound and the tick's deadline (:class:`Budget`), whichever is
shorter, and reads at most a bounded amount of what it is handed.
"""

from __future__ import annotations

import ipaddress
import math
import os
import pwd
import re
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple
from urllib.parse import urlsplit

from ..serving import endpoint, unit_flags
from ..gpu import gpufacts
from .model import Config, Generation, Progress, UnitState

# What a tick asks the server: one short generation through sglang's native API.
GENERATE_PATH = "/generate"
GENERATE_PROMPT = "Say OK."
GENERATE_MAX_NEW_TOKENS = 4
# Kernel log lines read per check: an Xid storm is reported by its first lines, and a kernel line is
# at most ~1 KiB (printk), so this bounds what journalctl hands back.
KERNEL_LOG_LINES = 1000
# Each outside command's own bound (the tick's deadline may cut it shorter) and what it may print.
COMMAND_TIMEOUT_S = 10.0
COMMAND_MAX_BYTES = 4 * 1024 * 1024
NVIDIA_SMI_TIMEOUT_S = 60.0
METRICS_TIMEOUT_S = 10.0
# /proc/net/tcp{,6} lists every socket of the host, ~150 bytes each: read at most this much of each.
PROC_NET_MAX_BYTES = 64 * 1024 * 1024
# The kernel's line for an Xid: the GPU's PCI address and the code.
XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f:.]+)\): (\d+)")
# What a refused generation asks the operator to do.
KEY_FIX = (
    "the API key in the unit's env file and the server's must be the same: run the role again "
    "(it writes both), then `systemctl restart` the server if it still runs with an old key"
)
REQUEST_FIX = (
    "the server refuses the watchdog's request (POST /generate, text and sampling_params as sglang's native "
    "API takes them): check that --url is an sglang server and its version serves /generate"
)


class Budget:
    """The tick's deadline: each outside call gets its own bound or what is left of the tick, the smaller."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock, self.end = clock, clock() + seconds

    def left(self, cap: float) -> float:
        return max(0.0, min(cap, self.end - self.clock()))


def run_in_budget(argv: Sequence[str], budget: Budget, cap: float = COMMAND_TIMEOUT_S) -> gpufacts.Output:
    seconds = budget.left(cap)
    if seconds <= 0:
        return gpufacts.Output("", f"{' '.join(argv)}: not run, the tick's time is spent", gpufacts.EXIT_TIMED_OUT)
    return gpufacts.run_bounded(argv, seconds, COMMAND_MAX_BYTES)


def unit_state(config: Config, budget: Optional[Budget] = None) -> UnitState:
    """``systemctl show`` of the unit: active state, invocation, when it became active."""
    done = run_in_budget(
        [config.systemctl, "show", config.unit, "-p", "ActiveState", "-p", "SubState", "-p", "InvocationID",
         "-p", "ActiveEnterTimestampMonotonic"], budget or Budget(COMMAND_TIMEOUT_S),
    )  # fmt: skip
    if done.rc != 0:
        return UnitState("unknown", f"systemctl show exited {done.rc}: {' '.join(done.stderr.split())[:300]}")
    props = dict(line.split("=", 1) for line in done.stdout.splitlines()[:100] if "=" in line)
    since = props.get("ActiveEnterTimestampMonotonic", "0")
    return UnitState(
        props.get("ActiveState", "unknown")[:40],
        props.get("SubState", "")[:40],
        props.get("InvocationID", "")[:64],
        int(since) / 1e6 if since.isdigit() and 0 < int(since) < 10**18 else None,
    )


def gpu_check(
    config: Config, runner: Optional[Callable[[Sequence[str]], gpufacts.Output]] = None, budget: Optional[Budget] = None
) -> "tuple[List[str], str]":
    """Problems with the GPUs the server needs (empty when none), and a one-line summary."""
    if runner is None:
        clock = budget or Budget(2 * NVIDIA_SMI_TIMEOUT_S)

        def runner(args: Sequence[str]) -> gpufacts.Output:
            return gpufacts.run_nvidia_smi(args, config.nvidia_smi, timeout=clock.left(NVIDIA_SMI_TIMEOUT_S))

    facts = gpufacts.collect(nvidia_smi=config.nvidia_smi, runner=runner, p2p=False)
    problems: List[str] = []
    if not facts.nvidia_smi_found:
        problems.append(f"{config.nvidia_smi} is not there (is the NVIDIA driver installed?)")
    problems += gpufacts.health_problems(facts)
    problems += [e for e in facts.errors if e not in problems and not facts.gpus]
    count, how = gpufacts.visible_gpu_count(facts, config.visible_devices)
    if count < config.expected_gpus:
        problems.insert(0, f"{how}, {config.expected_gpus} expected")
    return problems, f"{count} of {config.expected_gpus} expected GPUs usable"


def kernel_xids(config: Config, since: Optional[float], budget: Optional[Budget] = None) -> List[str]:
    """NVIDIA Xid lines of the kernel log since ``since`` (wall clock; None: this boot), at most
    KERNEL_LOG_LINES lines read. A journal that cannot be read gives no lines (and no verdict)."""
    window = ["--since", f"@{int(since)}"] if since else ["-b"]
    done = run_in_budget([config.journalctl, "-k", "-q", "--no-pager", "-o", "cat", "-n", str(KERNEL_LOG_LINES), *window],
                budget or Budget(COMMAND_TIMEOUT_S))  # fmt: skip
    return [line.strip()[:1000] for line in done.stdout.splitlines()[:KERNEL_LOG_LINES] if XID_LINE.search(line)]


def xid_codes(lines: Sequence[str]) -> List[tuple]:
    """(PCI address, Xid code) of each Xid line, in order, each pair once."""
    found: List[tuple] = []
    for line in lines:
        match = XID_LINE.search(line)
        if match and (match.group(1), int(match.group(2))) not in found:
            found.append((match.group(1), int(match.group(2))))
    return found


def _proc_net_address(text: str) -> "ipaddress.IPv4Address | ipaddress.IPv6Address":
    """An address as /proc/net/tcp{,6} writes it: hex, each 32-bit word in the host's (little-endian) order."""
    raw = bytes.fromhex(text)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)


def listeners(host: str, port: int, proc_net: str = "/proc/net") -> List[Tuple[str, int]]:
    """The listening TCP sockets a connection to ``host``:``port`` could reach - bound to that address, to a
    wildcard of its family, or (IPv4) to ``::`` or its IPv4-mapped form - as (address, owner uid), read from
    ``proc_net``/tcp and tcp6 (at most PROC_NET_MAX_BYTES each)."""
    target = ipaddress.ip_address(host)
    found: List[Tuple[str, int]] = []
    for name in ("tcp", "tcp6"):
        try:
            with open(os.path.join(proc_net, name), "rb") as handle:
                text = handle.read(PROC_NET_MAX_BYTES).decode("ascii", "replace")
        except OSError:
            continue
        for line in text.splitlines()[1:]:
            fields_ = line.split()
            if len(fields_) < 8 or fields_[3] != "0A":  # 0A: TCP_LISTEN
                continue
            address, _, port_hex = fields_[1].partition(":")
            try:
                if int(port_hex, 16) != port:
                    continue
                bound = _proc_net_address(address)
                uid = int(fields_[7])
            except ValueError:
                continue
            mapped = getattr(bound, "ipv4_mapped", None)
            reaches = (
                bound == target
                or (bound.is_unspecified and (bound.version == target.version or bound.version == 6))
                or (mapped is not None and mapped == target)
            )
            if reaches:
                found.append((str(bound), uid))
    return found


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def port_owner_problem(config: Config) -> Optional[Generation]:
    """None when every socket that could take a connection to ``config.url`` is the service user's; else
    the Generation (not tried) that says why the key is not sent: nothing listens (the server is not up),
    or someone else holds the port."""
    parts = urlsplit(config.url)
    host, port = (parts.hostname or ""), parts.port or (443 if parts.scheme == "https" else 80)
    try:
        owner_uid = pwd.getpwnam(config.service_user).pw_uid
    except KeyError:
        return Generation(False, f"the service user {config.service_user!r} does not exist: the key is not sent", True,
                          "run the role again (it creates the user)")  # fmt: skip
    try:
        held = listeners(host, port, config.proc_net)
    except ValueError:  # not an IP address: the resolver allows none when the watchdog is enabled
        return Generation(False, f"{host} is not an IP address: cannot tell who listens there; the key is not sent",
                          True, "bind the server to an IP address (sglang_server_flags host)")  # fmt: skip
    strangers = sorted({(address, uid) for address, uid in held if uid != owner_uid})
    if strangers:
        who = ", ".join(f"{unit_flags.url_host(address)}:{port} by {_user_name(uid)}" for address, uid in strangers)
        return Generation(
            False,
            f"the port is held by someone other than {config.service_user} ({who}): the API key is not sent to it",
            True, f"find it with `ss -ltnp 'sport = :{port}'`, stop it, then `systemctl restart {config.unit}`",
            port_taken=True,
        )  # fmt: skip
    if not held:
        return Generation(False, f"nothing listens on {host}:{port} yet (the key is sent only to {config.service_user}'s socket)")
    return None


def generate(config: Config, api_key: str) -> Generation:
    """One tiny real generation; passes with at least one token. Sent only to the service user's socket."""
    taken = port_owner_problem(config)
    if taken is not None:
        return taken
    client = endpoint.Endpoint(config.url, api_key=api_key, timeout=config.timeout_s, cafile=config.cafile)
    payload = {"text": GENERATE_PROMPT, "sampling_params": {"max_new_tokens": GENERATE_MAX_NEW_TOKENS, "temperature": 0}}
    what = f"POST {GENERATE_PATH}"
    started = time.monotonic()
    try:
        answer = client.request("POST", GENERATE_PATH, payload)
    except endpoint.EndpointError as err:
        return Generation(False, str(err))
    took = time.monotonic() - started
    if answer.status in (401, 403):
        return Generation(False, f"{what}: HTTP {answer.status}: the server refuses the API key", True, KEY_FIX)
    if 400 <= answer.status < 500:
        return Generation(False, f"{what}: HTTP {answer.status} {answer.text[:200]!r}", True, REQUEST_FIX)
    if answer.status != 200:
        return Generation(False, f"{what}: HTTP {answer.status} {answer.text[:200]!r}")
    try:
        data = answer.json()
    except endpoint.EndpointError as err:
        return Generation(False, f"{what}: {err}")
    meta = data.get("meta_info") if isinstance(data, dict) else None
    tokens = meta.get("completion_tokens") if isinstance(meta, dict) else None
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
        return Generation(False, f"{what}: HTTP 200 but no token generated (completion_tokens={repr(tokens)[:40]}) in {took:.1f}s")
    return Generation(True, f"{what}: {tokens} token(s) in {took:.1f}s")


_SAMPLE = re.compile(r"^(sglang:(?:realtime_tokens_total|num_running_reqs|num_queue_reqs))(?:\{[^}]*\})?\s+(\S+)")


def parse_progress(exposition: str) -> Progress:
    """sglang's token counters and request gauges in a /metrics page, summed over labels (ranks, modes)."""
    sums: Dict[str, float] = {}
    for line in exposition.splitlines():
        match = _SAMPLE.match(line)
        if not match:
            continue
        try:
            value = float(match.group(2))
        except ValueError:
            continue
        if math.isfinite(value) and value >= 0:
            sums[match.group(1)] = sums.get(match.group(1), 0.0) + value
    return Progress(sums.get("sglang:realtime_tokens_total"), sums.get("sglang:num_running_reqs"), sums.get("sglang:num_queue_reqs"))


def progress(config: Config, budget: Optional[Budget] = None) -> Progress:
    """sglang's counters from /metrics (sglang serves it without the key: none is sent), or an empty
    Progress when it is not served (--enable-metrics off) or does not answer in time."""
    seconds = (budget or Budget(METRICS_TIMEOUT_S)).left(METRICS_TIMEOUT_S)
    if seconds <= 0 or port_owner_problem(config) is not None:
        return Progress()
    try:
        answer = endpoint.Endpoint(config.url, timeout=seconds, cafile=config.cafile).get("/metrics", timeout=seconds)
    except (endpoint.EndpointError, ValueError):
        return Progress()
    return parse_progress(answer.text) if answer.status == 200 else Progress()
