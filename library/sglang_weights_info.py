#!/usr/bin/python
"""Ansible module sglang_weights_info: where a model directory stands against its source, as data."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_weights_info
short_description: Measure a model directory against its source - bytes left, free disk, completeness, progress
description:
  - Compares I(dest) with the source's files and sizes (I(files) from the hub, a recorded I(manifest), or
    a local checkpoint I(src), which is then checked itself). Every safetensors shard must also have the
    size its own header implies, so a truncated shard is found without any network access.
  - Read-only; runs in check mode too. The logic is module_utils/sglang_deploy_host/model/weights.py, the same
    file as C(python3 -m sglang_deploy_host.model.weights) on the control node.
  - The hf_model role's module. I(require) turns a finding into a failure whose message names the role's
    variable to fix (src is hf_model_local_path, dest hf_model_dir, margin_gib hf_model_disk_margin_gib).
options:
  dest:
    description: The model directory (it need not exist yet).
    type: path
    required: true
  src:
    description: A local checkpoint directory; its files are the source's.
    type: path
  files:
    description: The source's files, relative path -> size in bytes (the hub's file list).
    type: dict
  manifest:
    description: 'A file holding C({"files": {path: size}}), as the role records it beside I(dest).'
    type: path
  margin_gib:
    description: Free space required beyond the bytes still to fetch, in GiB.
    type: float
    default: 0
  model:
    description: How messages name these weights, e.g. C(org/name@revision).
    type: str
    default: the weights
  require:
    description:
      - Findings that fail the task. C(source_complete) - I(src) is a complete checkpoint (needs I(src));
        C(space) - the disk holds what is left plus I(margin_gib); C(complete) - I(dest) holds every file of
        the source at its size.
    type: list
    elements: str
    choices: [source_complete, space, complete]
    default: []
  inventory_hostname:
    description: The inventory host the task runs for; failure messages start with it, as all of the role's do.
    type: str
"""

RETURN = r"""
complete:
  description: I(dest) holds every file of the source at its size and every shard is whole.
  type: bool
  returned: always
files:
  description: The source's files, relative path -> size.
  type: dict
  returned: always
file_count:
  description: Number of files of the source.
  type: int
  returned: always
total_bytes:
  description: Size of the source.
  type: int
  returned: always
missing_bytes:
  description: Bytes still to write into I(dest) (0 when complete); a shorter file counts only its rest.
  type: int
  returned: always
missing_files:
  description: The files still to write into I(dest) (missing, short, or of another size), in name order.
  type: list
  elements: str
  returned: always
needed_bytes:
  description: I(missing_bytes) plus the margin (0 when complete).
  type: int
  returned: always
free_bytes:
  description: Free bytes at I(dest), or at its nearest existing parent (I(free_path)).
  type: int
  returned: always
free_path:
  description: Where the free space was measured.
  type: str
  returned: always
enough_space:
  description: I(free_bytes) >= I(needed_bytes).
  type: bool
  returned: always
problems:
  description: What is wrong in I(dest) (name, state missing/truncated/oversized/bad-header, expected_bytes,
    present_bytes, detail), or C({error}) for a directory that cannot be read as a checkpoint.
  type: list
  elements: dict
  returned: always
problems_brief:
  description: The problems in one line; empty when complete.
  type: str
  returned: always
source_complete:
  description: Whether I(src) is itself a complete checkpoint; null without I(src).
  type: bool
  returned: always
source_problems:
  description: What is wrong in I(src), as I(problems).
  type: list
  elements: dict
  returned: always
source_problems_brief:
  description: The source's problems in one line.
  type: str
  returned: always
progress:
  description: Every byte under I(dest) so far (partial downloads included) against I(total_bytes) - bytes,
    expected_bytes, percent.
  type: dict
  returned: always
"""

from pathlib import Path
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.formatters import bytes_to_human
from ansible.module_utils.sglang_deploy_host.model import weights

GIB = 1024**3


def _unmet(
    require: list[str], info: dict[str, Any], src: Path | None, dest: Path, model: str, margin_gib: float
) -> str:
    """The failure message of the first requirement the findings do not meet ('' when all are met)."""
    if "source_complete" in require and not info["source_complete"]:
        return (
            f"hf_model_local_path={src} is not a complete checkpoint: {info['source_problems_brief']}. "
            "Nothing was copied. Fix: repair or re-copy the source (every shard of model.safetensors.index.json, "
            "full size)."
        )
    if "space" in require and not info["enough_space"]:
        return (
            f"{info['free_path']} has {bytes_to_human(info['free_bytes'])} free; {model} needs "
            f"{bytes_to_human(info['missing_bytes'])} more in hf_model_dir={dest} plus "
            f"hf_model_disk_margin_gib={margin_gib:g} = {bytes_to_human(info['needed_bytes'])}. "
            "Fix: free space there, or point sglang_common_models_root at a larger disk."
        )
    if "complete" in require and not info["complete"]:
        return (
            f"{dest} is not a complete copy of {model}: {info['problems_brief']}. Fix: re-run the play (the fetch "
            "resumes what is short or missing); if the source itself is short, repair it (hf_model_local_path, or "
            "the repository on the hub or mirror)."
        )
    return ""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "dest": {"type": "path", "required": True},
            "src": {"type": "path"},
            "files": {"type": "dict"},
            "manifest": {"type": "path"},
            "margin_gib": {"type": "float", "default": 0.0},
            "model": {"type": "str", "default": "the weights"},
            "require": {
                "type": "list",
                "elements": "str",
                "choices": ["source_complete", "space", "complete"],
                "default": [],
            },
            "inventory_hostname": {"type": "str"},
        },
        mutually_exclusive=[("src", "files", "manifest")],
        required_one_of=[("src", "files", "manifest")],
        supports_check_mode=True,
    )
    params = module.params
    prefix = f"host {params['inventory_hostname']}: " if params["inventory_hostname"] else ""
    dest, model, require = Path(params["dest"]), params["model"], params["require"]
    src = Path(params["src"]) if params["src"] else None
    if "source_complete" in require and src is None:
        module.fail_json(
            msg=f"{prefix}require=source_complete needs src (the local checkpoint). Fix: pass src, or drop it from require."
        )
    # Why the source's list could not be had, by where it came from, and what to do about it.
    fixes = {
        "src": "hf_model_local_path must be the checkpoint directory on the host",
        "manifest": "re-run the role's start step, which records the source's files beside hf_model_dir",
        "files": "check what the hub or mirror lists for hf_model_repo at hf_model_revision",
    }
    origin = next(key for key in fixes if params[key] is not None)
    try:
        if src is not None:
            manifest = weights.source_manifest(src)
        elif params["manifest"]:
            manifest = weights.load_manifest(Path(params["manifest"]))
        else:
            manifest = weights.validate_manifest(params["files"], "files")
    except (weights.WeightsError, OSError) as exc:
        module.fail_json(msg=f"{prefix}the source of {model} could not be listed ({exc}). Fix: {fixes[origin]}.")
    margin_bytes = int(params["margin_gib"] * GIB)
    info = weights.plan(dest, manifest, margin_bytes, src)
    info["progress"] = weights.progress(dest, info["total_bytes"])

    unmet = _unmet(require, info, src, dest, model, params["margin_gib"])
    if unmet:
        module.fail_json(msg=prefix + unmet)
    module.exit_json(changed=False, **info)


if __name__ == "__main__":
    main()
