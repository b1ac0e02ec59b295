"""The resolver (src/sglang_deploy/serving/server.py): one serving host in, every value about its server out.

The role hands its variables over in one mapping (roles/sglang_server/vars/main.yml,
``__sglang_server_inputs``); these tests build that mapping from the role's defaults and the shipped
inventory/proxmox profile, as Ansible would, and check what the published fact holds."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml
from conftest import ROOT
from server_inputs import API_KEY, SERVER_DEFAULTS, UNIT, WATCHDOG, facts, inputs, resolve

from sglang_deploy.serving import server
from sglang_deploy_host.serving import systemd, unit_flags
from sglang_deploy_host import watchdog as host_watchdog


def test_the_roles_handover_names_every_input_once() -> None:
    """roles/sglang_server/vars/main.yml hands over exactly the resolver's inputs (no more, no fewer)."""
    role_vars = yaml.safe_load((ROOT / "roles" / "sglang_server" / "vars" / "main.yml").read_text())
    handed = role_vars["__sglang_server_inputs"]
    assert set(handed) == set(server.ServerInputs.__dataclass_fields__)
    assert set(handed["unit"]) == set(UNIT)
    # every handed-over role variable is a documented default of the role
    names = {v.strip("{} ").split(" | ")[0] for v in handed.values() if isinstance(v, str)}
    names |= {v.strip("{} ") for v in handed["unit"].values()}
    assert names <= set(SERVER_DEFAULTS), names - set(SERVER_DEFAULTS)


def test_the_proxmox_profile_resolves_to_seed_004_with_the_key_from_the_env_file() -> None:
    result = resolve()
    flags = result["flags"]
    # canonical: every value as sglang gets it on the command line
    assert flags["tp-size"] == "8" and flags["mem-fraction-static"] == "0.92"
    assert flags["api-key"] == {"env": unit_flags.API_KEY_ENV}
    assert list(flags)[-1] == "api-key"  # the role's addition goes last; the profile's order stays
    assert result["launch"]["exec_start"].startswith(
        "/opt/sglang-deploy/ml-env/bin/python /usr/local/libexec/sglang-deploy/sglang_launcher.py --module sglang.launch_server"
    )
    assert result["environment"]["NCCL_P2P_DISABLE"] == "1"
    assert result["unit"]["restart_marker"] == "/etc/sglang/sglang.restart-pending"
    assert result["unit"]["env_file"] == "/etc/sglang/sglang.env"
    assert result["endpoint"] == {
        "bind_host": "0.0.0.0", "port": 8000, "local_url": "http://127.0.0.1:8000",
        "worker_url": "http://10.0.0.21:8000", "served_model": "glm-5", "api_key_env": unit_flags.API_KEY_ENV, "cafile": "",
    }  # fmt: skip
    plan = result["memory_plan"]
    assert plan["safe"] is True and plan["requested"] == 0.92 and plan["mem_fraction_static"] == 0.92
    assert result["launch"]["tp_size"] == 8
    assert result["pending"] == [] and result["adjustments"] == {"flags": {}, "env": {}}


def test_the_result_holds_no_secret() -> None:
    result = resolve(secret_env={"HF_TOKEN": "hf_secret_value_123"})
    text = json.dumps(result)
    assert API_KEY not in text and "hf_secret_value_123" not in text
    assert result["secret_env_names"] == ["HF_TOKEN", unit_flags.API_KEY_ENV]
    secrets = server.secrets(server.ServerInputs.from_vars(inputs(secret_env={"HF_TOKEN": "hf_secret_value_123"})))
    assert secrets == {"HF_TOKEN": "hf_secret_value_123", unit_flags.API_KEY_ENV: API_KEY}


def test_the_tuned_profile_resolves_auto_to_the_planners_fraction_in_place() -> None:
    result = resolve(profile="tuned-mtp")
    flags = result["flags"]
    assert flags["kv-cache-dtype"] == "bfloat16" and flags["speculative-algorithm"] == "EAGLE"
    fraction = float(flags["mem-fraction-static"])
    assert 0.5 < fraction < 0.92
    assert fraction == result["memory_plan"]["recommended_mem_fraction_static"]
    assert result["memory_plan"]["requested"] == "auto"
    # replaced where the profile had it, not appended
    base = list(resolve()["flags"])
    assert list(flags).index("mem-fraction-static") == base.index("mem-fraction-static")


def test_auto_without_a_gpu_size_is_pending_not_guessed() -> None:
    plan = {k: v for k, v in inputs()["memory_plan"].items() if k != "gpu_memory_mib"}
    result = resolve(profile="tuned", memory_plan=plan)
    assert result["flags"]["mem-fraction-static"] == "auto"
    assert result["memory_plan"] is None
    assert result["pending"] == [
        "mem-fraction-static auto needs the host's GPU facts (a driver) or sglang_server_memory_plan.gpu_memory_mib"
    ]
    # with the host's GPUs it is final
    done = resolve(profile="tuned", memory_plan=plan, gpu_facts=facts("rtx-pro-6000-8gpu-passthrough"))
    assert done["pending"] == [] and 0.5 < float(done["flags"]["mem-fraction-static"]) <= 0.92


def test_an_unsafe_fraction_is_refused_naming_host_variable_and_fix_unless_allowed() -> None:
    with pytest.raises(server.ResolveError) as err:
        resolve(flags_override={"mem-fraction-static": 0.95})
    message = str(err.value)
    assert message.startswith("host glm5-01: sglang_server_flags['mem-fraction-static'] = 0.95 is unsafe")
    assert "sglang_server_mem_fraction_unsafe_ok: true" in message and "(or auto)" in message
    allowed = resolve(flags_override={"mem-fraction-static": 0.95}, mem_fraction_unsafe_ok=True)
    assert allowed["flags"]["mem-fraction-static"] == "0.95" and allowed["memory_plan"]["safe"] is False


def test_p2p_adjustment_adds_what_the_p2p_check_needs_only_when_asked() -> None:
    box = facts("rtx-pro-6000-8gpu-passthrough")
    bare = {"flags_override": {"disable-custom-all-reduce": None}, "env_override": {"NCCL_P2P_DISABLE": None}}
    left = resolve(gpu_facts=box, **bare)
    assert "disable-custom-all-reduce" not in left["flags"] and "NCCL_P2P_DISABLE" not in left["environment"]
    adjusted = resolve(gpu_facts=box, p2p_adjust=True, **bare)
    assert adjusted["adjustments"] == {"flags": {"disable-custom-all-reduce": True}, "env": {"NCCL_P2P_DISABLE": "1"}}
    assert adjusted["flags"]["disable-custom-all-reduce"] is True  # a switch: no value on the command line
    assert adjusted["environment"]["NCCL_P2P_DISABLE"] == "1"
    assert '"NCCL_P2P_DISABLE=1"' in adjusted["launch"]["environment_assignments"]


def test_a_p2p_capable_box_or_no_facts_needs_no_adjustment() -> None:
    assert resolve(p2p_adjust=True)["adjustments"] == {"flags": {}, "env": {}}


@pytest.mark.parametrize(
    "overrides, words",
    [
        ({"state": "restarted"}, ["sglang_server_state=restarted", "Fix: use started, stopped or installed"]),
        ({"api_key": ""}, ["0.0.0.0:8000", "sglang_server_api_key"]),
        ({"api_key": "a key with spaces"}, ["sglang_server_api_key holds a space or tab at character 2"]),
        ({"advertise_url": "http://user:pw@w1:8000"}, ["sglang_server_advertise_url"]),
        ({"advertise_url": "http://w1:8000\n"}, ["sglang_server_advertise_url"]),
        ({"flags_override": {"port": 70000}}, ["sglang_server_flags['port']"]),
        ({"profile": "tunned"}, ["'tunned' is not one of sglang_server_profiles"]),
        ({"secret_env": {"BAD NAME": "x"}}, ["sglang_server_secret_env"]),
    ],
)
def test_bad_input_is_one_error_naming_the_host_and_the_variable(overrides: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(server.ResolveError) as err:
        resolve(host="gpu-07", **overrides)
    message = str(err.value)
    assert message.startswith("host gpu-07: "), message
    assert all(word in message for word in words), message
    assert API_KEY not in message


def test_an_unauthenticated_open_endpoint_resolves_only_when_the_inventory_says_so() -> None:
    result = resolve(api_key="", allow_unauthenticated=True)
    assert "api-key" not in result["flags"] and result["endpoint"]["api_key_env"] is None


def test_advertise_url_replaces_the_worker_url_and_the_bind_address_never_leaks_into_it() -> None:
    assert resolve(advertise_url="https://w1.example:8443/")["endpoint"]["worker_url"] == "https://w1.example:8443"
    assert resolve(advertise_address="")["endpoint"]["worker_url"] == "http://glm5-01:8000"
    assert resolve(advertise_address="fd00::21")["endpoint"]["worker_url"] == "http://[fd00::21]:8000"


def test_the_inputs_are_checked_as_a_whole() -> None:
    with pytest.raises(server.ResolveError, match=r"unknown server inputs \['flag'\]"):
        server.ServerInputs.from_vars({**inputs(), "flag": {}})
    with pytest.raises(server.ResolveError, match="server inputs"):
        server.ServerInputs.from_vars({k: v for k, v in inputs().items() if k != "flags"})


def test_inventory_flags_is_step_one_alone() -> None:
    values = inputs()
    merged = server.inventory_flags(values["flags"], "tuned", values["profiles"], {"port": 9000})
    assert merged["kv-cache-dtype"] == "bfloat16" and merged["port"] == 9000
    assert merged["mem-fraction-static"] == "auto"


# -- the watchdog ----------------------------------------------------------------------------------
def test_the_watchdog_gets_its_units_and_a_checked_command_line_without_the_key() -> None:
    resolved = resolve()
    dog = resolved["watchdog"]
    assert (dog["name"], dog["enabled"], dog["expected_gpus"]) == ("sglang-watchdog", True, 8)
    assert dog["service_path"] == "/etc/systemd/system/sglang-watchdog.service"
    assert dog["timer_path"] == "/etc/systemd/system/sglang-watchdog.timer"
    argv = systemd.split_words(dog["exec_start"].replace("\\\n", " "))
    assert argv[:4] == ["/usr/bin/python3", "-m", "sglang_deploy_host.watchdog", "check"]
    pairs = dict(zip(argv[4::2], argv[5::2]))
    assert pairs["--url"] == resolved["endpoint"]["local_url"] == "http://127.0.0.1:8000"
    assert pairs["--env-file"] == resolved["unit"]["env_file"] and pairs["--api-key-env"] == "SGLANG_API_KEY"
    assert pairs["--state-file"] == "/var/lib/sglang-watchdog/state.json" and pairs["--start-grace"] == "2400"
    # The key goes only to a socket of the unit's user; the alert reads the metrics file.
    assert pairs["--service-user"] == "sglang" and pairs["--metrics-file"] == "/var/lib/sglang-watchdog/sglang-watchdog.prom"
    assert (pairs["--stable"], pairs["--max-restarts-per-hour"]) == ("3600", "3")
    assert API_KEY not in dog["exec_start"] and API_KEY not in str(dog)
    # The tick bounds itself (its generation + watchdog.TICK_EXTRA_S); systemd's limit is above that by construction.
    assert dog["ip_address_allow"] == "localhost" and dog["timeout_start_sec"] == 60 + int(host_watchdog.TICK_EXTRA_S) + 30


def test_the_watchdog_follows_the_launch_and_the_bind_address() -> None:
    four = resolve(flags_override={"tp-size": 4, "host": "10.0.0.21"}, env_override={"CUDA_VISIBLE_DEVICES": "4,5,6,7"})
    dog = four["watchdog"]
    assert dog["expected_gpus"] == 4 and "--visible-devices 4,5,6,7" in dog["exec_start"]
    assert dog["ip_address_allow"] == "localhost 10.0.0.21" and "--url http://10.0.0.21:8000" in dog["exec_start"]
    assert resolve(watchdog={**WATCHDOG, "gpu_count": 2})["watchdog"]["expected_gpus"] == 2
    assert "--api-key-env" not in resolve(api_key="", flags_override={"host": "127.0.0.1"})["watchdog"]["exec_start"]


@pytest.mark.parametrize(
    ("change", "message"),
    [({"failures": 0}, "sglang_server_watchdog_failures = 0 is not an integer from 1 to 100"),
     # 1e30 in YAML reaches the resolver as a huge integer (the role's int type) or a float: refused either way.
     ({"interval_sec": 10**30}, "sglang_server_watchdog_interval_sec = 1000000000000000000000000000000 is not an integer from 10 to 86400"),
     ({"interval_sec": float("nan")}, "sglang_server_watchdog_interval_sec = nan is not an integer"),
     ({"timeout_sec": 10**6}, "sglang_server_watchdog_timeout_sec = 1000000 is not an integer from 1 to 3600"),
     ({"max_restarts_per_hour": 0}, "sglang_server_watchdog_max_restarts_per_hour = 0 is not an integer from 1 to 60"),
     ({"interval_sec": "60s"}, "sglang_server_watchdog_interval_sec = '60s' is not an integer"),
     ({"backoff_max_sec": 60}, "sglang_server_watchdog_backoff_max_sec = 60 is below sglang_server_watchdog_backoff_initial_sec"),
     ({"enabled": "yes"}, "sglang_server_watchdog_enabled = 'yes' is not true or false")],
)  # fmt: skip
def test_bad_watchdog_values_name_the_variable(change: dict[str, Any], message: str) -> None:
    with pytest.raises(server.ResolveError, match=f"host glm5-01: {re.escape(message)}"):
        resolve(watchdog={**WATCHDOG, **change})


def test_a_host_name_bind_needs_the_watchdog_off() -> None:
    with pytest.raises(server.ResolveError, match="binds the host name 'gpu-box'.*sglang_server_watchdog_enabled: false"):
        resolve(flags_override={"host": "gpu-box"})
    assert resolve(flags_override={"host": "gpu-box"}, watchdog={**WATCHDOG, "enabled": False})["watchdog"]["enabled"] is False


def test_a_resolve_builds_the_launch_once_and_amends_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """LaunchConfig.from_vars runs once per resolve (the inventory's flags, in the lane's spelling); the P2P
    adjustment and the role's additions amend that launch, parsing only what they change."""
    from sglang_deploy.launch.config import LaunchConfig

    built: list[str] = []
    amended: list[list[str]] = []
    original_build, original_amend = LaunchConfig.from_vars.__func__, LaunchConfig.amended  # type: ignore[attr-defined]

    def counting_build(cls: type, *args: Any, **kwargs: Any) -> LaunchConfig:
        built.append(kwargs.get("lane", ""))
        return original_build(cls, *args, **kwargs)

    def counting_amend(self: LaunchConfig, **changes: Any) -> LaunchConfig:
        amended.append(sorted(changes.get("flags") or {}))
        return original_amend(self, **changes)

    monkeypatch.setattr(LaunchConfig, "from_vars", classmethod(counting_build))
    monkeypatch.setattr(LaunchConfig, "amended", counting_amend)
    box = facts("rtx-pro-6000-8gpu-passthrough")
    done = resolve(profile="tuned", gpu_facts=box, p2p_adjust=True, flags_override={"disable-custom-all-reduce": None})
    assert built == ["cu128"]
    assert amended == [["disable-custom-all-reduce"], ["api-key", "mem-fraction-static"]]
    assert float(done["flags"]["mem-fraction-static"]) == done["memory_plan"]["mem_fraction_static"]
