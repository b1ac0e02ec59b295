"""The tests mirror the code: each package of src/sglang_deploy has a folder of its own under tests/unit, beside
host/ (module_utils/sglang_deploy_host and its modules), vm/ (the Proxmox layer), cli/ and project/ (the repository
as a whole); no test file lies outside them or grows past 800 lines."""

from __future__ import annotations

from conftest import ROOT

UNIT = ROOT / "tests" / "unit"
MAX_LINES = 800
BEYOND_THE_PACKAGES = {"host", "vm", "cli", "project"}


def test_every_package_has_its_test_folder_and_every_folder_a_package() -> None:
    packages = {p.parent.name for p in (ROOT / "src" / "sglang_deploy").glob("*/__init__.py")} - {"commands"}
    folders = {p.name for p in UNIT.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert packages - folders == set(), "packages without a test folder"
    assert folders - packages - BEYOND_THE_PACKAGES == set(), "test folders that mirror no package"


def test_no_test_file_lies_outside_the_folders_or_grows_past_the_bound() -> None:
    assert sorted(p.name for p in UNIT.glob("test_*.py")) == []
    long = {
        str(p.relative_to(UNIT)): n
        for p in UNIT.rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}
