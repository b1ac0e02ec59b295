"""The doctor on real log excerpts (tests/fixtures/logs/<id>/, sources in SOURCES.md)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest

from sglang_deploy import inputfiles
from sglang_deploy.observe import doctor
from sglang_deploy.playbook import runner
from sglang_deploy.commands import doctor as doctor_command

ROOT = Path(__file__).resolve().parents[3]
LOGS = ROOT / "tests" / "fixtures" / "logs"
REQUIRED_IDS = {
    "cuda-graph-oom", "kv-cache-too-small", "gpu-busy", "p2p-unsupported", "nccl-timeout",
    "kernel-arch-unsupported", "nan-output", "unrecognized-flag",
}
FIXTURES = sorted(p for p in LOGS.glob("*/*.log") if p.parent.name != "clean")


def ids(path: Path) -> list[str]:
    return [f.id for f in doctor.diagnose(path.read_text().splitlines())]


def test_every_rule_has_two_differently_worded_fixtures_and_a_source() -> None:
    rules = {rule.id for rule in doctor.default_rules()}
    assert REQUIRED_IDS <= rules
    sources = (LOGS / "SOURCES.md").read_text()
    for rule_id in rules:
        files = sorted((LOGS / rule_id).glob("*.log"))
        assert len(files) >= 2, rule_id
        # differently worded: the evidence lines differ between the fixtures
        evidence = {tuple(f.evidence) for p in files for f in
                    doctor.diagnose(p.read_text().splitlines()) if f.id == rule_id}
        assert len(evidence) >= 2, rule_id
        for path in files:
            assert f"{rule_id}/{path.name}" in sources, path


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_each_fixture_is_named_by_its_rule(path: Path) -> None:
    assert path.parent.name in ids(path)


def test_the_seed_oom_is_graph_oom_and_fragmentation_and_nothing_else() -> None:
    path = LOGS / "cuda-graph-oom" / "seed-000-graph-capture-0.95.log"
    findings = doctor.diagnose(path.read_text().splitlines())
    assert [f.id for f in findings] == ["cuda-graph-oom", "memory-fragmentation"]
    (evidence,) = findings[0].evidence
    assert "Tried to allocate 694.00 MiB" in evidence and "6.44 GiB is reserved" in evidence


def test_a_clean_start_has_no_findings() -> None:
    assert ids(LOGS / "clean" / "seed-004-start-0.92.log") == []


def test_an_oom_outside_graph_capture_is_not_called_a_graph_oom() -> None:
    line = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB. GPU 6 has a "
            "total capacity of 44.53 GiB of which 448.00 KiB is free.")
    assert "cuda-graph-oom" not in [f.id for f in doctor.diagnose([line])]


def test_nccl_init_options_with_a_timeout_value_are_not_a_timeout() -> None:
    # PyTorch's INFO line at process-group creation (ProcessGroupNCCL.cpp) names the timeout too.
    line = ("[I ProcessGroupNCCL.cpp:886] [PG 0 Rank 0] ProcessGroupNCCL initialization options: "
            "size: 8, global rank: 0, TIMEOUT(ms): 600000, USE_HIGH_PRIORITY_STREAM: 0")
    assert doctor.diagnose([line]) == []


def test_fix_uses_the_planners_value_when_given() -> None:
    lines = (LOGS / "cuda-graph-oom" / "sglang-5285-capture-failed.log").read_text().splitlines()
    (with_plan,) = doctor.diagnose(lines, plan={"recommended_mem_fraction_static": 0.91})
    assert "Lower --mem-fraction-static to 0.91" in with_plan.fix
    (without,) = doctor.diagnose(lines)
    assert "<recommended_mem_fraction_static from `sglang-deploy plan`>" in without.fix


def test_colour_codes_do_not_hide_a_line() -> None:
    line = ("\x1b[31mRuntimeError: CUDART error: peer access is not supported between these two "
            "devices\x1b[0m")
    (finding,) = doctor.diagnose([line])
    assert finding.id == "p2p-unsupported" and not finding.evidence[0].startswith("\x1b")


def test_malformed_rules_are_rejected_with_the_rule_named() -> None:
    with pytest.raises(doctor.RulesError, match="rule x: patterns regex"):
        doctor.load_rules("- {id: x, patterns: ['('], summary: s, fix: f}")
    with pytest.raises(doctor.RulesError, match="rule y: fix is missing"):
        doctor.load_rules("- {id: y, patterns: [a], summary: s}")
    with pytest.raises(doctor.RulesError, match="repeated"):
        doctor.load_rules("- {id: z, patterns: [a], summary: s, fix: f}\n"
                          "- {id: z, patterns: [b], summary: s, fix: f}")


def run_cli(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sglang_deploy.cli", "doctor", *argv],
        input=stdin, capture_output=True, text=True, timeout=180, cwd=ROOT, check=False,
    )


def test_cli_json_and_exit_status() -> None:
    done = run_cli(str(LOGS / "nccl-timeout" / "sglang-507-store-timeout.log"), "--json")
    assert done.returncode == 1, done.stderr
    (finding,) = json.loads(done.stdout)
    assert set(finding) == {"id", "evidence", "summary", "fix"} and finding["id"] == "nccl-timeout"
    clean = run_cli("-", stdin=(LOGS / "clean" / "seed-004-start-0.92.log").read_text())
    assert clean.returncode == 0 and "no known failure" in clean.stdout


def test_cli_reads_a_hosts_journal_through_ansible(tmp_path: Path) -> None:
    """The real Ansible path (ansible-runner, ansible.builtin.command, journalctl) against this
    machine over the local connection; the unit does not exist, so the journal has no entries."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(textwrap.dedent(
        f"""
        sglang_servers:
          hosts:
            here:
              ansible_connection: local
              ansible_python_interpreter: {sys.executable}
        """
    ))
    done = run_cli("-i", str(inventory), "--unit", "sglang-doctor-test-none", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout) == {"here": []}
    unreachable = run_cli("-i", str(inventory), "--host", "nobody")
    assert unreachable.returncode == 2 and "no host" in unreachable.stderr


# --- bounded input: the journal through Ansible, the --plan file ------------------------------------------


def _fake_journalctl(tmp_path: Path, body: str) -> dict[str, str]:
    """An environment whose PATH finds a journalctl that runs ``body`` (sh)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "journalctl"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_the_journal_is_cut_on_the_host_just_past_the_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """journalctl -n bounds lines, not their length: head -c bounds the bytes that come back, and a
    journalctl that fails (not the one cut off by head) still fails the command."""
    monkeypatch.setattr(doctor_command, "LOG_MAX_BYTES", 1000)
    argv = shlex.split(doctor_command.journal_command("sglang", 5))
    endless = subprocess.run(argv, env=_fake_journalctl(tmp_path, "exec yes 'a long journal line'"),
                             capture_output=True, timeout=30, check=False)
    assert len(endless.stdout) == 1002 and endless.returncode != 0


def test_a_failing_journalctl_fails_the_command(tmp_path: Path) -> None:
    argv = shlex.split(doctor_command.journal_command("sglang", 5))
    failing = subprocess.run(argv, env=_fake_journalctl(tmp_path, "echo 'No journal files' >&2; exit 1"),
                             capture_output=True, text=True, timeout=30, check=False)
    assert failing.returncode == 1 and "No journal files" in failing.stderr


def test_the_last_quality_verdict_follows_the_journal_and_the_doctor_names_it(tmp_path: Path) -> None:
    """doctor -i's command prints the host's kept verdict line (quality.py) after the journal: its first line,
    bounded; a missing file or a link in its place prints nothing; a FAIL line is named with its fix."""
    verdict = tmp_path / "sglang.quality"
    failed = (LOGS / "quality-check-failed" / "batch-race.log").read_text().splitlines()[-1]
    verdict.write_text(failed + "\nsecond line\n")
    env = _fake_journalctl(tmp_path, "echo 'INFO the journal'")
    argv = shlex.split(doctor_command.journal_command("sglang", 5, str(verdict)))
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0 and done.stdout == f"INFO the journal\n{failed}\n"
    assert [f.id for f in doctor.diagnose(done.stdout.splitlines())] == ["quality-check-failed"]
    verdict.unlink()
    verdict.symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").write_text(failed + "\n")
    linked = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)
    assert linked.returncode == 0 and linked.stdout == "INFO the journal\n"
    verdict.unlink()
    missing = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)
    assert missing.returncode == 0 and missing.stdout == "INFO the journal\n"


def test_the_journal_command_quotes_the_unit() -> None:
    """ansible.builtin.command splits its free-form line like shlex: bash gets the script whole."""
    bash, flag, script = shlex.split(doctor_command.journal_command("sglang@a\\x2db", 5))
    assert (bash, flag) == ("bash", "-c")
    assert shlex.split(script.split("|")[0])[3:9] == [
        "journalctl", "-u", "sglang@a\\x2db", "-u", "sglang@a\\x2db-watchdog", "--no-pager"]  # fmt: skip


@pytest.mark.parametrize(
    ("event", "stdout", "why"),
    [("runner_on_failed", "x" * 1002, "more than the 1,000 this reads. Fix: lower --lines"),
     ("runner_on_ok", "x" * 1001, "more than the 1,000"),
     ("runner_on_ok", "INFO a\0b\n", "NUL bytes"),
     ("runner_on_failed", "", "non-zero return code")],
)  # fmt: skip
def test_a_journal_over_the_cap_or_not_text_is_refused(event: str, stdout: str, why: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_ansible(monkeypatch, {"event": event, "event_data": {"host": "here", "res": {"stdout": stdout, "msg": "non-zero return code"}}})
    monkeypatch.setattr(doctor_command, "LOG_MAX_BYTES", 1000)
    with pytest.raises(doctor_command.JournalError, match=f"here: .*{re.escape(why)}"):
        doctor_command.journal_via_ansible("inv.yml", "sglang_servers", "sglang", 5)


def test_a_journal_within_the_cap_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_ansible(monkeypatch, {"event": "runner_on_ok", "event_data": {"host": "here", "res": {"stdout": "x" * 1000}}})
    monkeypatch.setattr(doctor_command, "LOG_MAX_BYTES", 1000)
    assert doctor_command.journal_via_ansible("inv.yml", "sglang_servers", "sglang", 5) == {"here": "x" * 1000}


def _fake_ansible(monkeypatch: pytest.MonkeyPatch, event: dict[str, Any]) -> None:
    """ansible_runner.run delivers ``event`` for host ``here``; nothing runs."""

    def run(**kwargs: Any) -> types.SimpleNamespace:
        kwargs["event_handler"](event)
        return types.SimpleNamespace(status="successful", rc=0)

    monkeypatch.setitem(sys.modules, "ansible_runner", types.SimpleNamespace(run=run))
    monkeypatch.setattr(runner, "serving_hosts", lambda inventories, pattern: ["here"])
    monkeypatch.setattr(runner, "runner_kwargs", lambda artifacts, event_handler: {"event_handler": event_handler})


def test_plan_file_is_read_bounded(tmp_path: Path) -> None:
    with pytest.raises(doctor.PlanFileError, match="--plan /dev/zero: not a regular file"):
        doctor.load_plan("/dev/zero")
    with (tmp_path / "plan.json").open("wb") as handle:
        handle.truncate(inputfiles.JSON_MAX_BYTES + 1)
    with pytest.raises(doctor.PlanFileError, match="more than the 16,777,216 this reads"):
        doctor.load_plan(tmp_path / "plan.json")
    (tmp_path / "plan.json").write_text('{"recommended_mem_fraction_static": 0.9}')
    assert doctor.load_plan(tmp_path / "plan.json") == {"recommended_mem_fraction_static": 0.9}


def test_cli_stdin_is_bounded_and_text() -> None:
    zero = subprocess.run(
        [sys.executable, "-m", "sglang_deploy.cli", "doctor", "-"], stdin=open("/dev/zero", "rb"),  # noqa: SIM115
        capture_output=True, text=True, timeout=180, cwd=ROOT, check=False,
    )  # fmt: skip
    assert zero.returncode == 2 and zero.stderr.strip() == "doctor: stdin: more than the 67,108,864 bytes this reads"
    binary = run_cli("-", stdin="INFO ok\n\0\n")
    assert binary.returncode == 2 and "binary" in binary.stderr


def test_nan_with_the_cutlass_fp4_gemm_names_that_cause_and_its_fix_alone() -> None:
    for path in sorted((LOGS / "nan-output-fp4-gemm").glob("*.log")):
        findings = doctor.diagnose(path.read_text().splitlines())
        assert [f.id for f in findings] == ["nan-output-fp4-gemm"], path
        assert "--fp4-gemm-backend flashinfer_cudnn" in findings[0].fix and "#2708" in findings[0].summary
    # The same NaN without that backend in the log is the attention/NSA rule's.
    assert ids(LOGS / "nan-output" / "sampler-nan-logits.log") == ["nan-output"]
