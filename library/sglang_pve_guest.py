#!/usr/bin/python
"""Ansible module sglang_pve_guest: wait for a Proxmox VM's guest agent and read the guest's address."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_pve_guest
short_description: Wait, within a budget, until a Proxmox VM's QEMU guest agent answers; return its address
description:
  - Polls the guest agent (C(agent/ping), then C(agent/network-get-interfaces)) through the node's API until it
    answers with a global address or I(timeout) seconds have passed; then fails naming the VM, the node, what did
    not come up and where to look. Read-only; runs in check mode too.
options:
  node:
    description: PVE's name of the node.
    type: str
    required: true
  vmid:
    description: The VM.
    type: int
    required: true
  timeout:
    description: Seconds to wait for the agent and an address.
    type: int
    default: 600
  poll:
    description: Seconds between two tries.
    type: float
    default: 5
  inventory_hostname:
    description: The serving host the VM is; messages start with it.
    type: str
    default: ""
extends_documentation_fragment:
  - community.proxmox.proxmox.documentation
"""

RETURN = r"""
address:
  description: The guest's first global address (IPv4 preferred) as the agent reports it.
  type: str
  returned: success
waited:
  description: Seconds it took.
  type: float
  returned: always
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_deploy_host import pve
from ansible.module_utils.sglang_pve_client import HAS_PROXMOXER, PROXMOXER_ERROR, PveApiError, PveClient
from ansible_collections.community.proxmox.plugins.module_utils.proxmox import proxmox_auth_argument_spec


def main() -> None:
    argument_spec = proxmox_auth_argument_spec()
    argument_spec.update(
        node={"type": "str", "required": True},
        vmid={"type": "int", "required": True},
        timeout={"type": "int", "default": 600},
        poll={"type": "float", "default": 5.0},
        inventory_hostname={"type": "str", "default": ""},
    )
    module = AnsibleModule(
        argument_spec=argument_spec,
        required_one_of=[("api_password", "api_token_id")],
        required_together=[("api_token_id", "api_token_secret")],
        supports_check_mode=True,
    )
    p = module.params
    node, vmid = p["node"], p["vmid"]
    where = f"host {p['inventory_hostname'] or '?'}: VM {vmid} on node {node}"
    if not HAS_PROXMOXER:
        module.fail_json(msg=f"{where}: proxmoxer is missing ({PROXMOXER_ERROR}). Fix: pip install proxmoxer")
    start = time.monotonic()
    base = f"nodes/{node}/qemu/{vmid}/agent"
    last = "no answer yet"
    answered = False
    while True:
        try:
            client = PveClient(p)
            client.post(f"{base}/ping")
            answered = True
            interfaces = client.get(f"{base}/network-get-interfaces")
            address = pve.pick_address((interfaces or {}).get("result") or [])
            if address:
                module.exit_json(changed=False, address=address, waited=round(time.monotonic() - start, 1))
            last = "the agent answers but reports no global address yet"
        except PveApiError as exc:
            last = exc.message
        if time.monotonic() - start >= p["timeout"]:
            break
        time.sleep(max(0.1, min(p["poll"], p["timeout"] - (time.monotonic() - start))))
    what = "has no network address" if answered else "has no running guest agent"
    module.fail_json(
        msg=f"{where}: after {p['timeout']} s (proxmox_vm_agent_timeout) the guest {what} (last: {last}). "
        "Fix: the cloud image needs qemu-guest-agent (the vendor snippet proxmox_vm_ci_vendor_snippet installs "
        f"it), and cloud-init must finish: read the VM's console (qm terminal {vmid} on the node) for errors",
        waited=round(time.monotonic() - start, 1),
    )


if __name__ == "__main__":
    main()
