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
  - C(watchdog) is not one file but a copy of the package the watchdog needs
    (C(python3 -m sglang_deploy_host.watchdog), with C(PYTHONPATH=)I(dest)C(/python)); the watchdog
    and the modules it imports, nothing else, in I(dest)C(/python/sglang_deploy_host/), mode 0644 (a module
    an older layout left there is removed).
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
    choices: [gpufacts, sglang_launcher, unitcheck, watchdog]
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
from ansible.module_utils.sglang_deploy_host.gpu import gpufacts  # noqa: F401
from ansible.module_utils.sglang_deploy_host.serving import sglang_launcher, unitcheck  # noqa: F401
from ansible.module_utils.sglang_deploy_host import watchdog  # noqa: F401
from ansible.module_utils.sglang_deploy_host.interp import package_closure, source

MODE = 0o755
# A module of a package copy is read, not run.
PACKAGE_MODE = 0o644
PACKAGES = ("watchdog",)
# Each helper's module in the package (the name the role asks for is the file's name).
SOURCES = {"gpufacts": "gpu.gpufacts", "sglang_launcher": "serving.sglang_launcher", "unitcheck": "serving.unitcheck",
           "watchdog": "watchdog"}


def _current(path: str, mode: int = MODE) -> tuple[bytes | None, bool]:
    """The file's bytes, and whether its owner and mode are already root and ``mode``."""
    try:
        info = os.stat(path)
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return None, False
    right = info.st_uid == 0 and info.st_gid == 0 and (info.st_mode & 0o7777) == mode
    return data, right


def _write(path: str, data: bytes, mode: int = MODE) -> None:
    """Replace ``path`` atomically: a running unit sees the old or the new helper, never half."""
    directory = os.path.dirname(path)
    handle, temporary = tempfile.mkstemp(prefix=".sglang-host-file.", dir=directory)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.chown(temporary, 0, 0)
        os.chmod(temporary, mode)
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
                "choices": ["gpufacts", "sglang_launcher", "unitcheck", "watchdog"],
                "default": ["gpufacts", "sglang_launcher", "unitcheck"],
            },
        },
        supports_check_mode=True,
    )
    dest = module.params["dest"]
    files, changed_files, diffs = [], [], []

    def directory(path: str) -> None:
        if os.path.isdir(path):
            return
        changed_files.append(path)
        diffs.append({"before_header": path, "after_header": path, "before": "absent\n", "after": "directory\n"})
        if not module.check_mode:
            os.makedirs(path, mode=0o755, exist_ok=True)
            os.chown(path, 0, 0)

    def install(path: str, name: str, mode: int) -> None:
        files.append(path)
        wanted = source(name)
        data, right = _current(path, mode)
        if data == wanted and right:
            return
        changed_files.append(path)
        diffs.append(
            {
                "before_header": path,
                "after_header": f"{path} (module_utils/sglang_deploy_host/{name.replace('.', '/')}.py)",
                "before": "" if data is None else data.decode("utf-8", errors="replace"),
                "after": wanted.decode("utf-8"),
            }
        )
        if not module.check_mode:
            _write(path, wanted, mode)

    def stale(package: str) -> None:
        """A source left in the package's copy by an older layout is removed: the copy holds what it runs."""
        for root, _, names in os.walk(package):
            for leftover in sorted(n for n in names if n.endswith(".py") and os.path.join(root, n) not in files):
                path = os.path.join(root, leftover)
                changed_files.append(path)
                diffs.append({"before_header": path, "after_header": path, "before": "present\n", "after": "absent\n"})
                if not module.check_mode:
                    os.unlink(path)

    directory(dest)
    for name in module.params["names"]:
        if name in PACKAGES:
            package = os.path.join(dest, "python", "sglang_deploy_host")
            directory(os.path.join(dest, "python"))
            directory(package)
            for member in package_closure(SOURCES[name]):
                *subpackages, leaf = member.split(".")
                for depth in range(1, len(subpackages) + 1):
                    directory(os.path.join(package, *subpackages[:depth]))
                install(os.path.join(package, *subpackages, f"{leaf}.py"), member, PACKAGE_MODE)
            stale(package)
        else:
            install(os.path.join(dest, f"{name}.py"), SOURCES[name], MODE)
    module.exit_json(changed=bool(changed_files), files=files, changed_files=changed_files, diff=diffs)


if __name__ == "__main__":
    main()
