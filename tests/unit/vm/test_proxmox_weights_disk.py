"""The weights_disk role (library/sglang_weights_disk.py) run by real Ansible on this machine.

The "disk" is a file image: blkid and mkfs work on it without privileges, so finding it by serial (a by-id
directory laid out as udev does), the blank test, formatting once and never again, and the fstab line by
UUID are all real. A file is no block device, so those runs record the fstab line without mounting. The
mount itself runs on a loop device (root and /dev/loop-control needed; CI has both): mounted by UUID at the
models root, then a "rebuild" - a fresh fstab, the same disk - mounts the same filesystem with its file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

from sglang_deploy_host.fs import blockdev

SERIAL = "sglang-weights"
LINK = f"scsi-0QEMU_QEMU_HARDDISK_{SERIAL}"
MIB = 1024 * 1024


def blkid(device: Path) -> dict[str, str]:
    done = subprocess.run(["blkid", "-p", "-o", "export", str(device)], capture_output=True, text=True, check=False)
    return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture()
def tmp_path(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """This module's own tmp_path: a directory in /run, not /tmp. The role creates its mount point and kept
    caches with sglang_directory, which refuses a path through a directory others may write (/tmp is 1777),
    as it would on a host; /run is root's alone."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="sglang-deploy-weights-disk-", dir="/run"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        subprocess.run(["umount", "-R", str(base / "models")], capture_output=True, check=False)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture()
def disk(tmp_path: Path) -> Path:
    """A blank 64 MiB image, linked under by-id by its serial beside the root disk's link."""
    image = tmp_path / "weights.img"
    with image.open("wb") as handle:
        handle.truncate(64 * MIB)
    by_id = tmp_path / "by-id"
    by_id.mkdir()
    (by_id / LINK).symlink_to(image)
    (by_id / f"{LINK}-part1").symlink_to(tmp_path / "nowhere")  # udev's partition links are not the disk
    root = tmp_path / "root.img"
    root.write_bytes(b"\x01" * MIB)
    (by_id / "scsi-0QEMU_QEMU_HARDDISK_drive-scsi0").symlink_to(root)
    return image


def run_role(tmp_path: Path, *extra: str, **role_vars: Any) -> tuple[int, dict[str, Any], str]:
    """The weights_disk role on localhost; returns (rc, the role's task results by name, output)."""
    variables = {
        "weights_disk_serial": SERIAL,
        "weights_disk_by_id_dir": str(tmp_path / "by-id"),
        "weights_disk_mount_point": str(tmp_path / "models"),
        "weights_disk_fstab": str(tmp_path / "fstab"),
        # The data root the role keeps root's is the test's own, not this machine's /var/lib/sglang.
        "sglang_common_data_root": str(tmp_path),
        **role_vars,
    }
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        "- hosts: guest\n  gather_facts: false\n  roles:\n    - role: weights_disk\n"
        f"  vars: {json.dumps(variables)}\n"
    )
    (tmp_path / "hosts.yml").write_text(
        "all:\n  hosts:\n    guest:\n      ansible_connection: local\n"
        f"      ansible_python_interpreter: {sys.executable}\n"
    )
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_STDOUT_CALLBACK": "json",
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-local"),
        "ANSIBLE_CACHE_PLUGIN": "memory",
        "ANSIBLE_NOCOLOR": "1",
    }
    proc = subprocess.run(
        [
            str(Path(sys.executable).with_name("ansible-playbook")),
            str(playbook),
            "-i",
            str(tmp_path / "hosts.yml"),
            *extra,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    data = json.loads(proc.stdout) if proc.stdout.startswith("{") else {}
    results = {
        t["task"]["name"].split(" : ")[-1]: t["hosts"]["guest"] for p in data.get("plays", []) for t in p["tasks"]
    }
    results["stats"] = (data.get("stats") or {}).get("guest", {})
    return proc.returncode, results, proc.stdout + proc.stderr


FIND = "Find the weights disk by its serial and format it only when blank"


def test_a_blank_disk_is_formatted_once_and_recorded_by_uuid(tmp_path: Path, disk: Path) -> None:
    (tmp_path / "fstab").write_text("UUID=1111-2222 / ext4 defaults 0 1\n")
    rc, results, output = run_role(tmp_path)
    assert rc == 0, output
    first = results[FIND]
    assert first["formatted"] and first["changed"] and first["device"] == str(disk) and not first["block_device"]
    signatures = blkid(disk)
    assert (signatures["TYPE"], signatures["LABEL"], signatures["UUID"]) == ("ext4", "sglang-weights", first["uuid"])
    fstab = (tmp_path / "fstab").read_text().splitlines()
    assert fstab[0] == "UUID=1111-2222 / ext4 defaults 0 1"
    assert fstab[1].split() == [
        f"UUID={first['uuid']}",
        str(tmp_path / "models"),
        "ext4",
        "defaults,nofail,noatime,x-systemd.device-timeout=30s",
        "0",
        "0",
    ]
    assert "is not a block device (a test image)" in results["Say that a test image is recorded but not mounted"]["msg"]

    before = digest(disk)
    rc, results, output = run_role(tmp_path)
    assert rc == 0, output
    again = results[FIND]
    assert not again["formatted"] and again["uuid"] == first["uuid"] and results["stats"]["changed"] == 0
    assert digest(disk) == before, "the second run wrote to the disk"


def test_check_mode_formats_nothing(tmp_path: Path, disk: Path) -> None:
    rc, results, output = run_role(tmp_path, "--check")
    assert rc == 0, output
    assert results[FIND]["formatted"] and results[FIND]["changed"]
    assert blkid(disk) == {} and not disk.read_bytes().strip(b"\0")
    assert not (tmp_path / "fstab").exists()


@pytest.mark.parametrize(
    "offset, data, shown",
    [
        (10 * MIB, os.urandom(4096), "non-zero data but no filesystem blkid knows"),
        (0, None, "PTTYPE=dos"),
        (63 * MIB + 1000, b"\x42" * 512, "non-zero data but no filesystem blkid knows"),
    ],
    ids=["data-in-the-middle", "partition-table", "data-at-the-end"],
)
def test_a_disk_with_data_is_never_formatted(
    tmp_path: Path, disk: Path, offset: int, data: bytes | None, shown: str
) -> None:
    with disk.open("r+b") as handle:
        if data is None:  # an MBR with one Linux partition, as fdisk writes it
            entry = bytes([0, 0, 0, 0, 0x83, 0, 0, 0]) + (2048).to_bytes(4, "little") + (4096).to_bytes(4, "little")
            handle.seek(446)
            handle.write(entry)
            handle.seek(510)
            handle.write(b"\x55\xaa")
        else:
            handle.seek(offset)
            handle.write(data)
    before = digest(disk)
    rc, results, output = run_role(tmp_path)
    assert rc != 0
    message = results[FIND]["msg"]
    assert f"host guest: weights disk (serial {SERIAL}): {disk} is not blank ({shown}" in message, message
    assert "refusing to format a disk that holds data" in message and "Nothing was changed" in message
    assert digest(disk) == before and not (tmp_path / "fstab").exists()


def test_another_filesystem_is_used_as_it_is_or_refused(tmp_path: Path, disk: Path) -> None:
    subprocess.run(["mkfs.ext4", "-q", "-F", "-L", "old-weights", str(disk)], check=True)
    uuid, before = blkid(disk)["UUID"], digest(disk)
    rc, results, output = run_role(tmp_path, weights_disk_fstype="xfs")
    assert rc != 0
    assert "holds a ext4 filesystem" in results[FIND]["msg"] and "weights_disk_fstype: ext4" in results[FIND]["msg"]
    assert digest(disk) == before
    rc, results, output = run_role(tmp_path)  # the filesystem it has: kept, label and all
    assert rc == 0, output
    assert results[FIND]["uuid"] == uuid and not results[FIND]["formatted"] and blkid(disk)["LABEL"] == "old-weights"


def test_a_missing_disk_fails_naming_the_serial_and_what_is_there(tmp_path: Path, disk: Path) -> None:
    rc, results, output = run_role(tmp_path, weights_disk_serial="other-serial")
    assert rc != 0
    message = results[FIND]["msg"]
    assert "no disk with serial other-serial under" in message and LINK in message
    assert "weights_disk_serial must be its serial=" in message


def test_without_a_serial_the_models_root_is_left_alone(tmp_path: Path) -> None:
    rc, results, output = run_role(tmp_path, weights_disk_serial="")
    assert rc == 0, output
    assert "stays on the root filesystem" in results["Say that this host keeps its weights on the root disk"]["msg"]
    assert results["stats"]["changed"] == 0 and not (tmp_path / "models").exists()


def _loop_device(image: Path) -> str | None:
    if os.geteuid() != 0 or shutil.which("losetup") is None:
        return None
    done = subprocess.run(["losetup", "--find", "--show", str(image)], capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else None


def test_a_loop_device_is_mounted_by_uuid_and_survives_a_rebuild(tmp_path: Path, disk: Path) -> None:
    device = _loop_device(disk)
    if device is None:
        pytest.skip("needs root and a loop device to mount a block device (the file-image tests above still ran)")
    mount_point = tmp_path / "models"
    try:
        (tmp_path / "by-id" / LINK).unlink()
        (tmp_path / "by-id" / LINK).symlink_to(device)
        rc, results, output = run_role(tmp_path)
        assert rc == 0, output
        uuid = results[FIND]["uuid"]
        assert results[FIND]["formatted"] and results[FIND]["block_device"]
        found = json.loads(
            subprocess.run(
                ["findmnt", "-J", "-o", "SOURCE,FSTYPE,TARGET", str(mount_point)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )["filesystems"][0]
        assert (found["source"], found["fstype"]) == (device, "ext4")
        (mount_point / "weights.safetensors").write_bytes(b"x" * 4096)
        subprocess.run(["umount", str(mount_point)], check=True)

        # The rebuild: a fresh root disk has a fresh fstab; the weights disk is the same.
        (tmp_path / "fstab").unlink()
        rc, results, output = run_role(tmp_path)
        assert rc == 0, output
        assert not results[FIND]["formatted"] and results[FIND]["uuid"] == uuid
        assert (mount_point / "weights.safetensors").read_bytes() == b"x" * 4096
        assert f"UUID={uuid} {mount_point} ext4" in (tmp_path / "fstab").read_text()
    finally:
        subprocess.run(["umount", str(mount_point)], capture_output=True, check=False)
        subprocess.run(["losetup", "-d", device], capture_output=True, check=False)


@pytest.mark.parametrize(
    "variables",
    [
        {"weights_disk_serial": SERIAL + "\n"},
        {"weights_disk_serial": "../" + SERIAL},
        {"weights_disk_serial": "", "weights_disk_wwn": "0x5000c500a1b2c3d4\n"},
    ],
    ids=["serial-lf", "serial-slash", "wwn-lf"],
)
def test_a_serial_or_wwn_is_checked_whole_before_any_lookup(
    tmp_path: Path, disk: Path, variables: dict[str, str]
) -> None:
    """The serial is PVE's serial= of the disk and part of a by-id name: a line break or a slash is never in a
    disk's serial (re.match(...$) took "x\n", and the link below was found and formatted)."""
    (tmp_path / "by-id" / f"{LINK}\n").symlink_to(disk)
    rc, results, output = run_role(tmp_path, **variables)
    assert rc != 0
    assert FIND not in results, "the module looked for the disk"
    message = results["Check the weights disk's serial and WWN"]["msg"]
    assert "weights_disk_serial=" in message and "is not" in message and "Fix:" in message, message
    assert "\n" not in message, message
    assert blkid(disk) == {}, "the disk was touched"


@pytest.mark.parametrize(
    ("serial", "wwn", "expected"),
    [
        (SERIAL + "\n", "", "weights_disk_serial='sglang-weights\\n' is not a disk serial"),
        ("../" + SERIAL, "", "weights_disk_serial='../sglang-weights' is not a disk serial"),
        ("", "0x5000c500a1b2c3d4\n", "weights_disk_wwn='0x5000c500a1b2c3d4\\n' is not a WWN"),
    ],
)
def test_blockdev_finds_by_whole_serials_only(tmp_path: Path, serial: str, wwn: str, expected: str) -> None:
    (tmp_path / "disk").write_bytes(b"")
    (tmp_path / f"scsi-0QEMU_QEMU_HARDDISK_{SERIAL}\n").symlink_to(tmp_path / "disk")
    (tmp_path / "wwn-0x5000c500a1b2c3d4\n").symlink_to(tmp_path / "disk")
    with pytest.raises(blockdev.DiskError) as refused:
        blockdev.find(serial, wwn, str(tmp_path))
    assert expected in str(refused.value)
