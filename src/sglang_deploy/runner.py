"""Run the project's playbooks through ansible-runner, with live per-host progress and a recap.

``sglang-deploy up`` is ``ansible-playbook site.yml`` plus this view: per host the task it is on and
its ok/changed/failed counts, failure messages as they happen, a recap table at the end, the exit
status non-zero on any failure, and the run's artifacts kept (``--artifacts``) for later reading.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

# Events that close a task on one host, and the counter each one bumps.
_RESULT_EVENTS = {
    "runner_on_ok": "ok",
    "runner_on_failed": "failed",
    "runner_on_unreachable": "unreachable",
    "runner_on_skipped": "skipped",
}


def project_dir() -> Path:
    """The checkout holding site.yml: $SGLANG_DEPLOY_PROJECT, else the one this package sits in."""
    override = os.environ.get("SGLANG_DEPLOY_PROJECT")
    candidates = [Path(override)] if override else []
    candidates += [Path(__file__).resolve().parents[2], Path.cwd()]
    for candidate in candidates:
        if (candidate / "site.yml").is_file() and (candidate / "roles").is_dir():
            return candidate
    raise SystemExit(
        "cannot find the sglang-deploy project (site.yml, roles/). Fix: run from the checkout or set "
        "SGLANG_DEPLOY_PROJECT to it."
    )


@dataclass
class HostProgress:
    task: str = ""
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0


@dataclass
class ProgressView:
    """Turns ansible-runner events into a live table; failures are printed as they happen."""

    console: Console
    hosts: dict[str, HostProgress] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    # Not on a terminal (CI, a pipe, a log file): one timestamped line per play and task instead of
    # the live table, so an hours-long run still shows where it is.
    plain: bool = False

    def handle(self, event: Mapping[str, Any]) -> bool:
        data = event.get("event_data") or {}
        host = data.get("host") or data.get("remote_addr")
        kind = event.get("event", "")
        if self.plain and kind in ("playbook_on_play_start", "playbook_on_task_start"):
            what = "PLAY" if kind == "playbook_on_play_start" else "TASK"
            name = data.get("play" if what == "PLAY" else "task", "")
            role = data.get("role")
            label = f"{role} : {name}" if what == "TASK" and role else name
            self.console.print(
                f"{time.strftime('%H:%M:%S')} {what} [{label}]", markup=False, highlight=False, soft_wrap=True
            )
        if kind == "runner_on_start" and host:
            self._host(host).task = str(data.get("task", ""))
        elif kind in _RESULT_EVENTS and host:
            progress = self._host(host)
            if kind == "runner_on_ok" and (data.get("res") or {}).get("changed"):
                progress.changed += 1
            else:
                counter = _RESULT_EVENTS[kind]
                setattr(progress, counter, getattr(progress, counter) + 1)
            if kind in ("runner_on_failed", "runner_on_unreachable") and not data.get("ignore_errors"):
                self._report_failure(host, data)
        return True  # keep the event in the artifacts

    def table(self, title: str) -> Table:
        table = Table(title=title)
        for column in ("host", "ok", "changed", "failed", "unreachable", "skipped", "task"):
            table.add_column(column, justify="left" if column in ("host", "task") else "right")
        for name, p in sorted(self.hosts.items()):
            style = "red" if p.failed or p.unreachable else ("yellow" if p.changed else "green")
            table.add_row(
                name, str(p.ok), str(p.changed), str(p.failed), str(p.unreachable), str(p.skipped),
                p.task, style=style,
            )
        return table

    def _host(self, name: str) -> HostProgress:
        return self.hosts.setdefault(name, HostProgress())

    def _report_failure(self, host: str, data: Mapping[str, Any]) -> None:
        result = data.get("res") or {}
        message = result.get("msg") or result.get("stderr") or result.get("module_stderr") or result
        line = f"[{host}] {data.get('task', '?')}: {message}"
        self.failures.append(line)
        # escape(): "[host]" would otherwise be read as Rich markup and vanish from the line.
        self.console.print(f"[bold red]FAILED[/] {escape(line)}", markup=True, highlight=False, soft_wrap=True)


@dataclass(frozen=True)
class PlaybookRun:
    rc: int
    status: str
    artifacts: Path
    failures: tuple[str, ...]


def run_playbook(
    playbook: str,
    inventory: Sequence[str],
    *,
    extravars: Mapping[str, Any] | None = None,
    limit: str | None = None,
    artifacts_dir: Path | None = None,
    title: str = "sglang-deploy",
    console: Console | None = None,
    live: bool = True,
) -> PlaybookRun:
    """Run ``playbook`` (relative to the project) and return its outcome; never raises on failure."""
    import ansible_runner  # heavy import, only when a playbook actually runs

    console = console or Console(stderr=True)
    project = project_dir()
    artifacts = (artifacts_dir or project / "artifacts").resolve()
    artifacts.mkdir(parents=True, exist_ok=True)
    # ansible-playbook must be the one installed beside this interpreter (the project's venv).
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    view = ProgressView(console)
    kwargs: dict[str, Any] = dict(
        private_data_dir=str(artifacts),
        project_dir=str(project),
        playbook=str(project / playbook),
        inventory=[str(Path(i).resolve()) for i in inventory],
        extravars=dict(extravars or {}),
        limit=limit,
        quiet=True,
        event_handler=view.handle,
        envvars={"ANSIBLE_CONFIG": str(project / "ansible.cfg"), "ANSIBLE_FORCE_COLOR": "0"},
    )
    if live and console.is_terminal:
        with Live(view.table(title), console=console, refresh_per_second=4) as screen:
            kwargs["status_handler"] = lambda *_, **__: screen.update(view.table(title))
            kwargs["event_handler"] = lambda e: (view.handle(e), screen.update(view.table(title)))[0]
            result = ansible_runner.run(**kwargs)
    else:
        view.plain = live
        result = ansible_runner.run(**kwargs)
    if live:
        console.print(view.table(f"{title}: recap ({result.status})"))
    rc = result.rc if result.rc is not None else 1
    if rc != 0 and not view.failures:
        # Errors before any task ran (syntax, inventory, argument specs) only reach stdout.
        tail = "".join(result.stdout.readlines()[-40:]) if result.stdout else ""
        console.print(tail, markup=False, highlight=False)
    return PlaybookRun(
        rc=rc,
        status=str(result.status),
        artifacts=Path(result.config.artifact_dir),
        failures=tuple(view.failures),
    )
