"""The filter plugin is a thin adapter: same result as the package, errors name the host."""

from __future__ import annotations

import importlib.util

import pytest
from ansible.errors import AnsibleFilterError
from conftest import ROOT

from sglang_deploy.launch import LaunchConfig

spec = importlib.util.spec_from_file_location("plugin", ROOT / "filter_plugins" / "sglang_deploy.py")
plugin = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plugin)


def test_filter_returns_the_model_as_data(profile):
    flags = profile["sglang_server_flags"]
    data = plugin.sglang_launch(flags, python="/p/python3", allow_unauthenticated=True, host="h1")
    assert data == LaunchConfig.from_vars(flags, python="/p/python3").to_dict()


def test_filter_refuses_an_open_endpoint_naming_the_host(profile):
    with pytest.raises(AnsibleFilterError, match=r"^host h1: the server binds 0.0.0.0:8000"):
        plugin.sglang_launch(profile["sglang_server_flags"], python="/p/python3", host="h1")


def test_filter_error_names_the_host():
    with pytest.raises(AnsibleFilterError, match=r"^host gpu-07: sglang_server_flags: 'tp-size'"):
        plugin.sglang_launch({"tp": 8, "tp-size": 8}, python="/p/python3", host="gpu-07")


def test_env_file_lines():
    assert plugin.sglang_env_file_lines({"SGLANG_API_KEY": "k"}) == ["SGLANG_API_KEY='k'"]
    with pytest.raises(AnsibleFilterError, match="host h: sglang_server_secret_env"):
        plugin.sglang_env_file_lines({"BAD NAME": "k"}, host="h")
    assert set(plugin.FilterModule().filters()) == {
        "sglang_launch", "sglang_profile_flags", "sglang_api_key_problem", "sglang_env_file_lines",
        "sglang_unit_settings", "sglang_path_component", "sglang_redact",
    }
    assert plugin.sglang_api_key_problem("0123456789abcdef", "sglang_server_api_key") == ""
    assert "sglang_server_api_key holds '\\t'" in plugin.sglang_api_key_problem("abc\tdef", "sglang_server_api_key")
    with pytest.raises(AnsibleFilterError, match=r"^host h: sglang_server_profile 'x' is not one of"):
        plugin.sglang_profile_flags({"port": 8000}, "x", {"tuned": {}}, host="h")
    assert plugin.sglang_profile_flags({"port": 8000}, "tuned", {"tuned": {"port": 9000}}) == {"port": 9000}


def test_redact_masks_every_secret_longest_first():
    secrets = {"SGLANG_API_KEY": "abc123", "OTHER": "abc123-long", "EMPTY": ""}
    text = "key abc123 and abc123-long twice abc123"
    assert plugin.sglang_redact(text, secrets) == "key ******** and ******** twice ********"
