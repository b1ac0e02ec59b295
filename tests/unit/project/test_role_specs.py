"""Every role's defaults/main.yml and meta/argument_specs.yml describe the same variables.

Each default carries a one-line comment, each spec entry a description, and the spec's default
equals the real default, so neither can drift from the other.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

ROLES = sorted(p.parent.parent for p in (ROOT / "roles").glob("*/defaults/main.yml"))


def _commented_defaults(path: Path) -> dict[str, bool]:
    """Top-level variable -> whether a '# ' comment line stands right above it."""
    result: dict[str, bool] = {}
    previous = ""
    for line in path.read_text().splitlines():
        match = re.match(r"^([a-z_][a-z0-9_]*):", line)
        if match:
            result[match.group(1)] = previous.startswith("# ")
        previous = line
    return result


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_defaults_and_argument_specs_agree(role: Path):
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {}
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    options = specs["main"]["options"]
    assert set(defaults) == set(options), "defaults/main.yml and argument_specs main differ"
    for name, value in defaults.items():
        assert name.startswith(role.name + "_"), f"{name} is not prefixed with the role name"
        assert options[name].get("description"), f"{name} has no description in argument_specs"
        assert options[name].get("default") == value, f"{name}: spec default != defaults/main.yml"
    for entry, spec in specs.items():
        for name in spec.get("options", {}):
            assert name.startswith(role.name + "_"), f"{entry}: {name} lacks the role prefix"


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_every_default_has_a_comment(role: Path):
    uncommented = [n for n, ok in _commented_defaults(role / "defaults" / "main.yml").items() if not ok]
    assert not uncommented, f"defaults without a comment line above them: {uncommented}"


def test_there_are_roles():
    assert ROLES, "no roles found"


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_no_secret_has_a_templated_default(role: Path):
    """A failed argument-spec check prints every option's default, evaluated: a secret whose default reads
    vault or the environment would be printed in clear (issue 22: the Proxmox token, the HF token).
    Secrets default to "" and the role resolves them in vars/."""
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    for entry, spec in specs.items():
        for name, option in (spec.get("options") or {}).items():
            if option.get("no_log"):
                assert "{{" not in str(option.get("default", "")), f"{entry}: {name} is no_log with a templated default"
