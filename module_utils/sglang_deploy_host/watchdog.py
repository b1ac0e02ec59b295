"""The serving host's watchdog: one check of the sglang unit per timer tick, and what to do about it.

STDLIB ONLY, Python >= 3.9. The sglang_server role installs this package's files the watchdog needs
(library/sglang_host_files.py) and a systemd timer runs, every ``--interval`` seconds::

    python3 -m sglang_deploy_host.watchdog check --unit sglang.service --url http://127.0.0.1:8000 \\
        --env-file /etc/sglang/sglang.env --api-key-env SGLANG_API_KEY --expected-gpus 8 ...

Why: sglang's ``/health_generate`` can keep answering 200 after its scheduler died, and GPUs
passed through to a VM have been seen to hang after long load until the host resets them. So one
check is:

1. the unit's state (``systemctl show``): a unit that is not active is left to systemd;
2. the GPUs (``nvidia-smi``, gpufacts' parser): it answers, at least ``--expected-gpus`` usable GPUs,
   no health problem; and the kernel log since the last check (``journalctl -k``) for NVIDIA Xid
   errors. A GPU problem is reported, never answered with a restart: a restart cannot bring a GPU
   back, and a restart loop on a dead GPU only hides it;
3. a real generation: ``POST /generate`` of a few tokens at temperature 0 with the API key (read
   here from the unit's 0600 environment file, bounded, never in an argv or a log line), within
   ``--timeout`` seconds; it passes with one token or more.

The watchdog holds the API key, so it is the most careful client there is:

* **the key goes only to the watched server.** Port 8000 is unprivileged: while the unit loads its model
  (minutes) nothing of sglang's listens, and any local user could bind the port first and receive the key
  with the next check. Before a request, the listening sockets that would take a connection to ``--url``
  (``/proc/net/tcp`` and ``tcp6``: the address or a wildcard, the port) must all belong to the unit's
  user (``--service-user``; a socket's owner is the user of the process that made it, and no other
  local user can make one as that user). Anything else on the port is PORT TAKEN: the key is not sent,
  nothing is restarted (the server cannot bind a port that is taken), and the line names the owner;
* **the key is masked** (every form the launcher masks: raw, repr, JSON, URL-encoded) in every line it
  writes, whatever the line quotes: a proxy or a squatter that echoes the request cannot put it in
  the journal;
* **every outside answer is bounded**: systemctl, journalctl and nvidia-smi run with a deadline and a
  byte cap (gpufacts.run_bounded; killed with what they started past either), the HTTP client has a total
  deadline and a body cap, files are read only when regular and small; the whole tick runs inside
  ``--timeout`` + :data:`TICK_EXTRA_S`, below the unit's ``TimeoutStartSec=`` (the resolver adds a margin);
* **a bad state starts afresh** with one line (not JSON, a directory at its path, a field of the wrong
  type, NaN, a restart time in the future after a clock step).

After ``--failures`` failed generations in a row the unit is restarted (``systemctl restart
--no-block``), with a back-off between restarts (``--backoff-initial`` doubling up to
``--backoff-max``). A flapping server (it generates once after each restart, then hangs) does not
reset the back-off: only ``--stable`` seconds of generating do, and at most ``--max-restarts-per-hour``
restarts happen in any hour; past that it is GIVING UP (a critical line, and
``sglang_watchdog_giving_up 1`` in ``--metrics-file`` for node_exporter's textfile collector) until
the hour's oldest restart ages out. A busy server is not a dead one: sglang's ``/metrics`` (no key
needed) is read before the generation and, when it fails, after it; a server whose token counters
(``sglang:realtime_tokens_total``: prefill and decode) moved while the check waited is BUSY, not failed. A server that has not
generated since it started is given ``--start-grace`` seconds (its model load) before its failures
count. Answers that a restart cannot fix (401/403: the key; other 4xx) are reported, not counted.

Every decision is one journal line starting with :data:`PREFIX` and a word doctor's rules match
(src/sglang_deploy/observe/doctor_rules.yml): OK, WAITING, BUSY, CHECK FAILED, RESTART, RESTART HELD, RESTART
FAILED, GIVING UP, GPU PROBLEM, GPU XID, REFUSED, PORT TAKEN, IDLE. While healthy it is silent (its state
says when it last checked). Its state (failures in a row, restarts, their times) is a JSON file in the
unit's StateDirectory=.

Exit status: 0 healthy (or nothing to watch), 1 the check failed, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import math
import os
import pwd
import re
import stat
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple
from urllib.parse import urlsplit

from . import endpoint, gpufacts, sglang_launcher
from .files import UnreadableFileError, read_regular_file

PREFIX = "sglang-watchdog:"
# The words after PREFIX, one per kind of decision (doctor_rules.yml matches them).
OK, WAITING, FAILED, RESTART, HELD, RESTART_FAILED = "OK", "WAITING", "CHECK FAILED", "RESTART", "RESTART HELD", "RESTART FAILED"
GPU_PROBLEM, GPU_XID, REFUSED, IDLE = "GPU PROBLEM", "GPU XID", "REFUSED", "IDLE"
BUSY, GIVING_UP, PORT_TAKEN, CLOCK = "BUSY", "GIVING UP", "PORT TAKEN", "CLOCK"
GENERATE_PATH = "/generate"
GENERATE_PROMPT = "Say OK."
GENERATE_MAX_NEW_TOKENS = 4
STATE_MAX_BYTES = 64 * 1024
# Kernel log lines read per check: an Xid storm is reported by its first lines, and a kernel line is
# at most ~1 KiB (printk), so this bounds what journalctl hands back.
KERNEL_LOG_LINES = 1000
# Each outside command's own bound (the tick's deadline may cut it shorter) and what it may print.
COMMAND_TIMEOUT_S = 10.0
COMMAND_MAX_BYTES = 4 * 1024 * 1024
NVIDIA_SMI_TIMEOUT_S = 60.0
METRICS_TIMEOUT_S = 10.0
# What one tick may take beyond its generation (--timeout): systemctl show, journalctl, systemctl restart
# (10 s each), nvidia-smi's two queries (60 s each), /metrics before and after (10 s each), /proc/net and
# the files (~1 s). Every call gets its own bound or what is left of this, the smaller (Budget).
TICK_EXTRA_S = 3 * COMMAND_TIMEOUT_S + 2 * NVIDIA_SMI_TIMEOUT_S + 2 * METRICS_TIMEOUT_S + 10.0
# /proc/net/tcp{,6} lists every socket of the host, ~150 bytes each: read at most this much of each.
PROC_NET_MAX_BYTES = 64 * 1024 * 1024
# Restart times kept in the state (the hourly cap needs the last hour's).
RESTART_LOG_MAX = 64
HOUR_S = 3600.0
# The largest value any duration or count of the CLI may take (a year of seconds): beyond is a typo.
MAX_SECONDS = 365 * 24 * 3600.0
MASK = "********"
# NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors): codes after which the GPU needs a reset
# (or the host a reboot) before it computes again; restarting sglang cannot help.
# 48 double-bit ECC, 79 fallen off the bus, 95 uncontained ECC, 119/120 GSP RPC timeout / GSP error,
# 154 recovery action changed (reset or reboot required).
XID_NEEDS_RESET = frozenset({48, 79, 95, 119, 120, 154})
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f:.]+)\): (\d+)")
# syslog priorities systemd reads from a "<N>" line prefix when stdout is the journal.
_PRIORITY = {"crit": 2, "err": 3, "warning": 4, "notice": 5, "info": 6}
KEY_FIX = (
    "the API key in the unit's env file and the server's must be the same: run the role again "
    "(it writes both), then `systemctl restart` the server if it still runs with an old key"
)
REQUEST_FIX = (
    "the server refuses the watchdog's request (POST /generate, text and sampling_params as sglang's native "
    "API takes them): check that --url is an sglang server and its version serves /generate"
)
SERVICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9:_.@-]*\.service")


def unit_name(server_unit: str) -> str:
    """The watchdog's own unit name (without ``.service``/``.timer``) for a server unit name: the
    role names its units so, and ``sglang-deploy doctor -i`` reads that unit's journal too."""
    return f"{server_unit[: -len('.service')] if server_unit.endswith('.service') else server_unit}-watchdog"


@dataclass(frozen=True)
class Config:
    """One check's settings. The numbers have no defaults here: the role's defaults
    (``sglang_server_watchdog_*``) are their only source, and the unit passes every one."""

    unit: str
    url: str
    env_file: Optional[str]
    api_key_env: Optional[str]
    expected_gpus: int
    state_file: str
    failures: int
    backoff_initial_s: float
    backoff_max_s: float
    timeout_s: float
    start_grace_s: float
    # Seconds of generating after which the back-off starts again from its first pause.
    stable_s: float
    max_restarts_per_hour: int
    # The unit's User=: the only owner a socket on the server's port may have before the key is sent.
    service_user: str
    visible_devices: Optional[str] = None
    metrics_file: Optional[str] = None
    # The CA an https server's certificate is verified with (the unit's --ssl-ca-certs); "" = plain HTTP.
    cafile: str = ""
    nvidia_smi: str = gpufacts.DEFAULT_NVIDIA_SMI
    journalctl: str = "journalctl"
    systemctl: str = "systemctl"
    proc_net: str = "/proc/net"


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 1_000_000


def _is_time(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _is_text(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= 4096


_OPTIONAL_TEXT = (lambda v: v is None or _is_text(v))
_OPTIONAL_TIME = (lambda v: v is None or _is_time(v))


@dataclass
class State:
    """What the watchdog remembers between ticks (the StateDirectory= file)."""

    failures: int = 0  # failed generations in a row
    restarts: int = 0  # restarts since the server last generated for --stable seconds (the back-off's exponent)
    last_restart: Optional[float] = None  # wall clock of the last restart
    restart_times: List[float] = field(default_factory=list)  # wall clocks of the recent restarts (the hourly cap)
    restarts_total: int = 0  # every restart this watchdog made (the metrics file's counter)
    healthy_since: Optional[float] = None  # wall clock of the first generation of the current good run
    giving_up_until: Optional[float] = None  # wall clock when the hourly cap frees a restart again (None: not given up)
    generated_invocation: Optional[str] = None  # the unit's InvocationID that generated last
    waiting_invocation: Optional[str] = None  # the InvocationID a WAITING line was written for
    last_result: str = ""  # the last decision word
    last_check: Optional[float] = None  # wall clock of the last check (the Xid window starts here)
    last_gpu_problem: str = ""  # the GPU problem reported last ("" when none)
    last_line: str = ""

    # Each field's check: a state file is read back, and whatever wrote it, a wrong value starts afresh.
    _CHECKS = {
        "failures": _is_count, "restarts": _is_count, "restarts_total": _is_count,
        "last_restart": _OPTIONAL_TIME, "healthy_since": _OPTIONAL_TIME, "last_check": _OPTIONAL_TIME,
        "giving_up_until": _OPTIONAL_TIME,
        "restart_times": lambda v: isinstance(v, list) and len(v) <= RESTART_LOG_MAX and all(_is_time(t) for t in v),
        "generated_invocation": _OPTIONAL_TEXT, "waiting_invocation": _OPTIONAL_TEXT,
        "last_result": _is_text, "last_gpu_problem": _is_text, "last_line": _is_text,
    }  # fmt: skip

    @classmethod
    def from_dict(cls, data: Any) -> "State":
        """The state ``data`` holds; ValueError naming the first field that is not of its kind."""
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        known = {f.name for f in fields(cls)}
        for name, value in data.items():
            if name in known and not cls._CHECKS[name](value):
                raise ValueError(f"{name} = {str(value)[:80]!r} is not a value it can hold")
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class UnitState:
    active_state: str
    sub_state: str = ""
    invocation_id: str = ""
    # CLOCK_MONOTONIC seconds when the unit last became active (None: never).
    active_since: Optional[float] = None


@dataclass(frozen=True)
class Generation:
    ok: bool
    what: str
    # A refusal a restart cannot fix (401/403: the API key; another 4xx: the request), and its fix.
    refused: bool = False
    fix: str = ""
    # Something else holds the server's port: the key was not sent (the line names the owner).
    port_taken: bool = False


@dataclass(frozen=True)
class Progress:
    """sglang's token counters from /metrics (``sglang:realtime_tokens_total`` summed over its modes and
    ranks) and its running and queued requests; None where /metrics did not say."""

    tokens: Optional[float] = None
    running: Optional[float] = None
    queued: Optional[float] = None


@dataclass(frozen=True)
class Observation:
    unit: UnitState
    gpu_problems: List[str]
    gpu_summary: str
    xids: List[str] = field(default_factory=list)
    generation: Optional[Generation] = None  # None: not tried (unit idle, or a GPU problem)
    # sglang's counters just before the generation and, when it failed, just after it: a server that
    # works through a long prefill moves them during the check itself.
    progress_before: Progress = field(default_factory=Progress)
    progress: Progress = field(default_factory=Progress)


@dataclass(frozen=True)
class Decision:
    state: State
    lines: List[tuple]  # (priority, text)
    restart: bool
    status: int


# -- what one check observes -----------------------------------------------------------------------
class Budget:
    """The tick's deadline: each outside call gets its own bound or what is left of the tick, the smaller."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock, self.end = clock, clock() + seconds

    def left(self, cap: float) -> float:
        return max(0.0, min(cap, self.end - self.clock()))


def _run(argv: Sequence[str], budget: Budget, cap: float = COMMAND_TIMEOUT_S) -> gpufacts.Output:
    seconds = budget.left(cap)
    if seconds <= 0:
        return gpufacts.Output("", f"{' '.join(argv)}: not run, the tick's time is spent", gpufacts.EXIT_TIMED_OUT)
    return gpufacts.run_bounded(argv, seconds, COMMAND_MAX_BYTES)


def unit_state(config: Config, budget: Optional[Budget] = None) -> UnitState:
    """``systemctl show`` of the unit: active state, invocation, when it became active."""
    done = _run(
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
    done = _run([config.journalctl, "-k", "-q", "--no-pager", "-o", "cat", "-n", str(KERNEL_LOG_LINES), *window],
                budget or Budget(COMMAND_TIMEOUT_S))  # fmt: skip
    return [line.strip()[:1000] for line in done.stdout.splitlines()[:KERNEL_LOG_LINES] if _XID.search(line)]


def xid_codes(lines: Sequence[str]) -> List[tuple]:
    """(PCI address, Xid code) of each Xid line, in order, each pair once."""
    found: List[tuple] = []
    for line in lines:
        match = _XID.search(line)
        if match and (match.group(1), int(match.group(2))) not in found:
            found.append((match.group(1), int(match.group(2))))
    return found


# -- who holds the server's port -------------------------------------------------------------------
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
        who = ", ".join(f"{endpoint.url_host(address)}:{port} by {_user_name(uid)}" for address, uid in strangers)
        return Generation(
            False,
            f"the port is held by someone other than {config.service_user} ({who}): the API key is not sent to it",
            True, f"find it with `ss -ltnp 'sport = :{port}'`, stop it, then `systemctl restart {config.unit}`",
            port_taken=True,
        )  # fmt: skip
    if not held:
        return Generation(False, f"nothing listens on {host}:{port} yet (the key is sent only to {config.service_user}'s socket)")
    return None


# -- the server's answers --------------------------------------------------------------------------
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


# -- the decision ----------------------------------------------------------------------------------
def backoff_s(config: Config, restarts: int) -> float:
    """The pause after restart number ``restarts`` (1, 2, ...) before another: initial, doubled, capped."""
    if restarts < 1:
        return 0.0
    return min(config.backoff_initial_s * (2 ** min(restarts - 1, 32)), config.backoff_max_s)


def restarts_in_the_last_hour(state: State, now: float) -> List[float]:
    return [t for t in state.restart_times if now - HOUR_S < t <= now]


def decide(config: Config, state: State, seen: Observation, now: float, mono: float) -> Decision:
    """What to do about one observation; pure (the caller runs the restart and writes the lines)."""
    new = State(**{**asdict(state), "restart_times": list(state.restart_times)})
    new.last_check = now
    lines: List[tuple] = []
    unit = config.unit

    def say(priority: str, word: str, text: str) -> None:
        lines.append((priority, f"{PREFIX} {word}: {text}"))
        new.last_line = lines[-1][1]

    # A clock stepped back (NTP, a VM restored) leaves times in the future: they would hold a restart for as
    # long as the step. Taken as now: the back-off runs from here.
    future = [*(x for x in (state.last_restart, state.healthy_since) if x is not None), *state.restart_times]
    if any(t > now + 60 for t in future) or (state.giving_up_until or 0) > now + HOUR_S:  # the latter lies ahead by design
        new.giving_up_until = None
        say("warning", CLOCK, f"times in the state lie in the future (the clock was set back): taken as now ({now:.0f})")
        new.last_restart = min(state.last_restart, now) if state.last_restart is not None else None
        new.healthy_since = min(state.healthy_since, now) if state.healthy_since is not None else None
        new.restart_times = [min(t, now) for t in state.restart_times]
    codes = xid_codes(seen.xids)
    reset_xids = [f"Xid {code} on {pci}" for pci, code in codes if code in XID_NEEDS_RESET]
    if codes:
        listed = ", ".join(f"Xid {code} on {pci}" for pci, code in codes)
        say("warning", GPU_XID, f"the kernel logged {listed} since the last check ({seen.xids[0][:300]})")
    if seen.unit.active_state != "active":
        new.failures = 0
        if state.last_result != IDLE:
            say("info", IDLE, f"{unit} is {seen.unit.active_state}: nothing to watch (systemd and the role start it)")
        new.last_result = IDLE
        return Decision(new, lines, False, 0)
    problems = list(seen.gpu_problems) + [f"the kernel logged {x}: the GPU needs a reset" for x in reset_xids]
    if problems:
        text = "; ".join(problems)
        if text != state.last_gpu_problem or state.last_result != GPU_PROBLEM:
            say(
                "err", GPU_PROBLEM,
                f"{text} ({seen.gpu_summary}). Not restarting {unit}: a restart cannot bring a GPU back. "
                f"Fix: {gpufacts.HEALTH_FIX.removeprefix('Fix: ')}",
            )  # fmt: skip
        new.last_gpu_problem = text
        new.last_result = GPU_PROBLEM
        return Decision(new, lines, False, 1)
    new.last_gpu_problem = ""
    generation = seen.generation
    assert generation is not None, "a generation is tried whenever the unit is active and the GPUs are fine"
    invocation = seen.unit.invocation_id
    if generation.ok:
        if state.last_result != OK:
            after = f" again after {state.last_result}" if state.last_result else ""
            say("notice", OK, f"{unit} generates{after}: {generation.what}; {seen.gpu_summary}")
        # The back-off starts over only after --stable seconds of generating: a server that generates once
        # after each restart and then hangs again keeps its back-off.
        new.healthy_since = new.healthy_since if state.last_result == OK and new.healthy_since is not None else now
        if new.restarts and now - new.healthy_since >= config.stable_s:
            say("notice", OK, f"{unit} has generated for {now - new.healthy_since:.0f}s: the restart back-off starts over")
            new.restarts = 0
        new.failures, new.last_result = 0, OK
        new.generated_invocation = invocation
        return Decision(new, lines, False, 0)
    new.healthy_since = None
    if generation.port_taken:
        new.failures = 0
        if state.last_result != PORT_TAKEN or generation.what not in state.last_line:
            say("err", PORT_TAKEN, f"{unit}: {generation.what}. Not restarting: the server cannot bind a port that is "
                                   f"taken. Fix: {generation.fix}")  # fmt: skip
        new.last_result = PORT_TAKEN
        return Decision(new, lines, False, 1)
    if generation.refused:
        new.failures = 0
        say("err", REFUSED, f"{unit}: {generation.what}. Not restarting: a restart does not change this. Fix: {generation.fix}")
        new.last_result = REFUSED
        return Decision(new, lines, False, 1)
    # A busy server is not a dead one: its token counters moved while the check waited for its answer (the
    # counters before and after the failed generation: the watchdog's own earlier generations do not count).
    tokens, since = seen.progress.tokens, seen.progress_before.tokens
    if tokens is not None and since is not None and tokens > since:
        new.failures = 0
        running = "" if seen.progress.running is None else f", {seen.progress.running:.0f} running"
        queued = "" if seen.progress.queued is None else f", {seen.progress.queued:.0f} queued"
        if state.last_result != BUSY:  # once per busy spell
            say("notice", BUSY, f"{unit} did not answer the check ({generation.what}), but it is working: "
                                f"{tokens - since:.0f} tokens during the check{running}{queued}. Not counted")  # fmt: skip
        new.last_result = BUSY
        return Decision(new, lines, False, 0)
    up_s = mono - seen.unit.active_since if seen.unit.active_since is not None else None
    if invocation != state.generated_invocation and up_s is not None and up_s < config.start_grace_s:
        if state.waiting_invocation != invocation:
            say("info", WAITING, f"{unit} started {up_s:.0f}s ago and has not generated yet ({generation.what}); "
                                 f"its failures count after {config.start_grace_s:.0f}s or once it has generated")  # fmt: skip
        new.waiting_invocation, new.failures, new.last_result = invocation, 0, WAITING
        return Decision(new, lines, False, 0)
    new.failures = state.failures + 1
    if new.failures < config.failures:
        say("warning", FAILED, f"{new.failures}/{config.failures}: {unit} did not generate: {generation.what} "
                               f"({seen.gpu_summary}); a restart after {config.failures} in a row")  # fmt: skip
        new.last_result = FAILED
        return Decision(new, lines, False, 1)
    recent = restarts_in_the_last_hour(new, now)
    new.restart_times = recent
    if len(recent) >= config.max_restarts_per_hour:
        again = min(recent) + HOUR_S - now
        if state.giving_up_until is None or now >= state.giving_up_until:  # once per hold, however it flaps meanwhile
            new.giving_up_until = min(recent) + HOUR_S
            say("crit", GIVING_UP, f"{unit} failed {new.failures} checks in a row (last: {generation.what}) after "
                                   f"{len(recent)} restarts in the last hour (the most sglang_server_watchdog_max_restarts_per_hour "
                                   f"allows): not restarting it again for {again:.0f}s. Fix: read its journal "
                                   f"(journalctl -u {unit}) and `sglang-deploy doctor`; restart it by hand once fixed")  # fmt: skip
        new.last_result = GIVING_UP
        return Decision(new, lines, False, 1)
    wait = backoff_s(config, new.restarts)
    last = new.last_restart
    if last is not None and now - last < wait:
        left = wait - (now - last)
        say("err", HELD, f"{unit} failed {new.failures} checks in a row (last: {generation.what}), but it was "
                         f"restarted {now - last:.0f}s ago (restart {new.restarts}; back-off {wait:.0f}s): "
                         f"the next restart in {left:.0f}s at the earliest")  # fmt: skip
        new.last_result = HELD
        return Decision(new, lines, False, 1)
    new.restarts = new.restarts + 1
    new.restarts_total = state.restarts_total + 1
    new.last_restart = now
    new.restart_times = (recent + [now])[-RESTART_LOG_MAX:]
    new.failures = 0
    new.generated_invocation = None
    new.last_result = RESTART
    say("err", RESTART, f"{unit} failed {config.failures} checks in a row (last: {generation.what}; {seen.gpu_summary}): "
                        f"systemctl restart {unit} (back-off restart {new.restarts}; the next one "
                        f"{backoff_s(config, new.restarts):.0f}s after this at the earliest; {len(new.restart_times)} of "
                        f"{config.max_restarts_per_hour} this hour)")  # fmt: skip
    return Decision(new, lines, True, 1)


# -- state file ------------------------------------------------------------------------------------
def load_state(path: str) -> "tuple[State, Optional[str]]":
    """The state, and why it was started afresh (None when it was read or did not exist): anything but a
    regular file of at most STATE_MAX_BYTES holding a state whose every field is of its kind."""
    try:
        data = json.loads(read_regular_file(path, STATE_MAX_BYTES).decode("utf-8"))
        return State.from_dict(data), None
    except FileNotFoundError:
        return State(), None
    except (OSError, UnreadableFileError, ValueError, TypeError) as err:
        return State(), f"state file {path} unreadable ({str(err)[:200]}): starting afresh"


def _set_aside(path: str) -> None:
    """Move what is at ``path`` (not a regular file: a directory, a link) aside, so the state can be written."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(info.st_mode):
        os.rename(path, f"{path}.not-state-{int(time.time())}")


def save_state(path: str, state: State) -> None:
    """Atomically: a tick that is killed leaves the old state or the new one."""
    _set_aside(path)
    _write_file(path, json.dumps(asdict(state), indent=1, sort_keys=True), 0o600)


def _write_file(path: str, text: str, mode: int) -> None:
    directory = os.path.dirname(path) or "."
    handle, temporary = tempfile.mkstemp(prefix=".watchdog.", dir=directory)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            os.fchmod(out.fileno(), mode)
            out.write(text)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def metrics_text(config: Config, state: State, now: float) -> str:
    """node_exporter textfile collector lines: what the alert SglangWatchdogGivingUp and a dashboard read."""
    unit = config.unit.replace("\\", "").replace('"', "")
    label = f'{{unit="{unit}"}}'
    rows = [
        ("sglang_watchdog_giving_up", "gauge", "1 while the watchdog has given up restarting the unit (its hourly cap)",
         int(state.giving_up_until is not None and now < state.giving_up_until)),
        ("sglang_watchdog_restarts_total", "counter", "restarts the watchdog made", state.restarts_total),
        ("sglang_watchdog_restarts_last_hour", "gauge", "restarts in the last hour", len(restarts_in_the_last_hour(state, now))),
        ("sglang_watchdog_failures", "gauge", "failed checks in a row", state.failures),
        ("sglang_watchdog_last_check_timestamp_seconds", "gauge", "when the watchdog last checked", round(now, 3)),
    ]  # fmt: skip
    return "".join(f"# HELP {name} {text}\n# TYPE {name} {kind}\n{name}{label} {value}\n" for name, kind, text, value in rows)


# -- one tick --------------------------------------------------------------------------------------
def emit(priority: str, text: str, secrets: Sequence[str] = ()) -> None:
    """One line on stdout, every form of each secret masked (whatever the line quotes: an echoed request);
    under systemd (JOURNAL_STREAM) with its syslog priority prefix."""
    for secret in secrets:
        for form in sglang_launcher.secret_forms(secret):
            text = text.replace(form.decode("utf-8"), MASK)
    prefix = f"<{_PRIORITY[priority]}>" if os.environ.get("JOURNAL_STREAM") else ""
    print(prefix + text.replace("\n", " "), flush=True)


def observe(config: Config, state: State, api_key: str, budget: Budget) -> Observation:
    unit = unit_state(config, budget)
    xids = kernel_xids(config, state.last_check, budget)
    if unit.active_state != "active":
        return Observation(unit, [], "GPUs not checked", xids)
    problems, summary = gpu_check(config, budget=budget)
    if problems or any(code in XID_NEEDS_RESET for _pci, code in xid_codes(xids)):
        return Observation(unit, problems, summary, xids)
    before = progress(config, budget)
    generation = generate(config, api_key)
    after = before if generation.ok or generation.refused else progress(config, budget)
    return Observation(unit, [], summary, xids, generation, before, after)


def check(config: Config) -> int:
    """One tick: observe, decide, act, remember, say. The exit status of the decision."""
    budget = Budget(config.timeout_s + TICK_EXTRA_S)
    state, afresh = load_state(config.state_file)
    api_key = endpoint.api_key_from_env_file(config.env_file, config.api_key_env or "")
    secrets = [api_key] if api_key else []
    if afresh:
        emit("warning", f"{PREFIX} {afresh}", secrets)
    decision = decide(config, state, observe(config, state, api_key, budget), time.time(), time.monotonic())
    for priority, text in decision.lines:
        emit(priority, text, secrets)
    if decision.restart:
        done = _run([config.systemctl, "restart", "--no-block", config.unit], budget)
        if done.rc:
            decision.state.last_result = RESTART_FAILED
            emit("err", f"{PREFIX} {RESTART_FAILED}: systemctl restart {config.unit} exited {done.rc}: "
                        f"{' '.join(done.stderr.split())[:300]}", secrets)  # fmt: skip
    save_state(config.state_file, decision.state)
    if config.metrics_file:
        try:
            _set_aside(config.metrics_file)
            _write_file(config.metrics_file, metrics_text(config, decision.state, time.time()), 0o644)
        except OSError as err:
            emit("warning", f"{PREFIX} cannot write {config.metrics_file} ({err.strerror}): the alert cannot see this tick")
    return decision.status


def _bounded(kind: Callable[[str], Any], low: float, high: float) -> Callable[[str], Any]:
    """An argument type: a finite number from ``low`` to ``high`` (NaN, inf and a typo's 1e30 refused)."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text}: must be a number from {low:g} to {high:g}")
        return value

    return parse


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m sglang_deploy_host.watchdog", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("check", help="one check of the unit (what the timer runs)")
    seconds, small = _bounded(float, 1, MAX_SECONDS), _bounded(int, 1, 1000)
    run.add_argument("--unit", required=True, help="the server's unit, e.g. sglang.service")
    run.add_argument("--url", required=True, help="the server's base URL from this host, e.g. http://127.0.0.1:8000")
    run.add_argument("--env-file", help="the unit's 0600 EnvironmentFile= holding the API key (read here)")
    run.add_argument("--api-key-env", help="the key's variable in --env-file (none: no key)")
    run.add_argument("--service-user", required=True, help="the unit's User=: the only owner the server's socket may have")
    run.add_argument("--expected-gpus", type=_bounded(int, 0, 1024), required=True, help="usable GPUs the server needs")
    run.add_argument("--visible-devices", help="the unit's CUDA_VISIBLE_DEVICES, if it sets one")
    run.add_argument("--state-file", required=True, help="the watchdog's state (in its StateDirectory=)")
    run.add_argument("--metrics-file", help="node_exporter textfile collector file the watchdog writes (optional)")
    run.add_argument("--cafile", default="", help="the CA an https server's certificate is verified with (PEM)")
    # No defaults: the role's sglang_server_watchdog_* are the only source, and its unit passes each.
    settings = run.add_argument_group("settings (the unit passes each from sglang_server_watchdog_*)")
    settings.add_argument("--failures", type=small, required=True, help="failed checks in a row before a restart")
    settings.add_argument("--backoff-initial", type=seconds, required=True, help="pause after the first restart (s)")
    settings.add_argument("--backoff-max", type=seconds, required=True, help="longest pause between restarts (s)")
    settings.add_argument("--stable", type=seconds, required=True, help="seconds of generating that start the back-off over")
    settings.add_argument("--max-restarts-per-hour", type=small, required=True, help="restarts in any hour before it gives up")
    settings.add_argument("--timeout", type=_bounded(float, 1, 3600), required=True, help="the generation's deadline (s)")
    settings.add_argument("--start-grace", type=_bounded(float, 0, MAX_SECONDS), required=True,
                          help="seconds a started server may take to generate")  # fmt: skip
    run.add_argument("--nvidia-smi", default=gpufacts.DEFAULT_NVIDIA_SMI, help="nvidia-smi to run")
    args = parser.parse_args(argv)
    if not SERVICE_NAME.fullmatch(args.unit):
        parser.error(f"--unit {args.unit!r} is not a service unit name")
    if not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", args.service_user):
        parser.error(f"--service-user {args.service_user!r} is not a user name")
    try:
        url = endpoint.check_url(args.url)
    except ValueError as err:
        parser.error(str(err))
    config = Config(
        unit=args.unit, url=url, env_file=args.env_file, api_key_env=args.api_key_env,
        expected_gpus=args.expected_gpus, visible_devices=args.visible_devices, state_file=args.state_file,
        failures=args.failures, backoff_initial_s=args.backoff_initial, backoff_max_s=max(args.backoff_max, args.backoff_initial),
        timeout_s=args.timeout, start_grace_s=args.start_grace, stable_s=args.stable,
        max_restarts_per_hour=args.max_restarts_per_hour, service_user=args.service_user,
        metrics_file=args.metrics_file, cafile=args.cafile, nvidia_smi=args.nvidia_smi,
    )  # fmt: skip
    try:
        return check(config)
    except ValueError as err:  # the env file or the CA file (endpoint names it)
        emit("err", f"{PREFIX} {REFUSED}: {err}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
