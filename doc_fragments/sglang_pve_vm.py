"""The options every proxmox_vm role module takes beside community.proxmox's API credentials: the node and
the serving host its messages name. Their argument spec: ``sglang_deploy_pve.client.module_argument_spec``."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  node:
    description: PVE's name of the node the VM lives on; every request goes to it.
    type: str
    required: true
  inventory_hostname:
    description: The serving host the VM is; messages start with it.
    type: str
    default: ''
"""
