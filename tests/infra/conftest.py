"""Fixtures shared by the testinfra suites (molecule, playbooks/verify.yml, sglang-deploy verify).

What a host should look like comes from `sglang-deploy render` of the same inventory: one source of
truth, the role's own templates. A failed test gets the unit's journal attached by the
journal_on_failure plugin beside this file.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("sglang-deploy")
    group.addoption("--sglang-render-dir", help="`sglang-deploy render --out` directory (default: render now)")
    group.addoption("--sglang-unit", default="sglang", help="unit name (sglang_server_name)")
    group.addoption("--sglang-user", default="sglang", help="service user (sglang_server_user)")
    group.addoption("--sglang-config-dir", default="/etc/sglang", help="sglang_server_config_dir")


@pytest.fixture(scope="session")
def unit_name(request: pytest.FixtureRequest) -> str:
    return str(request.config.getoption("--sglang-unit"))


@pytest.fixture(scope="session")
def service_user(request: pytest.FixtureRequest) -> str:
    return str(request.config.getoption("--sglang-user"))


@pytest.fixture(scope="session")
def env_file_path(request: pytest.FixtureRequest, unit_name: str) -> str:
    return f"{request.config.getoption('--sglang-config-dir')}/{unit_name}.env"


@pytest.fixture(scope="session")
def render_root(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The render of this run's inventory: given, or made now with the real `sglang-deploy render`."""
    given = request.config.getoption("--sglang-render-dir")
    if given:
        return Path(given)
    inventory = request.config.getoption("ansible_inventory", default=None)
    if not inventory:
        pytest.fail("need --sglang-render-dir or --ansible-inventory to know what the host should hold")
    out = tmp_path_factory.mktemp("render")
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_deploy.cli", "render", "-i", inventory, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, f"sglang-deploy render failed:\n{proc.stdout}\n{proc.stderr}"
    return out


@pytest.fixture()
def rendered_dir(host, render_root: Path) -> Path:  # type: ignore[no-untyped-def]
    """This host's rendered unit and env file (testinfra's ansible backend knows its inventory name)."""
    path = render_root / host.backend.host
    if not path.is_dir():
        pytest.fail(f"no rendered files for {host.backend.host} in {render_root}")
    return path
