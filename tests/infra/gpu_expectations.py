"""pytest plugin: what tests/infra/test_gpu.py expects of a host's GPUs, as command-line options.

Load it with ``-p gpu_expectations`` (tests/infra is on PYTHONPATH in molecule, playbooks/verify.yml
and ``sglang-deploy verify``). Defaults describe the target box of inventory/proxmox (8x RTX PRO 6000
Blackwell Server Edition, 97,887 MiB, SM120, driver >= 580 for both CUDA lanes' margin, persistence
on); another box passes its own, e.g. the device machine:

    pytest tests/infra/test_gpu.py --hosts=local:// -p gpu_expectations \\
        --gpu-count 1 --gpu-name "NVIDIA H200" --gpu-memory-mib 143771 --gpu-compute-cap 9.0

Every option also reads an environment variable (SGLANG_DEPLOY_GPU_COUNT, ..._NAME, ..._MEMORY_MIB,
..._COMPUTE_CAP, ..._MIN_DRIVER, ..._PERSISTENCE), so molecule.yml can set them in verifier.env.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

_DEFAULTS = {
    "count": "8",
    "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
    "memory_mib": "97887",
    "compute_cap": "12.0",
    "min_driver": "580.65.06",
    "persistence": "on",
}


@dataclass(frozen=True)
class GpuExpectations:
    count: int
    name: str
    memory_mib: int
    compute_cap: str
    min_driver: str
    # "on", "off" or "any"
    persistence: str


def _default(key: str) -> str:
    return os.environ.get(f"SGLANG_DEPLOY_GPU_{key.upper()}", _DEFAULTS[key])


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("sglang-deploy GPU expectations")
    group.addoption("--gpu-count", default=_default("count"), help="GPUs nvidia-smi must list")
    group.addoption("--gpu-name", default=_default("name"), help="product name of every GPU")
    group.addoption(
        "--gpu-memory-mib", default=_default("memory_mib"), help="memory.total of every GPU, MiB"
    )
    group.addoption(
        "--gpu-compute-cap", default=_default("compute_cap"), help="compute capability, e.g. 12.0"
    )
    group.addoption(
        "--gpu-min-driver", default=_default("min_driver"), help="lowest acceptable driver version"
    )
    group.addoption(
        "--gpu-persistence",
        default=_default("persistence"),
        choices=("on", "off", "any"),
        help="persistence mode every GPU must be in",
    )


@pytest.fixture(scope="session")
def gpu_expectations(request: pytest.FixtureRequest) -> GpuExpectations:
    opt = request.config.getoption
    return GpuExpectations(
        count=int(opt("--gpu-count")),
        name=str(opt("--gpu-name")),
        memory_mib=int(opt("--gpu-memory-mib")),
        compute_cap=str(opt("--gpu-compute-cap")),
        min_driver=str(opt("--gpu-min-driver")),
        persistence=str(opt("--gpu-persistence")),
    )
