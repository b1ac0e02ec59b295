"""The tests mirror the code: each package of src/sglang_deploy has a folder of its own under tests/unit, beside
host/ (module_utils/sglang_deploy_host and its modules), vm/ (the Proxmox layer), cli/ and project/ (the repository
as a whole); no test file lies outside them. No module, of the code or of the tests, grows past 800 lines, and a
package's __init__.py says what the package holds and defines nothing: its logic lives in a module named for it."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT, repository_files

UNIT = ROOT / "tests" / "unit"
MAX_LINES = 800
BEYOND_THE_PACKAGES = {"host", "vm", "cli", "project"}


def test_every_package_has_its_test_folder_and_every_folder_a_package() -> None:
    packages = {p.parent.name for p in (ROOT / "src" / "sglang_deploy").glob("*/__init__.py")} - {"commands"}
    folders = {p.name for p in UNIT.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert packages - folders == set(), "packages without a test folder"
    assert folders - packages - BEYOND_THE_PACKAGES == set(), "test folders that mirror no package"


def test_no_test_file_lies_outside_the_folders_or_grows_past_the_bound() -> None:
    assert sorted(p.name for p in UNIT.glob("test_*.py")) == []
    long = {
        str(p.relative_to(UNIT)): n
        for p in UNIT.rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}


def _code_files() -> list[Path]:
    """Every Python file of the project outside tests/ (tracked or new): the packages, the Ansible plugins and
    modules, the scripts (those without a .py suffix by their python shebang)."""
    return [
        path
        for path in repository_files(untracked=True)
        if path.relative_to(ROOT).parts[0] not in ("tests", "build")
        and (path.suffix == ".py" or (not path.suffix and path.read_bytes()[:64].startswith(b"#!/usr/bin/env python")))
    ]


def test_no_code_module_grows_past_the_bound() -> None:
    files = _code_files()
    assert any(p.name == "planner.py" for p in files) and any(p.name == "mutation" for p in files)
    long = {
        str(p.relative_to(ROOT)): n
        for p in files
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}, f"split these by what they do (at most {MAX_LINES} lines a module): {long}"


def test_a_package_init_defines_nothing() -> None:
    """A docstring, and at most the package's ``__version__``: no function, class, constant or import."""
    inits = [p for p in _code_files() if p.name == "__init__.py"]
    assert len(inits) >= 15, inits
    logic = {}
    for path in inits:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        body = tree.body[1:] if ast.get_docstring(tree) else tree.body
        extra = [
            ast.unparse(node).splitlines()[0]
            for node in body
            if not (isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["__version__"])
        ]
        if not ast.get_docstring(tree):
            extra.append("(no docstring saying what the package holds)")
        if extra:
            logic[str(path.relative_to(ROOT))] = extra
    assert logic == {}, logic
