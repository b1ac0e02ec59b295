"""ProgressView: what `sglang-deploy up` prints from ansible-runner's events."""

from __future__ import annotations

import io

from rich.console import Console

from sglang_deploy.runner import ProgressView


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
    from sglang_deploy import runner

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
