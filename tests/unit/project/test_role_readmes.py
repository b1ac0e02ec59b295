"""Each role's README.md says what its meta/argument_specs.yml says (scripts/role-readmes): every entry point,
every variable with its type, default and description, and the playbooks that run it; a variable added to the
specs without the README rewritten fails here."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from conftest import ROOT

SCRIPT = ROOT / "scripts" / "role-readmes"


def _script(root: Path) -> ModuleType:
    """The script as a module, reading the tree at ``root``."""
    loader = importlib.machinery.SourceFileLoader("role_readmes", str(SCRIPT))
    spec = importlib.util.spec_from_loader("role_readmes", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    module.ROOT = root
    return module


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the roles, the playbooks and site.yml."""
    shutil.copytree(ROOT / "roles", tmp_path / "roles")
    shutil.copytree(ROOT / "playbooks", tmp_path / "playbooks")
    shutil.copy(ROOT / "site.yml", tmp_path / "site.yml")
    return tmp_path


def test_every_role_has_a_readme_that_its_specs_give() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--check"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    for role in sorted(p.name for p in (ROOT / "roles").iterdir() if p.is_dir()):
        text = (ROOT / "roles" / role / "README.md").read_text(encoding="utf-8")
        head = text.split(_script(ROOT).MARKER)[0]
        assert head.startswith(f"# {role}\n"), role
        assert "## Example" in head, f"roles/{role}/README.md has no example above the generated part"


def test_every_variable_and_entry_point_is_in_the_readme() -> None:
    for spec_file in sorted((ROOT / "roles").glob("*/meta/argument_specs.yml")):
        role = spec_file.parent.parent.name
        text = (ROOT / "roles" / role / "README.md").read_text(encoding="utf-8")
        for entry, body in yaml.safe_load(spec_file.read_text())["argument_specs"].items():
            assert f"### `{entry}`: {body['short_description']}" in text, (role, entry)
            for variable in body.get("options") or {}:
                assert f"| `{variable}` |" in text, (role, variable)


def test_a_variable_added_to_the_specs_fails_the_check_until_rewritten(tree: Path) -> None:
    script = _script(tree)
    assert script.main(["--check"]) == 0
    spec_file = tree / "roles" / "weights_disk" / "meta" / "argument_specs.yml"
    specs = yaml.safe_load(spec_file.read_text())
    specs["argument_specs"]["main"]["options"]["weights_disk_new_knob"] = {
        "type": "int", "default": 7, "description": "A knob the README does not know yet.",
    }  # fmt: skip
    spec_file.write_text(yaml.safe_dump(specs, sort_keys=False))
    assert script.main(["--check"]) == 1
    readme = tree / "roles" / "weights_disk" / "README.md"
    head_before = readme.read_text().split(script.MARKER)[0]
    assert script.main([]) == 0
    assert script.main(["--check"]) == 0
    text = readme.read_text()
    assert "| `weights_disk_new_knob` | int | `7` | A knob the README does not know yet. |" in text
    assert text.split(script.MARKER)[0] == head_before, "the hand-written part is kept"


def test_a_changed_default_or_a_new_playbook_use_fails_the_check(tree: Path) -> None:
    script = _script(tree)
    spec_file = tree / "roles" / "cuda_toolkit" / "meta" / "argument_specs.yml"
    text = spec_file.read_text()
    specs = yaml.safe_load(text)
    option = next(iter(specs["argument_specs"]["main"]["options"].values()))
    option["default"] = "something-else"
    spec_file.write_text(yaml.safe_dump(specs, sort_keys=False))
    assert script.main(["--check"]) == 1
    spec_file.write_text(text)
    assert script.main(["--check"]) == 0
    (tree / "playbooks" / "extra.yml").write_text(
        "---\n- name: Extra\n  hosts: all\n  tasks:\n    - name: Run it\n      ansible.builtin.include_role:\n"
        "        name: cuda_toolkit\n"
    )
    assert script.main(["--check"]) == 1
    assert "`playbooks/extra.yml` (main)" in script.used_by("cuda_toolkit")


def test_defaults_are_shown_as_written() -> None:
    script = _script(ROOT)
    assert script._default({"default": ""}) == '`""`'
    assert script._default({"default": "{{ a | b }}"}) == "`{{ a | b }}`"
    assert script._default({"default": ["video", "render"]}) == "`[video, render]`"
    assert script._default({"default": False}) == "`false`"
    assert script._default({"required": True}) == "*required*"
    assert script._default({}) == "*none*"
    assert script._cell("a | b") == "a \\| b"
