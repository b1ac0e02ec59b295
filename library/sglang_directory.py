#!/usr/bin/python
"""Ansible module sglang_directory: a directory root manages, never reached through a path another user can change."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_directory
short_description: Create or adjust a directory root manages, only through directories and links root alone controls
description:
  - Every directory on the way to I(path) must be owned by root and writable by root alone, and every
    link on the way owned by root (its target checked the same way); otherwise the task fails naming
    the entry, its owner and mode, before anything changes. A less-trusted user (the service user, model
    code it runs) therefore cannot make root chown or chmod something else by planting a link.
  - Missing directories above I(path) are created root:root 0755; I(path) itself with mkdir, then its
    owner and mode are set through a descriptor opened with O_NOFOLLOW.
  - The logic is module_utils/sglang_deploy_host/fs/safepath.py. Check mode changes nothing and reports
    what would change; there an I(owner) or I(group) that does not exist yet (an earlier task of the same
    run would create it) is reported as to be set, while a real run fails naming it.
options:
  path:
    description: The directory.
    type: path
    required: true
  owner:
    description: Its owner (a user name).
    type: str
    default: root
  group:
    description: Its group (a group name).
    type: str
    default: root
  mode:
    description: Its mode, as octal text (C(0755)).
    type: str
    default: "0755"
  variable:
    description: The inventory variable the path comes from, for the error message.
    type: str
    default: path
"""

RETURN = r"""
path:
  description: The directory acted on (a root-owned link on the way resolved).
  type: str
  returned: always
created:
  description: The directories created (or that would be, in check mode).
  type: list
  returned: always
"""

import grp
import pwd
import re

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_deploy_host.fs import safepath


def _ids(owner: str, group: str) -> "tuple[int, int, list[str]]":
    """The uid and gid of ``owner`` and ``group``; -1 and the name in the list for one that does not exist."""
    unknown = []
    try:
        uid = pwd.getpwnam(owner).pw_uid
    except KeyError:
        uid = -1
        unknown.append(f"user {owner!r}")
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        gid = -1
        unknown.append(f"group {group!r}")
    return uid, gid, unknown


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "owner": {"type": "str", "default": "root"},
            "group": {"type": "str", "default": "root"},
            "mode": {"type": "str", "default": "0755"},
            "variable": {"type": "str", "default": "path"},
        },
        supports_check_mode=True,
    )
    params = module.params
    variable = params["variable"]
    if not re.fullmatch(r"0?[0-7]{3,4}", params["mode"]):
        module.fail_json(msg=f"mode {params['mode']!r} is not an octal mode such as 0755")
    uid, gid, unknown = _ids(params["owner"], params["group"])
    if unknown and not module.check_mode:
        module.fail_json(msg=f"{variable} = {params['path']}: no such user or group {', '.join(unknown)}")
    try:
        # A dry run on a fresh host: the user and group are the ones an earlier task of this run would create
        # (-1 owns nothing, so the directory reads as to be changed); the path itself is checked all the same.
        done = safepath.ensure_directory(
            params["path"], uid, gid, int(params["mode"], 8), variable, dry_run=module.check_mode
        )
    except (safepath.UntrustedPathError, OSError) as err:
        module.fail_json(msg=str(err), path=params["path"])
    if unknown:
        done["after"] = {"owner": params["owner"], "group": params["group"], "mode": params["mode"], "note": "created by this run"}
    result = {"changed": done["changed"], "path": done["path"], "created": done["created"]}
    if done["changed"]:
        result["diff"] = {
            "before": f"{done['before']}\n" if done["before"] else "absent\n",
            "after": f"{done['after']}\n",
            "before_header": done["path"],
            "after_header": done["path"],
        }
    module.exit_json(**result)


if __name__ == "__main__":
    main()
