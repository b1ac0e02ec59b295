"""The shipped inventories: the multi-host example serves the same launch profile as inventory/proxmox,
and both pass `sglang-deploy validate` (the server's and the router's pinned parsers)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

PROFILE_FILES = ("sglang_server.yml", "profiles.yml", "hf_model.yml", "ml_env.yml", "nvidia_cuda.yml")


@pytest.mark.parametrize("name", PROFILE_FILES)
def test_the_multi_host_workers_serve_the_proxmox_profile(name: str):
    proxmox = ROOT / "inventory" / "proxmox" / "group_vars" / "sglang_servers" / name
    multi = ROOT / "inventory" / "multi_host" / "group_vars" / "sglang_servers" / name
    assert multi.read_text() == proxmox.read_text(), f"{multi} differs from {proxmox}: copy it again"


def _validate(inventory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).with_name("sglang-deploy")), "validate", "-i", str(inventory)],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
        env={**os.environ, "SGLANG_API_KEY": "a-key-for-the-test-0123456789"},
    )  # fmt: skip


def test_the_multi_host_inventory_validates_workers_and_router():
    done = _validate(ROOT / "inventory" / "multi_host")
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_flag_the_router_does_not_know_fails_validate_before_any_host(tmp_path: Path):
    inventory = tmp_path / "inventory"
    shutil.copytree(ROOT / "inventory" / "multi_host", inventory)
    (inventory / "host_vars").mkdir()
    (inventory / "host_vars" / "router-01.yml").write_text("sglang_router_extra_flags: {no-such-router-flag: 1}\n")
    done = _validate(inventory)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "router-01" in out and "no-such-router-flag" in out and "sglang_router_extra_flags" in out, out


def test_the_tuned_profile_validates_with_the_lanes_parser(tmp_path: Path):
    """inventory/proxmox with sglang_server_profile: tuned (BF16 KV, MTP, the planner's fraction): sglang
    0.5.10.post1's own parser accepts the launch, and an unknown profile name is refused naming the fix."""
    inventory = tmp_path / "inventory"
    shutil.copytree(ROOT / "inventory" / "proxmox", inventory)
    (inventory / "host_vars").mkdir()
    (inventory / "host_vars" / "glm5-01.yml").write_text("sglang_server_profile: tuned\n")
    done = _validate(inventory)
    assert done.returncode == 0, done.stdout + done.stderr
    (inventory / "host_vars" / "glm5-01.yml").write_text("sglang_server_profile: tunned\n")
    done = _validate(inventory)
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "host glm5-01" in out and "'tunned' is not one of sglang_server_profiles" in out, out
