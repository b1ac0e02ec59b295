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
import json
import math
import os
import re
import stat
import sys
import tempfile
import time
from dataclasses import asdict
from typing import Any, Callable, List, Optional, Sequence

from .serving import endpoint, sglang_launcher, unit_flags
from .gpu import gpufacts
from .fs.files import UnreadableFileError, read_regular_file
from .watch.observe import (
    COMMAND_TIMEOUT_S,
    METRICS_TIMEOUT_S,
    NVIDIA_SMI_TIMEOUT_S,
    Budget,
    generate,
    gpu_check,
    kernel_xids,
    progress,
    run_in_budget,
    unit_state,
    xid_codes,
)
from .watch.model import (
    BUSY,
    CLOCK,
    Config,
    Decision,
    FAILED,
    GIVING_UP,
    GPU_PROBLEM,
    GPU_XID,
    HELD,
    HOUR_S,
    IDLE,
    MAX_SECONDS,
    OK,
    Observation,
    PORT_TAKEN,
    PREFIX,
    REFUSED,
    RESTART,
    RESTART_FAILED,
    RESTART_LOG_MAX,
    SERVICE_NAME,
    STATE_MAX_BYTES,
    State,
    WAITING,
    XID_NEEDS_RESET,
)

# What one tick may take beyond its generation (--timeout): systemctl show, journalctl, systemctl restart
# (10 s each), nvidia-smi's two queries (60 s each), /metrics before and after (10 s each), /proc/net and
# the files (~1 s). Every call gets its own bound or what is left of this, the smaller (Budget).
TICK_EXTRA_S = 3 * COMMAND_TIMEOUT_S + 2 * NVIDIA_SMI_TIMEOUT_S + 2 * METRICS_TIMEOUT_S + 10.0
MASK = "********"
# syslog priorities systemd reads from a "<N>" line prefix when stdout is the journal.
_PRIORITY = {"crit": 2, "err": 3, "warning": 4, "notice": 5, "info": 6}


# -- what one check observes -----------------------------------------------------------------------


# -- who holds the server's port -------------------------------------------------------------------


# -- the server's answers --------------------------------------------------------------------------


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
        done = run_in_budget([config.systemctl, "restart", "--no-block", config.unit], budget)
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
        url = unit_flags.check_url(args.url)
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
