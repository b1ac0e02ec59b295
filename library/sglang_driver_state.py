#!/usr/bin/python
"""Ansible module sglang_driver_state: is the installed NVIDIA driver the one the kernel runs?"""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_driver_state
short_description: Compare the NVIDIA module installed for the running kernel with the loaded one, and say what to do
description:
  - Reads the version of the nvidia module on disk for the running kernel (C(modinfo -F version nvidia)),
    the loaded driver's version (C(/proc/driver/nvidia/version)) and whether nouveau is loaded, and
    returns the next step as I(step) - C(ok), C(load) (modprobe; nothing holds the GPUs), C(reboot)
    or C(stop) - with the reason. The nvidia_driver role acts on it; a server is never started on a
    kernel that does not run the installed driver.
  - Read-only; runs in check mode too.
options:
  reboot_allowed:
    description: The operator allows a reboot (nvidia_driver_reboot_allowed).
    type: bool
    default: false
  can_reboot:
    description: The host may be rebooted by Ansible at all (false over a local connection).
    type: bool
    default: true
  after:
    description: The step already taken this run (C(load) or C(reboot)); a state still wrong after it escalates.
    type: str
    choices: ["", load, reboot]
    default: ""
  proc_version:
    description: The loaded driver's version file.
    type: path
    default: /proc/driver/nvidia/version
  nouveau:
    description: Present when nouveau is loaded.
    type: path
    default: /sys/module/nouveau
"""

RETURN = r"""
state:
  description: kernel, installed (version or null), loaded (version or null), nouveau_loaded.
  type: dict
  returned: always
step:
  description: What to do next - ok, load, reboot or stop.
  type: str
  returned: always
reason:
  description: Why, in one sentence naming the versions.
  type: str
  returned: always
"""

import os
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_deploy_host.gpu import driverstate


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "reboot_allowed": {"type": "bool", "default": False},
            "can_reboot": {"type": "bool", "default": True},
            "after": {"type": "str", "default": "", "choices": ["", "load", "reboot"]},
            "proc_version": {"type": "path", "default": "/proc/driver/nvidia/version"},
            "nouveau": {"type": "path", "default": "/sys/module/nouveau"},
        },
        supports_check_mode=True,
    )
    params = module.params
    state = driverstate.read_state(
        Path(params["proc_version"]),
        Path(params["nouveau"]),
        module.get_bin_path("modinfo") or "",
        os.uname().release,
    )
    decision = driverstate.decide(
        state, reboot_allowed=params["reboot_allowed"], can_reboot=params["can_reboot"], after=params["after"]
    )
    module.exit_json(changed=False, state=state.to_dict(), **decision.to_dict())


if __name__ == "__main__":
    main()
