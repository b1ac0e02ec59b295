"""The one mechanism by which Python reaches hosts, kept honest.

module_utils/sglang_deploy_host is the only code that runs on managed hosts: stdlib only at import
time and Python 3.9 syntax (the oldest interpreter of a supported guest), shipped by Ansible with
the modules in library/ that import it. Its domains import one way (DOMAIN_ORDER), as src/'s packages do.
The programs systemd runs on the host are installed from the same files, so those must be whole programs
on their own. module_utils/sglang_deploy_pve (the Proxmox layer) runs only on the control node: no module
a host runs imports it. Roles never reach into the checkout.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest
from conftest import ROOT

PACKAGE = ROOT / "module_utils" / "sglang_deploy_host"
PVE = ROOT / "module_utils" / "sglang_deploy_pve"
MODULES = sorted([*PACKAGE.rglob("*.py"), *PVE.rglob("*.py")])
# Installed on the host by library/sglang_host_files.py and run by systemd by path.
SCRIPTS = ("gpu/gpufacts", "serving/sglang_launcher", "serving/unitcheck")
# The host package's domains, lowest first: a module imports its own domain's and lower ones' only. The
# package's top-level modules (the watchdog program, interp) may import any domain.
DOMAIN_ORDER = ("fs", "model", "serving", "gpu", "stack", "watch")


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


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(ROOT / "module_utils")) for p in MODULES])
def test_host_code_imports_only_the_standard_library_and_itself(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"), feature_version=(3, 9))
    foreign = []
    for node in _top_level_imports(tree):
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            continue  # a sibling of this package
        names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
        foreign += [n for n in names if n.split(".")[0] not in sys.stdlib_module_names | {"__future__"}]
    if path.is_relative_to(PVE):
        # Control-node code: what it imports under `except ImportError` is reported by the module that needs it
        # (proxmoxer in client.py) or is the host package, shipped beside it (vmspec.py's disk serial).
        guarded = {
            name
            for node in tree.body
            if isinstance(node, ast.Try) and any(ast.unparse(h.type or ast.Name("")) == "ImportError" for h in node.handlers)
            for stmt in ast.walk(node)
            if isinstance(stmt, (ast.Import, ast.ImportFrom))
            for name in ([stmt.module or ""] if isinstance(stmt, ast.ImportFrom) else [a.name for a in stmt.names])
        }
        foreign = [n for n in foreign if n not in guarded]
    assert not foreign, f"{path.name} imports {foreign} at import time; hosts have only the standard library"


def _domain_imports(path: Path) -> list[str]:
    """The domains of the host package that ``path`` imports relatively, resolved as interp resolves them."""
    from sglang_deploy_host import interp

    dotted = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
    return [imported.split(".")[0] for imported in interp.relative_imports(dotted)]


@pytest.mark.parametrize("domain", DOMAIN_ORDER)
def test_a_domain_imports_only_itself_and_the_domains_below(domain: str) -> None:
    allowed = set(DOMAIN_ORDER[: DOMAIN_ORDER.index(domain) + 1])
    upward = {
        f"{path.relative_to(PACKAGE)} -> {target}"
        for path in sorted((PACKAGE / domain).rglob("*.py"))
        for target in _domain_imports(path)
        if target not in allowed
    }
    assert not upward, f"imports that run up the host package's domains ({' < '.join(DOMAIN_ORDER)}): {sorted(upward)}"


def test_every_module_of_the_host_package_lies_in_a_domain_or_is_a_program() -> None:
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert top == ["__init__", "interp", "watchdog"], "a module directly in the package belongs in a domain"
    domains = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert domains == sorted([*DOMAIN_ORDER]), "a domain missing from DOMAIN_ORDER (or an order naming none)"


def test_nothing_a_host_runs_imports_the_proxmox_layer() -> None:
    """The Proxmox layer is control-node code: no host module and no module run on a host imports it."""
    host_modules = [p for p in (ROOT / "library").glob("*.py") if not p.name.startswith(("sglang_pve_", "sglang_known_hosts"))]
    offenders = [
        str(p.relative_to(ROOT))
        for p in [*PACKAGE.rglob("*.py"), *host_modules]
        if "sglang_deploy_pve" in p.read_text(encoding="utf-8")
    ]
    assert not offenders, offenders


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
