"""The cuda_toolkit role's result: each release under /usr/local/cuda-X.Y from NVIDIA's packages,
reporting its own release, installed side by side, /usr/local/cuda left where it was.

Used by molecule/nvidia_cuda and by playbooks/verify.yml on a real host. Environment (all optional):
  SGLANG_DEPLOY_CUDA_VERSIONS       releases that must be installed (default "12.8")
  SGLANG_DEPLOY_CUDA_NVCC_VERSIONS  releases that must have a working nvcc (default: all of them; the
                                    CI mirror's 12.8 carries ptxas only, the 12.8 nvcc is on no registry)
  SGLANG_DEPLOY_CUDA_DEFAULT        where /usr/local/cuda must point (default: any installed release, or absent)
"""

from __future__ import annotations

import json
import os
import re

import pytest

VERSIONS = os.environ.get("SGLANG_DEPLOY_CUDA_VERSIONS", "12.8").split()
NVCC_VERSIONS = os.environ.get("SGLANG_DEPLOY_CUDA_NVCC_VERSIONS", " ".join(VERSIONS)).split()
DEFAULT = os.environ.get("SGLANG_DEPLOY_CUDA_DEFAULT")
PREFIX = "/usr/local"


def banner_release(text: str) -> str:
    match = re.search(r"Cuda compilation tools, release (\d+\.\d+), V(\d+\.\d+)\.\d+", text)
    assert match, f"no 'Cuda compilation tools, release' line in:\n{text}"
    assert match.group(1) == match.group(2)
    return match.group(1)


@pytest.mark.parametrize("version", VERSIONS)
def test_toolkit_package_installed(host, version):
    package = "cuda-toolkit-" + version.replace(".", "-")
    assert host.package(package).is_installed, f"{package} is not installed"
    assert host.file(f"{PREFIX}/cuda-{version}").is_directory


@pytest.mark.parametrize("version", VERSIONS)
def test_version_json_reports_release(host, version):
    data = json.loads(host.file(f"{PREFIX}/cuda-{version}/version.json").content_string)
    assert data["cuda"]["version"].startswith(version + "."), data["cuda"]


@pytest.mark.parametrize("version", VERSIONS)
def test_ptxas_reports_release(host, version):
    out = host.check_output(f"{PREFIX}/cuda-{version}/bin/ptxas --version")
    assert "NVIDIA (R) Ptx optimizing assembler" in out
    assert banner_release(out) == version


@pytest.mark.parametrize("version", NVCC_VERSIONS)
def test_nvcc_reports_release(host, version):
    out = host.check_output(f"{PREFIX}/cuda-{version}/bin/nvcc --version")
    assert "NVIDIA (R) Cuda compiler driver" in out
    assert banner_release(out) == version


@pytest.mark.parametrize("version", VERSIONS)
def test_toolkit_files_untouched(host, version):
    # dpkg --verify compares every file with the md5sums its package shipped: installing another
    # release beside this one must not have changed a byte of it.
    owners = host.check_output(f"dpkg -S {PREFIX}/cuda-{version}/bin/ptxas {PREFIX}/cuda-{version}/version.json")
    packages = sorted({line.split(":")[0] for line in owners.splitlines()})
    result = host.run(f"dpkg --verify {' '.join(packages)}")
    assert result.rc == 0 and result.stdout.strip() == "", result.stdout


def test_releases_side_by_side(host):
    roots = {host.file(f"{PREFIX}/cuda-{v}").linked_to if host.file(f"{PREFIX}/cuda-{v}").is_symlink else f"{PREFIX}/cuda-{v}" for v in VERSIONS}
    assert len(roots) == len(VERSIONS), f"toolkit roots collapse: {roots}"


def test_default_cuda_link_untouched(host):
    link = host.file(f"{PREFIX}/cuda")
    if DEFAULT:
        assert link.exists, f"{PREFIX}/cuda disappeared"
        assert host.check_output(f"readlink -f {PREFIX}/cuda") == DEFAULT
        query = host.run("update-alternatives --query cuda").stdout
        assert f"Value: {DEFAULT}" in query, query
    else:
        installed = {f"{PREFIX}/cuda-{v}" for v in VERSIONS}
        assert not link.exists or host.check_output(f"readlink -f {PREFIX}/cuda") in installed
