"""``sglang-deploy doctor``: name known sglang failures in a server log and print their fixes.

Reads a log file, stdin (``-``), or the unit's journal on inventory hosts through Ansible
(``-i INV [--host H] [--unit sglang]``), with its watchdog's lines (the unit ``<unit>-watchdog``). Exit status 0 when nothing is found, 1 when something is,
2 when the log could not be read.
"""

from __future__ import annotations

import argparse
import json
import sys
import re
import shlex
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sglang_deploy import inputfiles
from sglang_deploy.observe import doctor
from sglang_deploy.commands.common import missing_role_defaults, role_defaults
from sglang_deploy_host.serving import quality
from sglang_deploy_host.watch import model as watch_model

DEFAULT_JOURNAL_LINES = 5000
# journalctl -n bounds the lines, not their length: what comes back is capped like a log file too.
MAX_JOURNAL_LINES = 100_000
LOG_MAX_BYTES = inputfiles.DEFAULT_MAX_BYTES
_UNIT_NAME = re.compile(r"[A-Za-z0-9:_.@\\-]+")
_STATE_DIR = re.compile(r"/[A-Za-z0-9._/-]*")
# The verdict line a host keeps (quality.py): one line, a few hundred bytes.
VERDICT_MAX_BYTES = 8192


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "doctor",
        help="name known failures in a server log (file, stdin or a host's journal) and the fix",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("log", nargs="?", help="log file, or - for stdin")
    p.add_argument("-i", "--inventory", help="read the unit's journal on this inventory's hosts")
    p.add_argument("--host", help="host or pattern (default: sglang_servers)")
    # The server role's unit name is the one default (roles/sglang_server/defaults/main.yml).
    defaults = role_defaults("sglang_server")
    unit = defaults.get("sglang_server_name")
    p.add_argument("--unit", default=unit, help=f"systemd unit (default: {unit})")
    state_dir = defaults.get("sglang_server_quality_state_dir")
    p.add_argument(
        "--quality-state-dir", default=state_dir,
        help=f"where the hosts keep the last quality check's verdict, <dir>/<unit>.quality (default: {state_dir})",
    )  # fmt: skip
    p.add_argument("--lines", type=int, default=DEFAULT_JOURNAL_LINES,
                   help=f"journal lines to read (1 to {MAX_JOURNAL_LINES:,}; default {DEFAULT_JOURNAL_LINES})")
    p.add_argument("--plan", help="`sglang-deploy plan --json` output, to fill planner values")
    p.add_argument("--json", action="store_true", help="print findings as a JSON list")
    p.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    # --unit is the journal's unit on the hosts of -i; a log file needs none.
    refused = (
        missing_role_defaults("doctor", "sglang_server", {"--unit": args.unit, "--quality-state-dir": args.quality_state_dir})
        if args.inventory else None
    )  # fmt: skip
    if refused is not None:
        return refused
    if args.log and args.inventory:
        print("doctor: give a log file (or -) or -i INVENTORY, not both", file=sys.stderr)
        return 2
    if not args.log and not args.inventory:
        print("doctor: nothing to read: give a log file, - for stdin, or -i INVENTORY (the unit's "
              "journal on its hosts)", file=sys.stderr)
        return 2
    if not _UNIT_NAME.fullmatch(args.unit):
        print(f"doctor: --unit {args.unit!r} is not a systemd unit name", file=sys.stderr)
        return 2
    if args.inventory and not _STATE_DIR.fullmatch(str(args.quality_state_dir)):
        print(f"doctor: --quality-state-dir {args.quality_state_dir!r} is not an absolute path of plain characters", file=sys.stderr)
        return 2
    if args.inventory and not 1 <= args.lines <= MAX_JOURNAL_LINES:
        print(f"doctor: --lines {args.lines}: want 1 to {MAX_JOURNAL_LINES:,} journal lines", file=sys.stderr)
        return 2
    plan: dict[str, Any] | None = None
    try:
        if args.plan:
            plan = doctor.load_plan(args.plan)
        if args.inventory:
            logs = journal_via_ansible(args.inventory, args.host or "sglang_servers", args.unit,
                                       args.lines, quality.verdict_path(args.quality_state_dir, args.unit))
        elif args.log == "-":
            logs = {"stdin": inputfiles.read_stream_text(sys.stdin.buffer, "stdin", LOG_MAX_BYTES)}
        else:
            logs = {args.log: inputfiles.read_text(args.log, "log", LOG_MAX_BYTES)}
    except (OSError, doctor.PlanFileError, JournalError, inputfiles.InputFileError) as err:
        print(f"doctor: {err}", file=sys.stderr)
        return 2
    results = {
        source: doctor.diagnose(text.splitlines(), plan=plan) for source, text in logs.items()
    }
    found = any(results.values())
    if args.json:
        if args.inventory:
            out: Any = {src: [f.to_dict() for f in fs] for src, fs in results.items()}
        else:
            out = [f.to_dict() for fs in results.values() for f in fs]
        print(json.dumps(out, indent=2))
    else:
        for source, findings in results.items():
            if args.inventory:
                print(f"== {source}")
            print(doctor.render_text(findings))
    return 1 if found else 0


class JournalError(RuntimeError):
    """The journal could not be read from a host."""


def journal_via_ansible(inventory: str, pattern: str, unit: str, lines: int, verdict_file: str = "") -> dict[str, str]:
    """``journalctl -u UNIT`` on each matching host through ansible-runner, then the last quality check's verdict
    line (``verdict_file``, when the host has one): host -> text.

    An inventory that does not parse or matches no host raises runner.InventoryError first.
    """
    import ansible_runner  # heavy import, only when a host is asked

    from sglang_deploy.playbook import runner

    hosts = runner.serving_hosts([inventory], pattern=pattern)
    outputs: dict[str, str] = {}
    failures: list[str] = []

    def on_event(event: Mapping[str, Any]) -> bool:
        data = event.get("event_data") or {}
        host = data.get("host")
        result = data.get("res") or {}
        kind = event.get("event")
        if kind in ("runner_on_ok", "runner_on_failed") and host:
            text = str(result.get("stdout", ""))
            # First: cut at the cap, journalctl loses its pipe and the command fails (pipefail).
            problem = _journal_problem(text)
            if problem:
                failures.append(f"{host}: {problem}")
            elif kind == "runner_on_ok":
                outputs[host] = text
            else:
                failures.append(f"{host}: {result.get('msg') or result.get('stderr') or result}")
        elif kind == "runner_on_unreachable" and host:
            failures.append(f"{host}: {result.get('msg') or result.get('stderr') or result}")
        return False  # no need to keep the events on disk

    with tempfile.TemporaryDirectory(prefix="sglang-doctor-") as private:
        run = ansible_runner.run(
            **runner.runner_kwargs(Path(private), event_handler=on_event),
            inventory=str(Path(inventory).resolve()),
            host_pattern=pattern,
            module="ansible.builtin.command",
            module_args=journal_command(unit, lines, verdict_file),
        )
    if failures:
        raise JournalError("could not read the journal: " + "; ".join(" ".join(f.split()) for f in failures))
    missing = sorted(set(hosts) - set(outputs))
    if missing:
        raise JournalError(
            f"Ansible ({run.status}, exit {run.rc}) returned no journal for {', '.join(missing)}"
        )
    return outputs


def journal_command(unit: str, lines: int, verdict_file: str = "") -> str:
    """The command that prints the journal's last ``lines`` of the unit and its watchdog on a host,
    cut there (``head -c``) just past LOG_MAX_BYTES, so that long lines cannot send more back (2 bytes
    past: Ansible strips one trailing newline, and a cut journal must still read as over the cap);
    pipefail keeps journalctl's own failure the command's. Then the first line of ``verdict_file`` (the
    last quality check's verdict, root's file) when it is a regular file, bounded too."""
    units = f"-u {shlex.quote(unit)} -u {shlex.quote(watch_model.unit_name(unit))}"
    script = (
        f"set -o pipefail; journalctl {units} --no-pager -o cat -n {int(lines)} "
        f"| head -c {LOG_MAX_BYTES + 2}"
    )
    if verdict_file:
        quoted = shlex.quote(verdict_file)
        script = f"{script} && {{ if [ -f {quoted} ] && [ ! -L {quoted} ]; then head -c {VERDICT_MAX_BYTES} {quoted} | head -n 1; fi; }}"
    return shlex.join(["bash", "-c", script])


def _journal_problem(text: str) -> str | None:
    """Why a host's journal text is not used as a log: over the log cap, or not text."""
    size = len(text.encode("utf-8", "replace"))
    if size > LOG_MAX_BYTES:
        return f"{size:,} bytes of journal, more than the {LOG_MAX_BYTES:,} this reads. Fix: lower --lines"
    if "\0" in text:
        return "the journal holds NUL bytes (binary), not text"
    return None
