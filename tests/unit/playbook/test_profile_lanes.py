"""The box's profiles on both lanes, end to end: `render -i` a copy of inventory/proxmox with the lane switched runs the
lane's pinned sglang parser (real ansible-playbook, real systemd-analyze), and `plan -i` gives the fraction render writes."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "render"
# The checkpoint with GLM-5's draft layer restored (known_checkpoints.yml): tuned-mtp is refused on the default one.
MTP_REPO = "festr2/GLM-5-NVFP4-MTP"
PROFILES = ("seed-004", "tuned", "tuned-mtp")
LANES = {"cu128": ("0.5.10.post1", "nsa"), "cu130": ("0.5.23", "dsa")}


def _inventory(tmp_path: Path, lane: str, profile: str, **host_vars: object) -> Path:
    """A copy of inventory/proxmox (its API key as the unencrypted stand-in of the vault) with the lane and profile
    switched on the host, as a user does in host_vars."""
    inventory = tmp_path / "inventory"
    shutil.copytree(ROOT / "inventory" / "proxmox", inventory)
    (inventory / "group_vars" / "sglang_servers" / "vault.yml").write_text("vault_sglang_server_api_key: ci-key-0f3a9b\n")
    (inventory / "host_vars").mkdir()
    values = {"sglang_common_lane": lane, "sglang_server_profile": profile, **host_vars}
    if profile == "tuned-mtp":
        values["hf_model_repo"] = MTP_REPO
    (inventory / "host_vars" / "glm5-01.yml").write_text(yaml.safe_dump(values))
    return inventory


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sglang_deploy.cli", *args], capture_output=True, text=True, timeout=600, check=False,
        cwd=ROOT, env={k: v for k, v in os.environ.items() if k != "SGLANG_API_KEY"},
    )  # fmt: skip


def _exec_start(unit: str) -> list[str]:
    """The flags of ExecStart=, one per continuation line."""
    block = unit.split("ExecStart=", 1)[1].split("\nRestart=", 1)[0]
    return [line.strip().removesuffix(" \\") for line in block.splitlines()[1:]]


@pytest.mark.parametrize("lane", sorted(LANES))
@pytest.mark.parametrize("profile", PROFILES)
def test_each_profile_renders_and_passes_the_lanes_pinned_parser(tmp_path: Path, profile: str, lane: str) -> None:
    out = tmp_path / "out"
    done = _cli("render", "-i", str(_inventory(tmp_path, lane, profile)), "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "flags valid; systemd-analyze verify: clean" in done.stderr
    flags = _exec_start((out / "glm5-01" / "sglang.service").read_text())
    version, dsa = LANES[lane]
    names = [flag.split()[0] for flag in flags]
    # The table's renames: each DSA backend in the lane's own spelling, never the other lane's.
    assert f"--{dsa}-decode-backend" in names and f"--{dsa}-prefill-backend" in names, names
    assert not any(name.startswith("--nsa-" if dsa == "dsa" else "--dsa-") for name in names), names
    # 0.5.23 on SM120: the allreduce fusion raises there, so each profile drops it on that lane (its lanes entry).
    assert ("--enable-flashinfer-allreduce-fusion" in names) == (lane == "cu128"), names
    if profile == "seed-004" and lane == "cu130":
        assert "--dsa-prefill-backend flashinfer_sparse_mla" in flags and "--dsa-decode-backend flashinfer_sparse_mla" in flags
    if profile != "seed-004":
        assert "--kv-cache-dtype bfloat16" in flags and f"--{dsa}-prefill-backend trtllm" in flags


@pytest.mark.parametrize("profile", ["seed-004", "tuned"])
def test_the_default_lanes_units_are_byte_identical_to_those_before_the_flag_table(tmp_path: Path, profile: str) -> None:
    """The fixtures are render's output of the commit before the flag table (f1af553), for the same inventory."""
    out = tmp_path / "out"
    inventory = _inventory(tmp_path, "cu128", profile)
    (inventory / "host_vars" / "glm5-01.yml").write_text("" if profile == "seed-004" else f"sglang_server_profile: {profile}\n")
    done = _cli("render", "-i", str(inventory), "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert (out / "glm5-01" / "sglang.service").read_bytes() == (FIXTURES / f"glm5-01-cu128-{profile}.service").read_bytes()


def test_a_flag_the_lane_lacks_stops_render_naming_the_host_the_flag_the_lane_and_the_choice(tmp_path: Path) -> None:
    inventory = _inventory(tmp_path, "cu130", "tuned", sglang_server_flags_override={"enable-nan-detection": True})
    done = _cli("render", "-i", str(inventory), "--out", str(tmp_path / "out"))
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "host glm5-01: sglang_server_flags['enable-nan-detection']: lane cu130's sglang has no --enable-nan-detection" in out
    assert "SGLANG_ENABLE_NAN_LOGITS_CHECK" in out


@pytest.mark.parametrize("lane", sorted(LANES))
def test_plan_with_the_lane_switched_gives_the_fraction_render_writes(tmp_path: Path, lane: str) -> None:
    inventory = _inventory(tmp_path, lane, "tuned")
    planned = _cli("plan", "-i", str(inventory), "--json")
    assert planned.returncode == 0, planned.stdout + planned.stderr
    plan = json.loads(planned.stdout)
    assert f"rules of sglang {LANES[lane][0]} (lane {lane})" in plan["notes"]
    out = tmp_path / "out"
    done = _cli("render", "-i", str(inventory), "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    rendered = re.search(r"--mem-fraction-static (\S+)", (out / "glm5-01" / "sglang.service").read_text())
    assert rendered is not None and float(rendered.group(1)) == plan["recommended_mem_fraction_static"]
