#!/usr/bin/python
"""Ansible module sglang_pve_root_disk: (re-)image the serving VM's root disk, never any other disk."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_pve_root_disk
short_description: Replace a stopped Proxmox VM's root disk (scsi0) with a fresh import of the cloud image
description:
  - The one place the proxmox_vm role touches a disk after creating the VM. On a stopped VM, with I(replace),
    it deletes the old root disk (C(PUT unlink force=1) frees that one volume) and imports the cloud image as
    the new root disk (C(import-from), with C(boot=order=scsi0)); then it grows the root disk to I(size_gib)
    and, with I(regenerate_cloudinit), rebuilds the cloud-init drive. It refuses before any call that writes
    when the root disk carries the weights disk's serial, and fails if the weights disk is not attached exactly
    as before afterwards.
  - Without I(replace) it only grows the root disk a new VM was created with (community.proxmox.proxmox_kvm
    imports it at create).
options:
  vmid:
    description: The VM.
    type: int
    required: true
  storage:
    description: Storage of the root disk.
    type: str
    required: true
  image:
    description: Volume id of the cloud image (STORAGE:import/NAME.qcow2).
    type: str
    required: true
  size_gib:
    description: Size of the root disk after the import, in GiB (cloud-init grows the filesystem at first boot).
    type: int
    required: true
  weights_serial:
    description: Serial of the weights disk, which must stay attached and untouched.
    type: str
    required: true
  replace:
    description: Delete the old root disk and import the image again (a rebuild); false only grows it.
    type: bool
    default: true
  regenerate_cloudinit:
    description: Regenerate the cloud-init drive afterwards (a rebuild).
    type: bool
    default: false
  timeout:
    description: Seconds each PVE task (import, resize) may take.
    type: int
    default: 900
extends_documentation_fragment:
  - community.proxmox.proxmox.documentation
  - sglang_pve_vm
"""

RETURN = r"""
old_volume:
  description: The root disk's volume before (now freed), or "" when the VM had none.
  type: str
  returned: always
root_disk:
  description: The scsi0 value PVE holds afterwards.
  type: str
  returned: always
weights_disk:
  description: The weights disk's key and volume, the same before and after.
  type: dict
  returned: always
calls:
  description: The API calls made, in order (method and path), for the run's record.
  type: list
  elements: str
  returned: always
"""

from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_deploy_pve import vmconfig, vmspec
from ansible.module_utils.sglang_deploy_pve import client as pve
from ansible_collections.community.proxmox.plugins.module_utils.proxmox import proxmox_auth_argument_spec


def _weights(config: dict[str, Any], serial: str) -> dict[str, str]:
    found = vmconfig.find_serial(config, serial)
    return {"key": found[0].key, "volume": found[0].volume} if len(found) == 1 else {}


def main() -> None:
    argument_spec = pve.module_argument_spec(
        proxmox_auth_argument_spec(),
        vmid={"type": "int", "required": True},
        storage={"type": "str", "required": True},
        image={"type": "str", "required": True},
        size_gib={"type": "int", "required": True},
        weights_serial={"type": "str", "required": True},
        replace={"type": "bool", "default": True},
        regenerate_cloudinit={"type": "bool", "default": False},
        timeout={"type": "int", "default": 900},
    )
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True, **pve.AUTH_RULES)
    p = module.params
    node, vmid, slot = p["node"], p["vmid"], vmspec.ROOT_SLOT
    where = f"host {p['inventory_hostname'] or '?'}: VM {vmid} on node {vmspec.shown(node)}"
    # sglang_pve_plan checked these variables; they reach this module on their own, so again, before any request.
    problems = [
        vmspec.node_problem(node),
        vmspec.storage_problem("proxmox_vm_storage", p["storage"]),
        vmspec.volume_problem("proxmox_vm_image", p["image"]),
        vmspec.serial_problem("proxmox_vm_weights_disk_serial", p["weights_serial"]),
    ]
    if any(problems):
        module.fail_json(msg=f"{where}: " + "; ".join(filter(None, problems)) + ". Nothing was changed.")
    if not pve.HAS_PROXMOXER:
        module.fail_json(msg=f"{where}: proxmoxer is missing ({pve.PROXMOXER_ERROR}). Fix: pip install proxmoxer")
    calls: list[str] = []
    base = f"nodes/{node}/qemu/{vmid}"
    try:
        client = pve.PveClient(p)
        config = client.get(f"{base}/config")
        status = client.get(f"{base}/status/current").get("status")
        weights = _weights(config, p["weights_serial"])
        old = vmspec.parse_props(config.get(slot, ""), "file").get("file", "")
        if p["replace"] and status != "stopped":
            module.fail_json(msg=f"{where}: the VM is {status}; its root disk is only replaced while it is stopped")
        if weights.get("key") == slot or (old and old == weights.get("volume")):
            module.fail_json(
                msg=f"{where}: {slot} ({old}) is the weights disk (serial {p['weights_serial']}); refusing to re-image "
                "it. Nothing was changed. Fix: give the weights their own disk first"
            )
        new_value = f"{p['storage']}:0,import-from={p['image']},discard=on,iothread=1,ssd=1"
        if module.check_mode:
            module.exit_json(changed=True, old_volume=old, root_disk=new_value, weights_disk=weights, calls=calls)
        if p["replace"] and old:
            # force=1: the old root volume is freed, not kept as unusedN (a destroy would free unusedN anyway).
            client.put(f"{base}/unlink", idlist=slot, force=1)
            calls.append(f"PUT {base}/unlink idlist={slot} force=1")
        if p["replace"]:
            upid = client.post(f"{base}/config", **{slot: new_value, "boot": f"order={slot}"})
            calls.append(f"POST {base}/config {slot}={new_value} boot=order={slot}")
            client.wait(node, upid, p["timeout"])
        elif not old:
            module.fail_json(msg=f"{where}: the VM has no {slot} to grow. Fix: rebuild it (proxmox_vm_rebuild: true)")
        upid = client.put(f"{base}/resize", disk=slot, size=f"{p['size_gib']}G")
        calls.append(f"PUT {base}/resize disk={slot} size={p['size_gib']}G")
        client.wait(node, upid, p["timeout"])
        if p["regenerate_cloudinit"]:
            client.put(f"{base}/cloudinit")
            calls.append(f"PUT {base}/cloudinit")
        after = client.get(f"{base}/config")
    except pve.PveApiError as exc:
        fix = pve.unreachable_fix("the API", node) if exc.status == 0 else "check the task log in PVE (Tasks)"
        module.fail_json(
            msg=f"{where}: replacing the root disk failed after {calls or 'no change'}: {exc.message}. {fix}",
            calls=calls,
        )
    if _weights(after, p["weights_serial"]) != weights:
        module.fail_json(
            msg=f"{where}: the weights disk changed while the root disk was replaced: before {weights}, after "
            f"{_weights(after, p['weights_serial'])}. Stop and check the VM's Hardware tab; do not destroy the VM",
            calls=calls,
        )
    module.exit_json(
        changed=True, old_volume=old, root_disk=str(after.get(slot, "")), weights_disk=weights, calls=calls
    )


if __name__ == "__main__":
    main()
