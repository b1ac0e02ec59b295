"""The Ansible collection sglang_deploy.deploy (scripts/build-collection, collection/galaxy.yml): it builds,
installs with ansible-galaxy into a scratch path, and a playbook that uses its role, module and filter by their
full names passes its syntax check and runs in check mode - with a configuration that knows nothing of the
checkout's roles/, library/ or plugin directories, so only the installed collection can answer."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import ROOT

PLAYBOOK = ROOT / "tests" / "fixtures" / "collection" / "use-by-fqcn.yml"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("collection")
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "build-collection"), str(out / "build")],
                          capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    tarball = Path(done.stdout.strip().splitlines()[-1])
    names = tarfile.open(tarball).getnames()
    for name in ("roles/sglang_server/tasks/main.yml", "plugins/modules/sglang_wait_ready.py",
                 "plugins/module_utils/sglang_deploy_host/serving/endpoint.py", "plugins/filter/sglang_deploy.py",
                 "plugins/action/sglang_validate_tls.py", "plugins/lookup/sglang_deploy_probes.py",
                 "plugins/doc_fragments/sglang_endpoint_client.py", "MANIFEST.json"):
        assert name in names, name
    assert not [n for n in names if "__pycache__" in n]
    galaxy = str(Path(sys.executable).with_name("ansible-galaxy"))
    done = subprocess.run([galaxy, "collection", "install", "--no-deps", "-p", str(out / "collections"), str(tarball)],
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def _env(installed: Path) -> dict[str, str]:
    """Ansible with the installed collection and the community collections it depends on, and nothing of the
    checkout: its own ansible.cfg in the scratch directory."""
    cfg = installed / "ansible.cfg"
    cfg.write_text(
        "[defaults]\n"
        f"collections_path = {installed / 'collections'}:{ROOT / 'collections'}\n"
        "roles_path = /nonexistent\nlibrary = /nonexistent\nfilter_plugins = /nonexistent\n"
        "action_plugins = /nonexistent\nlookup_plugins = /nonexistent\nmodule_utils = /nonexistent\n"
        "gathering = explicit\ninterpreter_python = auto_silent\nstdout_callback = default\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_") or k == "ANSIBLE_CACHE_PLUGIN_CONNECTION"}
    return {**env, "ANSIBLE_CONFIG": str(cfg), "SGLANG_API_KEY": "a-key-for-the-test-0123456789"}


def test_a_playbook_uses_the_installed_collection_by_full_names(installed: Path) -> None:
    playbook = str(Path(sys.executable).with_name("ansible-playbook"))
    base = [playbook, "-i", str(ROOT / "inventory" / "proxmox"), "-e", "ansible_connection=local",
            "-e", f"ansible_python_interpreter={sys.executable}", str(PLAYBOOK)]  # fmt: skip
    syntax = subprocess.run([*base, "--syntax-check"], cwd=installed, env=_env(installed),
                            capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert syntax.returncode == 0, syntax.stdout + syntax.stderr
    done = subprocess.run([*base, "--check"], cwd=installed, env=_env(installed), capture_output=True, text=True,
                          timeout=600, check=False)  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "glm5-01" in out and "failed=0" in out, out
    assert "sglang_deploy.deploy.sglang_server : Resolve the server" in out, out
