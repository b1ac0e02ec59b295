"""Every non-flag value of the sglang unit is checked before the template sees it: no newline or CR
can add a directive, no name can leave its directory (systemd.unit_settings, through the resolver's filter)."""

from __future__ import annotations

import copy
import re
import importlib.util

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from conftest import ROOT

from sglang_deploy_host.serving import systemd

spec = importlib.util.spec_from_file_location("plugin", ROOT / "filter_plugins" / "sglang_deploy.py")
plugin = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plugin)

COMMON = yaml.safe_load((ROOT / "roles" / "sglang_common" / "defaults" / "main.yml").read_text())
_PLAIN_NAME = re.compile(r"\{\{ ?([a-z_]+) ?\}\}")


def _fill(value: object) -> object:
    """A default with the shared names it is built of (sglang_common's ``{{ name }}``) filled in, as Ansible
    would; anything with more than plain names in it stays as it is."""
    while isinstance(value, str) and (match := _PLAIN_NAME.search(value)) and match.group(1) in COMMON:
        value = value[: match.start()] + str(COMMON[match.group(1)]) + value[match.end():]
    return value


# The role's defaults with the shared names filled in.
DEFAULTS = {
    name: _fill(value)
    for name, value in yaml.safe_load((ROOT / "roles" / "sglang_server" / "defaults" / "main.yml").read_text()).items()
}
KEYS = (
    "name", "user", "group", "home", "config_dir", "unit_dir", "libexec_dir", "read_write_paths",
    "hardening", "start_timeout_sec", "stop_timeout_sec", "restart_sec", "start_limit_burst",
    "start_limit_interval_sec", "limit_nofile", "gpu_idle_max_used_mib",
)  # fmt: skip


def _values() -> dict:
    values = {key: copy.deepcopy(DEFAULTS[f"sglang_server_{key}"]) for key in KEYS}
    values["read_write_paths"] = [values["home"]]  # the default templates sglang_server_home
    return values


INJECTION = "x\n[Service]\nExecStartPre=/bin/sh -c id"
BAD = {
    "name": [INJECTION, "../../etc/cron.d/x", "a/b", "..", ".hidden", "", "sglang\r", 7],
    "user": [INJECTION, "root\nUser=root", "Sglang", "a b", "", "x" * 40, None],
    "group": [INJECTION, "video render", ""],
    "home": [INJECTION, "relative/path", "/var/lib/../../etc", "/a b", "/a//b", "/a/", '/a"b', "/a%b"],
    "config_dir": [INJECTION, "etc/sglang", "/etc/sglang/.."],
    "unit_dir": ["/etc/systemd/system/../../tmp", INJECTION],
    "libexec_dir": ["/usr/local/libexec/sglang deploy", INJECTION],
    "read_write_paths": [[INJECTION], ["/ok", "rel"], "/not-a-list", []],
    "hardening": [{"ProtectSystem": INJECTION}, {"Protect\nSystem": "yes"}, {"ExecStartPre=/bin/sh #": "x"},
                  {"NoNewPrivileges": " yes"}, {"UMask": "0077\r"}, ["ProtectSystem"]],
    "start_timeout_sec": [0, -1, "2400", True, 2.5],
    "stop_timeout_sec": [0, "90\nExecStop=/bin/sh"],
    "restart_sec": [-1, "30"],
    "start_limit_burst": [0],
    "start_limit_interval_sec": [-5],
    "limit_nofile": [0, "infinity\nUser=root"],
    "gpu_idle_max_used_mib": [-1, "1024"],
}
CASES = [(key, value) for key, values in BAD.items() for value in values]


def test_the_role_defaults_pass_and_paths_are_built_from_checked_parts() -> None:
    settings = systemd.unit_settings(_values())
    assert settings["unit_path"] == "/etc/systemd/system/sglang.service"
    assert settings["env_file"] == "/etc/sglang/sglang.env"
    assert settings["hardening"]["CapabilityBoundingSet"] == ""  # empty = no capabilities
    assert all(isinstance(v, str) for v in settings["hardening"].values())


@pytest.mark.parametrize("key, value", CASES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(CASES)])
def test_a_value_that_could_inject_or_escape_is_refused_naming_the_variable(key: str, value: object) -> None:
    values = _values()
    values[key] = value
    inputs = {"flags": {"model-path": "/m", "host": "127.0.0.1"}, "python": "/p/python3", "lane": "cu128", "unit": values}
    with pytest.raises(AnsibleFilterError, match=rf"^host gpu-01: sglang_server_{key}"):
        plugin.sglang_server_resolve(inputs, host="gpu-01")


@pytest.mark.parametrize("name", ["../x", "..", ".", "a/b", "x\ny", "", "/abs"])
def test_a_host_name_cannot_leave_the_render_directory(name: str) -> None:
    with pytest.raises(AnsibleFilterError, match="inventory_hostname"):
        plugin.sglang_path_component(name, "inventory_hostname")
    assert plugin.sglang_path_component("glm5-01.example", "inventory_hostname") == "glm5-01.example"


def test_the_unit_template_reads_only_checked_or_quoted_values() -> None:
    """The whole class, not one example: any variable the template prints must come from
    sglang_server_resolved (checked or quoted by the resolver); the one switch is a boolean."""
    import re

    template = (ROOT / "roles" / "sglang_server" / "templates" / "sglang.service.j2").read_text()
    printed = set(re.findall(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)", template))
    loop_names = {n.strip() for names in re.findall(r"\{%\s*for (.*?) in ", template) for n in names.split(",")}
    assert printed - loop_names == {"ansible_managed", "sglang_server_resolved"}
    # The switches: one boolean, and whether the resolver found mounts to wait for.
    assert set(re.findall(r"\{%\s*if ([A-Za-z_][A-Za-z0-9_]*)", template)) == {
        "sglang_server_gpu_idle_check", "sglang_server_resolved"
    }
    loops = re.findall(r"\{%\s*for .* in ([A-Za-z_][A-Za-z0-9_.]*)", template)
    assert loops and all(name.startswith("sglang_server_resolved.") for name in loops)
