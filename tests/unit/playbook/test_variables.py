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


def test_the_routers_play_refuses_a_misspelt_variable_too(tmp_path: Path) -> None:
    """resolve.yml checks each play's hosts: a router (multi_host's router-01) with a misspelt router variable is
    refused naming the router, its file and the closest name, while the workers are fine."""
    inventory = tmp_path / "inventory"
    shutil.copytree(ROOT / "inventory" / "multi_host", inventory)
    (inventory / "host_vars").mkdir()
    (inventory / "host_vars" / "router-01.yml").write_text("sglang_router_extra_flag:\n  log-level: debug\n")
    rendered = _cli("render", "-i", str(inventory), "--out", str(tmp_path / "out"), "--no-validate")
    out = rendered.stdout + rendered.stderr
    assert rendered.returncode != 0, out
    assert "host router-01: sglang_router_extra_flag (set in " in out and "host_vars/router-01.yml" in out, out
    assert "Did you mean sglang_router_extra_flags?" in out, out
    assert "host glm5-01: sglang_router_extra_flag" not in out, out


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


def _roles(tmp_path: Path, roles: dict[str, list[str]], tasks: dict[str, str] | None = None) -> Path:
    for role, options in roles.items():
        (tmp_path / role / "meta").mkdir(parents=True)
        spec = {"argument_specs": {"main": {"options": {name: {"type": "str"} for name in options}}}}
        (tmp_path / role / "meta" / "argument_specs.yml").write_text(__import__("yaml").safe_dump(spec))
        if tasks and role in tasks:
            (tmp_path / role / "tasks").mkdir()
            (tmp_path / role / "tasks" / "main.yml").write_text(tasks[role])
    return tmp_path


def test_a_name_is_compared_within_the_role_of_its_longest_prefix(tmp_path: Path) -> None:
    """With roles `web` and `web_cache`, web_cache_x is compared as web_cache's `x` (nothing there is close), not as
    web's `cache_x`, which the shared `cache_` would make look like web_cache_size."""
    roles = _roles(tmp_path, {"web": ["web_port"], "web_cache": ["web_cache_size"]})
    assert variables.unknown(["web_cache_x", "web_cache_sise", "web_prt"], str(roles)) == [
        ("web_cache_sise", "web_cache_size"), ("web_cache_x", None), ("web_prt", "web_port")]


TASKS = """\
- name: Publish
  ansible.builtin.set_fact:
    web_published: 1

    web_also: 2
    cacheable: true
  vars:
    web_not_a_fact: 3
- name: Say
  ansible.builtin.debug:
    web_not_either: 4
"""


def test_only_the_keys_right_under_set_fact_are_published(tmp_path: Path) -> None:
    """The block ends at the first line as far in as set_fact (its task's next key, the next task); a blank line
    inside it does not end it."""
    assert variables._published(TASKS) == {"web_published", "web_also"}
    roles = _roles(tmp_path, {"web": ["web_port"]}, {"web": TASKS})
    assert variables.unknown(["web_published", "web_also", "web_not_a_fact", "web_not_either"], str(roles)) == [
        ("web_not_a_fact", None), ("web_not_either", None)]


def test_an_inventory_file_that_is_a_link_is_not_searched(tmp_path: Path) -> None:
    """The files named as setting a variable are the inventory's own: a link (to anywhere) is not read."""
    inventory = tmp_path / "inventory"
    (inventory / "group_vars").mkdir(parents=True)
    (inventory / "group_vars" / "all.yml").write_text("sglang_server_profle: tuned\n")
    outside = tmp_path / "outside.yml"
    outside.write_text("sglang_server_profle: tuned\n")
    (inventory / "group_vars" / "linked.yml").symlink_to(outside)
    assert variables.sources("sglang_server_profle", [str(inventory)]) == [str(inventory / "group_vars" / "all.yml")]


def test_the_search_for_a_names_file_is_bounded_and_goes_past_what_it_cannot_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files over the size bound, not UTF-8 or unreadable are passed over, and the search goes on to the next."""
    limit = variables._SOURCE_MAX_BYTES
    line = b"sglang_server_profle: tuned\n"
    inventory = tmp_path / "inventory"
    inventory.mkdir()
    (inventory / "a-big.yml").write_bytes(line + b"#" * (limit + 1 - len(line)))  # one byte over
    (inventory / "b-binary.yml").write_bytes(line + b"\xff\xfe")
    (inventory / "c-unreadable.yml").write_bytes(line)
    (inventory / "d-edge.yml").write_bytes(b"#" * (limit - len(line) - 1) + b"\n" + line)  # exactly the bound, the name last
    (inventory / "e-plain.yml").write_bytes(line)
    real_open = Path.open

    def open_refusing(self: Path, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        if self.name == "c-unreadable.yml":
            raise PermissionError(13, "Permission denied")
        return real_open(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "open", open_refusing)
    assert variables.sources("sglang_server_profle", [str(inventory)]) == [
        str(inventory / "d-edge.yml"), str(inventory / "e-plain.yml")]


@pytest.mark.parametrize("extras", ["sglang_server_x", ["sglang_server_x", 3], {"sglang_server_x": 1}])
def test_the_extra_variables_list_must_be_a_list_of_names(extras: object) -> None:
    with pytest.raises(variables.UnknownVariablesError, match=rf"host h1: {variables.EXTRAS_VAR} must be a list of variable names"):
        variables.check("h1", {variables.EXTRAS_VAR: extras}, str(ROOT / "roles"))
