#!/usr/bin/python
"""Ansible module sglang_pci_vfio: are a Proxmox node's GPUs ready for passthrough (IOMMU, vfio-pci)?"""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_pci_vfio
short_description: Check on a Proxmox node that PCI devices are bound to vfio-pci in usable IOMMU groups
description:
  - Read-only; runs in check mode too. Reads the node's sysfs (the API does not say which driver holds a
    device) and fails, naming the node, the device and the fix, when IOMMU is off, a device is missing or held
    by a host driver (nvidia, nouveau), or its IOMMU group holds another device a host driver keeps.
  - The logic is module_utils/sglang_deploy_host/gpu/pcidev.py.
options:
  devices:
    description: Name (GPU mapping or address) -> list of PCI addresses on this node.
    type: dict
    required: true
  sysfs:
    description: Where sysfs is mounted.
    type: path
    default: /sys
  vm:
    description: How messages name the VM that will get the devices (host, VM id).
    type: str
    default: ""
"""

RETURN = r"""
devices:
  description: Per address - present, driver, vendor_device, iommu_group, group_blockers, problems.
  type: list
  elements: dict
  returned: always
"""

from dataclasses import asdict

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_deploy_host.gpu import pcidev


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "devices": {"type": "dict", "required": True},
            "sysfs": {"type": "path", "default": "/sys"},
            "vm": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    names = {addr: name for name, addrs in module.params["devices"].items() for addr in addrs}
    states = pcidev.check(sorted(names), module.params["sysfs"])
    problems = [f"GPU {names[s.address]}: " + "; ".join(s.problems) for s in states if s.problems]
    result = {"changed": False, "devices": [asdict(s) for s in states]}
    if problems:
        node = module.params.get("vm") or "the VM"
        module.fail_json(
            msg=f"{node}: node not ready for passthrough, nothing was changed: "
            + " | ".join(problems)
            + " (README 'Pointing it at a real node' has the IOMMU / vfio checklist)",
            **result,
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
