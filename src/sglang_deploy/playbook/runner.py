"""Run the project's playbooks through ansible-runner, with live per-host progress and a recap.

``sglang-deploy up`` is ``ansible-playbook site.yml`` plus this view: per host the task it is on and
its ok/changed/failed counts, failure messages as they happen, a recap at the end (Ansible's own
counts, and the testinfra results when the run verified hosts), the exit status non-zero on any
failure, and the run's artifacts kept under ``artifacts/runs/<UTC time>-<command>-<id>/`` for later reading.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from sglang_deploy import ownpath
from sglang_deploy.observe import testreport
# Lines of the validator's progress in Ansible's output start with it.
from sglang_deploy.launch.validator_venv import PROGRESS_PREFIX

# Events that close a task on one host, and the counter each one bumps.
_RESULT_EVENTS = {
    "runner_on_ok": "ok",
    "runner_on_failed": "failed",
    "runner_on_unreachable": "unreachable",
    "runner_on_skipped": "skipped",
}


# Actions whose message the view prints: the roles' words to the operator.
_DEBUG_ACTIONS = frozenset(("debug", "ansible.builtin.debug"))
# Seconds between two "still running" lines of one async task.
ASYNC_SAY_S = 30.0

# HostProgress field <- the key of Ansible's playbook_on_stats event.
_STATS_COUNTERS = {
    "ok": "ok", "changed": "changed", "failed": "failures", "unreachable": "dark", "skipped": "skipped",
}  # fmt: skip


# The inventory group of the GPU hosts every playbook serves.
SERVING_GROUP = "sglang_servers"
# Runs whose artifacts are kept under artifacts/runs/ (ansible-runner deletes older ones).
KEEP_ARTIFACTS = 20
RUNS_SUBDIR = "runs"
# Environment variables whose values are secrets: redacted from the artifacts ansible-runner writes.
_SECRET_ENV_NAME = re.compile(r"(?i)(api_?key|token|secret|passw(or)?d|credential)")
_REDACTED = "********"
# Bound on `ansible --list-hosts`: it only reads the inventory.
_LIST_HOSTS_TIMEOUT_S = 120
# Seconds an interrupted run has to stop after the CLI passed the signal on; then its processes are killed.
INTERRUPT_GRACE_S = 30.0


class RunnerError(RuntimeError):
    """Ansible cannot run as asked: an inventory that does not parse or has no serving hosts, or
    an Ansible that does not start. The CLI reports the message on one line and exits 2."""


class InventoryError(RunnerError):
    """The inventory is missing, broken, or selects no serving host."""


class AnsibleStartError(RunnerError):
    """Ansible itself could not be started (not installed beside this interpreter, not on PATH)."""


class Interrupted(BaseException):
    """SIGINT or SIGTERM reached the CLI (see stop_on_signals), raised once the Ansible run it interrupted,
    if any, is gone. A BaseException, as KeyboardInterrupt: a command's ``except Exception`` must not
    carry on after it."""

    def __init__(self, signum: int, where: str = "", artifacts: str = "", killed: str = "") -> None:
        super().__init__(signum)
        self.signum, self.where, self.artifacts, self.killed = signum, where, artifacts, killed

    @property
    def exit_status(self) -> int:
        """128 + the signal, as a shell reports a command the signal killed (130 SIGINT, 143 SIGTERM)."""
        return 128 + self.signum

    def line(self) -> str:
        """What was interrupted, on one line (the CLI puts ``sglang-deploy COMMAND:`` before it)."""
        name = signal.Signals(self.signum).name
        if not self.artifacts:
            return f"interrupted by {name}; no Ansible run was in flight"
        at = f" at {self.where}" if self.where else ""
        how = f"killed {self.killed}" if self.killed else "stopped"
        kept = f"artifacts: {self.artifacts}" if Path(self.artifacts).is_dir() else "no artifacts kept"
        return (
            f"interrupted by {name}{at}: its ansible-playbook was {how}, the hosts may be half-changed; "
            f"{kept}. Fix: run the command again to finish"
        )


def _run_groups() -> set[int]:
    """The process groups of this process's descendants but its own: ansible-runner runs
    ansible-playbook in a pty of its own session and every Ansible worker calls setsid, so no signal
    to the CLI's group reaches them, and a kill of ansible-playbook's group alone leaves the workers
    and their tasks running. Empty without /proc."""
    table: dict[int, tuple[int, int]] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(entry.path, "stat").read_bytes()
                # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
                _, ppid, pgrp = stat[stat.rindex(b")") + 2 :].split()[:3]
                table[int(entry.name)] = (int(ppid), int(pgrp))
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    own, groups, todo = os.getpgrp(), set(), [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), ()):
            todo.append(child)
            if table[child][1] != own:
                groups.add(table[child][1])
    return groups


@dataclass
class _RunStop:
    """What a SIGINT/SIGTERM of the CLI does to the ansible-runner run in flight (stop_on_signals)."""

    armed: bool = False
    running: bool = False
    signum: int | None = None
    since: float = 0.0
    groups: set[int] = field(default_factory=set)
    killed: str = ""  # why the run was killed instead of stopping by itself
    where: str = ""
    artifacts: str = ""

    def send(self, signum: int, groups: set[int] | None = None) -> None:
        """``signum`` to ``groups`` (default: every group of the run seen so far and now)."""
        if groups is None:
            self.groups |= _run_groups()
            groups = self.groups
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signum)

    def signalled(self, signum: int) -> None:
        """The handler: pass the first signal on to the run (Ansible stops its workers and says so),
        kill it at a second one; outside a run, stop the command at once."""
        if self.running and self.signum is not None:
            self.killed = "at a second signal"
            self.send(signal.SIGKILL)
            return
        if self.signum is None:
            self.signum, self.since = signum, time.monotonic()
        if not self.running:
            raise self.interrupted()
        self.send(signum)

    def cancel(self) -> bool:
        """ansible-runner's cancel_callback, asked between reads of the run's output (at least every 5 s):
        the signal for groups started since it came, and after INTERRUPT_GRACE_S the kill of them all
        (True: ansible-runner then stops waiting for ansible-playbook)."""
        if self.signum is None:
            return False
        if time.monotonic() - self.since < INTERRUPT_GRACE_S:
            fresh = _run_groups() - self.groups
            self.groups |= fresh
            self.send(self.signum, fresh)
            return False
        self.killed = f"after {INTERRUPT_GRACE_S:.0f} s"
        self.send(signal.SIGKILL)
        return True

    def finished(self, _runner: Any) -> None:
        """ansible-runner's finished_callback: an interrupted run's leftovers (a task that ignored the
        signal, in a group whose worker is gone) are killed, then the command stops."""
        self.running = False
        if self.signum is None:
            self.where = self.artifacts = ""  # a signal after it interrupts no run
            return
        self.send(signal.SIGKILL)
        raise self.interrupted()

    def saw(self, event: Mapping[str, Any]) -> None:
        data = event.get("event_data") or {}
        if event.get("event") == "runner_on_start" and data.get("host"):
            self.where = f"[{data['host']}] {data.get('task', '?')}"

    def interrupted(self) -> Interrupted:
        assert self.signum is not None
        return Interrupted(self.signum, self.where, self.artifacts, self.killed)


_stop = _RunStop()


def _on_signal(signum: int, _frame: Any) -> None:
    _stop.signalled(signum)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """While the block (a CLI command) runs, SIGINT and SIGTERM stop it with Interrupted: an Ansible
    run in flight gets the signal (every process group of it), INTERRUPT_GRACE_S to stop, then SIGKILL,
    and is gone before Interrupted is raised. Without this, ansible-runner's own handlers would kill
    ansible-playbook alone and leave its workers and their tasks running."""
    global _stop
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers belong to the main thread; a caller elsewhere keeps ansible-runner's
        return
    _stop = _RunStop(armed=True)
    previous = {signum: signal.signal(signum, _on_signal) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _stop = _RunStop()


# Where a wheel carries the project's Ansible content (setup.py's build_py): beside the package.
INSTALLED_PROJECT = Path(__file__).resolve().parents[1] / "_project"


def project_dir() -> Path:
    """The tree holding site.yml: $SGLANG_DEPLOY_PROJECT, else the checkout this package sits in (or the
    current directory's), else the copy a pip-installed wheel carries (INSTALLED_PROJECT)."""
    override = os.environ.get("SGLANG_DEPLOY_PROJECT")
    candidates = [Path(override)] if override else []
    candidates += [Path(__file__).resolve().parents[3], Path.cwd(), INSTALLED_PROJECT]
    for candidate in candidates:
        if (candidate / "site.yml").is_file() and (candidate / "roles").is_dir():
            return candidate
    raise SystemExit(
        "cannot find the sglang-deploy project (site.yml, roles/). Fix: run from the checkout or set "
        "SGLANG_DEPLOY_PROJECT to it."
    )


def state_dir() -> Path:
    """Where runs leave what they write (``artifacts/``, the fact cache): the checkout's own tree; for a
    pip-installed CLI (the project inside the package) $SGLANG_DEPLOY_STATE, else $XDG_STATE_HOME/sglang-deploy
    (~/.local/state/sglang-deploy), never the installed package."""
    project = project_dir()
    if project != INSTALLED_PROJECT:
        return project
    override = os.environ.get("SGLANG_DEPLOY_STATE")
    if override:
        return Path(override)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "sglang-deploy"


@dataclass
class HostProgress:
    task: str = ""
    # As in Ansible's recap: ok counts every task that did not fail, changed ones included.
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
    # When each (host, task) still running async was first seen polling, and when it was last said.
    _async_since: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)

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
        elif kind == "verbose":
            # Progress of work inside a task (the validator's first build) that says it is ours.
            text = str(event.get("stdout") or "").strip()
            if text.startswith(PROGRESS_PREFIX):
                self._say(text)
        elif kind == "runner_on_async_poll" and host:
            # The poll's own event names Ansible's internal async_status; the task is the one started.
            self._async_poll(host, self._host(host).task or str(data.get("task", "")))
        elif kind in _RESULT_EVENTS and host:
            progress = self._host(host)
            counter = _RESULT_EVENTS[kind]
            setattr(progress, counter, getattr(progress, counter) + 1)
            if kind == "runner_on_ok" and (data.get("res") or {}).get("changed"):
                progress.changed += 1
            if kind in ("runner_on_failed", "runner_on_unreachable") and not data.get("ignore_errors"):
                self._report_failure(host, data)
            if kind == "runner_on_ok" and data.get("task_action") in _DEBUG_ACTIONS:
                self._report_message(host, data)
        elif kind == "playbook_on_stats":
            self._take_stats(data)
        return True  # keep the event in the artifacts

    def _take_stats(self, stats: Mapping[str, Any]) -> None:
        """Ansible's own recap replaces the counts taken from events: a ``no_log`` task's event
        hides whether it changed something, the recap does not."""
        for ours, theirs in _STATS_COUNTERS.items():
            for host, count in (stats.get(theirs) or {}).items():
                setattr(self._host(host), ours, int(count))

    def recap_lines(self) -> list[str]:
        """The recap as Ansible prints it, one line per host: for logs, which must not wrap."""
        return [
            f"{name} : ok={p.ok} changed={p.changed} unreachable={p.unreachable} failed={p.failed} "
            f"skipped={p.skipped}"
            for name, p in sorted(self.hosts.items())
        ]

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

    def _say(self, line: str) -> None:
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def _report_message(self, host: str, data: Mapping[str, Any]) -> None:
        """What the roles say to the operator (debug tasks: progress, what a dry run would do,
        what was skipped and why); a loop's messages are in its items, not shown."""
        message = (data.get("res") or {}).get("msg")
        lines = [str(part) for part in message] if isinstance(message, list) else [str(message or "")]
        if any(lines):
            self._say(f"[{host}] " + "\n    ".join(lines))

    def _async_poll(self, host: str, task: str) -> None:
        """A long async task (the ml-env install): "still running" at most every ASYNC_SAY_S."""
        now = time.monotonic()
        since, said = self._async_since.setdefault((host, task), (now, now))
        if now - said >= ASYNC_SAY_S:
            self._async_since[(host, task)] = (since, now)
            self._say(f"[{host}] {task}: still running ({now - since:.0f} s)")

    def _report_failure(self, host: str, data: Mapping[str, Any]) -> None:
        result = data.get("res") or {}
        message = result.get("msg") or result.get("stderr") or result.get("module_stderr") or result
        line = f"[{host}] {data.get('task', '?')}: {message}"
        self.failures.append(line)
        # escape(): "[host]" would otherwise be read as Rich markup and vanish from the line.
        self.console.print(f"[bold red]FAILED[/] {escape(line)}", markup=True, highlight=False, soft_wrap=True)


def ansible_executable(name: str) -> str:
    """``ansible-playbook`` & co. of the project's venv (beside this interpreter, so a bare
    ``.venv/bin/sglang-deploy`` works without an activated venv), else from PATH."""
    beside = Path(sys.executable).with_name(name)
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise AnsibleStartError(
            f"cannot start Ansible: {name} is neither beside {sys.executable} nor on PATH. "
            "Fix: run scripts/setup and use .venv/bin/sglang-deploy"
        )
    return found


def ansible_env() -> dict[str, str]:
    """Environment for every Ansible process the CLI starts: the project's ansible.cfg, the venv
    first on PATH (Ansible starts helpers by name), and SSH host-key checking ON unless the
    operator's own environment turns it off (ansible-runner would default it to off)."""
    project = project_dir()
    # ansible.cfg's fact cache is relative to the tree; an installed CLI keeps it in its state directory.
    cache = (
        {"ANSIBLE_CACHE_PLUGIN_CONNECTION": str(state_dir() / ".cache" / "facts")}
        if project == INSTALLED_PROJECT and "ANSIBLE_CACHE_PLUGIN_CONNECTION" not in os.environ
        else {}
    )
    return {
        **cache,
        "ANSIBLE_CONFIG": str(project / "ansible.cfg"),
        # ansible-runner runs Ansible in a pty, where Ansible colours its output; the artifacts are
        # for reading later, without escape codes.
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_HOST_KEY_CHECKING": os.environ.get("ANSIBLE_HOST_KEY_CHECKING", "True"),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }


def serving_hosts(
    inventories: Sequence[str], limit: str | None = None, pattern: str = SERVING_GROUP
) -> list[str]:
    """The hosts of ``pattern`` (after ``limit``) in ``inventories``, as Ansible parses them.

    Raises InventoryError with Ansible's parse error for a missing or broken inventory, and with
    "no serving hosts" when nothing matches: a run that provisions nothing must not pass.
    """
    missing = [inventory for inventory in inventories if not Path(inventory).exists()]
    if missing:
        raise InventoryError(
            f"inventory {', '.join(missing)} does not exist. Fix: pass -i with an inventory "
            "directory or file (the project's: inventory/proxmox)"
        )
    command = [ansible_executable("ansible"), pattern, "--list-hosts"]
    for inventory in inventories:
        command += ["-i", str(Path(inventory).resolve())]
    if limit:
        command += ["--limit", limit]
    env = {**os.environ, **ansible_env()}
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=_LIST_HOSTS_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise AnsibleStartError(f"cannot start Ansible ({command[0]}): {err}") from None
    where = ", ".join(inventories)
    no_match = "leaves us with no hosts" in done.stderr  # ansible's own exit 1 for a --limit
    if done.returncode != 0 and not no_match:
        raise InventoryError(
            f"inventory {where} does not parse: {_parse_error(done.stderr) or done.stdout.strip()}. "
            "Fix: correct the file (ansible-inventory -i INV --list shows what Ansible sees)"
        )
    hosts = [] if no_match else [line.strip() for line in done.stdout.splitlines()[1:] if line.strip()]
    if not hosts:
        selection = f"{pattern}" + (f" limited to {limit!r}" if limit else "")
        raise InventoryError(
            f"no serving hosts in {where}: {selection} matches no host. Fix: list the GPU hosts under "
            f"the group {SERVING_GROUP} (see inventory/proxmox/hosts.yml)"
            + (" or correct --limit" if limit else "")
        )
    return hosts


def _parse_error(stderr: str) -> str:
    """The parser's own complaint (the YAML plugin's when there is one) and where, on one line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    failures = [i for i, line in enumerate(lines) if "Failed to parse" in line and "plugin:" in line]
    preferred = [i for i in failures if "'yaml' plugin" in lines[i] or "'auto' plugin" in lines[i]] or failures
    if not preferred:
        return " ".join(line for line in lines if "ERROR" in line)
    explained = []
    for first in preferred:
        origin = next((line for line in lines[first + 1 : first + 12] if line.startswith("Origin:")), "")
        reason = lines[first].removeprefix("[WARNING]:").strip()
        explained.append(f"{reason} ({origin})" if origin else reason)
    # An origin with a line number (file:LINE:COL) points at the mistake; prefer it.
    return next((text for text in explained if re.search(r":\d+:\d+\)$", text)), explained[0])


def redact_secret_env(artifact_dir: Path) -> None:
    """ansible-runner writes the whole environment of the run into ``<artifacts>/command``; the
    values of secret-looking variables (API keys, tokens, passwords) are replaced there."""
    command_file = artifact_dir / "command"
    try:
        data = json.loads(command_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    env = data.get("env") or {}
    if not any(_SECRET_ENV_NAME.search(name) and value for name, value in env.items()):
        return
    data["env"] = {
        name: _REDACTED if _SECRET_ENV_NAME.search(name) and value else value
        for name, value in env.items()
    }
    command_file.write_text(json.dumps(data), encoding="utf-8")
    command_file.chmod(0o600)


def _private_dir(path: Path, what: str = "the artifacts directory") -> Path:
    """A directory only its owner can read (runs hold inventory data and journals), made by this command or the
    invoking user's own, reached through no link another user planted (ownpath); UnsafeDirectoryError otherwise."""
    return ownpath.private_directory(path, what)


def fact_cache_dir() -> Path:
    """Where runs keep Ansible's facts between them: $ANSIBLE_CACHE_PLUGIN_CONNECTION, else the state directory's
    .cache/facts (ansible.cfg's ./.cache/facts in a checkout). ansible-runner would give each run a cache of its own,
    so that a run with --limit could not find what an earlier run resolved."""
    configured = os.environ.get("ANSIBLE_CACHE_PLUGIN_CONNECTION")
    return _private_dir(Path(configured) if configured else state_dir() / ".cache" / "facts", "the fact cache")


def rotate_runs(artifacts: Path, keep: int) -> None:
    """Leave room for one more run under ``artifacts/runs``: the oldest run directories beyond ``keep - 1``
    go. ansible-runner's own rotation is off: two CLI runs at once (render beside validate) would both
    delete the same oldest entry and one would crash on the file the other removed first; here the
    removal is under a lock beside the runs and a vanished entry is already gone, not an error."""
    runs = artifacts / RUNS_SUBDIR
    with os.fdopen(ownpath.open_append(artifacts / ".runs.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        entries = []
        for entry in runs.iterdir():
            with contextlib.suppress(FileNotFoundError):
                if entry.is_dir() and not entry.is_symlink():
                    entries.append((entry.stat().st_mtime, entry.name, entry))
        for *_, old in sorted(entries)[: max(len(entries) - max(keep - 1, 0), 0)]:
            shutil.rmtree(old, ignore_errors=True)


def run_ident(title: str) -> str:
    """The name of a run's artifacts directory: when it started (UTC) and what it was, so the
    newest is last in ``ls`` and a person finds "the failed up of this morning" by name."""
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-") or "run"
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{slug}-{uuid.uuid4().hex[:6]}"


def runner_kwargs(
    artifacts: Path,
    *,
    event_handler: Callable[[Mapping[str, Any]], bool],
    status_handler: Callable[..., None] | None = None,
    keep_artifacts: int = KEEP_ARTIFACTS,
    ident: str | None = None,
) -> dict[str, Any]:
    """What every ansible_runner.run() of the CLI shares: the project's environment, private and
    rotated artifacts (``artifacts/runs/<ident>/``), no env/ files, the secret environment
    redacted as soon as it is on disk, and under stop_on_signals the run stopped by SIGINT/SIGTERM.
    Runs get a directory of their own because ansible-runner's rotation deletes the oldest entries
    of it, whatever they are (artifacts/bench/ must survive)."""

    stop = _stop

    def on_status(data: Mapping[str, Any], runner_config: Any = None) -> None:
        if data.get("status") != "starting" and runner_config is not None:
            redact_secret_env(Path(runner_config.artifact_dir))
        elif runner_config is not None and stop.armed:
            stop.running, stop.where, stop.artifacts = True, "", str(runner_config.artifact_dir)
        if status_handler is not None:
            status_handler(data, runner_config=runner_config)

    def on_event(event: Mapping[str, Any]) -> bool:
        stop.saw(event)
        return event_handler(event)

    artifacts = _private_dir(artifacts)
    runs = _private_dir(artifacts / RUNS_SUBDIR)
    if keep_artifacts > 0:
        rotate_runs(artifacts, keep_artifacts)
    kwargs: dict[str, Any] = {
        "private_data_dir": str(artifacts),
        "artifact_dir": str(runs),
        "ident": ident,
        "envvars": ansible_env(),
        "quiet": True,
        "event_handler": on_event,
        "status_handler": on_status,
        "rotate_artifacts": 0,  # rotate_runs did it, under a lock
        "suppress_env_files": True,
        # Absolute: ansible-runner joins it to the run's own folder, which an absolute path replaces.
        "fact_cache": str(fact_cache_dir()),
        "fact_cache_type": "jsonfile",
    }
    if stop.armed:
        # The CLI's handlers stop the run (stop_on_signals); a cancel_callback also keeps ansible-runner
        # from installing its own, which kill ansible-playbook's group only.
        kwargs.update(cancel_callback=stop.cancel, finished_callback=stop.finished)
    return kwargs


@dataclass(frozen=True)
class PlaybookRun:
    rc: int
    status: str
    artifacts: Path
    failures: tuple[str, ...]
    # The testinfra results of the hosts the run verified (playbooks/verify.yml), one per host.
    tests: tuple[testreport.SuiteResult, ...] = ()


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
    keep_artifacts: int = KEEP_ARTIFACTS,
    check: bool = False,
    tags: str | None = None,
    skip_tags: str | None = None,
) -> PlaybookRun:
    """Run ``playbook`` (relative to the project) and return its outcome.

    Raises RunnerError before anything runs when the inventory is broken or selects no serving
    host, or Ansible cannot start; a failing play is returned (rc != 0), not raised.
    """
    import ansible_runner  # heavy import, only when a playbook actually runs

    serving_hosts(inventory, limit)
    ansible_executable("ansible-playbook")  # ansible-runner starts it by name from ansible_env()'s PATH
    console = console or Console(stderr=True)
    project = project_dir()
    artifacts = (artifacts_dir or state_dir() / "artifacts").resolve()
    view = ProgressView(console, plain=live and not console.is_terminal)
    screen = Live(view.table(title), console=console, refresh_per_second=4) if live and console.is_terminal else None

    def on_event(event: Mapping[str, Any]) -> bool:
        keep = view.handle(event)
        if screen is not None:
            screen.update(view.table(title))
        return keep

    def on_status(*_: Any, **__: Any) -> None:
        if screen is not None:
            screen.update(view.table(title))

    ident = run_ident(title)
    reports = artifacts / RUNS_SUBDIR / ident / testreport.REPORT_SUBDIR
    kwargs = runner_kwargs(
        artifacts, event_handler=on_event, status_handler=on_status, keep_artifacts=keep_artifacts, ident=ident
    )
    kwargs.update(
        project_dir=str(project),
        playbook=str(project / playbook),
        inventory=[str(Path(i).resolve()) for i in inventory],
        # Playbooks that run the testinfra suites write their JUnit reports there (others ignore it).
        extravars={testreport.REPORT_DIR_VAR: str(reports), **dict(extravars or {})},
        limit=limit,
        tags=tags,
        skip_tags=skip_tags,
    )
    if check:
        kwargs["cmdline"] = "--check --diff"
    if screen is not None:
        with screen:
            result = ansible_runner.run(**kwargs)
    else:
        result = ansible_runner.run(**kwargs)
    artifact_dir = Path(result.config.artifact_dir)
    redact_secret_env(artifact_dir)
    tests = testreport.read_reports(reports)
    if live:
        if console.is_terminal:
            console.print(view.table(f"{title}: recap ({result.status})"))
        else:
            console.print(f"RECAP {title} ({result.status})", markup=False, highlight=False, soft_wrap=True)
            for line in view.recap_lines():
                console.print(line, markup=False, highlight=False, soft_wrap=True)
    for suite in tests:
        style = "green" if suite.ok else "red"
        console.print(f"[{style}]testinfra[/] {escape(suite.line())}", highlight=False, soft_wrap=True)
    rc = result.rc if result.rc is not None else 1
    if rc != 0 and not view.failures:
        # Errors before any task ran (syntax, inventory, argument specs) only reach stdout.
        tail = "".join(result.stdout.readlines()[-40:]) if result.stdout else ""
        console.print(tail, markup=False, highlight=False)
    return PlaybookRun(
        rc=rc,
        status=str(result.status),
        artifacts=artifact_dir,
        failures=tuple(view.failures),
        tests=tuple(tests),
    )
