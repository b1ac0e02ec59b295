"""A serving host of inventory/proxmox as the sglang_server role hands it to the resolver
(``__sglang_server_inputs``), and the resolver's answer: shared by the tests of serving/, launch/ and fleet/."""

from __future__ import annotations

import copy
from typing import Any

import yaml
from conftest import ROOT

from sglang_deploy.serving import server
from sglang_deploy_host.gpu import gpufacts

FIXTURES = ROOT / "tests" / "fixtures" / "nvidia-smi"
PROFILE_DIR = ROOT / "inventory" / "proxmox" / "group_vars" / "sglang_servers"
SERVER_DEFAULTS = yaml.safe_load((ROOT / "roles" / "sglang_server" / "defaults" / "main.yml").read_text())
API_KEY = "a-long-test-key-0123456789abcdef"
UNIT = {
    "name": "sglang", "user": "sglang", "group": "sglang", "home": "/var/lib/sglang/home",
    "config_dir": "/etc/sglang", "unit_dir": "/etc/systemd/system",
    "libexec_dir": "/usr/local/libexec/sglang-deploy", "read_write_paths": ["/var/lib/sglang/home"],
    "hardening": SERVER_DEFAULTS["sglang_server_hardening"], "start_timeout_sec": 2400,
    "stop_timeout_sec": 90, "restart_sec": 30, "start_limit_burst": 3,
    "start_limit_interval_sec": 3600, "limit_nofile": 1048576, "gpu_idle_max_used_mib": 1024,
}  # fmt: skip


# The role's sglang_server_watchdog_* defaults, as the role hands them over.
WATCHDOG = {
    "enabled": True, "interval_sec": 60, "failures": 3, "backoff_initial_sec": 600, "backoff_max_sec": 7200,
    "timeout_sec": 60, "start_grace_sec": 2400, "gpu_count": 0, "stable_sec": 3600, "max_restarts_per_hour": 3,
}  # fmt: skip


def inputs(**overrides: Any) -> dict[str, Any]:
    """``__sglang_server_inputs`` of a host of inventory/proxmox (the profile's values, untemplated)."""
    profile = yaml.safe_load((PROFILE_DIR / "sglang_server.yml").read_text())
    profiles = yaml.safe_load((PROFILE_DIR / "profiles.yml").read_text())
    values: dict[str, Any] = {
        "flags": profile["sglang_server_flags"],
        "profile": profiles["sglang_server_profile"],
        "profiles": profiles["sglang_server_profiles"],
        "flags_override": {},
        "env": profile["sglang_server_env"],
        "env_override": {},
        "secret_env": {},
        "api_key": API_KEY,
        "allow_unauthenticated": False,
        "python": "/opt/sglang-deploy/ml-env/bin/python",
        "lane": profile["sglang_common_lane"],
        "state": "started",
        "memory_plan": profile["sglang_server_memory_plan"],
        "mem_fraction_unsafe_ok": False,
        "p2p_adjust": False,
        "advertise_url": "",
        "advertise_address": "10.0.0.21",
        "unit": copy.deepcopy(UNIT),
        "watchdog": dict(WATCHDOG),
    }
    values.update(overrides)
    return values


def resolve(host: str = "glm5-01", gpu_facts: dict[str, Any] | None = None, **overrides: Any) -> dict[str, Any]:
    return server.resolve(server.ServerInputs.from_vars(inputs(**overrides)), host=host, gpu_facts=gpu_facts).to_dict()


def facts(name: str) -> dict[str, Any]:
    return gpufacts.collect(from_dir=FIXTURES / name).to_dict()
