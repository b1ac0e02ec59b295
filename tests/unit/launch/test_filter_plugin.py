"""The filter plugin is a thin adapter: same result as the package, errors name the host."""

from __future__ import annotations

import importlib.util

import pytest
from ansible.errors import AnsibleFilterError
from conftest import ROOT
from server_inputs import API_KEY, inputs

from sglang_deploy.serving import server
from sglang_deploy_host.serving import unit_flags

spec = importlib.util.spec_from_file_location("plugin", ROOT / "filter_plugins" / "sglang_deploy.py")
plugin = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plugin)


def test_resolve_returns_the_package_result_as_data() -> None:
    data = plugin.sglang_server_resolve(inputs(), host="h1")
    assert data == server.resolve(server.ServerInputs.from_vars(inputs()), host="h1").to_dict()


def test_resolve_errors_name_the_host() -> None:
    with pytest.raises(AnsibleFilterError, match=r"^host h1: the server binds 0.0.0.0:8000"):
        plugin.sglang_server_resolve(inputs(api_key=""), host="h1")
    with pytest.raises(AnsibleFilterError, match=r"^host gpu-07: sglang_server_flags: 'tp-size'"):
        plugin.sglang_server_resolve(inputs(flags_override={"tp": 8, "tp_size": 8}), host="gpu-07")
    # The override's other spelling replaces the flag (the table knows them one flag), rendered in full.
    resolved = plugin.sglang_server_resolve(inputs(flags_override={"tp": 4}), host="gpu-07")
    assert resolved["flags"]["tp-size"] == "4" and "tp" not in resolved["flags"]
    with pytest.raises(AnsibleFilterError, match=r"^host gpu-07: unknown server inputs"):
        plugin.sglang_server_resolve({**inputs(), "typo": 1}, host="gpu-07")


def test_secrets_hold_the_key_for_the_env_file_only() -> None:
    assert plugin.sglang_server_secrets(inputs(), host="h1") == {"SGLANG_API_KEY": API_KEY}


def test_env_file_lines_and_api_key_problem() -> None:
    """The API key is checked by the resolvers (server.py, router.py) through unit_flags.api_key_problem."""
    assert plugin.sglang_env_file_lines({"SGLANG_API_KEY": "k"}) == ["SGLANG_API_KEY='k'"]
    with pytest.raises(AnsibleFilterError, match="host h: sglang_server_secret_env"):
        plugin.sglang_env_file_lines({"BAD NAME": "k"}, host="h")
    assert unit_flags.api_key_problem("0123456789abcdef", "sglang_server_api_key") is None
    assert "sglang_server_api_key holds a space or tab at character 4" in (unit_flags.api_key_problem("abc\tdef", "sglang_server_api_key") or "")
    assert plugin.sglang_bearer_headers("k1") == {"Authorization": "Bearer k1"}
    assert plugin.sglang_bearer_headers("") == {}
    assert set(plugin.FilterModule().filters()) == {
        "sglang_check_variables", "sglang_server_resolve", "sglang_server_basis", "sglang_server_model_path", "sglang_server_secrets", "sglang_env_file_lines",
        "sglang_bearer_headers", "sglang_path_component", "sglang_redact",
    }  # fmt: skip


def test_the_model_path_is_the_merged_flags_directory_or_nothing() -> None:
    # Untemplated (the test hands the inventory's text over as it is): not a path yet.
    assert plugin.sglang_server_model_path(inputs(), host="h1") == ""
    values = inputs()
    values["flags_override"] = {"model": "/srv/weights/glm-5"}
    assert plugin.sglang_server_model_path(values, host="h1") == "/srv/weights/glm-5"
    values["flags_override"] = {"model": "lukealonso/GLM-5-NVFP4"}  # a hub id: nothing on the host's disk to read
    assert plugin.sglang_server_model_path(values, host="h1") == ""
    values["flags_override"] = {"model": None, "model-path": "/m"}
    assert plugin.sglang_server_model_path(values, host="h1") == "/m"
    # A flag removed with null (the cu130 profiles remove one) is no flag; a broken one is the resolve's to name.
    values["flags_override"] = {"enable-metrics": None, "model": "/srv/x"}
    assert plugin.sglang_server_model_path({**values, "lane": "cu130", "profile": "tuned"}, host="h1") == "/srv/x"
    values["flags_override"] = {"tp-size": "eight", "model": "/srv/x"}
    assert plugin.sglang_server_model_path(values, host="h1") == ""


def test_redact_masks_every_secret_longest_first():
    secrets = {"SGLANG_API_KEY": "abc123", "OTHER": "abc123-long", "EMPTY": ""}
    text = "key abc123 and abc123-long twice abc123"
    assert plugin.sglang_redact(text, secrets) == "key ******** and ******** twice ********"
