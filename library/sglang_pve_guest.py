#!/usr/bin/python
"""Ansible module sglang_pve_guest: wait for a Proxmox VM's guest agent, read the guest's address and, on
request, its SSH host public keys."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_pve_guest
short_description: Wait, within a budget, until a Proxmox VM's QEMU guest agent answers; return its address
description:
  - Polls the guest agent (C(agent/ping), then C(agent/network-get-interfaces)) through the node's API until it
    answers with a global address or I(timeout) seconds have passed; then fails naming the VM, the node, what did
    not come up and where to look. Read-only; runs in check mode too.
  - With I(host_keys), it then reads the guest's SSH host public keys through the agent (C(agent/file-read) of
    C(/etc/ssh/ssh_host_ed25519_key.pub), then the ecdsa and rsa ones when present), retrying within the same
    I(timeout) until the ed25519 key is there (cloud-init writes the keys on the first boot). Each key must parse
    as an OpenSSH public key of the type its file names (module_utils/sglang_deploy_pve/hostkeys.py); anything
    else fails the module, so nothing unchecked reaches known_hosts. The channel is the node's API (its TLS
    certificate verified, the token authenticated), not the network the guest is reached on.
options:
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
  host_keys:
    description:
      - Also read the guest's SSH host public keys (needs C(VM.GuestAgent.FileRead) on PVE 9, C(VM.Monitor) on PVE 8).
    type: bool
    default: false
extends_documentation_fragment:
  - community.proxmox.proxmox.documentation
  - sglang_pve_vm
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
host_keys:
  description:
    - The guest's SSH host public keys, ed25519 first; each with the file it came from, its type, C(key)
      (C(TYPE BASE64), no comment), C(fingerprint) (SHA256:...) and C(describe) (ssh-keygen -l's words).
  type: list
  elements: dict
  returned: success with host_keys
"""

import time
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_deploy_pve import hostkeys, vmconfig, vmspec
from ansible.module_utils.sglang_deploy_pve import client as pve
from ansible_collections.community.proxmox.plugins.module_utils.proxmox import proxmox_auth_argument_spec


class KeyRefused(Exception):
    """A host key file that the agent read but that is not a key of its type: never retried, never recorded."""

    def __init__(self, path: str, error: hostkeys.HostKeyError) -> None:
        super().__init__(f"{path}: {error}")
        self.path = path
        self.error = error


class NoFileRead(Exception):
    """The API refused the agent's file-read (403): waiting longer does not help."""


def read_file(client: pve.PveClient, base: str, path: str) -> str:
    """A guest file's text through the agent; '' when it is not there (yet)."""
    try:
        answer = client.get(f"{base}/file-read", file=path)
    except pve.PveApiError as exc:
        if exc.status == 403:
            raise NoFileRead(exc.message) from None
        raise
    answer = answer or {}
    if answer.get("truncated"):
        raise KeyRefused(path, hostkeys.HostKeyError("the agent read it only in part (truncated)"))
    return str(answer.get("content") or "")


def read_host_keys(client: pve.PveClient, base: str) -> tuple[list[dict[str, Any]], str]:
    """(the guest's host keys, '') once the ed25519 key is there; ([], why not) before."""
    try:
        text = read_file(client, base, hostkeys.REQUIRED_KEY_FILE)
    except pve.PveApiError as exc:  # QGA: "Failed to open file ...: No such file or directory", or not ready
        return [], f"reading {hostkeys.REQUIRED_KEY_FILE}: {exc.message}"
    if not text.strip():
        return [], f"{hostkeys.REQUIRED_KEY_FILE} is not there yet (or empty)"
    found = []
    for path in hostkeys.KEY_FILES:
        if path != hostkeys.REQUIRED_KEY_FILE:
            try:
                text = read_file(client, base, path)
            except pve.PveApiError as exc:
                if exc.status == 500:  # the agent's own error: no such file, no key of that type on this guest
                    continue
                raise  # no answer: try the whole set again
            if not text.strip():
                continue
        try:
            key = hostkeys.parse_key_file(path, text)
        except hostkeys.HostKeyError as exc:
            raise KeyRefused(path, exc) from None
        found.append(
            {
                "file": path,
                "type": key.type,
                "key": key.line,
                "fingerprint": key.fingerprint,
                "describe": key.describe(),
            }
        )
    return found, ""


def main() -> None:
    argument_spec = pve.module_argument_spec(
        proxmox_auth_argument_spec(),
        vmid={"type": "int", "required": True},
        timeout={"type": "int", "default": 600},
        poll={"type": "float", "default": 5.0},
        host_keys={"type": "bool", "default": False},
    )
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True, **pve.AUTH_RULES)
    p = module.params
    node, vmid = p["node"], p["vmid"]
    where = f"host {p['inventory_hostname'] or '?'}: VM {vmid} on node {vmspec.shown(node)}"
    if vmspec.node_problem(node):  # it goes into every request's path
        module.fail_json(msg=f"{where}: {vmspec.node_problem(node)}. Nothing was asked.")
    if not pve.HAS_PROXMOXER:
        module.fail_json(msg=f"{where}: proxmoxer is missing ({pve.PROXMOXER_ERROR}). Fix: pip install proxmoxer")
    start = time.monotonic()
    base = f"nodes/{node}/qemu/{vmid}/agent"
    last = "no answer yet"
    answered = False
    address = ""
    while True:
        try:
            client = pve.PveClient(p)
            if not address:
                client.post(f"{base}/ping")
                answered = True
                interfaces = client.get(f"{base}/network-get-interfaces")
                address = vmconfig.pick_address((interfaces or {}).get("result") or [])
                last = "" if address else "the agent answers but reports no global address yet"
            if address and not p["host_keys"]:
                module.exit_json(changed=False, address=address, waited=round(time.monotonic() - start, 1))
            if address:
                keys, last = read_host_keys(client, base)
                if keys:
                    module.exit_json(
                        changed=False, address=address, host_keys=keys, waited=round(time.monotonic() - start, 1)
                    )
        except pve.PveApiError as exc:
            last = exc.message
        except NoFileRead as exc:
            module.fail_json(
                msg=f"{where}: the API refused to read the guest's SSH host keys through its agent ({exc}). Nothing "
                "was written to known_hosts. Fix: grant VM.GuestAgent.FileRead (PVE 9; VM.Monitor on PVE 8) on "
                f"/vms/{vmid} to the token, or set proxmox_vm_trust_host_keys_from_agent: false and keep known_hosts "
                "yourself",
                waited=round(time.monotonic() - start, 1),
            )
        except KeyRefused as exc:
            module.fail_json(
                msg=f"{where}: refusing the guest's SSH host key {exc.path}, read through its agent: {exc.error}. "
                "Nothing was written to known_hosts. Fix: look at the file on the VM's console (qm terminal "
                f"{vmid} on the node): ssh-keygen -lf {exc.path} must show a key; regenerate a broken one "
                f"(rm /etc/ssh/ssh_host_*; ssh-keygen -A; systemctl restart ssh) or rebuild the VM",
                waited=round(time.monotonic() - start, 1),
            )
        if time.monotonic() - start >= p["timeout"]:
            break
        time.sleep(max(0.1, min(p["poll"], p["timeout"] - (time.monotonic() - start))))
    if address:
        module.fail_json(
            msg=f"{where}: after {p['timeout']} s (proxmox_vm_agent_timeout) the guest agent answers (address "
            f"{address}) but the guest has no SSH host key {hostkeys.REQUIRED_KEY_FILE} (last: {last}). Nothing was "
            "written to known_hosts. Fix: cloud-init generates the host keys on the first boot - read the VM's "
            f"console (qm terminal {vmid} on the node) for cloud-init errors and check ls /etc/ssh/ssh_host_*; the "
            "agent must allow guest-file-open and guest-file-read; or set proxmox_vm_trust_host_keys_from_agent: "
            "false and record the key in known_hosts yourself",
            address=address,
            waited=round(time.monotonic() - start, 1),
        )
    what = "has no network address" if answered else "has no running guest agent"
    module.fail_json(
        msg=f"{where}: after {p['timeout']} s (proxmox_vm_agent_timeout) the guest {what} (last: {last}). "
        "Fix: the cloud image needs qemu-guest-agent (the vendor snippet proxmox_vm_ci_vendor_snippet installs "
        f"it), and cloud-init must finish: read the VM's console (qm terminal {vmid} on the node) for errors",
        waited=round(time.monotonic() - start, 1),
    )


if __name__ == "__main__":
    main()
