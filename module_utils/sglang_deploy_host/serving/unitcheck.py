"""``systemd-analyze verify`` with the strictness systemd itself lacks.

systemd-analyze exits 0 on unknown keys and bad values and only prints a warning, so any output
counts as a problem here. The one exception is for units rendered on a control node: the target's
interpreter (the ml-env python) does not exist on this machine, which systemd reports as
"Command ... is not executable"; the role checks that path on the host itself instead.

STDLIB ONLY: the sglang_server role also installs this file on the host and validates the unit with
it before the unit replaces the old one (the template module's ``validate:``, which hands over a
temporary file without the ``.service`` name systemd-analyze needs)::

    python3 unitcheck.py verify --as sglang.service /path/to/tmpfile [--allow-missing-command]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

_MISSING_COMMAND = re.compile(r"Command (\S+) is not executable: No such file or directory")


@dataclass(frozen=True)
class UnitCheck:
    unit: Path
    problems: tuple[str, ...]
    notes: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def systemd_analyze() -> str | None:
    return shutil.which("systemd-analyze")


def verify_unit(unit: Path, *, rendered_elsewhere: bool = False, timeout: float = 60) -> UnitCheck:
    """Run ``systemd-analyze verify`` on ``unit``; every printed line is a problem.

    ``rendered_elsewhere``: the unit is for another host, so a missing ExecStart= binary is a note.
    """
    tool = systemd_analyze()
    if tool is None:
        raise FileNotFoundError("systemd-analyze is not installed (package systemd)")
    proc = subprocess.run(
        [tool, "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    problems: list[str] = []
    notes: list[str] = []
    for line in (proc.stdout + proc.stderr).splitlines():
        if not line.strip():
            continue
        missing = _MISSING_COMMAND.search(line)
        if rendered_elsewhere and missing and not Path(missing.group(1)).exists():
            notes.append(f"{missing.group(1)} is not on this machine; the role checks it on the host")
        else:
            problems.append(line.strip())
    if proc.returncode != 0 and not problems and not notes:
        problems.append(f"systemd-analyze verify exited {proc.returncode}")
    return UnitCheck(unit=unit, problems=tuple(problems), notes=tuple(notes))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="unitcheck.py", description="systemd-analyze verify, strict")
    sub = parser.add_subparsers(dest="command", required=True)
    verify = sub.add_parser("verify", help="verify a unit file; any output fails")
    verify.add_argument("file", help="the unit file (any name)")
    verify.add_argument("--as", dest="name", required=True, help="its unit name, e.g. sglang.service or sglang-watchdog.timer")
    verify.add_argument("--allow-missing-command", action="store_true",
                        help="a missing ExecStart= binary is a note (it is not installed yet)")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9:_.@-]*\.(service|timer)", args.name):
        print(f"unitcheck: --as {args.name!r} is not a service or timer unit name", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="unitcheck-") as work:
        unit = Path(work) / args.name
        shutil.copyfile(args.file, unit)
        check = verify_unit(unit, rendered_elsewhere=args.allow_missing_command)
    for note in check.notes:
        print(f"note: {note}")
    for problem in check.problems:
        print(problem.replace(str(unit), args.name), file=sys.stderr)
    return 0 if check.ok else 1


if __name__ == "__main__":
    sys.exit(main())
