"""The driver step's decision (module_utils/sglang_deploy_host/gpu/driverstate.py) and the
sglang_driver_state module through real Ansible, with a fake modinfo and /proc, /sys files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from sglang_deploy_host.gpu.driverstate import DriverState, decide, parse_proc_version

PROC_580 = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  "
    "(dvs-builder@U16-I3-B03-4-3)  Tue Sep 23 09:47:43 UTC 2025\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
)


def test_the_loaded_version_is_read_from_procs_text() -> None:
    assert parse_proc_version(PROC_580) == "580.95.05"
    assert parse_proc_version("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  Wed Jan 22") == "570.86.15"
    assert parse_proc_version("garbage") is None


def _state(installed: str | None, loaded: str | None, nouveau: bool = False) -> DriverState:
    return DriverState(kernel="6.1.0-40-amd64", installed=installed, loaded=loaded, nouveau_loaded=nouveau)


@pytest.mark.parametrize(
    "state, allowed, can, after, action, words",
    [
        (_state("580.95.05", "580.95.05"), False, True, "", "ok", "is loaded and installed"),
        # A bare host: nothing holds the GPUs, the module is loaded without a reboot.
        (_state("580.95.05", None), False, True, "", "load", "nothing holds the GPUs"),
        (_state("580.95.05", None), False, True, "load", "stop", "modprobe nvidia did not load"),
        (_state("580.95.05", None), True, True, "load", "reboot", "modprobe nvidia did not load"),
        # nouveau or an older driver in the running kernel: only a reboot helps.
        (_state("580.95.05", None, nouveau=True), False, True, "", "stop", "nouveau holds the GPUs"),
        (_state("580.95.05", None, nouveau=True), True, True, "", "reboot", "nouveau holds the GPUs"),
        (_state("580.95.05", "570.86.15"), False, True, "", "stop", "570.86.15 loaded, but 580.95.05 is installed"),
        (_state("580.95.05", "570.86.15"), True, False, "", "stop", "570.86.15 loaded"),  # local connection
        (_state("580.95.05", "570.86.15"), True, True, "", "reboot", "570.86.15 loaded"),
        (_state("580.95.05", "570.86.15"), True, True, "reboot", "stop", "after the reboot, still"),
        (_state(None, None), True, True, "", "reboot", "no nvidia module is installed for the running kernel"),
        (_state(None, None), False, True, "", "stop", "dkms status"),
    ],
)
def test_the_decision(state, allowed, can, after, action, words) -> None:
    decision = decide(state, reboot_allowed=allowed, can_reboot=can, after=after)
    assert decision.step == action
    assert words in decision.reason


def _run_module(tmp_path: Path, modinfo_version: str | None, proc: str | None, nouveau: bool, **args: object) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    modinfo = bin_dir / "modinfo"
    if modinfo_version is None:
        modinfo.write_text("#!/bin/sh\necho 'modinfo: ERROR: Module nvidia not found.' >&2\nexit 1\n")
    else:
        modinfo.write_text(f"#!/bin/sh\n[ \"$*\" = '-F version nvidia' ] || exit 2\necho {modinfo_version}\n")
    modinfo.chmod(0o755)
    proc_file = tmp_path / "proc-version"
    if proc is not None:
        proc_file.write_text(proc)
    nouveau_dir = tmp_path / "sys-module-nouveau"
    if nouveau:
        nouveau_dir.mkdir(exist_ok=True)
    module_args = {"proc_version": str(proc_file), "nouveau": str(nouveau_dir), **args}
    (tmp_path / "hosts.yml").write_text(
        f"all:\n  hosts:\n    gpu-01:\n      ansible_connection: local\n      ansible_python_interpreter: {sys.executable}\n"
    )
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_STDOUT_CALLBACK": "json",
        "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-local"),
        "ANSIBLE_REMOTE_TEMP": str(tmp_path / "ansible-remote"),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
    }
    argv = [str(Path(sys.executable).with_name("ansible")), "gpu-01", "-i", str(tmp_path / "hosts.yml"),
            "-m", "sglang_driver_state", "-a", json.dumps(module_args), "--check"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, check=False)
    assert done.stdout.startswith("{"), done.stdout + done.stderr
    [play] = json.loads(done.stdout)["plays"]
    [task] = play["tasks"]
    return task["hosts"]["gpu-01"]


def test_the_module_reads_a_host_that_needs_a_reboot(tmp_path: Path) -> None:
    result = _run_module(tmp_path, "580.95.05", PROC_580.replace("580.95.05", "570.86.15"), False)
    assert result["state"]["installed"] == "580.95.05" and result["state"]["loaded"] == "570.86.15"
    assert result["step"] == "stop" and not result["changed"]


def test_the_module_loads_on_a_bare_host_and_is_ok_when_the_versions_match(tmp_path: Path) -> None:
    assert _run_module(tmp_path, "580.95.05", None, False)["step"] == "load"
    assert _run_module(tmp_path, "580.95.05", PROC_580, False)["step"] == "ok"


def test_the_module_says_when_no_module_is_built_for_this_kernel(tmp_path: Path) -> None:
    result = _run_module(tmp_path, None, None, True, reboot_allowed=True)
    assert result["state"]["installed"] is None and result["state"]["nouveau_loaded"] is True
    assert result["step"] == "reboot"
    assert os.uname().release in result["reason"]


KERNEL_PLAY = """
- name: The nvidia_driver role's kernel step, on a host whose files the test wrote
  hosts: gpu-01
  gather_facts: false
  module_defaults:
    sglang_driver_state:
      proc_version: {proc}
      nouveau: {nouveau}
  tasks:
    - name: Kernel module steps
      ansible.builtin.include_role:
        name: nvidia_driver
        tasks_from: kernel.yml
      vars:
        nvidia_driver_secure_boot_check: false
        nvidia_driver_reboot_allowed: true
    - name: Report
      ansible.builtin.debug:
        msg: "loaded={{{{ __nvidia_driver_loaded }}}}"
"""


def _run_kernel_step(tmp_path: Path, loaded: str) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "modinfo").write_text("#!/bin/sh\necho 580.95.05\n")
    (bin_dir / "modinfo").chmod(0o755)
    (tmp_path / "proc-version").write_text(PROC_580.replace("580.95.05", loaded))
    (tmp_path / "play.yml").write_text(
        KERNEL_PLAY.format(proc=tmp_path / "proc-version", nouveau=tmp_path / "no-nouveau")
    )
    (tmp_path / "hosts.yml").write_text(
        f"all:\n  hosts:\n    gpu-01:\n      ansible_connection: local\n      ansible_python_interpreter: {sys.executable}\n"
    )
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-local"),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
    }
    argv = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(tmp_path / "hosts.yml"),
            str(tmp_path / "play.yml")]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False)


def test_the_role_stops_a_host_whose_kernel_runs_the_old_driver_with_the_fix(tmp_path: Path) -> None:
    """Over a local connection nothing is rebooted, even when allowed: the host stops, named, with the fix."""
    done = _run_kernel_step(tmp_path, loaded="570.86.15")
    assert done.returncode == 2, done.stdout
    out = " ".join(done.stdout.split())
    assert "host gpu-01: the running kernel has nvidia 570.86.15 loaded, but 580.95.05 is installed" in out
    assert "reboot it" in out and "then run again" in out and "never over a local connection" in out
    assert "loaded=" not in out  # nothing after the driver step ran


def test_the_role_carries_on_when_the_kernel_runs_the_installed_driver(tmp_path: Path) -> None:
    done = _run_kernel_step(tmp_path, loaded="580.95.05")
    assert done.returncode == 0, done.stdout
    assert "loaded=True" in done.stdout
