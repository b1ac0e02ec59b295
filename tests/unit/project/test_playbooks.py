"""The playbook layer, kubespray's model: one playbook per lifecycle operation (site.yml and playbooks/*.yml),
each usable alone; no second layer of plays beside them; a role's task files reached only through the entry
points it documents in meta/argument_specs.yml."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from conftest import ROOT

PLAYBOOKS = [ROOT / "site.yml", *sorted((ROOT / "playbooks").glob("*.yml"))]
# The plays' and roles' YAML that may name a role's task file.
TASK_FILES = [*PLAYBOOKS, *sorted((ROOT / "roles").glob("*/tasks/*.yml")), *sorted((ROOT / "playbooks" / "standins").glob("*.yml"))]


def _walk(node: object):
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def _entry_points(role: str) -> set[str]:
    specs = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())
    return set(specs["argument_specs"])


def test_every_tasks_from_is_an_entry_point_its_role_documents() -> None:
    undocumented = []
    for path in TASK_FILES:
        for node in _walk(yaml.safe_load(path.read_text())):
            for key in ("ansible.builtin.include_role", "ansible.builtin.import_role"):
                call = node.get(key)
                if isinstance(call, dict) and "tasks_from" in call:
                    entry = re.sub(r"\.ya?ml$", "", str(call["tasks_from"]))
                    if entry not in _entry_points(str(call["name"])):
                        undocumented.append(f"{path.relative_to(ROOT)}: {call['name']} tasks_from {entry}")
    assert undocumented == []


def test_one_layer_of_playbooks_each_imported_one_exists_and_each_is_used() -> None:
    assert not (ROOT / "playbooks" / "parts").exists()
    imported: set[Path] = set()
    for path in PLAYBOOKS:
        for play in yaml.safe_load(path.read_text()):
            target = play.get("ansible.builtin.import_playbook")
            if target:
                resolved = (path.parent / target).resolve()
                assert resolved.is_file(), f"{path.relative_to(ROOT)} imports {target}, which does not exist"
                imported.add(resolved)
    cli = "\n".join(p.read_text() for p in (ROOT / "src" / "sglang_deploy").rglob("*.py"))
    docs = "\n".join(p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
    for path in PLAYBOOKS[1:]:
        name = f"playbooks/{path.name}"
        # Each one is imported by another, run by a command, or an operation the docs show.
        assert path.resolve() in imported or name in cli or f"ansible-playbook {name}" in docs, name


def test_site_is_the_lifecycle_playbooks_in_rebuild_order() -> None:
    site = [play["ansible.builtin.import_playbook"] for play in yaml.safe_load((ROOT / "site.yml").read_text())]
    assert site == [f"playbooks/{name}.yml" for name in ("validate", "proxmox", "host", "router", "verify")]
