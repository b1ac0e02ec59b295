#!/usr/bin/python
"""Ansible module sglang_kernel_proof: which GPU architectures the kernels of a venv were compiled for."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_kernel_proof
short_description: Prove that a venv's kernel packages carry cubins for the lane's GPU architectures
description:
  - Parses the C(.nv_fatbin) section of every shared object of I(packages) (and their bare C(*.cubin)
    files, summed up as one C(<dir>/**/*.cubin) entry) with the project's fatbin parser, in this
    module's own interpreter. No GPU, no CUDA and nothing from the venv are needed.
  - Fails listing every object with cubins that lacks one of I(required_archs), unless one of
    I(exemptions) matches it. An exempt object must still lack the archs, and every exemption must
    match an object, so that the lane's kernel_exemptions stay true.
  - Read-only; runs in check mode too. The sglang_ml_env module runs the same proof before it
    switches to a new venv.
options:
  path:
    description: A venv (its site-packages are read) or a site-packages directory.
    type: path
    required: true
  packages:
    description: Top-level directories under site-packages whose objects must carry the archs, e.g. sgl_kernel.
    type: list
    elements: str
    required: true
  required_archs:
    description: Architectures every such object must have a cubin for (sm_120 is met by sm_120, sm_120a or sm_120f).
    type: list
    elements: str
    required: true
  exemptions:
    description: Globs relative to site-packages (the lane's kernel_exemptions objects) of objects known to lack the archs.
    type: list
    elements: str
    default: []
"""

RETURN = r"""
site_packages:
  description: The site-packages directory that was read.
  type: str
  returned: success or when the proof failed
archs:
  description: Cubin architectures of every object judged (required or exempt), by path relative to site-packages.
  type: dict
  returned: success or when the proof failed
required:
  description: The objects that had to carry I(required_archs).
  type: list
  elements: str
  returned: success or when the proof failed
problems:
  description: What failed the proof, one sentence each.
  type: list
  elements: str
  returned: success or when the proof failed
"""

from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_deploy_host.stack import mlenv


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "packages": {"type": "list", "elements": "str", "required": True},
            "required_archs": {"type": "list", "elements": "str", "required": True},
            "exemptions": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    params = module.params
    path = Path(params["path"])
    if not path.is_dir():
        module.fail_json(msg=f"path {path} is not a directory: give the ml-env (a venv) or its site-packages")
    try:
        site = mlenv.site_packages(path)
        proof = mlenv.kernel_proof(site, params["packages"], params["required_archs"], params["exemptions"])
    except (OSError, ValueError) as exc:
        module.fail_json(msg=f"kernel proof of {path}: {exc}")
    result = {"site_packages": str(site), "archs": proof.archs, "required": proof.required, "problems": proof.problems}
    if proof.problems:
        module.fail_json(
            msg=f"kernel proof of {site} for {' '.join(params['required_archs'])}: " + "; ".join(proof.problems),
            **result,
        )
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
