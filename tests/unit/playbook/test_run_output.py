"""What a run leaves behind and prints: artifacts under artifacts/runs/<time>-<command>/ without
escape codes, a recap with Ansible's own counts (no_log tasks included) that does not wrap in a
log, and the testinfra results read back from pytest's JUnit XML. Real ansible-playbook through
ansible-runner (local connection) and real pytest."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import yaml
from rich.console import Console

from sglang_deploy.observe import testreport
from sglang_deploy.playbook import runner

# Three changed tasks, one of them no_log (its event hides "changed"), one a loop, and an ok task.
PLAYBOOK = """
- name: Changes, one hidden by no_log
  hosts: sglang_servers
  gather_facts: false
  tasks:
    - name: A changed task
      ansible.builtin.command: "true"
    - name: A changed task whose output is secret
      ansible.builtin.command: "true"
      no_log: true
    - name: A changed loop
      ansible.builtin.command: "true"
      loop: [1, 2]
    - name: An unchanged task
      ansible.builtin.debug:
        msg: nothing to see
"""

LONG_HOST = "gpu-host-with-a-name-long-enough-to-wrap-an-eighty-column-table.example.internal"


def _run(tmp_path: Path, playbook_text: str = PLAYBOOK, **kwargs: object) -> tuple[runner.PlaybookRun, str]:
    inventory = tmp_path / "hosts.yml"
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory.write_text(yaml.safe_dump({"sglang_servers": {"hosts": {LONG_HOST: host}}}))
    playbook = tmp_path / "play.yml"
    playbook.write_text(playbook_text)
    out = io.StringIO()
    console = Console(file=out, width=80, no_color=True)  # a log file: not a terminal, 80 columns
    run = runner.run_playbook(
        str(playbook), [str(inventory)], artifacts_dir=tmp_path / "artifacts", console=console, title="up", **kwargs
    )
    return run, out.getvalue()


def test_the_recap_has_ansibles_counts_and_does_not_wrap(tmp_path: Path) -> None:
    run, printed = _run(tmp_path)
    assert run.rc == 0
    # Ansible's own recap: 4 tasks ok, 3 changed (the no_log one included).
    recap = [line for line in printed.splitlines() if line.startswith(LONG_HOST)]
    assert recap == [f"{LONG_HOST} : ok=4 changed=3 unreachable=0 failed=0 skipped=0"]
    assert "RECAP up (successful)" in printed


def test_artifacts_are_under_runs_named_by_time_and_command_without_escape_codes(tmp_path: Path) -> None:
    run, _ = _run(tmp_path)
    assert run.artifacts.parent == tmp_path / "artifacts" / "runs"
    assert run.artifacts.name.split("-")[1] == "up" and run.artifacts.name[:8].isdigit()
    files = [p for p in run.artifacts.rglob("*") if p.is_file()]
    assert any(p.name == "stdout" for p in files)
    coloured = [str(p) for p in files if "\x1b[" in p.read_text(errors="replace")]
    assert not coloured, f"ANSI escape codes in {coloured}"


def test_rotation_keeps_what_is_beside_the_runs(tmp_path: Path) -> None:
    bench = tmp_path / "artifacts" / "bench" / "gpu-01"
    bench.mkdir(parents=True)
    (bench / "results.jsonl").write_text("{}\n")
    for _ in range(3):
        assert _run(tmp_path, keep_artifacts=1)[0].rc == 0
    assert (bench / "results.jsonl").is_file()
    assert len(list((tmp_path / "artifacts" / "runs").iterdir())) == 1


SUITE = """
import pytest

def test_one():
    pass

@pytest.mark.parametrize("n", [1, 2])
def test_param(n):
    assert n == 1

def test_skipped():
    pytest.skip("not here")

@pytest.fixture
def broken():
    raise RuntimeError("fixture error")

def test_error(broken):
    pass
"""


def _junit(tmp_path: Path, name: str) -> Path:
    suite = tmp_path / "test_suite_demo.py"
    suite.write_text(SUITE)
    report = tmp_path / "reports" / f"{name}.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", str(suite)],
        cwd=tmp_path, capture_output=True, check=False, timeout=120,
    )  # fmt: skip
    return report


def test_a_real_junit_report_reads_back_with_the_failing_names(tmp_path: Path) -> None:
    result = testreport.read_report(_junit(tmp_path, "gpu-01"))
    assert (result.host, result.passed, result.skipped) == ("gpu-01", 2, 1)
    assert result.failed == ("test_suite_demo::test_param[2]", "test_suite_demo::test_error")
    assert result.line() == (
        "gpu-01: 2 passed, 2 failed: test_suite_demo::test_param[2], test_suite_demo::test_error, 1 skipped"
    )
    assert not result.ok


def test_a_broken_report_is_said_not_counted_as_passed(tmp_path: Path) -> None:
    (tmp_path / "gpu-02.xml").write_text("<testsuites><testsuite")
    (result,) = testreport.read_reports(tmp_path)
    assert not result.ok and result.line().startswith("gpu-02: no test report")


VERIFY_LIKE = """
- name: Write a report where the CLI asked
  hosts: sglang_servers
  gather_facts: false
  tasks:
    - name: Run a suite with a JUnit report
      ansible.builtin.command:
        argv: ["{{ ansible_playbook_python }}", -m, pytest, -q, -p, no:cacheprovider,
               "--junitxml={{ sglang_deploy_verify_report_dir }}/{{ inventory_hostname }}.xml", "{{ suite }}"]
      changed_when: false
      failed_when: false
"""


def test_the_run_prints_each_hosts_test_results(tmp_path: Path) -> None:
    suite = tmp_path / "test_suite_demo.py"
    suite.write_text(SUITE)
    run, printed = _run(tmp_path, VERIFY_LIKE, extravars={"suite": str(suite)})
    assert run.rc == 0
    assert [t.host for t in run.tests] == [LONG_HOST]
    assert f"testinfra {LONG_HOST}: 2 passed, 2 failed: test_suite_demo::test_param[2]" in printed
    assert (run.artifacts / "testinfra" / f"{LONG_HOST}.xml").is_file()
