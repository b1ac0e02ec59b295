"""Shared fixtures: the repository root, the seed 004 profile as the inventory holds it, and the
sglang HTTP stand-in as a process."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from seed_004 import (  # noqa: E402,F401  (re-exported for tests)
    PROFILE_ADDED_ENV,
    SEED_004_ENV,
    SEED_004_FLAGS,
    profile_flags,
)

ROOT = Path(__file__).resolve().parents[2]
# The proxmox_vm role's stand-ins and their fixtures (pve, inventory, agent_up, ssh_standin, sysfs), shared by
# its test_proxmox_vm_*.py files.
pytest_plugins = ["pve_harness"]
STANDIN = ROOT / "tests" / "standin" / "sglang_server_standin.py"


def repository_files(*, untracked: bool = False) -> list[Path]:
    """The checkout's files as git lists them (regular files, no links): the tracked ones, and with ``untracked``
    also those git does not ignore. Outside a git checkout the test is skipped (a listed reason)."""
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout")
    argv = ["git", "ls-files", "-z", *(["-co", "--exclude-standard"] if untracked else [])]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, timeout=60, check=True).stdout
    return [ROOT / name for name in out.decode().split("\0") if name and (ROOT / name).is_file() and not (ROOT / name).is_symlink()]
PROFILE = ROOT / "inventory" / "proxmox" / "group_vars" / "sglang_servers" / "sglang_server.yml"


@pytest.fixture(scope="session", autouse=True)
def _own_fact_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Each pytest process (scripts/test runs two, pytest-xdist) gets its own Ansible fact cache: the
    project's ansible.cfg caches facts as JSON files in .cache/facts, and two Ansible runs writing and
    reading the same host's file at once can read it half-written (Ansible then deletes it and fails)."""
    old = os.environ.get("ANSIBLE_CACHE_PLUGIN_CONNECTION")
    os.environ["ANSIBLE_CACHE_PLUGIN_CONNECTION"] = str(tmp_path_factory.mktemp("ansible-facts"))
    yield
    if old is None:
        os.environ.pop("ANSIBLE_CACHE_PLUGIN_CONNECTION", None)
    else:
        os.environ["ANSIBLE_CACHE_PLUGIN_CONNECTION"] = old


@pytest.fixture(scope="session")
def profile() -> dict[str, Any]:
    return yaml.safe_load(PROFILE.read_text())


class StandinProcess:
    """tests/standin/sglang_server_standin.py on an ephemeral port of 127.0.0.1. Its output goes to a
    file (a pipe nobody reads would fill up under a benchmark's requests and stall it)."""

    def __init__(self, log: Path, *args: str) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, str(STANDIN), "--host", "127.0.0.1", "--port", "0", *args],
            stdout=log.open("w"), stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 15
        while not (match := re.search(r"on (https?)://127\.0\.0\.1:(\d+)", log.read_text())):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise AssertionError(f"stand-in did not start within 15 s: {log.read_text()}")
            time.sleep(0.05)
        self.port = int(match.group(2))
        self.url = f"{match.group(1)}://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture()
def standin(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StandinProcess]:
    """The stand-in with the test module's STANDIN_ARGS, then the test's own (indirect parametrize)."""
    args = (*getattr(request.module, "STANDIN_ARGS", ()), *getattr(request, "param", ()))
    server = StandinProcess(tmp_path / "standin.log", *args)
    try:
        yield server
    finally:
        server.stop()


# -- skips: shown, and only those on this list ------------------------------------------------------------
# A skipped test proves nothing, so a skip must be seen and meant. These are the unit tests' only skips, each
# off the CI machine only (CI runs as root, in a git clone, with OpenSSH and loop devices); docs/testing.md
# lists them. Any other skip fails the run (pytest_sessionfinish below), and scripts/static-checks passes -rs,
# so every skip is printed with its reason.
ALLOWED_SKIP_REASONS = (
    "not a git checkout",  # test_docs, test_layout: they read the files git lists
    "needs OpenSSH's ssh-keygen",  # test_hostkeys: real host keys to parse
    "the module makes everything root-owned: run as root",  # test_ml_env_module, test_host_files_module
    "chown to another user needs root: run as root",  # test_safepath
    "needs root and a loop device to mount a block device",  # test_proxmox_weights_disk
)
_SKIPPED: list[tuple[str, str]] = []


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return str(reason).removeprefix("Skipped: ")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # Under pytest-xdist the controller sees every worker's reports here, so it judges the whole run.
    if report.skipped and not hasattr(report, "wasxfail"):
        _SKIPPED.append((report.nodeid, _skip_reason(report)))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller judges
        return
    unlisted = [(nodeid, why) for nodeid, why in _SKIPPED if not any(why.startswith(ok) for ok in ALLOWED_SKIP_REASONS)]
    if unlisted and exitstatus == 0:
        lines = "\n".join(f"  {nodeid}: {why}" for nodeid, why in unlisted)
        session.config.get_terminal_writer().line(
            f"\nFAILED: {len(unlisted)} test(s) skipped for a reason not in tests/unit/conftest.py ALLOWED_SKIP_REASONS "
            f"(a skip proves nothing; make the test run here, or list the reason there and in docs/testing.md):\n{lines}",
            red=True,
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
