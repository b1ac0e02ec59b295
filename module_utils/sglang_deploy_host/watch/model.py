"""The watchdog's data: its configuration (the timer unit's arguments, checked), the state it keeps between ticks,
what a tick observes and what it decides, and the words its log lines start with (doctor_rules.yml matches
them). STDLIB ONLY, Python >= 3.9; the program is ``sglang_deploy_host.watchdog``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from typing import Any, List, Optional

from ..gpu import gpufacts


PREFIX = "sglang-watchdog:"
# The words after PREFIX, one per kind of decision (doctor_rules.yml matches them).
OK, WAITING, FAILED, RESTART, HELD, RESTART_FAILED = "OK", "WAITING", "CHECK FAILED", "RESTART", "RESTART HELD", "RESTART FAILED"
GPU_PROBLEM, GPU_XID, REFUSED, IDLE = "GPU PROBLEM", "GPU XID", "REFUSED", "IDLE"
BUSY, GIVING_UP, PORT_TAKEN, CLOCK = "BUSY", "GIVING UP", "PORT TAKEN", "CLOCK"
STATE_MAX_BYTES = 64 * 1024
# Restart times kept in the state (the hourly cap needs the last hour's).
RESTART_LOG_MAX = 64
HOUR_S = 3600.0
# The largest value any duration or count of the CLI may take (a year of seconds): beyond is a typo.
MAX_SECONDS = 365 * 24 * 3600.0
# NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors): codes after which the GPU needs a reset
# (or the host a reboot) before it computes again; restarting sglang cannot help.
# 48 double-bit ECC, 79 fallen off the bus, 95 uncontained ECC, 119/120 GSP RPC timeout / GSP error,
# 154 recovery action changed (reset or reboot required).
XID_NEEDS_RESET = frozenset({48, 79, 95, 119, 120, 154})
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
