"""What every Ansible run of the CLI guarantees: real inventories and hosts, host keys checked,
secrets kept out of the artifacts. Real ansible-playbook through ansible-runner, local connection."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from sglang_deploy import runner

SECRET = "sk-test-3b1f9c0d7e"  # a value no file of the project holds

# Prints what Ansible itself resolved inside the run, so the test reads the real configuration.
PROBE_PLAYBOOK = """
- name: Report the run's settings
  hosts: sglang_servers
  gather_facts: false
  tasks:
    - name: Host key checking as Ansible resolved it
      ansible.builtin.debug:
        msg: "HOST_KEY_CHECKING={{ lookup('ansible.builtin.config', 'HOST_KEY_CHECKING') }}"
"""


def _local_inventory(tmp_path: Path, group: str = "sglang_servers") -> Path:
    path = tmp_path / "hosts.yml"
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    path.write_text(yaml.safe_dump({group: {"hosts": {"probe-01": host}}}))
    return path


def _run(tmp_path: Path, inventory: Path, **kwargs: object) -> runner.PlaybookRun:
    playbook = tmp_path / "probe.yml"
    playbook.write_text(PROBE_PLAYBOOK)
    return runner.run_playbook(
        str(playbook), [str(inventory)], artifacts_dir=tmp_path / "artifacts", live=False, **kwargs
    )


def _messages(run: runner.PlaybookRun) -> str:
    return "\n".join(p.read_text() for p in sorted(run.artifacts.glob("job_events/*.json")))


@pytest.mark.parametrize(
    "operator, resolved",
    [(None, "True"), ("False", "False")],
    ids=["default-on", "operator-turns-it-off"],
)
def test_host_key_checking_stays_on_unless_the_operator_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, operator: str | None, resolved: str
) -> None:
    """ansible-runner turns ANSIBLE_HOST_KEY_CHECKING off unless told otherwise; the CLI keeps it on,
    and only the operator's own environment can turn it off."""
    if operator is None:
        monkeypatch.delenv("ANSIBLE_HOST_KEY_CHECKING", raising=False)
    else:
        monkeypatch.setenv("ANSIBLE_HOST_KEY_CHECKING", operator)
    run = _run(tmp_path, _local_inventory(tmp_path))
    assert run.rc == 0
    assert f"HOST_KEY_CHECKING={resolved}" in _messages(run)


def test_secrets_in_the_environment_stay_out_of_the_artifacts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("SGLANG_API_KEY", "HF_TOKEN", "PROXMOX_TOKEN_SECRET", "ANSIBLE_VAULT_PASSWORD"):
        monkeypatch.setenv(name, SECRET)
    run = _run(tmp_path, _local_inventory(tmp_path))
    assert run.rc == 0
    artifacts = tmp_path / "artifacts"
    files = [p for p in artifacts.rglob("*") if p.is_file()]
    assert any(p.name == "command" for p in files)  # the file that held the whole environment
    leaked = [str(p) for p in files if SECRET in p.read_text(errors="replace")]
    assert not leaked, f"the secret is in {leaked}"
    assert artifacts.stat().st_mode & 0o777 == 0o700


def test_artifacts_are_rotated(tmp_path: Path) -> None:
    inventory = _local_inventory(tmp_path)
    for _ in range(4):
        assert _run(tmp_path, inventory, keep_artifacts=2).rc == 0
    runs = [p for p in (tmp_path / "artifacts" / "runs").iterdir() if p.is_dir()]
    assert len(runs) == 2


@pytest.mark.parametrize(
    "content, expected",
    [
        (None, "does not exist"),
        ("", "no serving hosts"),
        ("sglang_servers: [\n", "does not parse"),
        ("other:\n  hosts:\n    a: {}\n", "no serving hosts"),
        ("sglang_servers:\n  hosts: {}\n", "no serving hosts"),
    ],
    ids=["missing", "empty", "broken", "no-serving-group", "empty-serving-group"],
)
def test_a_useless_inventory_is_refused(tmp_path: Path, content: str | None, expected: str) -> None:
    path = tmp_path / "hosts.yml"
    if content is not None:
        path.write_text(content)
    with pytest.raises(runner.InventoryError, match=expected):
        runner.serving_hosts([str(path)])


def test_a_limit_that_matches_no_serving_host_is_refused(tmp_path: Path) -> None:
    inventory = _local_inventory(tmp_path)
    with pytest.raises(runner.InventoryError, match="limited to 'nomatch'"):
        runner.serving_hosts([str(inventory)], limit="nomatch")
    assert runner.serving_hosts([str(inventory)], limit="probe-01") == ["probe-01"]


def test_the_playbook_itself_refuses_no_serving_hosts(tmp_path: Path) -> None:
    """ansible-playbook used directly (no CLI) fails too: the serving_hosts.yml guard."""
    inventory = _local_inventory(tmp_path, group="other")
    done = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "playbooks/validate.yml", "-i", str(inventory)],
        capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")},
    )  # fmt: skip
    assert done.returncode != 0
    assert "no serving hosts" in done.stdout + done.stderr


def test_the_console_script_runs_ansible_without_an_activated_venv(tmp_path: Path) -> None:
    """`.venv/bin/sglang-deploy doctor -i` with a PATH that has no venv: Ansible is still found."""
    script = Path(sys.executable).with_name("sglang-deploy")
    env = {"HOME": os.environ.get("HOME", "/root"), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    done = subprocess.run(
        [str(script), "doctor", "-i", str(_local_inventory(tmp_path))],
        capture_output=True, text=True, timeout=300, check=False, env=env, cwd=tmp_path,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode in (0, 1), output  # 0: nothing found, 1: a finding; never "no host matched"
    assert "== probe-01" in output
