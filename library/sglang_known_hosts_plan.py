#!/usr/bin/python
"""Ansible module sglang_known_hosts_plan: which known_hosts entries a host's SSH host keys replace."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_known_hosts_plan
short_description: Say which names of a known_hosts file must get a host's SSH host keys, changing nothing
description:
  - Read-only; runs in check mode too. For each name (an address, or a host name, written as ssh looks it up,
    C([NAME]:PORT) off port 22), compares the known_hosts lines that are that name's alone (the name itself or
    its hash) with I(keys). A name whose lines hold exactly those keys is left alone; any other name is to be
    replaced - its old lines removed (C(ssh-keygen -R), which ansible.builtin.known_hosts runs) and I(keys)
    recorded - which the proxmox_vm role then does with ansible.builtin.known_hosts.
  - A line for a name that holds a key which is none of I(keys) (a changed host key) is replaced only with
    I(new_guest) (the run has just created or rebuilt the VM, so its keys are new); otherwise the module fails
    naming the host, the name, both fingerprints and the fix, as a changed key on an unchanged VM is what a
    man-in-the-middle looks like. Lines that only lack some of I(keys) are completed either way.
  - Every key is checked again as an OpenSSH public key line (module_utils/sglang_deploy_pve/hostkeys.py).
options:
  path:
    description: The known_hosts file (it may be missing).
    type: path
    required: true
  names:
    description: The host's names and addresses; empty ones and repeats are dropped.
    type: list
    elements: str
    required: true
  port:
    description: The SSH port the host is reached on.
    type: int
    default: 22
  keys:
    description: The host's public keys, C(TYPE BASE64) each.
    type: list
    elements: str
    required: true
  new_guest:
    description: The VM was created or rebuilt by this run (a new root disk, new host keys); differing keys are replaced.
    type: bool
    default: false
  vmid:
    description: The VM's id, for the console command messages name (C(qm terminal VMID)).
    type: int
    default: 0
  inventory_hostname:
    description: The host these keys are; messages start with it.
    type: str
    default: ""
"""

RETURN = r"""
names:
  description: The names as known_hosts holds them (lower case, C([NAME]:PORT) off port 22).
  type: list
  elements: str
  returned: always
replace:
  description: The names whose lines differ from the keys; they get the keys.
  type: list
  elements: str
  returned: always
conflicts:
  description:
    - Lines of a name holding a key that is none of I(keys) (only with I(new_guest); without it they fail the module),
      each with C(name), C(line) (number), C(hosts) and C(key) (C(TYPE SHA256:...)).
  type: list
  elements: dict
  returned: always
forget:
  description: The names of I(replace) that have lines now (to be removed first, with ssh-keygen -R).
  type: list
  elements: str
  returned: always
add:
  description: One C(NAME TYPE BASE64) known_hosts line per name of I(replace) and key, with its name.
  type: list
  elements: dict
  returned: always
directory_exists:
  description: The directory of I(path) exists (ansible.builtin.known_hosts does not create it).
  type: bool
  returned: always
msg:
  description: What changes, in words.
  type: str
  returned: always
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_deploy_pve import hostkeys


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "names": {"type": "list", "elements": "str", "required": True},
            "port": {"type": "int", "default": 22},
            "keys": {"type": "list", "elements": "str", "required": True, "no_log": False},
            "new_guest": {"type": "bool", "default": False},
            "vmid": {"type": "int", "default": 0},
            "inventory_hostname": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    p = module.params
    where = f"host {p['inventory_hostname'] or '?'}"
    path = p["path"]
    try:
        keys = [hostkeys.parse_public_key(text) for text in p["keys"]]
    except hostkeys.HostKeyError as exc:
        module.fail_json(msg=f"{where}: refusing to record a host key in {path}: {exc}. Nothing was written.")
    if not keys:
        module.fail_json(msg=f"{where}: no host keys to record in {path}. Nothing was written.")
    try:
        names = list(dict.fromkeys(hostkeys.known_hosts_name(n, p["port"]) for n in p["names"] if n))
    except hostkeys.HostNameError as exc:
        module.fail_json(
            msg=f"{where}: refusing to record host keys in {path}: the guest's address or ansible_host {exc}. Nothing "
            "was written. Fix: proxmox_vm_guest_address / ansible_host must be the guest's address or DNS name"
        )
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except FileNotFoundError:
        text = ""
    except OSError as exc:
        module.fail_json(
            msg=f"{where}: cannot read {path} ({exc}). Fix: proxmox_vm_known_hosts, or its permissions"
        )
    found = [
        {"name": name, "line": line.number, "hosts": line.hosts, "key": hostkeys.describe_known(line)}
        for name in names
        for line in hostkeys.conflicts(text, name, keys)
    ]
    if found and not p["new_guest"]:
        first = found[0]
        console = f"qm terminal {p['vmid']} on the node" if p["vmid"] else "the VM's console on the node"
        others = f" (and {len(found) - 1} more line(s) like it)" if len(found) > 1 else ""
        module.fail_json(
            msg=f"{where}: the SSH host key known for {first['name']} in {path} (proxmox_vm_known_hosts, line "
            f"{first['line']}: {first['key']}){others} is none of the keys the guest agent read from the VM "
            f"({'; '.join(f'{k.type} {k.fingerprint}' for k in keys)}), and this run did not create or rebuild the "
            "VM, so its keys should not have changed: a changed host key on an unchanged VM is what a "
            "man-in-the-middle looks like. Nothing was written and the run stops here. Fix: compare on the VM's "
            f"console ({console}: ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub); if the guest's key is the "
            "new one (the VM was re-imaged outside this run, or a run stopped before recording its keys), remove "
            f"the old entry (ssh-keygen -R {first['name']} -f {path}) and run again - the run then records the "
            "guest's keys; otherwise find out who answers at that address before going on",
            conflicts=found,
        )
    replace, forget, warnings = [], [], []
    for name in names:
        if not hostkeys.entries_differ(text, name, keys):
            continue
        replace.append(name)
        lines = hostkeys.known_lines(text, name)
        if lines:
            forget.append(name)
        shared = [f"line {line.number} ({line.hosts})" for line in lines if not line.names_only(name)]
        if shared:
            warnings.append(
                f"{where}: {path} names {name} also in lines that list other hosts or patterns: "
                f"{', '.join(shared)}; ssh-keygen -R {name} removes those lines whole"
            )
    for warning in warnings:
        module.warn(warning)
    add = [{"name": name, "line": f"{name} {key.line}"} for name in replace for key in keys]
    if replace:
        msg = f"{path}: the keys of {', '.join(replace)} are to be replaced"
        kept = [n for n in names if n not in replace]
        msg += f"; {', '.join(kept)} already hold them" if kept else ""
        msg += " (the VM is new or rebuilt: its old keys go)" if found else ""
    else:
        msg = f"{path} already holds exactly these keys for {', '.join(names)}"
    module.exit_json(
        changed=False,
        names=names,
        replace=replace,
        forget=forget,
        add=add,
        conflicts=found,
        directory_exists=os.path.isdir(os.path.dirname(path) or "."),
        msg=msg,
    )


if __name__ == "__main__":
    main()
