"""The CLI end to end on a copy of inventory/proxmox: real ansible-playbook, real systemd-analyze."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, profile_flags


def _inventory(tmp_path: Path, host_vars: dict | None = None) -> Path:
    inventory = tmp_path / "inventory"
    shutil.copytree(ROOT / "inventory" / "proxmox", inventory)
    if host_vars is not None:
        (inventory / "host_vars").mkdir(exist_ok=True)
        (inventory / "host_vars" / "glm5-01.yml").write_text(yaml.safe_dump(host_vars))
    return inventory


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sglang_deploy.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=ROOT,
    )


def test_render_writes_a_verified_unit_with_the_seed_flags(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = _cli("render", "-i", str(_inventory(tmp_path)), "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "systemd-analyze verify: clean" in proc.stderr
    unit = (out / "glm5-01" / "sglang.service").read_text()
    flat = unit.replace(" \\\n    ", " ")
    assert " ".join(profile_flags()) in flat  # the seed's command line reads back flag for flag
    assert unit.startswith("#\n# Ansible managed\n#\n")
    assert (out / "glm5-01" / "sglang.env").stat().st_mode & 0o777 == 0o600


def test_render_rejects_a_conflict_naming_host_and_fix(tmp_path: Path) -> None:
    inventory = _inventory(tmp_path, {"sglang_server_flags_override": {"tp": 4}})
    proc = _cli("render", "-i", str(inventory), "--out", str(tmp_path / "out"))
    assert proc.returncode == 1
    output = proc.stdout + proc.stderr
    assert "host glm5-01" in output and "'tp-size'" in output and "sglang_server_flags_override" in output


def test_render_fails_on_a_systemd_warning(tmp_path: Path) -> None:
    # An unknown directive is only a warning for systemd-analyze (exit 0); render must fail on it.
    inventory = _inventory(tmp_path, {"sglang_server_hardening": {"ProtectNothing": "yes"}})
    proc = _cli("render", "-i", str(inventory), "--out", str(tmp_path / "out"))
    assert proc.returncode == 1
    assert "ProtectNothing" in proc.stderr


@pytest.mark.slow
def test_validate_rejects_a_misspelt_choice_before_touching_hosts(tmp_path: Path) -> None:
    # The host's address is a documentation placeholder: any contact with it would fail differently.
    inventory = _inventory(tmp_path, {"sglang_server_flags_override": {"attention-backend": "flashinfr"}})
    proc = _cli("validate", "-i", str(inventory))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    assert "host glm5-01" in output
    assert "sglang 0.5.10.post1 rejects --attention-backend 'flashinfr'" in output
    assert "flashinfer" in output.split("Valid choices:", 1)[1]
    assert "UNREACHABLE" not in output


@pytest.mark.slow
def test_validate_accepts_the_seed_profile() -> None:
    proc = _cli("validate")
    assert proc.returncode == 0, proc.stdout + proc.stderr
