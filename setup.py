"""The wheel carries the project's Ansible content, so an `sglang-deploy` installed with pip works outside a checkout.

Everything else about the package is in pyproject.toml. ``build_py`` copies the playbooks, roles, plugins,
modules, module_utils, the shipped inventory (``sglang-deploy init``'s template) and the testinfra suites
(``verify``) into ``sglang_deploy/_project/`` of the build; ``sglang_deploy.playbook.runner.project_dir`` finds
them there when no checkout is around. A checkout (and ``pip install -e .``) keeps using its own tree.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
# What a run needs from the checkout, relative to it (directories copied whole, caches left out).
PROJECT_CONTENT = (
    "site.yml", "ansible.cfg", "playbooks", "roles", "library", "module_utils", "filter_plugins",
    "action_plugins", "lookup_plugins", "doc_fragments", "inventory/proxmox", "tests/infra", "monitoring",
)  # fmt: skip
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")


class BuildWithProject(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install runs from the checkout itself
        target = Path(self.build_lib) / "sglang_deploy" / "_project"
        if target.exists():
            shutil.rmtree(target)
        for name in PROJECT_CONTENT:
            source = ROOT / name
            if source.is_dir():
                shutil.copytree(source, target / name, ignore=IGNORED, symlinks=False)
            else:
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target / name)


setup(cmdclass={"build_py": BuildWithProject})
