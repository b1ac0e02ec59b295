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

After ``--failures`` failed generations in a row the unit is restarted (``systemctl restart
--no-block``), with a back-off between restarts (``--backoff-initial`` doubling up to
``--backoff-max``) that resets once the server generates again. A server that has not generated
since it started is given ``--start-grace`` seconds (its model load) before its failures count.
Answers that a restart cannot fix (401/403: the key; other 4xx) are reported, not counted.

Every decision is one journal line starting with :data:`PREFIX` and a word doctor's rules match
(src/sglang_deploy/doctor_rules.yml): OK, WAITING, CHECK FAILED, RESTART, RESTART HELD, RESTART
FAILED, GPU PROBLEM, GPU XID, REFUSED, IDLE. While healthy it is silent (its state says when it
last checked). Its state (failures in a row, restarts, the last restart's time) is a JSON file in
the unit's StateDirectory=.

Exit status: 0 healthy (or nothing to watch), 1 the check failed, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Dict, List, Optional, Sequence

from . import endpoint, gpufacts
from .files import UnreadableFileError, read_regular_file

PREFIX = "sglang-watchdog:"
# The words after PREFIX, one per kind of decision (doctor_rules.yml matches them).
OK, WAITING, FAILED, RESTART, HELD, RESTART_FAILED = "OK", "WAITING", "CHECK FAILED", "RESTART", "RESTART HELD", "RESTART FAILED"
GPU_PROBLEM, GPU_XID, REFUSED, IDLE = "GPU PROBLEM", "GPU XID", "REFUSED", "IDLE"
GENERATE_PATH = "/generate"
GENERATE_PROMPT = "Say OK."
GENERATE_MAX_NEW_TOKENS = 4
STATE_MAX_BYTES = 64 * 1024
# Kernel log lines read per check: an Xid storm is reported by its first lines, and a kernel line is
# at most ~1 KiB (printk), so this bounds what journalctl hands back.
KERNEL_LOG_LINES = 1000
COMMAND_TIMEOUT_S = 30.0
# NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors): codes after which the GPU needs a reset
# (or the host a reboot) before it computes again; restarting sglang cannot help.
# 48 double-bit ECC, 79 fallen off the bus, 95 uncontained ECC, 119/120 GSP RPC timeout / GSP error,
# 154 recovery action changed (reset or reboot required).
XID_NEEDS_RESET = frozenset({48, 79, 95, 119, 120, 154})
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f:.]+)\): (\d+)")
# syslog priorities systemd reads from a "<N>" line prefix when stdout is the journal.
_PRIORITY = {"err": 3, "warning": 4, "notice": 5, "info": 6}
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
    unit: str
    url: str
    env_file: Optional[str]
    api_key_env: Optional[str]
    expected_gpus: int
    state_file: str
    visible_devices: Optional[str] = None
    failures: int = 3
    backoff_initial_s: float = 300.0
    backoff_max_s: float = 3600.0
    timeout_s: float = 60.0
    start_grace_s: float = 2400.0
    nvidia_smi: str = gpufacts.DEFAULT_NVIDIA_SMI
    journalctl: str = "journalctl"
    systemctl: str = "systemctl"


@dataclass
class State:
    """What the watchdog remembers between ticks (the StateDirectory= file)."""

    failures: int = 0  # failed generations in a row
    restarts: int = 0  # restarts since the server last generated (the back-off's exponent)
    last_restart: Optional[float] = None  # wall clock of the last restart
    generated_invocation: Optional[str] = None  # the unit's InvocationID that generated last
    waiting_invocation: Optional[str] = None  # the InvocationID a WAITING line was written for
    last_result: str = ""  # the last decision word
    last_check: Optional[float] = None  # wall clock of the last check (the Xid window starts here)
    last_gpu_problem: str = ""  # the GPU problem reported last ("" when none)
    last_line: str = ""

    @classmethod
    def from_dict(cls, data: Any) -> "State":
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        known = {f.name for f in fields(cls)}
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


@dataclass(frozen=True)
class Observation:
    unit: UnitState
    gpu_problems: List[str]
    gpu_summary: str
    xids: List[str] = field(default_factory=list)
    generation: Optional[Generation] = None  # None: not tried (unit idle, or a GPU problem)


@dataclass(frozen=True)
class Decision:
    state: State
    lines: List[tuple]  # (priority, text)
    restart: bool
    status: int


# -- what one check observes -----------------------------------------------------------------------
def unit_state(config: Config, run: Callable[..., "subprocess.CompletedProcess[str]"] = subprocess.run) -> UnitState:
    """``systemctl show`` of the unit: active state, invocation, when it became active."""
    done = run(
        [config.systemctl, "show", config.unit, "-p", "ActiveState", "-p", "SubState", "-p", "InvocationID",
         "-p", "ActiveEnterTimestampMonotonic"],
        capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        return UnitState("unknown", f"systemctl show exited {done.returncode}: {' '.join(done.stderr.split())[:300]}")
    props = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    since = props.get("ActiveEnterTimestampMonotonic", "0")
    return UnitState(
        props.get("ActiveState", "unknown"),
        props.get("SubState", ""),
        props.get("InvocationID", ""),
        int(since) / 1e6 if since.isdigit() and int(since) > 0 else None,
    )


def gpu_check(config: Config, runner: Optional[Callable[[Sequence[str]], gpufacts.Output]] = None) -> "tuple[List[str], str]":
    """Problems with the GPUs the server needs (empty when none), and a one-line summary."""
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


def kernel_xids(config: Config, since: Optional[float]) -> List[str]:
    """NVIDIA Xid lines of the kernel log since ``since`` (wall clock; None: this boot), at most
    KERNEL_LOG_LINES lines read. A journal that cannot be read gives no lines (and no verdict)."""
    window = ["--since", f"@{int(since)}"] if since else ["-b"]
    try:
        done = subprocess.run(
            [config.journalctl, "-k", "-q", "--no-pager", "-o", "cat", "-n", str(KERNEL_LOG_LINES), *window],
            capture_output=True, text=True, errors="replace", timeout=COMMAND_TIMEOUT_S, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in done.stdout.splitlines() if _XID.search(line)]


def xid_codes(lines: Sequence[str]) -> List[tuple]:
    """(PCI address, Xid code) of each Xid line, in order, each pair once."""
    found: List[tuple] = []
    for line in lines:
        match = _XID.search(line)
        if match and (match.group(1), int(match.group(2))) not in found:
            found.append((match.group(1), int(match.group(2))))
    return found


def generate(config: Config, api_key: str) -> Generation:
    """One tiny real generation; passes with at least one token."""
    client = endpoint.Endpoint(config.url, api_key=api_key, timeout=config.timeout_s)
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
        return Generation(False, f"{what}: HTTP 200 but no token generated (completion_tokens={tokens!r}) in {took:.1f}s")
    return Generation(True, f"{what}: {tokens} token(s) in {took:.1f}s")


# -- the decision ----------------------------------------------------------------------------------
def backoff_s(config: Config, restarts: int) -> float:
    """The pause after restart number ``restarts`` (1, 2, ...) before another: initial, doubled, capped."""
    if restarts < 1:
        return 0.0
    return min(config.backoff_initial_s * (2 ** min(restarts - 1, 32)), config.backoff_max_s)


def decide(config: Config, state: State, seen: Observation, now: float, mono: float) -> Decision:
    """What to do about one observation; pure (the caller runs the restart and writes the lines)."""
    new = State(**asdict(state))
    new.last_check = now
    lines: List[tuple] = []
    unit = config.unit

    def say(priority: str, word: str, text: str) -> None:
        lines.append((priority, f"{PREFIX} {word}: {text}"))
        new.last_line = lines[-1][1]

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
        new.failures, new.restarts, new.last_result = 0, 0, OK
        new.generated_invocation = invocation
        return Decision(new, lines, False, 0)
    if generation.refused:
        new.failures = 0
        say("err", REFUSED, f"{unit}: {generation.what}. Not restarting: a restart does not change this. Fix: {generation.fix}")
        new.last_result = REFUSED
        return Decision(new, lines, False, 1)
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
    wait = backoff_s(config, state.restarts)
    if state.last_restart is not None and now - state.last_restart < wait:
        left = wait - (now - state.last_restart)
        say("err", HELD, f"{unit} failed {new.failures} checks in a row (last: {generation.what}), but it was "
                         f"restarted {now - state.last_restart:.0f}s ago (restart {state.restarts}; back-off {wait:.0f}s): "
                         f"the next restart in {left:.0f}s at the earliest")  # fmt: skip
        new.last_result = HELD
        return Decision(new, lines, False, 1)
    new.restarts = state.restarts + 1
    new.last_restart = now
    new.failures = 0
    new.generated_invocation = None
    new.last_result = RESTART
    say("err", RESTART, f"{unit} failed {config.failures} checks in a row (last: {generation.what}; {seen.gpu_summary}): "
                        f"systemctl restart {unit} (restart {new.restarts} since it last generated; the next one "
                        f"{backoff_s(config, new.restarts):.0f}s after this at the earliest)")  # fmt: skip
    return Decision(new, lines, True, 1)


# -- state file ------------------------------------------------------------------------------------
def load_state(path: str) -> "tuple[State, Optional[str]]":
    """The state, and why it was started afresh (None when it was read or did not exist)."""
    try:
        data = json.loads(read_regular_file(path, STATE_MAX_BYTES).decode("utf-8"))
        return State.from_dict(data), None
    except FileNotFoundError:
        return State(), None
    except (OSError, UnreadableFileError, ValueError, TypeError) as err:
        return State(), f"state file {path} unreadable ({err}): starting afresh"


def save_state(path: str, state: State) -> None:
    """Atomically: a tick that is killed leaves the old state or the new one."""
    directory = os.path.dirname(path) or "."
    handle, temporary = tempfile.mkstemp(prefix=".state.", dir=directory)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(asdict(state), out, indent=1, sort_keys=True)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


# -- one tick --------------------------------------------------------------------------------------
def emit(priority: str, text: str) -> None:
    """One line on stdout; under systemd (JOURNAL_STREAM) with its syslog priority prefix."""
    prefix = f"<{_PRIORITY[priority]}>" if os.environ.get("JOURNAL_STREAM") else ""
    print(prefix + text, flush=True)


def observe(config: Config, state: State) -> Observation:
    unit = unit_state(config)
    xids = kernel_xids(config, state.last_check)
    if unit.active_state != "active":
        return Observation(unit, [], "GPUs not checked", xids)
    problems, summary = gpu_check(config)
    if problems or any(code in XID_NEEDS_RESET for _pci, code in xid_codes(xids)):
        return Observation(unit, problems, summary, xids)
    return Observation(unit, [], summary, xids, generate(config, endpoint.api_key_from_env_file(config.env_file, config.api_key_env or "")))


def check(config: Config) -> int:
    """One tick: observe, decide, act, remember, say. The exit status of the decision."""
    state, afresh = load_state(config.state_file)
    if afresh:
        emit("warning", f"{PREFIX} {afresh}")
    decision = decide(config, state, observe(config, state), time.time(), time.monotonic())
    for priority, text in decision.lines:
        emit(priority, text)
    if decision.restart:
        try:
            done = subprocess.run(
                [config.systemctl, "restart", "--no-block", config.unit],
                capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False,
            )  # fmt: skip
            failed = f"exited {done.returncode}: {' '.join(done.stderr.split())[:300]}" if done.returncode else ""
        except (OSError, subprocess.TimeoutExpired) as err:
            failed = str(err)
        if failed:
            decision.state.last_result = RESTART_FAILED
            emit("err", f"{PREFIX} {RESTART_FAILED}: systemctl restart {config.unit} {failed}")
    save_state(config.state_file, decision.state)
    return decision.status


def _positive(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text}: must be > 0")
        return value

    return parse


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m sglang_deploy_host.watchdog", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("check", help="one check of the unit (what the timer runs)")
    run.add_argument("--unit", required=True, help="the server's unit, e.g. sglang.service")
    run.add_argument("--url", required=True, help="the server's base URL from this host, e.g. http://127.0.0.1:8000")
    run.add_argument("--env-file", help="the unit's 0600 EnvironmentFile= holding the API key (read here)")
    run.add_argument("--api-key-env", help="the key's variable in --env-file (none: no key)")
    run.add_argument("--expected-gpus", type=int, required=True, help="usable GPUs the server needs")
    run.add_argument("--visible-devices", help="the unit's CUDA_VISIBLE_DEVICES, if it sets one")
    run.add_argument("--state-file", required=True, help="the watchdog's state (in its StateDirectory=)")
    run.add_argument("--failures", type=_positive(int), default=3, help="failed checks in a row before a restart")
    run.add_argument("--backoff-initial", type=_positive(float), default=300.0, help="pause after the first restart (s)")
    run.add_argument("--backoff-max", type=_positive(float), default=3600.0, help="longest pause between restarts (s)")
    run.add_argument("--timeout", type=_positive(float), default=60.0, help="the generation's deadline (s)")
    run.add_argument("--start-grace", type=float, default=2400.0, help="seconds a started server may take to generate")
    run.add_argument("--nvidia-smi", default=gpufacts.DEFAULT_NVIDIA_SMI, help="nvidia-smi to run")
    args = parser.parse_args(argv)
    if not SERVICE_NAME.fullmatch(args.unit):
        parser.error(f"--unit {args.unit!r} is not a service unit name")
    if args.expected_gpus < 0:
        parser.error("--expected-gpus must be >= 0")
    try:
        url = endpoint.check_url(args.url)
    except ValueError as err:
        parser.error(str(err))
    config = Config(
        unit=args.unit, url=url, env_file=args.env_file, api_key_env=args.api_key_env,
        expected_gpus=args.expected_gpus, visible_devices=args.visible_devices, state_file=args.state_file,
        failures=args.failures, backoff_initial_s=args.backoff_initial, backoff_max_s=max(args.backoff_max, args.backoff_initial),
        timeout_s=args.timeout, start_grace_s=args.start_grace, nvidia_smi=args.nvidia_smi,
    )  # fmt: skip
    try:
        return check(config)
    except ValueError as err:  # the env file (endpoint._api_key names it)
        emit("err", f"{PREFIX} {REFUSED}: {err}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
