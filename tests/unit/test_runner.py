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
