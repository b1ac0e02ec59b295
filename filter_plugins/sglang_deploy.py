"""Filters for the roles: each one is a single call into the ``sglang_deploy`` package."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

from sglang_deploy_host.serving import systemd
from sglang_deploy.playbook import variables
from sglang_deploy.serving import server


def _inputs(values: Any, host: str) -> server.ServerInputs:
    try:
        return server.ServerInputs.from_vars(dict(values or {}))
    except server.ResolveError as err:
        raise AnsibleFilterError(f"host {host}: {err}") from None


def sglang_server_resolve(inputs: Any, host: str, gpu_facts: Any = None, checkpoint: Any = None) -> dict[str, Any]:
    """The host's server resolved once (src/sglang_deploy/serving/server.py): published as the fact
    ``sglang_server_resolved`` by roles/sglang_server/tasks/resolve.yml. ``checkpoint``: the host's
    inspection of the served weights (the sglang_checkpoint module's), when there is one."""
    try:
        return server.resolve(
            _inputs(inputs, host), host=host, gpu_facts=gpu_facts or None, checkpoint=checkpoint or None
        ).to_dict()
    except server.ResolveError as err:
        raise AnsibleFilterError(str(err)) from None


def sglang_server_basis(inputs: Any, host: str, gpu_facts: Any = None, checkpoint: Any = None) -> str:
    """What a resolution of these inputs would be made from (server.basis): resolve.yml resolves again only
    when it differs from the run's last one (``sglang_server_resolved.basis``)."""
    return server.basis(_inputs(inputs, host), gpu_facts or None, checkpoint or None)


def sglang_server_model_path(inputs: Any, host: str) -> str:
    """The directory the server loads, as the merged flags name it ("" when none on the host's disk)."""
    try:
        return server.model_path(_inputs(inputs, host))
    except server.LaunchConfigError as err:
        raise AnsibleFilterError(f"host {host}: {err}") from None


def sglang_server_secrets(inputs: Any, host: str) -> dict[str, str]:
    """The 0600 env file's variables (secret environment and API key), for its template and redaction."""
    return server.secrets(_inputs(inputs, host))


def sglang_env_file_lines(secrets: Any, host: str = "?", variable: str = "sglang_server_secret_env") -> list[str]:
    """Lines of an 0600 EnvironmentFile= holding secrets (``variable`` names where they came from)."""
    try:
        return [systemd.env_file_line(str(k), str(v)) for k, v in dict(secrets or {}).items()]
    except ValueError as err:
        raise AnsibleFilterError(f"host {host}: {variable}: {err}") from None


def sglang_bearer_headers(key: Any) -> dict[str, str]:
    """The request headers of a client with API key ``key`` ({} without one). Use with no_log."""
    return {"Authorization": f"Bearer {key}"} if key else {}


def sglang_path_component(value: Any, variable: str = "value") -> str:
    """``value`` if it is one safe directory name (e.g. a host name under render --out)."""
    try:
        return systemd.path_component(variable, value)
    except systemd.UnitValueError as err:
        raise AnsibleFilterError(str(err)) from None


def sglang_redact(text: Any, secrets: Any) -> str:
    """``text`` with every value of the ``secrets`` mapping replaced by ********, longest first
    (a journal read on failure must not print a key sglang or anything else logged)."""
    result = str(text)
    for value in sorted({str(v) for v in dict(secrets or {}).values() if v}, key=len, reverse=True):
        result = result.replace(value, "********")
    return result


def sglang_check_variables(
    names: Any, host: str, extras: Any = None, sources: Any = None, roles_dir: str = ""
) -> bool:
    """True when every role-prefixed variable of ``host`` (``names``) is one a role defines or publishes;
    otherwise an error naming each, the inventory file that sets it and the closest defined name
    (src/sglang_deploy/playbook/variables.py)."""
    try:
        variables.check(host, {**dict.fromkeys(names or ()), variables.EXTRAS_VAR: extras or []}, roles_dir, list(sources or []))
    except variables.UnknownVariablesError as err:
        raise AnsibleFilterError(str(err)) from None
    return True


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "sglang_check_variables": sglang_check_variables,
            "sglang_server_resolve": sglang_server_resolve,
            "sglang_server_basis": sglang_server_basis,
            "sglang_server_model_path": sglang_server_model_path,
            "sglang_server_secrets": sglang_server_secrets,
            "sglang_env_file_lines": sglang_env_file_lines,
            "sglang_bearer_headers": sglang_bearer_headers,
            "sglang_path_component": sglang_path_component,
            "sglang_redact": sglang_redact,
        }
