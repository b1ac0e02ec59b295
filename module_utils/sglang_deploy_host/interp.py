"""Run code of this package with another interpreter, e.g. the ml-env's python, which has torch and
sglang but not this package, and in which the check must run to see what that venv holds.

Works wherever the package was imported from: an installed checkout, or the zip Ansible ships with
a module (only the submodules the module imported are in that zip, so ``names`` must be some of
those). The sources are copied into a private temporary directory and run with ``python -m``.
"""

from __future__ import annotations

import ast
import os
import pkgutil
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, Optional, Sequence

PACKAGE = __name__.rpartition(".")[0]  # ansible.module_utils.sglang_deploy_host or sglang_deploy_host
_NAME = "sglang_deploy_host"


def _path(name: str) -> str:
    """``serving.endpoint`` -> ``serving/endpoint.py``: a submodule's file inside this package."""
    return name.replace(".", "/") + ".py"


def source(name: str) -> bytes:
    """The source of submodule ``name`` (e.g. ``gpu.gpufacts``, or ``serving.__init__``) as this process loaded it."""
    data = pkgutil.get_data(PACKAGE, _path(name))
    if data is None:
        raise FileNotFoundError(f"{PACKAGE}.{name} has no source here")
    return data


def _is_module(name: str) -> bool:
    try:
        source(name)
    except OSError:
        return False
    return True


def _packages(name: str) -> "list[str]":
    """The ``__init__`` of every package that holds ``name``: ``serving.endpoint`` -> ``__init__``, ``serving.__init__``."""
    parts = name.split(".")[:-1]
    return [".".join([*parts[:depth], "__init__"]) for depth in range(len(parts) + 1)]


def _imported(current: str, node: ast.ImportFrom) -> "list[str]":
    """The submodules of this package a relative import in ``current`` names."""
    here = current.split(".")[:-1]
    base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
    target = [*base, *(node.module.split(".") if node.module else [])]
    if target and _is_module(".".join(target)):  # from .x import names: names of module x
        return [".".join(target)]
    return [".".join([*target, alias.name]) for alias in node.names]  # from .pkg import a, b: submodules


def relative_imports(name: str) -> "list[str]":
    """The submodules of this package that submodule ``name`` imports relatively (dotted, e.g. ``fs.files``), in
    the order its source names them."""
    return [
        imported
        for node in ast.walk(ast.parse(source(name)))
        if isinstance(node, ast.ImportFrom) and node.level >= 1
        for imported in _imported(name, node)
    ]


def package_closure(name: str) -> "list[str]":
    """``name`` and every submodule it imports relatively, recursively, plus the ``__init__`` of each package
    on the way: the files a copy of this package needs for ``python -m sglang_deploy_host.<name>`` (sorted)."""
    found: "set[str]" = set()
    pending = [name]
    while pending:
        current = pending.pop()
        if current in found:
            continue
        found.add(current)
        found.update(_packages(current))
        pending.extend(relative_imports(current))
    return sorted(found)


def run_module(
    python: str,
    module: str,
    args: Sequence[str],
    *,
    names: Sequence[str],
    timeout: float,
    env: Optional[Dict[str, str]] = None,
) -> "subprocess.CompletedProcess[str]":
    """``python -m sglang_deploy_host.<module> args`` with the submodules ``names`` (``module``
    among them; dotted, e.g. ``stack.mlenv``) on its path; stdout and stderr captured as text. Run from ``/``
    so nothing in the caller's directory is imported."""
    with tempfile.TemporaryDirectory(prefix="sglang-deploy-host-") as work:
        package = Path(work) / _NAME
        for name in {module, *names}:
            for init in _packages(name):
                (package / _path(init)).parent.mkdir(parents=True, exist_ok=True)
                (package / _path(init)).touch()
            (package / _path(name)).write_bytes(source(name))
        environment = dict(os.environ if env is None else env)
        environment["PYTHONPATH"] = work
        environment.pop("PYTHONHOME", None)
        return subprocess.run(
            [python, "-m", f"{_NAME}.{module}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=environment,
            cwd="/",
            check=False,
        )
