"""Lookup sglang_deploy_probes: the correctness gate's probes as data, for a module on a host to run."""

from __future__ import annotations

DOCUMENTATION = r"""
name: sglang_deploy_probes
short_description: The correctness gate's probes (the shipped default set, or a probes file), checked
description:
  - Reads a probes file on the control node - the shipped default set (sglang_deploy_host/serving/probes/default.yml,
    what `sglang-deploy verify` asks) with no term, or the file a term names - checks every entry as the gate
    does, and returns the list for a module's I(probes) (sglang_correctness_gate on the host, which has no
    copy of the file).
  - Use it with query() or wantlist=True, so the list comes back whole.
options:
  _terms:
    description: A probes file on the control node (none = the shipped default set).
    required: false
"""

RETURN = r"""
_raw:
  description: The probes, each a mapping as the file holds it (name, prompt, expect, max_tokens, ...).
  type: list
  elements: dict
"""

from typing import Any

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from sglang_deploy_host.serving import gate


class LookupModule(LookupBase):
    def run(self, terms: list[Any], variables: dict[str, Any] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
        if len(terms) > 1:
            raise AnsibleLookupError(f"sglang_deploy_probes takes at most one probes file, got {terms!r}")
        path = str(terms[0]) if terms else None
        try:
            data = gate.probes_data(path)
            gate.parse_probes(data, path or str(gate.DEFAULT_PROBES))
        except gate.ProbeFileError as err:
            raise AnsibleLookupError(f"sglang_deploy_probes: {err}") from None
        return list(data)
