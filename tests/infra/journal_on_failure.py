"""pytest plugin for the molecule testinfra verifier: on a failed test, attach the journal.

Loaded through ``PYTEST_ADDOPTS=-p journal_on_failure`` (molecule: .config/molecule/config.yml; playbooks/verify.yml: `-p journal_on_failure`).
A scenario names the units in ``SGLANG_DEPLOY_JOURNAL_UNITS`` (space separated); when a test
that uses testinfra's ``host`` fixture fails, the last lines of each unit's journal on that host
are added to the failure report, so a CI log says why a service did not come up.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from collections.abc import Generator

JOURNAL_LINES = int(os.environ.get("SGLANG_DEPLOY_JOURNAL_LINES", "80"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Generator[None]:
    outcome = yield
    report = outcome.get_result()
    units = os.environ.get("SGLANG_DEPLOY_JOURNAL_UNITS", "").split()
    host = getattr(item, "funcargs", {}).get("host")
    if not (report.failed and call.when == "call" and units and host is not None):
        return
    for unit in units:
        try:
            # testinfra shell-quotes the arguments itself.
            cmd = host.run(
                "journalctl --no-pager -o short-precise -n %s -u %s",
                str(JOURNAL_LINES),
                unit,
            )
            text = cmd.stdout or cmd.stderr
        except Exception as exc:  # noqa: BLE001 - the report must not hide the real failure
            text = f"(could not read the journal: {exc})"
        report.sections.append((f"journalctl -u {unit} (last {JOURNAL_LINES} lines)", text))
