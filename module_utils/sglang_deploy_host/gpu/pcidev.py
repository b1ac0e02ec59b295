#!/usr/bin/env python3
"""PCI passthrough readiness of a Proxmox node, read from its sysfs: IOMMU on, each GPU bound to vfio-pci,
nothing else in its IOMMU group held by a host driver.

Stdlib only, Python >= 3.9, read-only. The proxmox_vm role runs it on the node over SSH
(library/sglang_pci_vfio.py) before any change, because PVE's API does not say which driver holds a
device. Also a command line:

    python3 -m sglang_deploy_host.gpu.pcidev 0000:41:00.0 0000:42:00.0 [--sysfs /sys] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

VFIO = "vfio-pci"
# Drivers that may hold other functions of a GPU's IOMMU group without blocking passthrough.
GROUP_OK_DRIVERS = frozenset({VFIO, "pcieport", "pci-stub"})
# PCI class codes of bridges, which stay with the host and do not block a group.
BRIDGE_CLASS_PREFIX = "0x0604"


@dataclass
class DeviceState:
    address: str
    present: bool
    driver: str = ""
    vendor_device: str = ""
    iommu_group: str = ""
    group_blockers: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii").strip()
    except OSError:
        return ""


def _link_name(path: Path) -> str:
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return ""


def check(addresses: list[str], sysfs: str = "/sys") -> list[DeviceState]:
    """One DeviceState per address, with what keeps it from passthrough (empty problems: ready)."""
    root = Path(sysfs)
    iommu_on = any((root / "kernel" / "iommu_groups").glob("*"))
    states = []
    for address in addresses:
        dev = root / "bus" / "pci" / "devices" / address
        state = DeviceState(address=address, present=dev.exists())
        if not state.present:
            state.problems.append(f"{address} is not on this node's PCI bus (lspci -D)")
            states.append(state)
            continue
        state.driver = _link_name(dev / "driver")
        vendor, device = _read(dev / "vendor"), _read(dev / "device")
        state.vendor_device = f"{vendor[2:]}:{device[2:]}" if vendor and device else ""
        state.iommu_group = _link_name(dev / "iommu_group")
        if not iommu_on or not state.iommu_group:
            state.problems.append(
                "IOMMU is off (no /sys/kernel/iommu_groups): add intel_iommu=on (Intel) or amd_iommu=on, and iommu=pt, "
                "to the kernel command line and reboot"
            )
        if state.driver != VFIO:
            held = f"bound to {state.driver}" if state.driver else "bound to no driver"
            ids = state.vendor_device or "VENDOR:DEVICE"
            state.problems.append(
                f"{address} is {held}, not {VFIO}: blacklist nouveau and nvidia on the node, add "
                f"'options vfio-pci ids={ids}' to /etc/modprobe.d/vfio.conf and vfio-pci to /etc/modules, "
                "update-initramfs -u -k all, reboot"
            )
        if state.iommu_group:
            for member in sorted((root / "kernel" / "iommu_groups" / state.iommu_group / "devices").glob("*")):
                if member.name == address or _read(member / "class").startswith(BRIDGE_CLASS_PREFIX):
                    continue
                driver = _link_name(member / "driver")
                if driver and driver not in GROUP_OK_DRIVERS:
                    state.group_blockers.append(f"{member.name} ({driver})")
            if state.group_blockers:
                state.problems.append(
                    f"IOMMU group {state.iommu_group} also holds {', '.join(state.group_blockers)}: every endpoint "
                    f"of the group must be passed through or bound to {VFIO} (bind its audio function too)"
                )
        states.append(state)
    return states


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m sglang_deploy_host.gpu.pcidev", description=__doc__.splitlines()[0])
    parser.add_argument("addresses", nargs="+", help="PCI addresses, 0000:41:00.0")
    parser.add_argument("--sysfs", default="/sys")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    states = check(args.addresses, args.sysfs)
    if args.json:
        print(json.dumps([asdict(s) for s in states], indent=2))
    else:
        for state in states:
            verdict = "ready" if not state.problems else "; ".join(state.problems)
            print(f"{state.address} driver={state.driver or '-'} group={state.iommu_group or '-'}: {verdict}")
    return 1 if any(s.problems for s in states) else 0


if __name__ == "__main__":
    sys.exit(main())
