"""Lookup sglang_deploy_quality: a quality reference or prompt set as data, for the module sglang_quality on a host."""

from __future__ import annotations

DOCUMENTATION = r"""
name: sglang_deploy_quality
short_description: A quality reference or prompt set read on the control node, checked
description:
  - C(reference PATH) reads a reference file (C(sglang-deploy quality record)), bounded, and checks it as the
    quality check does; C(prompts [PATH]) reads a prompt set file, the shipped sglang-deploy-default set with no
    path. Returns the data for the module sglang_quality (C(reference) or C(prompts)) on a host, which has no
    copy of the file.
  - Use it with query() or wantlist=True, so the mapping comes back whole.
options:
  _terms:
    description: C(reference) and its path, or C(prompts) and an optional path.
    required: true
"""

RETURN = r"""
_raw:
  description: The file's data (one mapping).
  type: list
  elements: dict
"""

from typing import Any

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from sglang_deploy_host.serving import quality_reference


class LookupModule(LookupBase):
    def run(self, terms: list[Any], variables: dict[str, Any] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
        kind = str(terms[0]) if terms else ""
        path = str(terms[1]) if len(terms) > 1 and terms[1] else ""
        if kind not in ("reference", "prompts") or len(terms) > 2 or (kind == "reference" and not path):
            raise AnsibleLookupError(f"sglang_deploy_quality takes 'reference' PATH or 'prompts' [PATH], got {terms!r}")
        try:
            if kind == "reference":
                data = quality_reference.reference_data(path)
                quality_reference.parse_reference(data, path)
            else:
                data = quality_reference.prompt_set_data(path or None)
                quality_reference.parse_prompt_set(data, path or str(quality_reference.DEFAULT_PROMPTS))
        except quality_reference.QualityInputError as err:
            raise AnsibleLookupError(f"sglang_deploy_quality: {err}") from None
        return [data]
