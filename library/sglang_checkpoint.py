#!/usr/bin/python
"""Ansible module sglang_checkpoint: what the served checkpoint holds, from its headers, kept beside it."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_checkpoint
short_description: Inspect the checkpoint the server loads (MTP draft layer, expert dtypes) from its headers alone
description:
  - Reads config.json, the safetensors index, hf_quant_config.json and each shard's header (never tensor data) with
    module_utils/sglang_deploy_host/model/inspection.py, the same code as C(sglang-deploy checkpoint DIR) on the control
    node. The sglang_server role hands the result to its resolver, which refuses a speculative launch whose draft
    layer is missing or quantized, and shared-expert fusion across dtypes, before the unit starts.
  - The verdict is kept in I(verdict_path) with the size, mtime and inode of every file it read; a later run whose
    files are unchanged reads it instead of the headers. It is kept only in a directory that root or this user owns
    and nobody else can write, and read back only from such a file.
  - A directory without the checkpoint yet (no config.json, or a shard still missing or short) is not an error -
    I(state) says so and nothing is judged; a malformed checkpoint fails, naming the file.
  - Check mode inspects (read-only) but keeps nothing.
options:
  path:
    description: The checkpoint directory (the server's --model-path).
    type: path
    required: true
  verdict_path:
    description: Where the verdict is kept (default, beside the weights - I(path) + C(.checkpoint.json)).
    type: path
  inventory_hostname:
    description: The inventory host the task runs for; failure messages start with it.
    type: str
"""

RETURN = r"""
state:
  description: C(inspected), C(absent) (no checkpoint at I(path) yet) or C(incomplete) (a shard missing or short).
  type: str
  returned: always
reason:
  description: Why it is absent or incomplete ("" when inspected).
  type: str
  returned: always
inspection:
  description: The inspection (inspection.Inspection.to_dict()) when I(state) is inspected, else null.
  type: dict
  returned: always
kept:
  description: Whether the verdict came from I(verdict_path) (true) or from the headers (false).
  type: bool
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_deploy_host.model import inspection


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "verdict_path": {"type": "path"},
            "inventory_hostname": {"type": "str"},
        },
        supports_check_mode=True,
    )
    host = module.params["inventory_hostname"]
    prefix = f"host {host}: " if host else ""
    path = module.params["path"].rstrip("/") or "/"
    verdict_path = module.params["verdict_path"] or inspection.verdict_path(path)
    result = {"state": "inspected", "reason": "", "inspection": None, "kept": False, "changed": False}
    kept = inspection.read_kept(path, verdict_path)
    if kept is not None:
        module.exit_json(**{**result, "inspection": kept.to_dict(), "kept": True})
    try:
        found = inspection.inspect(path)
    except inspection.AbsentCheckpointError as err:
        module.exit_json(**{**result, "state": "absent", "reason": str(err)})
    except inspection.IncompleteCheckpointError as err:
        module.exit_json(**{**result, "state": "incomplete", "reason": str(err)})
    except inspection.CheckpointError as err:
        module.fail_json(
            msg=f"{prefix}the checkpoint the server loads, {path}, is malformed: {err}. Fix: delete the file it names "
            "(or the directory) and re-run: the hf_model role fetches what is missing; `sglang-deploy checkpoint DIR` "
            "checks a copy"
        )
    result["inspection"] = found.to_dict()
    if not module.check_mode:
        try:
            why = inspection.keep(path, verdict_path, found)
        except OSError as err:
            why = f"{verdict_path}: {err.strerror}"
        result["changed"] = why is None
        if why is not None:
            module.warn(f"{prefix}the checkpoint's verdict is not kept ({why}); the next run reads its headers again")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
