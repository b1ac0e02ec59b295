"""The watchdog on a serving host (molecule/sglang_endpoint, and over https molecule/sglang_tls: the real
sglang unit runs the HTTP stand-in, nvidia-smi is the fixture stand-in): its units valid and hardened, and what it does,
tick by tick, started by hand (`systemctl start`, as its timer would): a healthy server is left
alone; a server whose /health keeps answering 200 while nothing is generated is restarted after
sglang_server_watchdog_failures ticks, with one journal line; a lost GPU is reported, never
answered with a restart. Runs last in the scenario: it restarts the unit."""

from __future__ import annotations

import json
import re
import shlex
import time

import pytest

from pathlib import Path

from sglang_deploy_host import interp
from sglang_deploy_host.serving import systemd

SOURCE = Path(__file__).resolve().parents[2] / "module_utils" / "sglang_deploy_host"
WATCHDOG = "sglang-watchdog"
UNIT_DIR = "/etc/systemd/system"
MODE_FILE = "/run/sglang-standin-mode"  # molecule/sglang_endpoint host_vars: SGLANG_STANDIN_MODE_FILE
STANDIN_CONF = "/etc/nvidia-smi-standin.conf"
FIXTURES = "/opt/nvidia-smi-fixtures"
STATE_FILE = f"/var/lib/{WATCHDOG}/state.json"
# The host_vars' sglang_server_watchdog_failures.
FAILURES = 2
# `systemd-analyze security` of the watchdog service (0 = locked down, 10 = unprotected); it runs as
# root (systemctl restart, the 0600 env file) without any capability.
MAX_EXPOSURE = 3.0


def _show(host, unit: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    out = host.run(f"systemctl show -p ActiveState -p InvocationID -p NRestarts -p MainPID {unit}").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _tick(host, says: bool = True) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    """One check, as the timer starts it: the exit status and the watchdog's lines of that run.
    journald reads a unit's stdout on its own schedule: a check that ``says`` something is waited for
    (bounded), after `journalctl --sync`."""
    cursor = re.search(r"-- cursor: (\S+)", host.run("journalctl -q -n 1 --show-cursor -o cat --no-pager").stdout)
    done = host.run(f"systemctl start {WATCHDOG}.service")
    after = f"--after-cursor={shlex.quote(cursor.group(1))}" if cursor else ""  # s=...;i=...: quoted
    deadline = time.monotonic() + (10 if says else 0)
    while True:
        host.run("journalctl --sync")
        lines = host.run(f"journalctl -q -u {WATCHDOG}.service {after} -o cat --no-pager").stdout
        said = "\n".join(line for line in lines.splitlines() if line.startswith("sglang-watchdog:"))
        if said or time.monotonic() > deadline:
            return done.rc, said
        time.sleep(0.5)


def _state(host) -> dict:  # type: ignore[no-untyped-def]
    return json.loads(host.run(f"cat {STATE_FILE}").stdout)


def _health(host) -> str:  # type: ignore[no-untyped-def]
    """GET /health_generate as the watchdog's own unit reaches the server (its --url, and its --cafile for
    an https one: molecule/sglang_tls), from the host; the status, or Python's error."""
    words = systemd.exec_start_argv(host.file(f"{UNIT_DIR}/{WATCHDOG}.service").content_string)
    url = words[words.index("--url") + 1]
    cafile = words[words.index("--cafile") + 1] if "--cafile" in words else None
    probe = (
        "import ssl, sys, urllib.request as u; "
        "c = ssl.create_default_context(cafile=sys.argv[2]) if sys.argv[2] else None; "
        "print(u.urlopen(sys.argv[1] + '/health_generate', timeout=10, context=c).status)"
    )
    return host.run("python3 -c %s %s %s", probe, url, cafile or "").stdout.strip()


def _wait(what: str, check, seconds: float = 90) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {seconds:.0f}s")
        time.sleep(1)


@pytest.fixture()
def server_ready(host):  # type: ignore[no-untyped-def]
    """The server generating in its launch mode, the GPUs idle, before and after the test."""
    host.run(f"rm -f {MODE_FILE}")
    _wait("the server answers /health_generate", lambda: _health(host) == "200")
    yield
    host.run(f"rm -f {MODE_FILE}")
    host.run(f"printf 'NVIDIA_SMI_FIXTURE_DIR={FIXTURES}/rtx-pro-6000-8gpu-passthrough\\n' > {STANDIN_CONF}")


def test_the_watchdog_units_verify_and_are_hardened(host) -> None:  # type: ignore[no-untyped-def]
    for suffix in ("service", "timer"):
        unit = host.file(f"{UNIT_DIR}/{WATCHDOG}.{suffix}")
        assert (unit.user, unit.group, unit.mode) == ("root", "root", 0o644)
        assert unit.content_string.startswith("#"), "the unit starts with ansible_managed"
        verify = host.run(f"systemd-analyze verify --man=no {UNIT_DIR}/{WATCHDOG}.{suffix} 2>&1")
        assert verify.rc == 0 and verify.stdout.strip() == "", verify.stdout
    security = host.run(f"systemd-analyze security --no-pager {WATCHDOG}.service 2>&1").stdout
    level = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", security)
    assert level and float(level.group(1)) <= MAX_EXPOSURE, security[-2500:]
    assert host.run(f"systemctl is-active {WATCHDOG}.timer").stdout.strip() == "active"
    assert host.run(f"systemctl is-enabled {WATCHDOG}.timer").stdout.strip() == "enabled"


def test_the_installed_program_is_the_projects_own(host) -> None:  # type: ignore[no-untyped-def]
    """The watchdog and the modules it imports (interp.package_closure), each the checkout's own file."""
    package = "/usr/local/libexec/sglang-deploy/python/sglang_deploy_host"
    names = host.run(f"cd {package} && find . -name '*.py' -printf '%P\\n'").stdout.split()
    closure = {name.replace(".", "/") + ".py" for name in interp.package_closure("watchdog")}
    assert set(names) == closure and {"watchdog.py", "serving/endpoint.py", "gpu/gpufacts.py"} <= closure, names
    for name in names:
        installed = host.file(f"{package}/{name}")
        assert (installed.user, installed.mode) == ("root", 0o644), name
        assert installed.content == (SOURCE / name).read_bytes(), name


def test_a_healthy_server_is_left_alone(host, server_ready) -> None:  # type: ignore[no-untyped-def]
    before = _show(host, "sglang.service")
    results = [_tick(host, says=False) for _ in range(FAILURES + 1)]
    assert [rc for rc, _ in results] == [0] * (FAILURES + 1), results
    after = _show(host, "sglang.service")
    assert (after["InvocationID"], after["NRestarts"], after["MainPID"]) == (
        before["InvocationID"], before["NRestarts"], before["MainPID"])  # fmt: skip
    assert "RESTART" not in "\n".join(lines for _, lines in results)
    state = _state(host)
    assert (state["last_result"], state["failures"], state["generated_invocation"]) == ("OK", 0, before["InvocationID"])


def test_a_server_that_stops_generating_is_restarted_once(host, server_ready) -> None:  # type: ignore[no-untyped-def]
    before = _show(host, "sglang.service")
    host.run(f"printf 'stall\\n' > {MODE_FILE}")
    assert _health(host) == "200", "in stall mode /health_generate still answers 200 (the case the watchdog is for)"
    first_rc, first = _tick(host)
    assert first_rc == 1 and f"sglang-watchdog: CHECK FAILED: 1/{FAILURES}: sglang.service did not generate" in first, first
    assert "no complete answer within 3 s" in first
    assert _show(host, "sglang.service")["InvocationID"] == before["InvocationID"], "one failure is not enough"
    rc, lines = _tick(host)
    restart = next((line for line in lines.splitlines() if line.startswith("sglang-watchdog: RESTART: ")), "")
    assert rc == 1 and f"sglang.service failed {FAILURES} checks in a row" in restart, lines
    print(f"the watchdog's restart line: {restart}")
    _wait("the restart", lambda: _show(host, "sglang.service")["InvocationID"] != before["InvocationID"], 60)
    # The new process ignores the mode file (a restart clears a hung scheduler): it loads, then generates.
    _wait("the restarted server answers /health_generate", lambda: _health(host) == "200")
    again_rc, again = _tick(host)
    assert again_rc == 0 and "sglang-watchdog: OK: sglang.service generates again" in again, again
    state = _state(host)
    # It generates again; the back-off starts over only after sglang_server_watchdog_stable_sec of generating.
    assert state["last_result"] == "OK" and state["restarts"] == 1 and state["restarts_total"] >= 1, state
    assert _show(host, "sglang.service")["ActiveState"] == "active"


def test_a_busy_server_is_not_restarted(host, server_ready) -> None:  # type: ignore[no-untyped-def]
    """/generate times out as in stall, but sglang's token counters keep moving (a long prefill): BUSY, once,
    and nothing restarted however many ticks (the stand-in's busy mode; the unit runs with --enable-metrics)."""
    before = _show(host, "sglang.service")
    host.run(f"printf 'busy\\n' > {MODE_FILE}")
    results = [_tick(host, says=n == 0) for n in range(FAILURES + 2)]
    assert [rc for rc, _ in results] == [0] * (FAILURES + 2), results
    assert "sglang-watchdog: BUSY: sglang.service did not answer the check" in results[0][1], results[0][1]
    assert "RESTART" not in "\n".join(lines for _, lines in results)
    assert _show(host, "sglang.service")["InvocationID"] == before["InvocationID"]
    assert _state(host)["last_result"] == "BUSY"


def test_the_metrics_file_is_node_exporters_and_the_state_is_private(host) -> None:  # type: ignore[no-untyped-def]
    prom = host.file(f"/var/lib/{WATCHDOG}/sglang-watchdog.prom")
    assert (prom.user, prom.mode) == ("root", 0o644) and 'sglang_watchdog_giving_up{unit="sglang.service"} 0' in prom.content_string
    assert (host.file(STATE_FILE).user, host.file(STATE_FILE).mode) == ("root", 0o600)


def test_a_lost_gpu_is_reported_and_not_restarted(host, server_ready) -> None:  # type: ignore[no-untyped-def]
    before = _show(host, "sglang.service")
    host.run(f"printf 'NVIDIA_SMI_FIXTURE_DIR={FIXTURES}/rtx-pro-6000-8gpu-lost\\n' > {STANDIN_CONF}")
    host.run(f"printf 'stall\\n' > {MODE_FILE}")  # nothing is generated either: still no restart
    results = [_tick(host, says=n == 0) for n in range(FAILURES + 2)]
    assert [rc for rc, _ in results] == [1] * (FAILURES + 2), results
    first = results[0][1]
    assert "sglang-watchdog: GPU PROBLEM: 7 usable GPU(s) of 8 listed, 8 expected" in first, first
    assert "GPU is lost" in first and "Not restarting sglang.service" in first
    assert all("GPU PROBLEM" not in lines for _, lines in results[1:]), "reported once, not every tick"
    assert "RESTART" not in "\n".join(lines for _, lines in results)
    assert _show(host, "sglang.service")["InvocationID"] == before["InvocationID"]
    assert _state(host)["last_result"] == "GPU PROBLEM"
