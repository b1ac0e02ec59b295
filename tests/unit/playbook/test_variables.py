"""A role-prefixed variable that no role defines is refused before any host changes (src/sglang_deploy/playbook/variables.py):
by render and validate (playbooks/resolve.yml, the start of up too) and by plan -i, naming the file that sets it
and the closest defined name; sglang_deploy_extra_variables keeps deliberate ones."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from sglang_deploy.playbook import variables

ROLES = str(ROOT / "roles")


def test_every_defined_and_published_name_passes_and_a_typo_gets_the_closest_name() -> None:
    defined, prefixes = variables.role_variables(ROLES)
    assert {"sglang_server_flags_override", "hf_model_revision", "ml_env_lane"} <= defined
    # What the roles publish (set_fact) is theirs too, however it is not a default.
    assert {"sglang_server_resolved", "sglang_router_resolved", "hf_model_path"} <= defined
    assert "sglang_server_" in prefixes and "hf_model_" in prefixes
    found = variables.unknown(["sglang_server_flag_override", "hf_model_revison", "sglang_server_frobnicate",
                               "sglang_deploy_render_out", "__sglang_server_inputs", "my_own", "ml_env_lane"], ROLES)  # fmt: skip
    assert found == [
        ("hf_model_revison", "hf_model_revision"),
        ("sglang_server_flag_override", "sglang_server_flags_override"),
        ("sglang_server_frobnicate", None),
    ]
    assert variables.unknown(["sglang_server_frobnicate"], ROLES, extras=["sglang_server_frobnicate"]) == []


def test_a_roles_directory_without_specs_is_an_error_not_a_pass(tmp_path: Path) -> None:
    with pytest.raises(variables.UnknownVariablesError, match="no role argument specs under"):
        variables.unknown(["sglang_server_frobnicate"], str(tmp_path))


def _inventory(tmp_path: Path, host_vars: str) -> Path:
    inventory = tmp_path / "inventory"
    shutil.copytree(ROOT / "inventory" / "proxmox", inventory)
    (inventory / "host_vars").mkdir()
    (inventory / "host_vars" / "glm5-01.yml").write_text(host_vars)
    return inventory


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sglang_deploy.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=600,
        check=False, env={**os.environ, "SGLANG_API_KEY": "a-key-for-the-test-0123456789"},
    )  # fmt: skip


def test_render_and_plan_refuse_a_misspelt_variable_naming_its_file(tmp_path: Path) -> None:
    inventory = _inventory(tmp_path, "sglang_server_flag_override:\n  mem-fraction-static: 0.80\n")
    rendered = _cli("render", "-i", str(inventory), "--out", str(tmp_path / "out"), "--no-validate")
    out = rendered.stdout + rendered.stderr
    assert rendered.returncode != 0, out
    assert "host glm5-01: sglang_server_flag_override (set in " in out and "host_vars/glm5-01.yml" in out, out
    assert "Did you mean sglang_server_flags_override?" in out and "sglang_deploy_extra_variables" in out, out
    assert not list((tmp_path / "out").glob("*/sglang.service")), "nothing rendered"
    planned = _cli("plan", "-i", str(inventory))
    assert planned.returncode == 2 and "Did you mean sglang_server_flags_override?" in planned.stderr, planned.stderr


def test_a_listed_extra_variable_is_kept(tmp_path: Path) -> None:
    inventory = _inventory(tmp_path, "sglang_server_site_note: ours\nsglang_deploy_extra_variables: [sglang_server_site_note]\n")
    rendered = _cli("render", "-i", str(inventory), "--out", str(tmp_path / "out"), "--no-validate")
    assert rendered.returncode == 0, rendered.stdout + rendered.stderr
    assert _cli("plan", "-i", str(inventory)).returncode == 0


@pytest.mark.parametrize("inventory", ["proxmox", "multi_host", "device", "rehearsal"])
def test_the_shipped_inventories_use_only_defined_variables(inventory: str) -> None:
    root = ROOT / "inventory" / inventory
    names = set()
    import yaml

    for path in root.rglob("*.yml"):
        data = yaml.safe_load(path.read_text())
        if isinstance(data, dict):
            names |= set(data)
            for group in data.values():  # hosts.yml: group -> hosts -> host -> vars
                for hosts in ([group.get("hosts")] if isinstance(group, dict) else []) + (
                        [c.get("hosts") for c in (group.get("children") or {}).values() if isinstance(c, dict)] if isinstance(group, dict) else []):  # fmt: skip
                    for host_vars in (hosts or {}).values():
                        names |= set(host_vars or {})
    assert variables.unknown(names, ROLES) == []
