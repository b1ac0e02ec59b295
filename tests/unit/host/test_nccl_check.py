"""The NCCL check's environment parsing and bandwidth arithmetic (the run itself needs GPUs: see README)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from sglang_deploy_host.gpu import nccl_check
from sglang_deploy_host.serving import systemd
from sglang_deploy.launch.config import LaunchConfig


def test_profile_environment_as_rendered(profile):
    launch = LaunchConfig.from_vars(
        profile["sglang_server_flags"], python="/venv/bin/python3", env=profile["sglang_server_env"]
    )
    unit = "\n".join(f"Environment={line}" for line in launch.environment_assignments())
    env = systemd.environment(unit)
    assert env["NCCL_P2P_LEVEL"] == "PHB"
    assert env["NCCL_IB_DISABLE"] == "1"
    assert env["NCCL_MIN_NCHANNELS"] == "8"
    assert env["NCCL_P2P_DISABLE"] == "1"  # not in the seeds: preflight's rule for P2P "NS" boxes


@pytest.mark.parametrize(
    ("world", "busbw"),
    [(1, 0.0), (2, 1.0), (8, 1.75)],
)
def test_bus_bandwidth_matches_nccl_tests(world, busbw):
    algbw, bus = nccl_check.bus_bandwidth(10**9, 1.0, world)
    assert algbw == pytest.approx(1.0)
    assert bus == pytest.approx(busbw)


def test_bad_env_argument_is_rejected():
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_deploy_host.gpu.nccl_check", "--env", "NOEQUALS"],
        capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert "expected KEY=VALUE" in proc.stderr


def test_p2p_counterpart_switches_the_other_way():
    name, env = nccl_check.p2p_counterpart({"NCCL_P2P_LEVEL": "PHB"})
    assert env == {"NCCL_P2P_LEVEL": "PHB", "NCCL_P2P_DISABLE": "1"} and "+ NCCL_P2P_DISABLE=1" in name
    name, env = nccl_check.p2p_counterpart({"NCCL_P2P_LEVEL": "PHB", "NCCL_P2P_DISABLE": "1"})
    assert env == {"NCCL_P2P_LEVEL": "PHB"} and "P2P allowed" in name
