"""Filters for the roles: each one is a single call into the ``sglang_deploy`` package."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

try:
    from sglang_deploy_host import endpoint, systemd
    from sglang_deploy.launch import DEFAULT_LAUNCHER, LaunchConfig, LaunchConfigError, profile_flags
except ImportError as exc:  # a clear message beats a bare "no filter named sglang_launch"
    raise ImportError(
        "the sglang_deploy package is not importable by this Ansible's Python. "
        "Fix: run scripts/setup (or `pip install -e .` in the venv running ansible-playbook)"
    ) from exc


def sglang_launch(
    flags: Any,
    python: str,
    flags_override: Any = None,
    env: Any = None,
    env_override: Any = None,
    secret_env: Any = None,
    launcher: str = DEFAULT_LAUNCHER,
    allow_unauthenticated: bool = False,
    host: str = "?",
) -> dict[str, Any]:
    """Launch configuration (argv, ExecStart=, Environment=) from the inventory's variables;
    refuses a launch that would expose the model without an API key (see exposure_problem)."""
    try:
        config = LaunchConfig.from_vars(
            flags,
            python=python,
            flags_override=flags_override,
            env=env,
            env_override=env_override,
            secret_env_names=list(secret_env or {}),
            launcher=launcher,
        )
    except LaunchConfigError as err:
        raise AnsibleFilterError(f"host {host}: {err}") from None
    problem = config.exposure_problem(allow_unauthenticated=bool(allow_unauthenticated))
    if problem:
        raise AnsibleFilterError(f"host {host}: {problem}")
    return config.to_dict()


def sglang_profile_flags(flags: Any, profile: Any = "", profiles: Any = None, host: str = "?") -> dict[str, Any]:
    """The flags with the launch profile merged in (``sglang_server_profile`` of ``sglang_server_profiles``)."""
    try:
        return profile_flags(flags, str(profile or ""), profiles)
    except LaunchConfigError as err:
        raise AnsibleFilterError(f"host {host}: {err}") from None


def sglang_api_key_problem(key: Any, variable: str) -> str:
    """Why an API key is refused ('' when it is fine); the message never holds the key."""
    return endpoint.api_key_problem(str(key or ""), variable) or ""


def sglang_env_file_lines(secret_env: Any, host: str = "?") -> list[str]:
    """Lines of the 0600 EnvironmentFile= holding secrets."""
    try:
        return [systemd.env_file_line(str(k), str(v)) for k, v in dict(secret_env or {}).items()]
    except ValueError as err:
        raise AnsibleFilterError(f"host {host}: sglang_server_secret_env: {err}") from None


def sglang_unit_settings(values: Any, host: str = "?") -> dict[str, Any]:
    """The unit's non-flag values, checked (no directive injection, no path escapes)."""
    try:
        return systemd.unit_settings(dict(values or {}))
    except systemd.UnitValueError as err:
        raise AnsibleFilterError(f"host {host}: {err}") from None


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


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "sglang_launch": sglang_launch,
            "sglang_profile_flags": sglang_profile_flags,
            "sglang_api_key_problem": sglang_api_key_problem,
            "sglang_env_file_lines": sglang_env_file_lines,
            "sglang_unit_settings": sglang_unit_settings,
            "sglang_path_component": sglang_path_component,
            "sglang_redact": sglang_redact,
        }
