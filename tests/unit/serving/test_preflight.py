"""Preflight checks on the fixtures: each failure class with its message, the profile passing, and
the filter plugin the role calls."""

from __future__ import annotations

import dataclasses
import importlib.util
from collections import Counter
from typing import Any

import pytest
from conftest import ROOT

from sglang_deploy.serving import preflight
from sglang_deploy_host.gpu import gpufacts
from sglang_deploy.launch.config import LaunchConfig

FIXTURES = ROOT / "tests" / "fixtures" / "nvidia-smi"
# Loaded from its file: putting filter_plugins/ on sys.path would shadow the sglang_deploy package.
_spec = importlib.util.spec_from_file_location(
    "preflight_filters", ROOT / "filter_plugins" / "preflight.py"
)
assert _spec is not None and _spec.loader is not None
preflight_filters = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(preflight_filters)

MIB_PER_GIB = 1024


def facts_of(
    name: str, shm_free_mib: int = 65536, weights_free_gib: int = 2000
) -> gpufacts.GpuFacts:
    facts = gpufacts.collect(from_dir=FIXTURES / name)
    facts.disks = [
        gpufacts.Disk("/dev/shm", "/dev/shm", shm_free_mib, shm_free_mib, 0),
        gpufacts.Disk("/var/lib/sglang", "/", 4_000_000, weights_free_gib * MIB_PER_GIB, 0),
    ]
    return facts


def launch(
    profile: dict[str, Any], flags: dict[str, Any] | None = None, env: dict[str, Any] | None = None
) -> LaunchConfig:
    return LaunchConfig.from_vars(
        profile["sglang_server_flags"],
        python="python3",
        flags_override=flags,
        env=profile["sglang_server_env"],
        env_override=env,
    )


SETTINGS = preflight.PreflightSettings(
    compute_capability="12.0",
    cuda="12.8",
    weights_path="/var/lib/sglang",
    weights_min_gib=410,
)
# The fix inventory/proxmox needs for the p2p check (see the module text of preflight.py).
P2P_OFF = {"NCCL_P2P_DISABLE": "1"}


def checks_failed(problems: list[preflight.Problem]) -> list[str]:
    return [p.check for p in problems]


def test_profile_with_p2p_disable_passes_on_the_passthrough_box(profile: dict[str, Any]) -> None:
    problems = preflight.evaluate(
        facts_of("rtx-pro-6000-8gpu-passthrough"), launch(profile, env=P2P_OFF), SETTINGS
    )
    assert problems == []


def test_profile_as_seeded_fails_only_p2p_naming_phb(profile: dict[str, Any]) -> None:
    """NCCL_P2P_LEVEL=PHB (seed 004) still lets NCCL try P2P; the profile needs NCCL_P2P_DISABLE."""
    if profile["sglang_server_env"].get("NCCL_P2P_DISABLE") == "1":
        base = launch(profile, env={"NCCL_P2P_DISABLE": None})
    else:
        base = launch(profile)
    problems = preflight.evaluate(facts_of("rtx-pro-6000-8gpu-passthrough"), base, SETTINGS)
    assert checks_failed(problems) == ["p2p"]
    message = problems[0].message("gpu-box")
    assert message.startswith(
        "host gpu-box: preflight check p2p failed: nvidia-smi topo -p2p r reports NS"
    )
    assert "NCCL_P2P_LEVEL=PHB still lets NCCL try P2P" in message
    assert 'Fix: add NCCL_P2P_DISABLE: "1" in sglang_server_env' in message
    assert "--disable-custom-all-reduce" not in message  # the profile has it


def test_p2p_without_custom_all_reduce_flag(profile: dict[str, Any]) -> None:
    problems = preflight.evaluate(
        facts_of("rtx-pro-6000-8gpu-passthrough"),
        launch(profile, flags={"disable-custom-all-reduce": None}, env=P2P_OFF),
        SETTINGS,
    )
    assert checks_failed(problems) == ["p2p"]
    assert (
        "lacks flag --disable-custom-all-reduce (sglang_server_flags: disable-custom-all-reduce: true)"
        in problems[0].found
    )


@pytest.mark.parametrize(
    ("env", "off"),
    [
        ({"NCCL_P2P_DISABLE": "1"}, True),
        ({"NCCL_P2P_LEVEL": "LOC"}, True),
        ({"NCCL_P2P_LEVEL": "0"}, True),
        ({"NCCL_P2P_LEVEL": "loc"}, True),
        ({"NCCL_P2P_LEVEL": "PHB"}, False),
        ({"NCCL_P2P_LEVEL": "SYS"}, False),
        ({"NCCL_P2P_DISABLE": "0"}, False),
        ({}, False),
    ],
)
def test_nccl_p2p_off(env: dict[str, str], off: bool) -> None:
    assert preflight.nccl_p2p_off(env) is off


def test_p2p_irrelevant_for_one_gpu(profile: dict[str, Any]) -> None:
    one = launch(profile, flags={"tp-size": 1, "disable-custom-all-reduce": None})
    settings = dataclasses.replace(SETTINGS, compute_capability="12.0")
    problems = preflight.evaluate(facts_of("rtx-pro-6000-8gpu-passthrough"), one, settings)
    assert problems == []


def test_p2p_ok_box_needs_nothing(profile: dict[str, Any]) -> None:
    facts = facts_of("rtx-pro-6000-8gpu-passthrough")
    facts.p2p_read = [dataclasses.replace(link, status="OK") for link in facts.p2p_read]
    bare = launch(profile, flags={"disable-custom-all-reduce": None}, env={"NCCL_P2P_LEVEL": None})
    assert preflight.evaluate(facts, bare, SETTINGS) == []
    assert preflight.p2p_adjustments(facts, bare) == {"flags": {}, "env": {}}


def test_p2p_adjustments(profile: dict[str, Any]) -> None:
    facts = facts_of("rtx-pro-6000-8gpu-passthrough")
    bare = launch(profile, flags={"disable-custom-all-reduce": None}, env={"NCCL_P2P_DISABLE": None})
    assert preflight.p2p_adjustments(facts, bare) == {
        "flags": {"disable-custom-all-reduce": True},
        "env": {"NCCL_P2P_DISABLE": "1"},
    }
    assert preflight.p2p_adjustments(facts, launch(profile, env=P2P_OFF)) == {
        "flags": {},
        "env": {},
    }


def test_tp8_on_one_gpu(profile: dict[str, Any]) -> None:
    problems = preflight.evaluate(facts_of("h200-1gpu"), launch(profile, env=P2P_OFF), SETTINGS)
    assert checks_failed(problems) == ["gpu-count", "compute-capability"]
    count = problems[0].message("h")
    assert "found" not in count  # the message is "check X failed: <found>. Fix: <fix>"
    assert "1 usable GPU(s) of 1 listed, but the launch has tp-size 8" in count
    assert "lower tp-size in sglang_server_flags_override to at most 1" in count
    assert "GPU compute capability {0: '9.0'}" in problems[1].found


def test_cuda_visible_devices_limits_the_count(profile: dict[str, Any]) -> None:
    env = {**P2P_OFF, "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    problems = preflight.evaluate(
        facts_of("rtx-pro-6000-8gpu-passthrough"), launch(profile, env=env), SETTINGS
    )
    assert checks_failed(problems) == ["gpu-count"]
    assert "4 usable GPU(s) in CUDA_VISIBLE_DEVICES=0,1,2,3" in problems[0].found


def test_busy_gpus(profile: dict[str, Any]) -> None:
    facts = facts_of("rtx-pro-6000-8gpu-busy")
    problems = preflight.evaluate(facts, launch(profile, env=P2P_OFF), SETTINGS)
    assert checks_failed(problems) == ["gpu-idle"] * 3
    assert "48213 (sglang::scheduler_TP0)" in problems[0].found
    assert "systemctl stop sglang" in problems[0].fix
    # While the service runs, its own GPU use is expected.
    assert preflight.evaluate(facts, launch(profile, env=P2P_OFF), SETTINGS, unit_active=True) == []


def test_lost_gpu(profile: dict[str, Any]) -> None:
    problems = preflight.evaluate(
        facts_of("rtx-pro-6000-8gpu-lost"), launch(profile, env=P2P_OFF), SETTINGS
    )
    assert checks_failed(problems) == ["nvidia-smi", "gpu-health", "gpu-count"]
    assert "exited 15 (a GPU has fallen off the bus" in problems[0].found
    assert "GPU is lost" in problems[1].found and "nvidia-smi -r -i" in problems[1].fix
    assert "7 usable GPU(s) of 8 listed" in problems[2].found


def test_ecc(profile: dict[str, Any]) -> None:
    problems = preflight.evaluate(
        facts_of("rtx-pro-6000-8gpu-ecc"), launch(profile, env=P2P_OFF), SETTINGS
    )
    assert checks_failed(problems)[:4] == ["gpu-health"] * 4
    assert "3 uncorrectable ECC errors" in problems[0].found


def test_wrong_compute_capability(profile: dict[str, Any]) -> None:
    settings = dataclasses.replace(SETTINGS, compute_capability="10.0")
    problems = preflight.evaluate(
        facts_of("rtx-pro-6000-8gpu-passthrough"), launch(profile, env=P2P_OFF), settings
    )
    assert checks_failed(problems) == ["compute-capability"]
    assert "the lane's kernels are built for 10.0" in problems[0].found
    assert "set preflight_compute_capability" in problems[0].fix


@pytest.mark.parametrize(
    ("cuda", "min_driver", "fails"),
    [
        ("12.8", "", False),  # 580.95.05 >= 570.26
        ("13.0", "", False),  # 580.95.05 >= 580.65.06
        ("12.8", "580.96", True),
        ("12.8", "580.95.05", False),
    ],
)
def test_driver_floor(profile: dict[str, Any], cuda: str, min_driver: str, fails: bool) -> None:
    settings = dataclasses.replace(SETTINGS, cuda=cuda, min_driver=min_driver)
    problems = preflight.evaluate(
        facts_of("rtx-pro-6000-8gpu-passthrough"), launch(profile, env=P2P_OFF), settings
    )
    assert checks_failed(problems) == (["driver"] if fails else [])


def test_old_driver_for_cu130(profile: dict[str, Any]) -> None:
    facts = facts_of("rtx-pro-6000-8gpu-passthrough")
    facts.driver_version = "575.57.08"
    settings = dataclasses.replace(SETTINGS, cuda="13.0")
    problems = preflight.evaluate(facts, launch(profile, env=P2P_OFF), settings)
    assert checks_failed(problems) == ["driver"]
    assert (
        problems[0].found == "driver 575.57.08 is older than 580.65.06, the minimum for CUDA 13.0"
    )


def test_unknown_cuda_release_names_the_variable() -> None:
    with pytest.raises(preflight.PreflightError, match="preflight_min_driver_version"):
        _ = dataclasses.replace(SETTINGS, cuda="14.2").driver_floor


def test_shm(profile: dict[str, Any]) -> None:
    problems = preflight.evaluate(
        facts_of("rtx-pro-6000-8gpu-passthrough", shm_free_mib=64),
        launch(profile, env=P2P_OFF),
        SETTINGS,
    )
    assert checks_failed(problems) == ["shm"]
    assert "/dev/shm has 64 MiB free of 64 MiB, below 8192 MiB" in problems[0].found
    assert "/dev/shm/nccl-*" in problems[0].fix


def test_weights_disk_counts_what_is_already_there(profile: dict[str, Any]) -> None:
    facts = facts_of("rtx-pro-6000-8gpu-passthrough", weights_free_gib=100)
    problems = preflight.evaluate(facts, launch(profile, env=P2P_OFF), SETTINGS)
    assert checks_failed(problems) == ["weights-disk"]
    assert (
        "100 GiB free and 0 GiB already under /var/lib/sglang; the weights need 410 GiB"
        in problems[0].found
    )
    # A rerun after the download: the weights on disk count.
    facts.disks[1] = dataclasses.replace(facts.disks[1], path_mib=380 * MIB_PER_GIB)
    assert preflight.evaluate(facts, launch(profile, env=P2P_OFF), SETTINGS) == []


def test_gpu_checks_leave_out_the_disk(profile: dict[str, Any]) -> None:
    facts = facts_of("rtx-pro-6000-8gpu-passthrough", weights_free_gib=1)
    assert (
        preflight.evaluate(
            facts, launch(profile, env=P2P_OFF), SETTINGS, checks=preflight.GPU_CHECKS
        )
        == []
    )


def test_every_check_has_exactly_one_table_row() -> None:
    table = [name for name, _ in preflight.CHECKS]
    assert Counter(table) == Counter(preflight.ALL_CHECKS)
    assert sorted(Counter(table).values()) == [1] * len(table)
    assert table == list(preflight.ALL_CHECKS)  # the table's order is the order of the problems
    functions = [check for _, check in preflight.CHECKS]
    assert len(set(functions)) == len(functions)  # one function per check


def test_unknown_check_is_refused(profile: dict[str, Any]) -> None:
    with pytest.raises(preflight.PreflightError, match="unknown checks"):
        preflight.evaluate(facts_of("h200-1gpu"), launch(profile), SETTINGS, checks=["gpu-cout"])


@pytest.mark.parametrize(
    ("overrides", "variable"),
    [
        ({"compute_capability": 12.0}, "preflight_compute_capability"),
        ({"gpu_max_used_mib": "lots"}, "preflight_gpu_max_used_mib"),
        ({"shm_min_free_mib": -1}, "preflight_shm_min_free_mib"),
        ({"min_driver": "580.x"}, "preflight_min_driver_version"),
    ],
)
def test_settings_from_vars_names_the_variable(overrides: dict[str, Any], variable: str) -> None:
    values: dict[str, Any] = {"compute_capability": "12.0", "cuda": "12.8", **overrides}
    with pytest.raises(preflight.PreflightError, match=variable):
        preflight.settings_from_vars(**values)


# -- the filter plugin ---------------------------------------------------------------------------
def role_settings(**overrides: Any) -> dict[str, Any]:
    # As the role passes them: templated, so numbers may arrive as strings.
    base = {
        "lane": "cu128",
        "compute_capability": "12.0",
        "min_driver": "",
        "gpu_max_used_mib": "1024",
        "shm_path": "/dev/shm",
        "shm_min_free_mib": "8192",
        "weights_path": "/var/lib/sglang",
        "weights_min_gib": "0",
    }
    return {**base, **overrides}


def role_launch(
    profile: dict[str, Any], env_override: dict[str, Any] | None = None
) -> dict[str, Any]:
    # As the role passes them: the server's resolved flags and environment (nothing merged by preflight).
    return {"flags": profile["sglang_server_flags"], "env": {**profile["sglang_server_env"], **(env_override or {})}}


def test_filter_messages_name_the_host(profile: dict[str, Any]) -> None:
    facts = facts_of("rtx-pro-6000-8gpu-busy").to_dict()
    messages = preflight_filters.preflight_problems(
        facts, role_launch(profile, P2P_OFF), role_settings(), host="gpu-box"
    )
    assert len(messages) == 3
    assert all(
        m.startswith("host gpu-box: preflight check gpu-idle failed: GPU ") for m in messages
    )


def test_filter_checks_and_unit_active(profile: dict[str, Any]) -> None:
    facts = facts_of("rtx-pro-6000-8gpu-busy").to_dict()
    launch_vars = role_launch(profile, P2P_OFF)
    assert (
        preflight_filters.preflight_problems(facts, launch_vars, role_settings(), unit_active=True)
        == []
    )
    assert (
        preflight_filters.preflight_problems(facts, launch_vars, role_settings(), checks=["shm"])
        == []
    )


def test_filter_bad_lane_names_host() -> None:
    from ansible.errors import AnsibleFilterError

    with pytest.raises(AnsibleFilterError, match="host h: preflight: unknown lane 'cu999'"):
        preflight_filters.preflight_problems(
            {}, {"flags": {}}, role_settings(lane="cu999"), host="h"
        )


def test_filter_reads_the_resolved_flags_in_their_own_lane(profile: dict[str, Any]) -> None:
    """The resolved flags of a cu130 host are spelled as 0.5.23 spells them; the filter types them for that lane
    (a flag 0.5.23 lacks would be refused there, so it reads them as the lane, not the default)."""
    facts = facts_of("rtx-pro-6000-8gpu-busy").to_dict()
    flags = {**{k: v for k, v in profile["sglang_server_flags"].items() if not k.startswith("nsa-")},
             "dsa-decode-backend": "flashinfer_sparse_mla", "dsa-prefill-backend": "flashinfer_sparse_mla"}  # fmt: skip
    launch_vars = {"flags": flags, "env": {**profile["sglang_server_env"], **P2P_OFF}}
    on_130 = preflight_filters.preflight_problems(facts, launch_vars, role_settings(lane="cu130"), host="gpu-box")
    assert len(on_130) == 3 and all("preflight check gpu-idle failed" in m for m in on_130)
    with pytest.raises(Exception, match="host gpu-box: preflight: .*lane cu130's sglang has no --enable-nan-detection"):
        preflight_filters.preflight_problems(
            facts, {**launch_vars, "flags": {**flags, "enable-nan-detection": True}}, role_settings(lane="cu130"), host="gpu-box"
        )
