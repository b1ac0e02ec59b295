#!/usr/bin/python
"""Ansible module sglang_gpu_facts: what nvidia-smi says about the host's GPUs, as data."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_gpu_facts
short_description: Read the host's GPUs (nvidia-smi), /dev/shm and disks, as the planner and preflight need them
description:
  - Runs nvidia-smi (CSV query, XML query, P2P matrix) and parses it with the project's gpufacts
    parser, the same one the unit's ExecStartPre= idle check and the CLI use. Read-only, so it runs in
    check mode too.
  - A host without nvidia-smi (bare OS, container) is not an error; I(gpu_facts.nvidia_smi_found)
    is false and I(gpu_facts.gpus) empty.
options:
  disks:
    description: Paths whose file system's free space is measured too (e.g. /dev/shm, the weights root).
    type: list
    elements: path
    default: []
  nvidia_smi:
    description: The nvidia-smi to run.
    type: str
    default: nvidia-smi
"""

RETURN = r"""
gpu_facts:
  description: GPUs (index, name, memory, compute capability, processes, ...), P2P links, driver and
    CUDA versions, disks, and the errors nvidia-smi reported (gpufacts.GpuFacts.to_dict()).
  type: dict
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_deploy_host.gpu import gpufacts


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "disks": {"type": "list", "elements": "path", "default": []},
            "nvidia_smi": {"type": "str", "default": gpufacts.DEFAULT_NVIDIA_SMI},
        },
        supports_check_mode=True,
    )
    facts = gpufacts.collect(nvidia_smi=module.params["nvidia_smi"])
    facts.disks = [gpufacts.measure_disk(path) for path in module.params["disks"]]
    module.exit_json(changed=False, gpu_facts=facts.to_dict())


if __name__ == "__main__":
    main()
