"""`sglang-deploy render` resolves each serving host once (src/sglang_deploy/serving/server.py, through the
filter sglang_server_resolve), validation included; and the paths follow sglang_common_code_root."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

from conftest import ROOT

CLI = str(Path(sys.executable).with_name("sglang-deploy"))
KEY_ENV = {"SGLANG_API_KEY": "a-key-for-the-test-0123456789"}


def _render(inventory: Path, out: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, "render", "-i", str(inventory), "--out", str(out), *extra],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
        env={**os.environ, **KEY_ENV, **(env or {})},
    )  # fmt: skip


def test_rendering_with_validation_calls_the_resolver_once_per_host(tmp_path: Path) -> None:
    log = tmp_path / "resolve.log"
    counter = ROOT / "tests" / "fixtures" / "resolve-counter"
    env = {
        "ANSIBLE_FILTER_PLUGINS": f"{counter}:{ROOT / 'filter_plugins'}",
        "SGLANG_DEPLOY_REAL_FILTERS": str(ROOT / "filter_plugins" / "sglang_deploy.py"),
        "SGLANG_DEPLOY_RESOLVE_LOG": str(log),
    }
    done = _render(ROOT / "inventory" / "multi_host", tmp_path / "out", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    output = done.stdout + done.stderr
    hosts = ["glm5-01", "glm5-02", "glm5-03"]
    assert all(f"ok {tmp_path / 'out' / host / 'sglang.service'} (flags valid;" in output for host in hosts), output
    calls = Counter(log.read_text().split())
    assert calls == dict.fromkeys(hosts, 1), calls


def test_the_unit_and_the_venvs_follow_sglang_common_code_root(tmp_path: Path) -> None:
    """Before: ml_env_path and three venv paths hard-coded /opt/sglang-deploy, so a moved code root made
    the unit run a venv that was never built."""
    inventory = tmp_path / "inventory"
    shutil.copytree(ROOT / "inventory" / "proxmox", inventory)
    (inventory / "group_vars" / "all").mkdir()
    (inventory / "group_vars" / "all" / "code_root.yml").write_text("sglang_common_code_root: /srv/sglang-deploy\n")
    done = _render(inventory, tmp_path / "out", "--no-validate")
    assert done.returncode == 0, done.stdout + done.stderr
    unit = (tmp_path / "out" / "glm5-01" / "sglang.service").read_text()
    assert "ExecStart=/srv/sglang-deploy/ml-env/bin/python3 /usr/local/libexec/sglang-deploy/sglang_launcher.py" in unit
    assert "PATH=/srv/sglang-deploy/ml-env/bin:" in unit
    assert "/opt/sglang-deploy" not in unit
    # The role that builds the venv reads the same root (its settings entry point, as verify reads it).
    play = tmp_path / "paths.yml"
    play.write_text(
        "- hosts: glm5-01\n  gather_facts: false\n  connection: local\n  tasks:\n"
        "    - {ansible.builtin.include_role: {name: ml_env, tasks_from: settings.yml}}\n"
        "    - {ansible.builtin.debug: {msg: 'ML_ENV={{ ml_env_settings.path }}'}}\n"
    )
    ran = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(inventory), str(play)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
             "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.default", "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"},
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert '"msg": "ML_ENV=/srv/sglang-deploy/ml-env"' in ran.stdout, ran.stdout


def test_no_role_default_spells_the_code_root() -> None:
    """Every path under the code root is built from sglang_common_code_root (roles/sglang_common)."""
    spelled = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "roles").glob("*/defaults/main.yml"))
        if path.parts[-3] != "sglang_common"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "/opt/sglang-deploy" in line and not line.lstrip().startswith("#")
    ]
    assert spelled == []
