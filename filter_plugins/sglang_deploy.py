"""Filters for the roles: each one is a single call into the ``sglang_deploy`` package."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

try:
    from sglang_deploy import systemd
    from sglang_deploy.launch import LaunchConfig, LaunchConfigError
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
    host: str = "?",
) -> dict[str, Any]:
    """Launch configuration (argv, ExecStart=, Environment=) from the inventory's variables."""
    try:
        return LaunchConfig.from_vars(
            flags,
            python=python,
            flags_override=flags_override,
            env=env,
            env_override=env_override,
            secret_env_names=list(secret_env or {}),
        ).to_dict()
    except LaunchConfigError as err:
        raise AnsibleFilterError(f"host {host}: {err}") from None


def sglang_env_file_lines(secret_env: Any, host: str = "?") -> list[str]:
    """Lines of the 0600 EnvironmentFile= holding secrets."""
    try:
        return [systemd.env_file_line(str(k), str(v)) for k, v in dict(secret_env or {}).items()]
    except ValueError as err:
        raise AnsibleFilterError(f"host {host}: sglang_server_secret_env: {err}") from None


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"sglang_launch": sglang_launch, "sglang_env_file_lines": sglang_env_file_lines}
