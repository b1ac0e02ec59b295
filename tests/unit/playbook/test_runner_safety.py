"""What every Ansible run of the CLI guarantees: real inventories and hosts, host keys checked,
secrets kept out of the artifacts. Real ansible-playbook through ansible-runner, local connection."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from sglang_deploy.playbook import runner

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


@pytest.mark.parametrize("shadowed", ["sglang_deploy", "sglang_deploy_host"])
def test_an_ansible_that_cannot_import_the_package_fails_first_with_the_fix(tmp_path: Path, shadowed: str) -> None:
    """The plugins import the package plainly; serving_hosts.yml, which every playbook imports first, refuses an
    Ansible whose Python cannot import it (here: either package shadowed by one that fails to import) before a
    plugin is used, naming the interpreter and the fix, instead of Ansible's "Skipping plugin" warning."""
    shadow = tmp_path / "shadow" / shadowed
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('shadowed for the test')\n")
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "PYTHONPATH": str(shadow.parent)}  # fmt: skip
    done = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "playbooks/render.yml", "-i", str(_local_inventory(tmp_path))],
        capture_output=True, text=True, timeout=300, check=False, cwd=ROOT, env=env,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Refuse a control node whose Ansible cannot import sglang_deploy" in output, output
    assert f"control node's ansible-playbook ({sys.executable}) cannot import" in output, output
    assert "shadowed for the test" in output and "Fix: run scripts/setup" in output, output
    # Nothing after the check ran: no resolve, no serving-host check.
    assert "Resolve the serving hosts" not in output and "Refuse a run without serving hosts" not in output, output


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


# --- a signal to the CLI stops its Ansible run (issue 22) ---------------------------------------------

# In the environment of the CLI, so of everything its run starts: how /proc tells this test's processes.
RUN_MARKER = "SGLANG_DEPLOY_TEST_RUN"
TASK = "Sleep for the interrupt test"
# The interrupted CLI must be gone within this many seconds (its own bound: 30 s, then SIGKILL).
EXIT_BOUND_S = 60

SLEEPING_PLAYBOOK = """
- name: Sleep on every serving host
  hosts: sglang_servers
  gather_facts: false
  tasks:
    - name: {task}
      {action}
"""
# A task that ignores the forwarded signal, as a wedged module would: only the kill of its group stops it.
SLEEP = "ansible.builtin.command: sleep 301"
DEAF_SLEEP = "ansible.builtin.shell: trap '' INT TERM HUP; sleep 302"


def _sleeping_project(tmp_path: Path, action: str) -> Path:
    """A project (SGLANG_DEPLOY_PROJECT) whose every playbook sleeps on the hosts: what the commands run."""
    project = tmp_path / "project"
    (project / "roles").mkdir(parents=True)
    (project / "playbooks").mkdir()
    (project / "ansible.cfg").write_text("[defaults]\nretry_files_enabled = false\ninterpreter_python = auto_silent\n")
    for playbook in ("site.yml", "playbooks/render.yml", "playbooks/bench.yml", "playbooks/validate.yml"):
        (project / playbook).write_text(SLEEPING_PLAYBOOK.format(task=TASK, action=action))
    # The roles whose defaults the commands' options take (bench's sweep, rollout's serial).
    for role in ("sglang_deploy_bench", "sglang_rolling", "sglang_server"):
        (project / "roles" / role / "defaults").mkdir(parents=True)
        shutil.copy(ROOT / "roles" / role / "defaults" / "main.yml", project / "roles" / role / "defaults" / "main.yml")
    return project


def _processes_of(marker: str) -> list[str]:
    """The live processes (zombies read as an empty environment) started with RUN_MARKER=marker."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            if f"{RUN_MARKER}={marker}".encode() in environ:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                found.append(f"{entry.name}: {cmdline}")
        except (OSError, ValueError):
            continue  # not a process, gone, or not ours
    return found


def _wait_for(predicate, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not (found := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)
    return found


@pytest.mark.parametrize(
    "argv, signum, action",
    [
        (["render", "--out", "out"], signal.SIGTERM, SLEEP),
        (["rebuild", "-l", "probe-01", "--yes"], signal.SIGINT, SLEEP),
        (["bench", "--out", "out"], signal.SIGTERM, DEAF_SLEEP),
        (["validate"], signal.SIGINT, DEAF_SLEEP),
    ],
    ids=["render-SIGTERM", "rebuild-SIGINT", "bench-SIGTERM-deaf-task", "validate-SIGINT-deaf-task"],
)
def test_a_signal_to_the_cli_stops_its_ansible_run(
    tmp_path: Path, argv: list[str], signum: signal.Signals, action: str
) -> None:
    """`kill` (or Ctrl-C) of the CLI mid-run: the run's ansible-playbook, its workers and the task's own
    processes are gone when the CLI exits, within the bound, with 128 + the signal and one line."""
    marker = uuid.uuid4().hex
    env = {**os.environ, "SGLANG_DEPLOY_PROJECT": str(_sleeping_project(tmp_path, action)), RUN_MARKER: marker}
    command = [sys.executable, "-m", "sglang_deploy.cli", argv[0], "-i", str(_local_inventory(tmp_path)), *argv[1:]]
    # A session of its own: the signal reaches the CLI alone, as `kill PID` does.
    cli = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
        start_new_session=True,
    )  # fmt: skip
    try:
        _wait_for(lambda: [p for p in _processes_of(marker) if ": sleep 30" in p], 120, "the task's sleep")
        os.kill(cli.pid, signum)
        out, err = cli.communicate(timeout=EXIT_BOUND_S)
        assert cli.returncode == 128 + signum, out + err
        line = err.strip().splitlines()[-1]
        assert line.startswith(f"sglang-deploy {argv[0]}: interrupted by {signum.name} at [probe-01] {TASK}"), err
        artifacts = Path(line.rsplit("artifacts: ", 1)[1].split()[0].rstrip(";."))
        assert (artifacts / "job_events").is_dir(), line
        deadline = time.monotonic() + 5  # a SIGKILL sent just before the CLI's exit takes effect at once, not in no time
        while (left := _processes_of(marker)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, f"still running after the CLI exited: {left}"
    finally:
        cli.kill()
        cli.communicate()
        for process in _processes_of(marker):  # what a failing run left: this test's own processes only
            with contextlib.suppress(OSError):
                os.kill(int(process.split(":")[0]), signal.SIGKILL)


def test_two_runs_rotating_at_once_both_go_on(tmp_path: Path) -> None:
    """Two CLI runs starting together rotate the same directory: neither fails on an entry the other
    removed (ansible-runner's own rotation crashed one of them with FileNotFoundError)."""
    import concurrent.futures
    import os

    artifacts = tmp_path / "artifacts"
    for index in range(40):
        run = artifacts / "runs" / f"run-{index:02d}"
        (run / "job_events").mkdir(parents=True)
        for event in range(20):
            (run / "job_events" / f"{event}.json").write_text("{}")
        os.utime(run, (index, index))
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for done in [pool.submit(runner.rotate_runs, artifacts, 3) for _ in range(8)]:
            done.result()
    assert sorted(p.name for p in (artifacts / "runs").iterdir()) == ["run-38", "run-39"]
