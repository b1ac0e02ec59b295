"""ProgressView: what `sglang-deploy up` prints from ansible-runner's events."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import time

import pytest
from rich.console import Console

from sglang_deploy.playbook import runner
from sglang_deploy.playbook.runner import ProgressView


def _view(plain: bool) -> tuple[ProgressView, io.StringIO]:
    out = io.StringIO()
    return ProgressView(Console(file=out, width=200, no_color=True), plain=plain), out


EVENTS = [
    {"event": "playbook_on_play_start", "event_data": {"play": "Bare OS to serving sglang endpoint"}},
    {"event": "playbook_on_task_start", "event_data": {"task": "Install the lock", "role": "ml_env"}},
    {"event": "runner_on_start", "event_data": {"host": "gpu-01", "task": "Install the lock"}},
    {"event": "runner_on_ok", "event_data": {"host": "gpu-01", "res": {"changed": True}}},
    {"event": "runner_on_failed", "event_data": {"host": "gpu-01", "task": "Check", "res": {"msg": "boom"}}},
]


def test_plain_mode_prints_a_line_per_play_and_task():
    view, out = _view(plain=True)
    for event in EVENTS:
        view.handle(event)
    lines = out.getvalue().splitlines()
    assert lines[0].endswith("PLAY [Bare OS to serving sglang endpoint]")
    assert lines[1].endswith("TASK [ml_env : Install the lock]")
    assert lines[2] == "FAILED [gpu-01] Check: boom"
    assert (view.hosts["gpu-01"].changed, view.hosts["gpu-01"].failed) == (1, 1)


def test_live_mode_prints_only_failures():
    view, out = _view(plain=False)
    for event in EVENTS:
        view.handle(event)
    assert out.getvalue().splitlines() == ["FAILED [gpu-01] Check: boom"]


def test_the_roles_messages_and_our_progress_lines_are_shown():
    view, out = _view(plain=True)
    view.handle({"event": "verbose", "stdout": "sglang-deploy: building the sglang 0.5.10 flag validator"})
    view.handle({"event": "verbose", "stdout": "some other line of Ansible's output"})
    debug = {"host": "gpu-01", "task_action": "ansible.builtin.debug", "res": {"msg": "weights: 3 GiB of 400 GiB"}}
    view.handle({"event": "runner_on_ok", "event_data": debug})
    listed = {"host": "gpu-01", "task_action": "debug", "res": {"msg": ["27 passed", "in 12 s"]}}
    view.handle({"event": "runner_on_ok", "event_data": listed})
    assert out.getvalue().splitlines() == [
        "sglang-deploy: building the sglang 0.5.10 flag validator",
        "[gpu-01] weights: 3 GiB of 400 GiB",
        "[gpu-01] 27 passed",
        "    in 12 s",
    ]


def test_a_long_async_task_says_it_is_still_running(monkeypatch):
    clock = iter([0.0, 10.0, 31.0, 40.0, 65.0])
    monkeypatch.setattr(runner.time, "monotonic", lambda: next(clock))
    view, out = _view(plain=False)
    view.handle({"event": "runner_on_start", "event_data": {"host": "gpu-01", "task": "Build the venv"}})
    # Ansible's poll events name its internal action, not the task that was started.
    for _ in range(5):
        view.handle({"event": "runner_on_async_poll", "event_data": {"host": "gpu-01", "task": "async_status"}})
    assert out.getvalue().splitlines() == [
        "[gpu-01] Build the venv: still running (31 s)",
        "[gpu-01] Build the venv: still running (65 s)",
    ]


# --- SIGINT/SIGTERM of the CLI (runner.stop_on_signals; the real runs: test_runner_safety.py) ------------


def _deaf_group() -> subprocess.Popen:
    """A process group of this test's that ignores SIGINT and SIGTERM, as a wedged Ansible run would."""
    return subprocess.Popen(["sh", "-c", "trap '' INT TERM; exec sleep 300"], start_new_session=True)


def test_outside_a_run_a_signal_stops_the_command_at_once():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(runner.Interrupted) as stop, runner.stop_on_signals():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises in here
    assert stop.value.exit_status == 143
    assert stop.value.line() == "interrupted by SIGTERM; no Ansible run was in flight"
    assert signal.getsignal(signal.SIGTERM) is before  # the command's handlers are gone with it


def test_a_run_that_ignores_the_signal_is_killed_after_the_grace():
    deaf = _deaf_group()
    try:
        time.sleep(0.3)  # its trap is set
        stop = runner._RunStop(armed=True, running=True, where="[gpu-01] Install", artifacts="/nonexistent")
        stop.signalled(signal.SIGINT)  # passed on; ignored
        assert deaf.pid in stop.groups
        assert not stop.cancel() and deaf.poll() is None
        stop.since -= runner.INTERRUPT_GRACE_S
        assert stop.cancel()  # the bound: killed, and ansible-runner told to stop waiting
        assert deaf.wait(timeout=10) == -signal.SIGKILL
        with pytest.raises(runner.Interrupted) as raised:
            stop.finished(None)
        assert raised.value.exit_status == 130
        assert raised.value.line() == (
            "interrupted by SIGINT at [gpu-01] Install: its ansible-playbook was killed after 30 s, the hosts may "
            "be half-changed; no artifacts kept. Fix: run the command again to finish"
        )
    finally:
        deaf.kill()
        deaf.wait()


def test_a_second_signal_kills_the_run_without_waiting():
    deaf = _deaf_group()
    try:
        time.sleep(0.3)
        stop = runner._RunStop(armed=True, running=True, artifacts="/nonexistent")
        stop.signalled(signal.SIGTERM)
        stop.signalled(signal.SIGTERM)
        assert deaf.wait(timeout=10) == -signal.SIGKILL
        assert stop.interrupted().line().startswith("interrupted by SIGTERM: its ansible-playbook was killed at a second signal")
    finally:
        deaf.kill()
        deaf.wait()


def test_without_the_clis_handlers_ansible_runner_keeps_its_own(tmp_path):
    kwargs = runner.runner_kwargs(tmp_path, event_handler=lambda event: True)
    assert "cancel_callback" not in kwargs and "finished_callback" not in kwargs
    with runner.stop_on_signals():
        kwargs = runner.runner_kwargs(tmp_path, event_handler=lambda event: True)
        assert kwargs["cancel_callback"]() is False  # no signal yet
