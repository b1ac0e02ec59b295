"""Filters for the cuda_toolkit role: each one is a single call into ``sglang_deploy.lanes.cudaversion``."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

from sglang_deploy.lanes import cudaversion


def cuda_toolkit_package(version: object, host: str = "?") -> str:
    """"12.8" -> "cuda-toolkit-12-8"."""
    try:
        return cudaversion.package_name(version)
    except cudaversion.CudaVersionError as err:
        raise AnsibleFilterError(f"host {host}: {err}") from None


def cuda_toolkit_suffix(version: object, host: str = "?") -> str:
    """"12.8" -> "12-8" (the tail of NVIDIA's per-release package names)."""
    try:
        return cudaversion.package_suffix(version)
    except cudaversion.CudaVersionError as err:
        raise AnsibleFilterError(f"host {host}: {err}") from None


def cuda_toolkit_home(version: object, prefix: str = "/usr/local", host: str = "?") -> str:
    """"12.8" -> "/usr/local/cuda-12.8"."""
    try:
        return cudaversion.home(version, prefix)
    except cudaversion.CudaVersionError as err:
        raise AnsibleFilterError(f"host {host}: {err}") from None


def cuda_toolkit_check(
    expected: Any,
    prefix: str = "/usr/local",
    version_json: str | None = None,
    ptxas: str | None = None,
    nvcc: str | None = None,
) -> dict[str, Any]:
    """Report (ok, sources, problems) of one installed release; the role asserts on ``ok``."""
    try:
        return cudaversion.check_toolkit(
            expected, prefix=prefix, version_json=version_json, ptxas=ptxas, nvcc=nvcc
        ).to_dict()
    except cudaversion.CudaVersionError as err:
        return {"expected": str(expected), "ok": False, "sources": {}, "problems": [str(err)]}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "cuda_toolkit_package": cuda_toolkit_package,
            "cuda_toolkit_suffix": cuda_toolkit_suffix,
            "cuda_toolkit_home": cuda_toolkit_home,
            "cuda_toolkit_check": cuda_toolkit_check,
        }
