"""The modules' documentation is what they take: every module of library/ documents itself in YAML that
``ansible-doc`` parses (doc fragments merged: doc_fragments/, community.proxmox's), and its documented options
are its argument spec (names, type, default, required, choices, elements).

Before this test six modules' DOCUMENTATION did not parse (a ``: `` inside a plain scalar), so
``ansible-doc`` showed nothing for them. The spec is the one each module's main() really builds: it runs under
a stand-in AnsibleModule that records its arguments and stops."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

MODULES = sorted(path.stem for path in (ROOT / "library").glob("*.py"))
BIN = Path(sys.executable).parent

# Runs one module's main() until it builds its AnsibleModule; prints that argument spec as JSON.
CAPTURE = r"""
import json, runpy, sys
import ansible.module_utils
import ansible.module_utils.basic as basic
root, module = sys.argv[1], sys.argv[2]
ansible.module_utils.__path__.append(root + "/module_utils")  # as Ansible's module_utils = ./module_utils
sys.path.insert(0, root + "/collections")


class Built(Exception):
    pass


class Recorder:
    def __init__(self, argument_spec, **_kwargs):
        print(json.dumps(argument_spec, default=lambda o: list(o) if isinstance(o, (tuple, set)) else repr(o)))
        raise Built


basic.AnsibleModule = Recorder
try:
    runpy.run_path(module, run_name="__main__")
except Built:
    pass
else:
    sys.exit("main() never built an AnsibleModule")
"""


def _env() -> dict[str, str]:
    return {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}


@pytest.fixture(scope="module")
def documented() -> dict[str, Any]:
    """``ansible-doc --json`` of every module at once: exit 1 and an error for any that does not parse."""
    done = subprocess.run(
        [str(BIN / "ansible-doc"), "--json", *MODULES], cwd=ROOT, env=_env(), capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr[-3000:]
    docs: dict[str, Any] = json.loads(done.stdout)
    return docs


def _spec(module: str) -> dict[str, dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-c", CAPTURE, str(ROOT), str(ROOT / "library" / f"{module}.py")],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    spec: dict[str, dict[str, Any]] = json.loads(done.stdout.splitlines()[-1])
    return spec


def _differences(spec: dict[str, dict[str, Any]], options: dict[str, dict[str, Any]]) -> list[str]:
    found = []
    for name in sorted(set(spec) | set(options)):
        taken, doc = spec.get(name), options.get(name)
        if taken is None or doc is None:
            found.append(f"{name}: {'documented only' if taken is None else 'taken but not documented'}")
            continue
        pairs = {
            "type": (taken.get("type", "raw"), doc.get("type", "str")),
            "default": (taken.get("default"), doc.get("default")),
            "required": (bool(taken.get("required")), bool(doc.get("required"))),
            "elements": (taken.get("elements"), doc.get("elements")),
            "choices": (sorted(map(str, taken.get("choices") or [])), sorted(map(str, doc.get("choices") or []))),
        }
        found += [f"{name}: {key} {a!r} taken, {b!r} documented" for key, (a, b) in pairs.items() if a != b]
    return found


@pytest.mark.parametrize("module", MODULES)
def test_the_documented_options_are_the_argument_spec(documented: dict[str, Any], module: str) -> None:
    doc = documented[module]["doc"]
    assert doc["module"] == module and doc.get("short_description")
    assert _differences(_spec(module), doc.get("options") or {}) == []


def test_the_differences_are_named() -> None:
    """The comparison itself: a renamed option, another default and a lost choice are each one line."""
    spec = {"a": {"type": "int", "default": 1}, "b": {"type": "str", "choices": ["x", "y"]}, "gone": {"type": "str"}}
    options = {"a": {"type": "int", "default": 2}, "b": {"type": "str", "choices": ["x"]}, "new": {"type": "str"}}
    assert _differences(spec, options) == [
        "a: default 1 taken, 2 documented",
        "b: choices ['x', 'y'] taken, ['x'] documented",
        "gone: taken but not documented",
        "new: documented only",
    ]
