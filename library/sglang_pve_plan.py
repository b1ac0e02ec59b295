#!/usr/bin/python
"""Ansible module sglang_pve_plan: the Proxmox node's preflight and the plan for the serving VM."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_pve_plan
short_description: Check a Proxmox VE node for the serving VM and plan what to change, changing nothing
description:
  - Read-only; runs in check mode too. Before the proxmox_vm role changes anything it checks, through the
    node's API (proxmoxer, community.proxmox's authentication options), that the API answers and accepts the
    credentials, that the user or token holds the privileges this run needs, that every GPU's resource mapping
    exists, points at a PCI device of this node with the mapped vendor:device id and is not used by another
    running VM, that the storages have room, that the cloud image (or its URL) and the vendor snippet are
    there, and that nothing would touch the weights disk. It fails naming host, node, VM and the fix.
  - Root-only settings (QEMU args for the GPUDirect clique or the OVMF MMIO option, raw PCI addresses) are
    refused unless the login is root@pam with a password; an API token is never root@pam.
  - The plan is C(create), C(rebuild), C(converge), C(none) or C(absent); I(kvm_create) and I(kvm_update)
    are community.proxmox.proxmox_kvm parameters. The checks and the plan are
    module_utils/sglang_deploy_pve/vmplan.py, the configuration logic vmspec.py beside it.
options:
  vm:
    description: The VM definition, the fields of VmSpec in module_utils/sglang_deploy_pve/vmspec.py (the role's proxmox_vm_* variables).
    type: dict
    required: true
  state:
    description: C(present) builds and converges the VM, C(absent) destroys it (guarded by I(destroy_weights)).
    type: str
    choices: [present, absent]
    default: present
  rebuild:
    description: Re-image the root disk from the cloud image (stop, import, regenerate cloud-init, start).
    type: bool
    default: false
  destroy_weights:
    description: Let C(state=absent) destroy the VM although its weights disk (or an unused disk) is attached.
    type: bool
    default: false
  image_url:
    description: Where the node downloads the cloud image from when the I(vm.image) volume is missing.
    type: str
    default: ""
  restart_allowed:
    description: The run may restart a running VM so that pending changes apply (then the privileges include it).
    type: bool
    default: false
extends_documentation_fragment:
  - community.proxmox.proxmox.documentation
  - sglang_pve_vm
"""

RETURN = r"""
action:
  description: create, rebuild, converge, none or absent (none also when state=absent and the VM is gone).
  type: str
  returned: always
exists:
  description: The VM exists on the node.
  type: bool
  returned: always
status:
  description: running, stopped, or absent.
  type: str
  returned: always
kvm_create:
  description: community.proxmox.proxmox_kvm parameters that create the VM (without its root disk).
  type: dict
  returned: always
kvm_update:
  description: community.proxmox.proxmox_kvm parameters of the settings that differ (empty when none do).
  type: dict
  returned: always
delete:
  description: Configuration keys the VM has but should not (extra GPUs, args); comma-separated.
  type: str
  returned: always
changes:
  description: Key -> {have, want} of every setting the run changes.
  type: dict
  returned: always
restart_needed:
  description: The VM runs and has (or will have) configuration changes that apply only at its next start.
  type: bool
  returned: always
download:
  description: The node must download the cloud image first (the volume is missing, image_url is set).
  type: bool
  returned: always
add_weights:
  description: The VM exists without a weights disk and without unused disks; a blank one is to be added.
  type: bool
  returned: always
weights_disk:
  description: The attached weights disk (key, volume, size in bytes), or {} when there is none.
  type: dict
  returned: always
root_disk:
  description: The root disk's volume id, or "" when the VM has none.
  type: str
  returned: always
gpu_paths:
  description: PCI address(es) per GPU on this node (mapping name or raw address -> list).
  type: dict
  returned: always
guest_address:
  description: The guest's static address from its cloud-init ipconfig, or "" for DHCP.
  type: str
  returned: always
notes:
  description: What the plan saw but does not change (drift in disks or the NIC), one line each.
  type: list
  elements: str
  returned: always
pve_version:
  description: The node's PVE version.
  type: str
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_deploy_pve import vmspec, vmplan
from ansible.module_utils.sglang_deploy_pve import client as pve
from ansible_collections.community.proxmox.plugins.module_utils.proxmox import proxmox_auth_argument_spec

# The planner (module_utils/sglang_deploy_pve/vmplan.py) is stdlib only: it reaches the API through these.
CONNECTOR = vmplan.Connector(
    pve.PveClient, pve.PveApiError, pve.unreachable_fix, pve.credentials_fix, pve.HAS_PROXMOXER, pve.PROXMOXER_ERROR
)


def main() -> None:
    argument_spec = pve.module_argument_spec(
        proxmox_auth_argument_spec(),
        vm={"type": "dict", "required": True},
        state={"type": "str", "choices": ["present", "absent"], "default": "present"},
        rebuild={"type": "bool", "default": False},
        destroy_weights={"type": "bool", "default": False},
        restart_allowed={"type": "bool", "default": False},
        image_url={"type": "str", "default": ""},
    )
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True, **pve.AUTH_RULES)
    planner = vmplan.Planner(module.params, CONNECTOR)
    try:
        result = planner.run()
    except (vmplan.Refusal, vmspec.SpecError) as exc:
        module.fail_json(msg=str(exc))
    except pve.PveApiError as exc:
        module.fail_json(msg=f"{planner.where()}: the API answered {exc.message}. Nothing was changed.")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
