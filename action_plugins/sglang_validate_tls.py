"""Action ``sglang_validate_tls``: the play's hosts' TLS files judged on the control node (serving/tls.py).

Runs before any host changes (an action plugin: nothing is sent to a host). For each host that serves TLS
(its published ``sglang_server_resolved.tls``): the certificate, key and CA files read as the copy task will
read them (an ansible-vault file decrypted through Ansible's loader, the plain copy removed after), then
every problem of every host at once, each naming the host, the variable and the file. Hosts without TLS
pass. ``checked`` holds each certificate's subject, names, end date and fingerprint (no secret).
"""

from __future__ import annotations

import datetime
from typing import Any

from ansible.errors import AnsibleError

from sglang_deploy.launch.validate_action import ValidateAction
from sglang_deploy.serving import tls


class ActionModule(ValidateAction):
    _VALID_ARGS = frozenset(("hosts",))

    def _read(self, path: str) -> tls.TlsFile:
        """``path`` decrypted when it is an ansible-vault file (the loader's temporary copy, removed here)."""
        try:
            real = self._loader.get_real_file(path, decrypt=True)
        except AnsibleError as err:
            # A vault file without its password (or with another's): one line naming the fix, not Ansible's error.
            first = (str(err).strip().splitlines() or ["?"])[0]
            raise ValueError(
                f"an ansible-vault file this run cannot decrypt ({first}). Fix: run with the vault password that "
                "encrypted it (--ask-vault-pass, --vault-password-file or ANSIBLE_VAULT_PASSWORD_FILE)"
            ) from None
        try:
            return tls.read_file(path, real)
        finally:
            if real != path:
                self._loader.cleanup_tmp_file(real)

    def validate(self, result: dict[str, Any], hosts: dict[str, Any]) -> dict[str, Any]:
        now = datetime.datetime.now(datetime.timezone.utc)
        errors: list[str] = []
        checked: dict[str, Any] = {}
        warnings: list[str] = []
        for host, resolved in hosts.items():
            served = dict((resolved or {}).get("tls") or {})
            if not served:
                checked[host] = "plain HTTP"
                continue
            try:
                summary = tls.judge_resolved(served, self._read, now)
            except tls.TlsError as err:
                errors.append(f"host {host}: {err}")
                continue
            checked[host] = summary
            warnings.extend(f"host {host}: {warning}" for warning in summary["warnings"])  # type: ignore[attr-defined]
        verdict = self.verdict(result, errors, checked, f"{len(hosts)} host(s) checked")
        if warnings:
            verdict["warnings"] = warnings
        return verdict
