#!/usr/bin/python
"""Ansible module sglang_weights: a resumable copy of a local checkpoint into the model directory."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_weights
short_description: Copy a local checkpoint into the model directory, resuming what an earlier copy left short
description:
  - Writes every file of I(files) from I(src) into I(dest). A file already at its size is skipped, a
    shorter one is appended to from where it stopped, any other is written again in full. Files end up
    0644 and directories 0755, so the server's user reads what the fetching user wrote but cannot change it.
  - Refuses, before writing anything, a source whose files no longer have the listed sizes.
  - Check mode writes nothing and reports what would be written (files, bytes) and a diff of the sizes.
    The hf_model role runs it in the background (async) outside check mode; the logic is
    module_utils/sglang_deploy_host/model/weights.py, the same as C(python3 -m sglang_deploy_host.model.weights copy).
options:
  src:
    description: The local checkpoint directory (the hf_model role's hf_model_local_path).
    type: path
    required: true
  dest:
    description: The model directory (created when missing).
    type: path
    required: true
  files:
    description: The files to copy, relative path -> size in bytes (what sglang_weights_info returned as I(files)).
    type: dict
    required: true
  inventory_hostname:
    description: The inventory host the task runs for; failure messages start with it, as all of the role's do.
    type: str
"""

RETURN = r"""
copied:
  description: The files written (in check mode, that would be written), in name order.
  type: list
  elements: str
  returned: always
bytes_copied:
  description: Bytes written (in check mode, that would be written); a resumed file counts only its rest.
  type: int
  returned: always
total_bytes:
  description: Size of every listed file together.
  type: int
  returned: always
"""

from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_deploy_host.model import weights


def _size(item: weights.PendingFile) -> str:
    return "absent" if item.present_bytes is None else f"{item.present_bytes} bytes"


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "src": {"type": "path", "required": True},
            "dest": {"type": "path", "required": True},
            "files": {"type": "dict", "required": True},
            "inventory_hostname": {"type": "str"},
        },
        supports_check_mode=True,
    )
    host = module.params["inventory_hostname"]
    prefix = f"host {host}: " if host else ""
    src, dest = Path(module.params["src"]), Path(module.params["dest"])
    try:
        manifest = weights.validate_manifest(module.params["files"], "files")
        if module.check_mode:
            pending = weights.copy_plan(src, dest, manifest)
        else:
            pending = weights.copy_resumable(src, dest, manifest)
    except (weights.WeightsError, OSError) as exc:
        module.fail_json(
            msg=f"{prefix}copying hf_model_local_path={src} into hf_model_dir={dest} failed: {exc}. What is in "
            f"{dest} is kept; a re-run resumes from it. Fix: repair the source (or let the role list it again), "
            "then re-run."
        )
    bytes_copied = sum(item.bytes_to_write for item in pending)
    result = {
        "changed": bool(pending),
        "copied": [item.name for item in pending],
        "bytes_copied": bytes_copied,
        "total_bytes": sum(manifest.values()),
    }
    if pending:
        # Only the files that change, with their size before and after.
        result["diff"] = {
            "before_header": str(dest),
            "after_header": f"{dest} (from {src}: {len(pending)} files, {bytes_copied} bytes to write)",
            "before": "".join(f"{item.name}: {_size(item)}\n" for item in pending),
            "after": "".join(f"{item.name}: {item.size} bytes\n" for item in pending),
        }
    module.exit_json(**result)


if __name__ == "__main__":
    main()
