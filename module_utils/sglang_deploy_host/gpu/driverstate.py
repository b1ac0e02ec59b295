"""Does the running kernel serve the NVIDIA driver that is installed? And if not, what now?

A first run on a bare host installs the driver; the kernel it runs still has nouveau or an older
nvidia module, so no server can start until the module on disk is the one loaded. The
nvidia_driver role reads the state (``read_state``), asks ``decide`` what to do, loads the module,
reboots, or stops the host with the reason and the fix: never carries on to a server that cannot
start. Stdlib only (it runs on the host, inside the sglang_driver_state module).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, Optional

# /proc/driver/nvidia/version: "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build ..."
_PROC_VERSION = re.compile(r"NVRM version:.*?Kernel Module(?:\s+for\s+\S+)?\s+(\d+(?:\.\d+){1,2})")
_VERSION = re.compile(r"^\d+(?:\.\d+){1,2}$")

# What the role does next.
OK = "ok"          # the installed module is the loaded one
LOAD = "load"      # nothing holds the GPU yet: modprobe the installed module
REBOOT = "reboot"  # only a reboot swaps the loaded module (or nouveau) for the installed one
STOP = "stop"      # a reboot is needed and not allowed here (or did not help): the host stops


@dataclass(frozen=True)
class DriverState:
    """What the host has: the nvidia module on disk for the running kernel, the loaded one."""

    kernel: str
    installed: Optional[str]  # `modinfo -F version nvidia`; None: no module for this kernel
    loaded: Optional[str]  # /proc/driver/nvidia/version; None: no nvidia module loaded
    nouveau_loaded: bool

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Decision:
    step: str  # OK, LOAD, REBOOT or STOP
    reason: str

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


def parse_proc_version(text: str) -> Optional[str]:
    """The driver version of /proc/driver/nvidia/version's text, or None."""
    found = _PROC_VERSION.search(text)
    return found.group(1) if found else None


def read_state(proc_version: Path, nouveau: Path, modinfo: str, kernel: str) -> DriverState:
    """The host's driver state; ``modinfo`` is the program's path ("" when there is none)."""
    try:
        loaded = parse_proc_version(proc_version.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        loaded = None
    installed = None
    if modinfo:
        done = subprocess.run(
            [modinfo, "-F", "version", "nvidia"], capture_output=True, text=True, timeout=60, check=False
        )
        version = done.stdout.strip()
        installed = version if done.returncode == 0 and _VERSION.match(version) else None
    return DriverState(kernel=kernel, installed=installed, loaded=loaded, nouveau_loaded=nouveau.exists())


def decide(state: DriverState, *, reboot_allowed: bool, can_reboot: bool, after: str = "") -> Decision:
    """What to do with ``state``. ``can_reboot``: the connection is not local (never reboot the
    machine Ansible runs on). ``after``: the action already taken ("load" or "reboot"); when the
    state is still wrong after it, the answer is to stop (after a reboot) or to reboot (after a load)."""
    if state.installed is not None and state.loaded == state.installed:
        return Decision(OK, f"nvidia {state.loaded} is loaded and installed for kernel {state.kernel}")
    if state.installed is None:
        why = (
            f"no nvidia module is installed for the running kernel {state.kernel} (modinfo nvidia found none; "
            "DKMS may have built it for a newer kernel only, or failed: see `dkms status`)"
        )
    elif state.loaded is not None:
        why = f"the running kernel has nvidia {state.loaded} loaded, but {state.installed} is installed"
    elif state.nouveau_loaded:
        why = f"nouveau holds the GPUs in the running kernel; nvidia {state.installed} is installed"
    elif after == LOAD:
        why = f"modprobe nvidia did not load the installed nvidia {state.installed} (see `dmesg | grep -i nvrm`)"
    else:
        return Decision(LOAD, f"nothing holds the GPUs: load the installed nvidia {state.installed}")
    if after == REBOOT:
        return Decision(STOP, f"after the reboot, still: {why}")
    if reboot_allowed and can_reboot:
        return Decision(REBOOT, why)
    return Decision(STOP, why)
