"""The testinfra suites' results as the recap shows them: pytest's JUnit XML, read back.

playbooks/verify.yml has pytest write ``<report dir>/<host>.xml`` when the run names a report
directory (``sglang_deploy_verify_report_dir``, set by the CLI to the run's artifacts); the CLI then
prints "27 passed" or the failing tests' names per host instead of only an artifacts path.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

# The extra variable that makes verify.yml write the reports, and the directory of one run's reports.
REPORT_DIR_VAR = "sglang_deploy_verify_report_dir"
REPORT_SUBDIR = "testinfra"


@dataclass(frozen=True)
class SuiteResult:
    """One host's testinfra run."""

    host: str
    passed: int
    failed: tuple[str, ...]  # failed or errored tests, as "file::test[param]"
    skipped: int
    # Set when the report could not be read (the run died before pytest wrote it, or it is broken).
    problem: str = ""

    @property
    def ok(self) -> bool:
        return not self.failed and not self.problem

    def line(self) -> str:
        if self.problem:
            return f"{self.host}: no test report ({self.problem})"
        parts = [f"{self.passed} passed"]
        if self.failed:
            parts.append(f"{len(self.failed)} failed: {', '.join(self.failed)}")
        if self.skipped:
            parts.append(f"{self.skipped} skipped")
        return f"{self.host}: {', '.join(parts)}"


def read_report(path: Path) -> SuiteResult:
    """A host's result from pytest's JUnit XML at ``path`` (host = the file's stem)."""
    host = path.stem
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as err:
        return SuiteResult(host, 0, (), 0, problem=f"{path}: {err}")
    passed = skipped = 0
    failed: list[str] = []
    for case in root.iter("testcase"):
        outcome = {child.tag for child in case}
        if outcome & {"failure", "error"}:
            module = (case.get("classname") or "").rsplit(".", 1)[-1]
            failed.append(f"{module}::{case.get('name', '?')}" if module else case.get("name", "?"))
        elif "skipped" in outcome:
            skipped += 1
        else:
            passed += 1
    return SuiteResult(host, passed, tuple(failed), skipped)


def read_reports(directory: Path) -> list[SuiteResult]:
    """Every host's result in ``directory`` (none when the run wrote no reports)."""
    if not directory.is_dir():
        return []
    return [read_report(path) for path in sorted(directory.glob("*.xml"))]
