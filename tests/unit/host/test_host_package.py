"""The one mechanism by which Python reaches hosts, kept honest.

module_utils/sglang_deploy_host is the only code that runs on managed hosts: stdlib only at import
time and Python 3.9 syntax (the oldest interpreter of a supported guest), shipped by Ansible with
the modules in library/ that import it. The programs systemd runs on the host are installed from
the same files, so those must be whole programs on their own. Roles never reach into the checkout.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest
from conftest import ROOT

PACKAGE = ROOT / "module_utils" / "sglang_deploy_host"
MODULES = sorted(PACKAGE.glob("*.py"))
# Installed on the host by library/sglang_host_files.py and run by systemd by path.
SCRIPTS = ("gpufacts", "sglang_launcher", "unitcheck")


def _top_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Imports that run when the module is imported (not those inside functions)."""
    found: list[ast.Import | ast.ImportFrom] = []
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, (ast.If, ast.Try)):
            pending += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]
            pending += [stmt for handler in getattr(node, "handlers", []) for stmt in handler.body]
    return found


@pytest.mark.parametrize("path", MODULES, ids=[p.stem for p in MODULES])
def test_host_code_imports_only_the_standard_library_and_itself(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"), feature_version=(3, 9))
    foreign = []
    for node in _top_level_imports(tree):
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            continue  # a sibling of this package
        names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
        foreign += [n for n in names if n.split(".")[0] not in sys.stdlib_module_names | {"__future__"}]
    assert not foreign, f"{path.name} imports {foreign} at import time; hosts have only the standard library"


@pytest.mark.parametrize("name", SCRIPTS)
def test_programs_systemd_runs_are_whole_on_their_own(name: str) -> None:
    tree = ast.parse((PACKAGE / f"{name}.py").read_text(encoding="utf-8"))
    relative = [n for n in _top_level_imports(tree) if isinstance(n, ast.ImportFrom) and n.level > 0]
    assert not relative, f"{name}.py is installed as a single file; it cannot import its siblings"
    assert any(
        isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) for node in tree.body
    ), f"{name}.py has no __main__ entry"


def test_roles_never_reach_into_the_checkout() -> None:
    """No role_path/../.. (into src/ or module_utils/): hosts get code only through the modules."""
    pattern = re.compile(r"role_path\s*}}/\.\.")
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "roles").rglob("*"))
        if path.is_file() and path.suffix in (".yml", ".yaml", ".j2", ".py")
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line) and not line.lstrip().startswith("#")
    ]
    assert not offenders, offenders


def test_no_symlinks_into_the_package() -> None:
    links = [p for p in ROOT.joinpath("roles").rglob("*") if p.is_symlink()]
    assert not links, links
