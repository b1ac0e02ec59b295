#!/usr/bin/env python3
"""The guest's weights disk: found by its serial or WWN (never by /dev/sdX), formatted only when blank.

Stdlib only, Python >= 3.9. library/sglang_weights_disk.py runs it on the serving VM (the weights_disk
role, before hf_model). "Blank" is strict, because formatting the weights disk costs hours of download:
blkid finds no filesystem, partition table or RAID/LVM signature, AND the disk reads as zeros - all of it
up to 1 GiB, else its first and last MiB and 1024 MiB-windows spread evenly over it (a fresh PVE volume
reads as zeros; a used disk whose signatures were wiped still has data in many of those places). Anything
else is never formatted. Also a command line:

    python3 -m sglang_deploy_host.fs.blockdev find --serial sglang-weights [--by-id-dir DIR]
    python3 -m sglang_deploy_host.fs.blockdev probe DEVICE
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO

BY_ID = "/dev/disk/by-id"
# What a QEMU disk serial may hold (PVE: url-encoded, at most 20 bytes) and a WWN; matched whole (fullmatch),
# as the serial is both PVE's serial= (library/sglang_pve_plan.py) and part of a by-id name here.
SERIAL = re.compile(r"[A-Za-z0-9_.-]{1,20}")
WWN = re.compile(r"0x[0-9a-fA-F]{16}")
# How udev names a QEMU disk's serial, per bus (virtio-scsi, virtio-blk, SATA, NVMe).
SERIAL_LINKS = ("scsi-0QEMU_QEMU_HARDDISK_{s}", "virtio-{s}", "ata-QEMU_HARDDISK_{s}", "nvme-QEMU_NVMe_Ctrl_{s}")
WINDOW_BYTES = 1024 * 1024
# Disks up to this size are read whole; larger ones in SAMPLES windows plus both ends.
FULL_SCAN_BYTES = 1024**3
SAMPLES = 1024
FSTYPES = ("ext4", "xfs")
TIMEOUT_S = 600


class DiskError(Exception):
    """The disk cannot be found, read or formatted as asked; the message names what to fix."""


@dataclass
class Probe:
    device: str
    signatures: dict[str, str]  # blkid -p -o export: TYPE, UUID, PTTYPE, LABEL, ...
    zero: bool  # every byte read (see the module's docstring for which) is zero

    @property
    def fstype(self) -> str:
        return self.signatures.get("TYPE", "")

    @property
    def uuid(self) -> str:
        return self.signatures.get("UUID", "")

    @property
    def blank(self) -> bool:
        return not self.signatures and self.zero


def find(serial: str = "", wwn: str = "", by_id_dir: str = BY_ID) -> tuple[str, str]:
    """(the by-id link, the device it points at) of the disk with this serial or WWN; exactly one must match."""
    if not serial and not wwn:
        raise DiskError("no serial or WWN to find the weights disk by")
    if serial and not SERIAL.fullmatch(serial):
        raise DiskError(f"weights_disk_serial={serial!r} is not a disk serial (1-20 of A-Z a-z 0-9 _ . -)")
    if wwn and not WWN.fullmatch(wwn):
        raise DiskError(f"weights_disk_wwn={wwn!r} is not a WWN (0x and 16 hex digits)")
    names = [pattern.format(s=serial) for pattern in SERIAL_LINKS] if serial else []
    if wwn:
        names.append(f"wwn-{wwn.lower()}")
    links = [Path(by_id_dir) / name for name in names if (Path(by_id_dir) / name).exists()]
    targets = sorted({os.path.realpath(link) for link in links})
    wanted = f"serial {serial}" if serial else f"WWN {wwn}"
    if not targets:
        present = sorted(p.name for p in Path(by_id_dir).glob("*")) if Path(by_id_dir).is_dir() else []
        raise DiskError(
            f"no disk with {wanted} under {by_id_dir} (it has: {', '.join(present) or 'nothing'}); the VM's weights "
            "disk is missing or has another serial"
        )
    if len(targets) > 1:
        raise DiskError(f"{wanted} names several disks ({', '.join(targets)}); give the weights disk a unique serial")
    return str(links[0]), targets[0]


def blkid(device: str) -> dict[str, str]:
    """Every signature blkid finds on the device itself (low-level probe, no cache); {} for none."""
    tool = shutil.which("blkid") or "/sbin/blkid"
    done = subprocess.run(
        [tool, "-p", "-o", "export", device], capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )
    if done.returncode == 2:  # nothing found
        return {}
    if done.returncode != 0:
        raise DiskError(f"blkid -p {device} failed (rc {done.returncode}): {done.stderr.strip()}")
    pairs = (line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    return {k: v for k, v in pairs if k != "DEVNAME"}


def _zero(handle: BinaryIO, offset: int, size: int) -> bool:
    handle.seek(offset)
    while size > 0:
        chunk = handle.read(min(size, WINDOW_BYTES))
        if not chunk:
            return True
        if chunk.strip(b"\0"):
            return False
        size -= len(chunk)
    return True


def reads_zero(handle: BinaryIO) -> bool:
    """The whole device up to FULL_SCAN_BYTES, else both ends and SAMPLES windows between, read as zeros."""
    end = handle.seek(0, os.SEEK_END)
    if end <= FULL_SCAN_BYTES:
        return _zero(handle, 0, end)
    offsets = [0, end - WINDOW_BYTES] + [i * (end - WINDOW_BYTES) // (SAMPLES + 1) for i in range(1, SAMPLES + 1)]
    return all(_zero(handle, offset, WINDOW_BYTES) for offset in offsets)


def is_block(device: str) -> bool:
    return stat.S_ISBLK(os.stat(device).st_mode)


def probe(device: str) -> Probe:
    with open(device, "rb") as handle:
        zero = reads_zero(handle)
    return Probe(device=device, signatures=blkid(device), zero=zero)


def mkfs(device: str, fstype: str, label: str) -> None:
    """A new filesystem on a device ``probe`` called blank (the caller checks; this does not)."""
    if fstype == "ext4":
        # -m 0: no root reserve on a data disk; lazy init: seconds instead of minutes on a large volume.
        argv = ["mkfs.ext4", "-q", "-F", "-m", "0", "-L", label, "-E", "lazy_itable_init=1,lazy_journal_init=1", device]
    elif fstype == "xfs":
        argv = ["mkfs.xfs", "-q", "-L", label, device]
    else:
        raise DiskError(f"filesystem {fstype!r} is not one of {', '.join(FSTYPES)}")
    tool = shutil.which(argv[0]) or f"/sbin/{argv[0]}"
    done = subprocess.run([tool, *argv[1:]], capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise DiskError(f"{' '.join(argv)} failed (rc {done.returncode}): {done.stderr.strip()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m sglang_deploy_host.fs.blockdev", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    finder = sub.add_parser("find")
    finder.add_argument("--serial", default="")
    finder.add_argument("--wwn", default="")
    finder.add_argument("--by-id-dir", default=BY_ID)
    prober = sub.add_parser("probe")
    prober.add_argument("device")
    args = parser.parse_args(argv)
    try:
        if args.command == "find":
            print(json.dumps(dict(zip(("link", "device"), find(args.serial, args.wwn, args.by_id_dir)))))
        else:
            found = probe(args.device)
            print(json.dumps({**asdict(found), "blank": found.blank}))
    except DiskError as exc:
        print(f"blockdev: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
