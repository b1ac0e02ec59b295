"""The launch model: inventory mapping -> argv, ExecStart= and Environment=."""

from __future__ import annotations

import pytest
from conftest import PROFILE_ADDED_ENV, SEED_004_ENV, profile_flags

from sglang_deploy.launch.config import DEFAULT_LAUNCHER, EnvRef, LaunchConfig, LaunchConfigError
from sglang_deploy.launch.flagtable import SecretRef

PY = "/opt/sglang-deploy/ml-env/bin/python3"


def config(flags, **kwargs) -> LaunchConfig:
    return LaunchConfig.from_vars(flags, python=PY, **kwargs)


def test_profile_renders_seed_004_flag_for_flag(profile):
    launch = config(profile["sglang_server_flags"], env=profile["sglang_server_env"])
    # Ansible templates the model directory and CUDA release; this test sees the inventory as written.
    assert launch.flag_argv() == profile_flags("{{ sglang_common_model_dir }}")
    assert launch.argv()[:5] == [PY, DEFAULT_LAUNCHER, "--module", "sglang.launch_server", "--"]
    assert launch.argv()[5:] == launch.flag_argv()  # no flag of the profile reads the environment
    env = dict(launch.environment)
    for name, value in {**SEED_004_ENV, **PROFILE_ADDED_ENV}.items():
        if name == "CUDA_HOME":
            value = "{{ sglang_common_cuda_home }}"
        assert env[name] == value
    assert env["PATH"].startswith("{{ sglang_server_venv }}/bin:")  # templated by Ansible, not here
    assert launch.tp_size == 8


def test_values_are_rendered_as_sglang_expects():
    launch = config(
        {
            "switch": True,
            "removed": None,
            "fraction": 0.92,
            "count": 64,
            "sizes": [1, 2, 4],
            "override-args": {"a": 1, "b": "x"},
            "api-key": {"env": "SGLANG_API_KEY"},
        },
        secret_env_names=["SGLANG_API_KEY"],
    )
    assert launch.flag_argv() == [
        "--switch",
        "--fraction", "0.92",
        "--count", "64",
        "--sizes", "1", "2", "4",
        "--override-args", '{"a":1,"b":"x"}',
        "--api-key", "${SGLANG_API_KEY}",
    ]  # fmt: skip
    assert launch.settings.api_key == SecretRef("SGLANG_API_KEY")


def test_secrets_from_the_environment_never_enter_argv_or_the_unit():
    """``{env: NAME}`` flags go to the launcher by variable NAME; their values exist only in the
    0600 environment file and, at start, inside the server process (sglang_launcher.py)."""
    launch = config(
        {"port": 8000, "api-key": {"env": "SGLANG_API_KEY"}}, secret_env_names=["SGLANG_API_KEY"],
        launcher="/usr/local/libexec/x/sglang_launcher.py",
    )
    assert launch.argv() == [
        PY, "/usr/local/libexec/x/sglang_launcher.py", "--module", "sglang.launch_server",
        "--env-flag", "api-key=SGLANG_API_KEY", "--", "--port", "8000",
    ]  # fmt: skip
    assert "api-key" not in launch.exec_start().replace("api-key=SGLANG_API_KEY", "")
    assert "$" not in launch.exec_start()  # no systemd ${} expansion: it would land in argv


def test_names_are_normalized_and_tp_abbreviation_expanded():
    launch = config({"--tp": 8, "served_model_name": "glm-5"})
    assert launch.flag_argv() == ["--tp-size", "8", "--served-model-name", "glm-5"]


@pytest.mark.parametrize(
    "flags",
    [
        {"tp": 8, "tp-size": 8},
        {"tp-size": 8, "tensor-parallel-size": 8},
        {"model": "a", "model-path": "b"},
        {"tp_size": 4, "tp-size": 8},
        {"ep": 2, "expert-parallel-size": 2},
    ],
)
def test_the_same_option_twice_is_an_error(flags):
    with pytest.raises(LaunchConfigError, match="one sglang option") as err:
        config(flags)
    assert "sglang_server_flags_override" in str(err.value)  # the message says how to fix it


def test_override_replaces_in_place_appends_and_removes(profile):
    launch = config(
        profile["sglang_server_flags"],
        flags_override={
            "mem-fraction-static": 0.88,
            "enable-flashinfer-allreduce-fusion": None,
            "cuda-graph-max-bs": 32,
        },
    )
    argv = launch.flag_argv()
    assert argv[argv.index("--mem-fraction-static") + 1] == "0.88"
    assert argv.index("--mem-fraction-static") < argv.index("--max-running-requests")  # kept its place
    assert "--enable-flashinfer-allreduce-fusion" not in argv
    assert argv[-2:] == ["--cuda-graph-max-bs", "32"]


def test_flag_order_is_stable():
    flags = {"b": 1, "x": 2, "z": True}
    assert config(flags).flag_argv() == config(dict(flags)).flag_argv() == [
        "--b", "1", "--x", "2", "--z",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("flags", "kwargs", "message"),
    [
        ({"x": {"env": "MISSING"}}, {}, "neither in sglang_server_env"),
        ({"x": {"env": "not valid"}}, {}, "not a valid environment variable name"),
        ({"x": []}, {}, "empty list"),
        ({"x": [True]}, {}, "cannot be a boolean"),
        ({"x": float("nan")}, {}, "not finite"),
        ({"x": object()}, {}, "type object"),
        ({"": 1}, {}, "empty or non-string key"),
        ([("x", 1)], {}, "must be a mapping"),
        ({"x": 1}, {"env": {"A": True}}, "booleans are ambiguous"),
        ({"x": 1}, {"env": {"1BAD": "x"}}, "not a valid environment variable name"),
    ],
)
def test_bad_input_names_the_variable(flags, kwargs, message):
    with pytest.raises(LaunchConfigError, match=message):
        config(flags, **kwargs)


def test_tp_size_must_be_an_integer():
    with pytest.raises(LaunchConfigError, match="not an integer"):
        _ = config({"tp-size": "eight"}).tp_size
    assert config({}).tp_size == 1


def test_empty_python_is_rejected():
    with pytest.raises(LaunchConfigError, match="sglang_server_python"):
        LaunchConfig.from_vars({}, python="")


def test_exec_start_has_one_flag_per_line(profile):
    text = config(profile["sglang_server_flags"]).exec_start()
    lines = text.split(" \\\n")
    assert lines[0] == f"{PY} {DEFAULT_LAUNCHER} --module sglang.launch_server --"
    assert lines[1] == '    --model "{{ sglang_common_model_dir }}"'  # quoted for systemd; Ansible templates it first
    assert "    --trust-remote-code" in lines
    assert len(lines) == 1 + len(profile["sglang_server_flags"])


def test_env_override_merges_and_removes():
    launch = config({}, env={"A": "1", "B": "2"}, env_override={"B": None, "C": 3})
    assert launch.environment == (("A", "1"), ("C", "3"))


def test_validation_argv_swaps_our_auto_placeholder_only():
    launch = LaunchConfig.from_vars({"mem-fraction-static": "auto", "tp-size": 8}, python="/p")
    assert launch.flag_argv() == ["--mem-fraction-static", "auto", "--tp-size", "8"]
    assert launch.validation_argv() == ["--mem-fraction-static", "0.9", "--tp-size", "8"]
    fixed = LaunchConfig.from_vars({"mem-fraction-static": 0.92}, python="/p")
    assert fixed.validation_argv() == fixed.flag_argv() == ["--mem-fraction-static", "0.92"]


# --- launch profiles (sglang_server_profile / sglang_server_profiles) -------------------------------------
def test_a_profile_is_merged_between_the_flags_and_the_override(profile):
    from sglang_deploy.launch.config import profile_flags as merged_profile
    import yaml
    from conftest import ROOT

    profiles = yaml.safe_load((ROOT / "inventory/proxmox/group_vars/sglang_servers/profiles.yml").read_text())
    flags = profile["sglang_server_flags"]
    # seed-004 is the flags as they are; "" too.
    assert merged_profile(flags, "seed-004", profiles["sglang_server_profiles"]) == flags
    assert merged_profile(flags, "", profiles["sglang_server_profiles"]) == flags
    tuned = config(flags, profile="tuned-mtp", profiles=profiles["sglang_server_profiles"], flags_override={"port": 9000})
    typed = tuned.settings
    assert typed.kv_cache_dtype == "bfloat16" and typed.speculative_algorithm == "EAGLE"
    assert typed.mem_fraction_static == "auto" and typed.port == 9000
    assert typed.dsa_decode_backend == "trtllm"  # what the profile does not change stays
    # The order on the command line is the flags' own; new flags come last.
    names = [f.name for f in tuned.flags]
    assert names.index("kv-cache-dtype") < names.index("quantization") < names.index("speculative-algorithm")
    removed = config(flags, profile="p", profiles={"p": {"enable-metrics": None}})
    assert removed.settings.enable_metrics is False


@pytest.mark.parametrize(("name", "profiles", "message"), [
    ("tunned", {"seed-004": {}, "tuned": {}}, "sglang_server_profile 'tunned' is not one of sglang_server_profiles (seed-004, tuned)"),
    ("tuned", {}, "(none defined)"),
    ("tuned", {"tuned": ["kv-cache-dtype"]}, "sglang_server_profiles['tuned'] must be a mapping"),
])  # fmt: skip
def test_an_unknown_or_malformed_profile_is_refused_with_the_fix(name, profiles, message):
    with pytest.raises(LaunchConfigError) as err:
        config({"port": 8000}, profile=name, profiles=profiles)
    assert message in str(err.value)
