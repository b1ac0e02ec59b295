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


def source(name: str) -> bytes:
    """The source of submodule ``name`` (e.g. ``gpufacts``) as this process loaded it."""
    data = pkgutil.get_data(PACKAGE, f"{name}.py")
    if data is None:
        raise FileNotFoundError(f"{PACKAGE}.{name} has no source here")
    return data


def package_closure(name: str) -> "list[str]":
    """``name`` and every submodule it imports relatively, recursively, plus ``__init__``: the files a
    copy of this package needs for ``python -m sglang_deploy_host.<name>`` (sorted)."""
    found = {"__init__"}
    pending = [name]
    while pending:
        current = pending.pop()
        if current in found:
            continue
        found.add(current)
        for node in ast.walk(ast.parse(source(current))):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    pending.append(node.module.split(".")[0])
                else:  # from . import a, b
                    pending.extend(alias.name for alias in node.names)
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
    among them) on its path; stdout and stderr captured as text. Run from ``/`` so nothing in the
    caller's directory is imported."""
    with tempfile.TemporaryDirectory(prefix="sglang-deploy-host-") as work:
        package = Path(work) / _NAME
        package.mkdir()
        (package / "__init__.py").write_bytes(b"")
        for name in {module, *names}:
            (package / f"{name}.py").write_bytes(source(name))
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
