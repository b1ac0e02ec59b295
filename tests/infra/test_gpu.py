"""GPU visibility: the host's GPUs are the expected ones and in a state to serve.

Runs nvidia-smi on the host through testinfra (``host.run``) and parses the output with
``sglang_deploy_host.gpu.gpufacts`` (the same parser the preflight role and the unit's ExecStartPre use).
Expectations come from the ``gpu_expectations`` plugin: ``-p gpu_expectations`` plus
``--gpu-count/--gpu-name/--gpu-memory-mib/--gpu-compute-cap/--gpu-min-driver/--gpu-persistence``.
In CI the host is a container whose nvidia-smi is the fixture-replaying stand-in
(tests/standin/nvidia-smi); on the device machine and the real box it is the real one.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

import pytest

from sglang_deploy_host.gpu import gpufacts

pytestmark = pytest.mark.usefixtures("gpu_expectations")


@pytest.fixture(scope="module")
def facts(host: Any) -> gpufacts.GpuFacts:
    def run(args: Sequence[str]) -> gpufacts.Output:
        cmd = host.run("nvidia-smi " + " ".join(shlex.quote(a) for a in args))
        return gpufacts.Output(cmd.stdout, cmd.stderr, cmd.rc)

    return gpufacts.collect(runner=run)


def test_nvidia_smi_answers_every_query(facts: gpufacts.GpuFacts) -> None:
    assert facts.errors == [], "nvidia-smi failed:\n" + "\n".join(facts.errors)


def test_gpu_count(facts: gpufacts.GpuFacts, gpu_expectations: Any) -> None:
    listed = [f"{g.index} {g.bus_id} {g.name}" for g in facts.gpus]
    assert facts.gpu_count == gpu_expectations.count, f"nvidia-smi lists {listed}"


def test_no_gpu_lost_or_in_error_state(facts: gpufacts.GpuFacts) -> None:
    problems = [p for g in facts.gpus for p in g.health_problems]
    assert problems == [], "\n".join(problems) + "\n" + gpufacts.HEALTH_FIX


def test_gpu_names(facts: gpufacts.GpuFacts, gpu_expectations: Any) -> None:
    assert facts.gpus
    assert {g.index: g.name for g in facts.gpus} == {
        g.index: gpu_expectations.name for g in facts.gpus
    }


def test_gpu_memory(facts: gpufacts.GpuFacts, gpu_expectations: Any) -> None:
    assert facts.gpus
    assert {g.index: g.memory_total_mib for g in facts.gpus} == {
        g.index: gpu_expectations.memory_mib for g in facts.gpus
    }


def test_compute_capability(facts: gpufacts.GpuFacts, gpu_expectations: Any) -> None:
    assert facts.gpus
    assert {g.index: g.compute_cap for g in facts.gpus} == {
        g.index: gpu_expectations.compute_cap for g in facts.gpus
    }


def test_driver_version(facts: gpufacts.GpuFacts, gpu_expectations: Any) -> None:
    assert facts.driver_version, "nvidia-smi reported no driver version"
    found = gpufacts.version_tuple(facts.driver_version)
    assert found >= gpufacts.version_tuple(gpu_expectations.min_driver), (
        f"driver {facts.driver_version} is older than {gpu_expectations.min_driver}"
    )
    per_gpu = {g.driver_version for g in facts.gpus}
    assert per_gpu == {facts.driver_version}


def test_persistence_mode(facts: gpufacts.GpuFacts, gpu_expectations: Any) -> None:
    if gpu_expectations.persistence == "any":
        pytest.skip("--gpu-persistence any: persistence mode not checked")
    want = gpu_expectations.persistence == "on"
    off = [g.index for g in facts.gpus if g.persistence_mode is not want]
    assert facts.gpus
    assert off == [], (
        f"GPUs {off} do not have persistence mode {gpu_expectations.persistence}. "
        "Fix: enable nvidia-persistenced (the nvidia_driver role does), or `nvidia-smi -pm 1`."
    )
