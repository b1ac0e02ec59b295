#!/usr/bin/python
"""Ansible module sglang_weights_disk: find the weights disk by serial/WWN, format it only when blank."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_weights_disk
short_description: Find the guest's weights disk by serial or WWN and put a filesystem on it only when it is blank
description:
  - Finds the disk under I(by_id_dir) by its serial (virtio-scsi, virtio-blk, SATA, NVMe names) or WWN, never by
    /dev/sdX. Formats it only when blank - blkid finds no signature at all and it reads as zeros (whole up to
    1 GiB, else both ends and 1024 windows spread over it);
    a disk with any data is never formatted (the task fails when it holds data without a filesystem, or another
    filesystem than I(fstype)). Returns the filesystem's UUID, which the weights_disk role mounts by.
  - Supports check mode (says whether it would format). The logic is module_utils/sglang_deploy_host/fs/blockdev.py.
options:
  serial:
    description: The disk's serial (PVE's serial= of the weights disk).
    type: str
    default: ""
  wwn:
    description: The disk's WWN (0x + 16 hex digits) when it is found by that instead.
    type: str
    default: ""
  by_id_dir:
    description: Where udev's by-id links are.
    type: path
    default: /dev/disk/by-id
  fstype:
    description: Filesystem to create on a blank disk, and to expect on a used one.
    type: str
    choices: [ext4, xfs]
    default: ext4
  label:
    description: Label of a new filesystem.
    type: str
    default: sglang-weights
  inventory_hostname:
    description: The host; messages start with it.
    type: str
    default: ""
"""

RETURN = r"""
device:
  description: The disk's device node.
  type: str
  returned: success
link:
  description: The by-id link it was found by.
  type: str
  returned: success
uuid:
  description: UUID of the filesystem on it (after formatting, if it was blank); "" in check mode before a format.
  type: str
  returned: success
fstype:
  description: The filesystem type.
  type: str
  returned: success
formatted:
  description: This run put the filesystem there (or would, in check mode).
  type: bool
  returned: success
block_device:
  description: The device is a block device (false for a file image, which is not mounted).
  type: bool
  returned: success
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_deploy_host.fs import blockdev


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "serial": {"type": "str", "default": ""},
            "wwn": {"type": "str", "default": ""},
            "by_id_dir": {"type": "path", "default": blockdev.BY_ID},
            "fstype": {"type": "str", "choices": list(blockdev.FSTYPES), "default": "ext4"},
            "label": {"type": "str", "default": "sglang-weights"},
            "inventory_hostname": {"type": "str", "default": ""},
        },
        required_one_of=[("serial", "wwn")],
        supports_check_mode=True,
    )
    p = module.params
    wanted = f"serial {p['serial']}" if p["serial"] else f"WWN {p['wwn']}"
    where = f"host {p['inventory_hostname'] or '?'}: weights disk ({wanted})"
    try:
        link, device = blockdev.find(p["serial"], p["wwn"], p["by_id_dir"])
        found = blockdev.probe(device)
    except (blockdev.DiskError, OSError) as exc:
        module.fail_json(
            msg=f"{where}: {exc}. Fix: check the VM's weights disk in PVE (weights_disk_serial must be its serial=)"
        )
    # A plain file stands in for the disk only in tests: it is formatted like a disk but cannot be mounted by UUID.
    result = {
        "device": device,
        "link": link,
        "changed": False,
        "formatted": False,
        "block_device": blockdev.is_block(device),
    }
    if found.fstype:
        if found.fstype != p["fstype"]:
            module.fail_json(
                msg=f"{where}: {device} holds a {found.fstype} filesystem (UUID {found.uuid}), weights_disk_fstype is "
                f"{p['fstype']}. Nothing was changed. Fix: set weights_disk_fstype: {found.fstype} to use it as it is",
                **result,
            )
        module.exit_json(**result, uuid=found.uuid, fstype=found.fstype)
    if not found.blank:
        what = (
            ", ".join(f"{k}={v}" for k, v in sorted(found.signatures.items()))
            or "non-zero data but no filesystem blkid knows"
        )
        module.fail_json(
            msg=f"{where}: {device} is not blank ({what}) and has no {p['fstype']} filesystem: "
            "refusing to format a disk "
            "that holds data. Nothing was changed. Fix: if it is disposable, wipe it yourself (wipefs -a and "
            f"blkdiscard {device}); if it holds the weights, mount it by hand and check",
            **result,
        )
    if module.check_mode:
        module.exit_json(**{**result, "changed": True, "formatted": True}, uuid="", fstype=p["fstype"])
    try:
        blockdev.mkfs(device, p["fstype"], p["label"])
        made = blockdev.probe(device)
    except (blockdev.DiskError, OSError) as exc:
        module.fail_json(msg=f"{where}: {exc}", **result)
    if made.fstype != p["fstype"] or not made.uuid:
        module.fail_json(msg=f"{where}: after mkfs, blkid sees {made.signatures} on {device}", **result)
    module.exit_json(**{**result, "changed": True, "formatted": True}, uuid=made.uuid, fstype=made.fstype)


if __name__ == "__main__":
    main()
