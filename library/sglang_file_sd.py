#!/usr/bin/python
"""Ansible module sglang_file_sd: the Prometheus file_sd targets file, only where it is sglang-deploy's."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_file_sd
short_description: Write the Prometheus file_sd targets of the workers and routers, only over a file this wrote
description:
  - Checks every target (host:port) and label, and the path (absolute, normalized, .json), then writes the
    groups to I(path) through a temporary file renamed into place (mode 0644) - unless something else is
    there (a link, a directory, or a file that is not a targets list whose groups are sglang-deploy's,
    labelled job sglang-worker or sglang-router), which is refused, naming it.
  - The logic is module_utils/sglang_deploy_host/watch/file_sd.py. Check mode writes nothing and shows the diff.
options:
  path:
    description: The targets file (sglang_router_file_sd_path).
    type: str
    required: true
  groups:
    description: The file_sd groups (sglang_router_file_sd's answer).
    type: list
    elements: dict
    required: true
"""

RETURN = r"""
path:
  description: The file written (or that would be, in check mode).
  type: str
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_deploy_host.watch import file_sd


def main() -> None:
    module = AnsibleModule(
        argument_spec={"path": {"type": "str", "required": True}, "groups": {"type": "list", "elements": "dict", "required": True}},
        supports_check_mode=True,
    )
    path = module.params["path"]
    try:
        done = file_sd.write(path, module.params["groups"], "sglang_router_file_sd_path", dry_run=module.check_mode)
    except (file_sd.FileSdError, OSError) as err:
        module.fail_json(msg=str(err), path=path)
    result = {"changed": done["changed"], "path": path}
    if done["changed"]:
        result["diff"] = {"before": done["before"], "after": done["after"], "before_header": path, "after_header": path}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
