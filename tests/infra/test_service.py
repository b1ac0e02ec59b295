"""The running sglang service: active, launched exactly as the inventory renders it, as the
service user, and alone on the GPUs.

test_sglang_unit.py checks the unit *file* (byte-identical to the render, enabled, systemd's parse);
this suite checks the *process* systemd started from it: /proc/<MainPID>/cmdline and environ
against the render, its owner, and that every GPU process belongs to the unit's cgroup.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from pathlib import Path

import pytest

from sglang_deploy_host.serving import systemd

def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@pytest.fixture()
def main_pid(host, unit_name: str) -> int:  # type: ignore[no-untyped-def]
    shown = host.run(f"systemctl show -p ActiveState -p SubState -p MainPID {unit_name}.service").stdout
    props = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
    assert (props.get("ActiveState"), props.get("SubState")) == ("active", "running"), props
    pid = int(props.get("MainPID", "0"))
    assert pid > 0, f"{unit_name}.service has no main process: {props}"
    return pid


def test_service_is_active_and_running(main_pid: int) -> None:
    assert main_pid > 0


def test_process_argv_is_the_rendered_execstart(host, main_pid: int, rendered_dir: Path, unit_name: str) -> None:  # type: ignore[no-untyped-def]
    """Word for word: the launcher, the module, secret flags by variable NAME only, then the flags."""
    expected = systemd.exec_start_argv((rendered_dir / f"{unit_name}.service").read_text())
    actual = host.file(f"/proc/{main_pid}/cmdline").content.decode().split("\0")[:-1]
    assert actual == expected


def _unit_pids(host, unit_name: str) -> list[int]:  # type: ignore[no-untyped-def]
    """Every process in the unit's cgroup (with a host cgroup namespace the path has a prefix)."""
    cgroup = host.run(f"systemctl show -p ControlGroup --value {unit_name}.service").stdout.strip()
    assert cgroup, f"{unit_name}.service has no control group"
    found = host.run(f"grep -l -- {shlex.quote(cgroup + '$')} /proc/[0-9]*/cgroup")
    return [int(path.split("/")[2]) for path in found.stdout.split()]


def test_no_secret_in_any_argv_of_the_unit(host, rendered_dir: Path, unit_name: str, main_pid: int) -> None:  # type: ignore[no-untyped-def]
    """/proc/PID/cmdline is readable by every local user: no process of the unit may carry a value
    of the 0600 env file there (the launcher hands --api-key to sglang inside the process)."""
    secrets = [v for v in systemd.env_file_values((rendered_dir / f"{unit_name}.env").read_text()).values() if v]
    pids = _unit_pids(host, unit_name)
    assert main_pid in pids
    for pid in pids:
        cmdline = host.file(f"/proc/{pid}/cmdline").content.decode(errors="replace")
        assert not any(secret in cmdline for secret in secrets), f"pid {pid}'s argv carries a secret"


def test_no_secret_in_the_journal(host, rendered_dir: Path, unit_name: str, main_pid: int) -> None:  # type: ignore[no-untyped-def]
    """sglang logs its ServerArgs with the API key in clear (the stand-in does as well): the
    launcher masks it before it reaches the journal."""
    secrets = systemd.env_file_values((rendered_dir / f"{unit_name}.env").read_text())
    journal = host.run(f"journalctl -u {unit_name}.service --no-pager -o cat").stdout
    assert "server_args=ServerArgs(" in journal, "the server did not log its arguments"
    for name, secret in secrets.items():
        assert secret not in journal, f"the journal holds the value of {name}"
    if secrets.get("SGLANG_API_KEY"):
        assert "api_key='********'" in journal


def test_process_environment_is_the_rendered_one(host, main_pid: int, rendered_dir: Path, unit_name: str) -> None:  # type: ignore[no-untyped-def]
    environ = host.file(f"/proc/{main_pid}/environ").content.decode(errors="replace").split("\0")
    actual = dict(item.split("=", 1) for item in environ if "=" in item)
    for name, value in systemd.environment((rendered_dir / f"{unit_name}.service").read_text()).items():
        assert actual.get(name) == value, f"{name} in the process differs from the render"
    for name, value in systemd.env_file_values((rendered_dir / f"{unit_name}.env").read_text()).items():
        assert name in actual, f"secret {name} of the env file is missing from the process"
        assert _digest(actual[name]) == _digest(value), f"secret {name} differs from the env file"


def test_main_process_runs_as_the_service_user(host, main_pid: int, service_user: str) -> None:  # type: ignore[no-untyped-def]
    status = host.file(f"/proc/{main_pid}/status").content_string
    uids = re.search(r"^Uid:\s+(\d+)\s+(\d+)\s+(\d+)", status, re.M)
    assert uids, status
    want = host.user(service_user).uid
    assert {int(u) for u in uids.groups()} == {want}, f"real/effective/saved uid {uids.groups()} != {service_user} ({want})"


def test_nothing_else_holds_the_gpus(host, main_pid: int, unit_name: str, request: pytest.FixtureRequest) -> None:  # type: ignore[no-untyped-def]
    """Every process nvidia-smi lists on a GPU belongs to the unit (a stale server would not)."""
    libexec = request.config.getoption("--sglang-libexec-dir")
    facts_run = host.run(f"python3 {libexec}/gpufacts.py facts --json")
    assert facts_run.rc == 0, facts_run.stderr
    facts = json.loads(facts_run.stdout)
    assert facts["gpus"], f"nvidia-smi reports no GPU: {facts.get('errors')}"
    cgroup = host.run(f"systemctl show -p ControlGroup --value {unit_name}.service").stdout.strip()
    assert cgroup, f"{unit_name}.service has no control group"
    foreign = []
    for gpu in facts["gpus"]:
        for proc in gpu["processes"]:
            proc_cgroup = host.run(f"cat /proc/{int(proc['pid'])}/cgroup")
            # With a host cgroup namespace the path carries a prefix: compare the unit's tail.
            paths = [line.split(":", 2)[-1] for line in proc_cgroup.stdout.splitlines()]
            if proc_cgroup.rc != 0 or not any(p == cgroup or p.endswith(cgroup) for p in paths):
                foreign.append(f"GPU {gpu['index']}: pid {proc['pid']} {proc['name']} ({proc['used_memory_mib']} MiB)")
    assert not foreign, "processes outside the sglang unit hold GPUs: " + "; ".join(foreign)
