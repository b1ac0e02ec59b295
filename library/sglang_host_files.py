#!/usr/bin/python
"""Ansible module sglang_host_files: the helper programs systemd runs for the sglang unit."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_host_files
short_description: Install the helper programs that systemd runs for the sglang unit
description:
  - Writes C(gpufacts.py) (the unit's ExecStartPre= GPU idle check), C(sglang_launcher.py) (its
    ExecStart=, which hands secrets to sglang in-process) and C(unitcheck.py) (the unit's
    validator before install) into I(dest), root-owned and read-only to everyone else.
  - The source is the project's one copy, module_utils/sglang_deploy_host, which Ansible ships
    with this module; the CLI and the plugins import the same files.
options:
  dest:
    description: Directory of the helpers (created, root-owned, mode 0755).
    type: path
    required: true
  names:
    description: Which helpers to install.
    type: list
    elements: str
    choices: [gpufacts, sglang_launcher, unitcheck]
    default: [gpufacts, sglang_launcher, unitcheck]
"""

RETURN = r"""
files:
  description: Path of every helper installed, whether or not it changed.
  type: list
  elements: str
  returned: always
changed_files:
  description: The helpers that were (or, in check mode, would be) written.
  type: list
  elements: str
  returned: always
"""

import os
import tempfile

from ansible.module_utils.basic import AnsibleModule

# Imported so that Ansible ships them with this module; their sources are what gets installed.
from ansible.module_utils.sglang_deploy_host import gpufacts, sglang_launcher, unitcheck  # noqa: F401
from ansible.module_utils.sglang_deploy_host.interp import source

MODE = 0o755


def _current(path: str) -> tuple[bytes | None, bool]:
    """The file's bytes, and whether its owner and mode are already root/0755."""
    try:
        info = os.stat(path)
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return None, False
    right = info.st_uid == 0 and info.st_gid == 0 and (info.st_mode & 0o7777) == MODE
    return data, right


def _write(path: str, data: bytes) -> None:
    """Replace ``path`` atomically: a running unit sees the old or the new helper, never half."""
    directory = os.path.dirname(path)
    handle, temporary = tempfile.mkstemp(prefix=".sglang-host-file.", dir=directory)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.chown(temporary, 0, 0)
        os.chmod(temporary, MODE)
        os.rename(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "dest": {"type": "path", "required": True},
            "names": {
                "type": "list",
                "elements": "str",
                "choices": ["gpufacts", "sglang_launcher", "unitcheck"],
                "default": ["gpufacts", "sglang_launcher", "unitcheck"],
            },
        },
        supports_check_mode=True,
    )
    dest = module.params["dest"]
    files, changed_files, diffs = [], [], []
    if not os.path.isdir(dest):
        changed_files.append(dest)
        diffs.append({"before_header": dest, "after_header": dest, "before": "absent\n", "after": "directory\n"})
        if not module.check_mode:
            os.makedirs(dest, mode=0o755, exist_ok=True)
            os.chown(dest, 0, 0)
    for name in module.params["names"]:
        path = os.path.join(dest, f"{name}.py")
        files.append(path)
        wanted = source(name)
        data, right = _current(path)
        if data == wanted and right:
            continue
        changed_files.append(path)
        diffs.append(
            {
                "before_header": path,
                "after_header": f"{path} (module_utils/sglang_deploy_host/{name}.py)",
                "before": "" if data is None else data.decode("utf-8", errors="replace"),
                "after": wanted.decode("utf-8"),
            }
        )
        if not module.check_mode:
            _write(path, wanted)
    module.exit_json(changed=bool(changed_files), files=files, changed_files=changed_files, diff=diffs)


if __name__ == "__main__":
    main()
