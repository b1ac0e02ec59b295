"""Lookup sglang_deploy_lane: a stack lane and its ml-env lock for one Python, as the ml_env role needs them."""

from __future__ import annotations

DOCUMENTATION = r"""
name: sglang_deploy_lane
short_description: A stack lane's CUDA, kernel requirements and ml-env lock for one Python
description:
  - Reads the lane from the sglang_deploy package (src/sglang_deploy/lanes/<lane>.yml, checked key by
    key) and its committed lock for I(python) (lanes/locks/<lane>-py<python>.txt), or the lock in
    I(lock_file). The lock's header must name that Python and a CUDA; a committed lock must also match
    the lane's current inputs (not stale).
  - Errors name the host, the lane, the Python, the locks the lane has, and the fix.
options:
  _terms:
    description: The lane's name (one term).
    required: true
  python:
    description: The host Python's minor version the lock must be made for, e.g. "3.11".
    type: str
    required: true
  lock_file:
    description: A lock file on the control node to use instead of the lane's ("" = the lane's).
    type: str
    default: ""
  host:
    description: The host the lock is for, named in errors.
    type: str
    default: "?"
"""

RETURN = r"""
_raw:
  description:
    - name, cuda, required_archs, kernel_exemptions (the object globs) of the lane, and lock with path,
      name (file name), text, header (lane, python, platform, inputs-sha256, cuda) and venv (the name of
      the venv the lock is installed into).
  type: list
  elements: dict
"""

import re
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from sglang_deploy.lanes import catalog, lock
from sglang_deploy_host.stack import lockfile


def lane_data(name: str, python: str, lock_file: str = "", host: str = "?") -> dict[str, Any]:
    """The lane ``name`` with its lock for ``python``; AnsibleLookupError naming the fix."""
    where = f"host {host}: lane {name}, Python {python}"
    if not re.fullmatch(r"3\.\d+", python):
        raise AnsibleLookupError(f"{where}: {python!r} is not a Python minor version such as 3.11 (ml_env_python's)")
    try:
        lane = catalog.load_lane(name)
    except catalog.LaneError as err:
        raise AnsibleLookupError(
            f"host {host}: ml_env_lane: {err}. Fix: set ml_env_lane to one of them, or add "
            f"src/sglang_deploy/lanes/{name}.yml and run `sglang-deploy lock --lane {name}`"
        ) from None
    if lane.lock is None:
        raise AnsibleLookupError(
            f"{where}: the lane has no lock: section, so it can validate flags but not build an ml-env. "
            f"Fix: add lock: to src/sglang_deploy/lanes/{name}.yml and run `sglang-deploy lock --lane {name}`"
        )
    target = lock.LockTarget(lane, python)
    regenerate = f"`sglang-deploy lock --lane {name}`"
    if lock_file:
        path = Path(lock_file)
        if not path.is_file():
            raise AnsibleLookupError(
                f"{where}: ml_env_lock_file {lock_file} is not a file on the control node. "
                f'Fix: point it at a lock made by {regenerate}, or set it to "" for the lane\'s own'
            )
    else:
        path = lock.lock_path(target)
        if python not in lane.lock.pythons or not path.is_file():
            have = ", ".join(sorted(p.name for p in lock.lock_dir().glob(f"{name}-py*.txt"))) or "none"
            raise AnsibleLookupError(
                f"{where}: the lane has no lock for this Python ({path.name}); its locks: {have}. "
                f"Fix: set ml_env_python to a Python the lane lists under lock.pythons "
                f"({', '.join(lane.lock.pythons)}), or add {python} there in src/sglang_deploy/lanes/{name}.yml "
                f"and run {regenerate}"
            )
    text = path.read_text(encoding="utf-8")
    header = lockfile.header_fields(text)
    if header.get("python") != python or "cuda" not in header or header.get("lane", name) != name:
        raise AnsibleLookupError(
            f"{where}: {path} is made for lane {header.get('lane', '(no header)')}, Python "
            f"{header.get('python', '(no header)')}, CUDA {header.get('cuda', '(no header)')}; a lock only installs "
            f"on the Python it was resolved for. Fix: use the lane's lock for this Python (ml_env_lock_file: \"\") "
            f"or regenerate it with {regenerate}"
        )
    stale = None if lock_file else lock.is_stale(target, text)
    if stale:
        raise AnsibleLookupError(f"{where}: {stale}. Fix: run {regenerate} and commit the lock")
    return {
        "name": lane.name,
        "cuda": lane.cuda,
        "required_archs": list(lane.required_archs),
        "kernel_exemptions": [exemption.object for exemption in lane.kernel_exemptions],
        "lock": {
            "path": str(path),
            "name": path.name,
            "text": text,
            "header": header,
            "venv": lockfile.venv_name(text),
        },
    }


class LookupModule(LookupBase):
    def run(self, terms: list[Any], variables: dict[str, Any] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
        self.set_options(var_options=variables, direct=kwargs)
        if len(terms) != 1:
            raise AnsibleLookupError(f"sglang_deploy_lane takes one lane name, got {terms!r}")
        return [
            lane_data(
                str(terms[0]),
                str(self.get_option("python")),
                str(self.get_option("lock_file") or ""),
                str(self.get_option("host")),
            )
        ]
