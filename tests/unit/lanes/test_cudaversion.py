"""sglang_deploy.lanes.cudaversion: toolkit names, paths and parsing of nvcc/ptxas/version.json."""

from __future__ import annotations

import importlib.util
import json

import pytest
from ansible.errors import AnsibleFilterError
from conftest import ROOT

from sglang_deploy.lanes import cudaversion as cv

# Verbatim output of the real binaries (ptxas from the nvidia-cuda-nvcc-cu12==12.8.93 wheel, nvcc and
# ptxas from the nvidia-cuda-nvcc==13.0.88 wheel).
PTXAS_12_8 = """ptxas: NVIDIA (R) Ptx optimizing assembler
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Fri_Feb_21_20:21:21_PST_2025
Cuda compilation tools, release 12.8, V12.8.93
Build cuda_12.8.r12.8/compiler.35583870_0
"""
NVCC_13_0 = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Wed_Aug_20_01:58:59_PM_PDT_2025
Cuda compilation tools, release 13.0, V13.0.88
Build cuda_13.0.r13.0/compiler.36424714_0
"""


def version_json(cuda: str, nvcc: str = "12.8.93") -> str:
    return json.dumps(
        {
            "cuda": {"name": "CUDA SDK", "version": cuda},
            "cuda_nvcc": {"name": "CUDA NVCC", "version": nvcc},
        },
        indent=3,
    )


@pytest.mark.parametrize(
    ("given", "package", "home"),
    [
        ("12.8", "cuda-toolkit-12-8", "/usr/local/cuda-12.8"),
        ("13.0", "cuda-toolkit-13-0", "/usr/local/cuda-13.0"),
        (" 12.08 ", "cuda-toolkit-12-8", "/usr/local/cuda-12.8"),
    ],
)
def test_names_and_paths(given: str, package: str, home: str):
    assert cv.package_name(given) == package
    assert cv.home(given) == home


def test_home_under_another_prefix():
    assert cv.home("12.8", "/opt/nvidia/") == "/opt/nvidia/cuda-12.8"


@pytest.mark.parametrize("bad", ["12", "12.8.1", "v12.8", "12,8", "", "cuda-12.8", 12.8])
def test_release_rejects_what_is_not_major_minor(bad):
    with pytest.raises(cv.CudaVersionError, match="major.minor"):
        cv.release(bad)


def test_banner_of_real_ptxas_and_nvcc():
    assert cv.parse_banner(PTXAS_12_8, "ptxas") == cv.ToolVersion("12.8", "12.8.93")
    assert cv.parse_banner(NVCC_13_0) == cv.ToolVersion("13.0", "13.0.88")


def test_banner_without_release_line_names_the_tool_and_first_line():
    with pytest.raises(cv.CudaVersionError, match=r"ptxas --version .*'bash: ptxas: not found'"):
        cv.parse_banner("bash: ptxas: not found\n", "ptxas")


def test_version_json_reads_the_cuda_entry():
    assert cv.parse_version_json(version_json("12.8.1")) == cv.ToolVersion("12.8", "12.8.1")


@pytest.mark.parametrize(
    ("text", "message"),
    [("{not json", "not JSON"), ('{"cuda_nvcc": {"version": "12.8.93"}}', '"cuda"'), ("[]", '"cuda"')],
)
def test_version_json_errors(text: str, message: str):
    with pytest.raises(cv.CudaVersionError, match=message):
        cv.parse_version_json(text)


def test_check_ok_from_version_json_and_ptxas():
    report = cv.check_toolkit("12.8", version_json=version_json("12.8.1"), ptxas=PTXAS_12_8)
    assert report.ok, report.problems
    assert report.to_dict()["sources"] == {"ptxas": "12.8.93", "version.json": "12.8.1"}
    assert report.home == "/usr/local/cuda-12.8"


def test_check_ok_from_nvcc_alone():
    assert cv.check_toolkit("13.0", nvcc=NVCC_13_0).ok


def test_check_flags_a_toolkit_that_reports_another_release():
    report = cv.check_toolkit("12.8", version_json=version_json("12.8.1"), ptxas=NVCC_13_0.replace("nvcc", "ptxas"))
    assert not report.ok
    assert report.problems == ["/usr/local/cuda-12.8: ptxas reports 13.0.88 (release 13.0), not 12.8"]


def test_check_without_nvcc_needs_both_other_sources():
    report = cv.check_toolkit("12.8", ptxas=PTXAS_12_8)
    assert not report.ok
    assert "missing or unreadable: version.json" in report.problems[0]


def test_check_with_nothing_is_not_ok():
    report = cv.check_toolkit("12.8")
    assert not report.ok and report.sources == {}


def test_check_reports_unparsable_output():
    report = cv.check_toolkit("12.8", version_json="garbage", ptxas=PTXAS_12_8)
    assert not report.ok
    assert any("version.json is not JSON" in p for p in report.problems)


# The role's filter plugin is a thin adapter over this module: same results, errors name the host.
_spec = importlib.util.spec_from_file_location("cuda_toolkit_filters", ROOT / "filter_plugins" / "cuda_toolkit.py")
assert _spec and _spec.loader
plugin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plugin)


def test_filters_are_registered():
    assert set(plugin.FilterModule().filters()) == {
        "cuda_toolkit_package",
        "cuda_toolkit_suffix",
        "cuda_toolkit_home",
        "cuda_toolkit_check",
    }


def test_filter_results_match_the_module():
    assert plugin.cuda_toolkit_package("12.8") == "cuda-toolkit-12-8"
    assert plugin.cuda_toolkit_suffix("13.0") == "13-0"
    assert plugin.cuda_toolkit_home("12.8", "/usr/local", host="h") == "/usr/local/cuda-12.8"
    assert plugin.cuda_toolkit_check("12.8", version_json=version_json("12.8.1"), ptxas=PTXAS_12_8)["ok"] is True


def test_filter_error_names_the_host_and_the_value():
    with pytest.raises(AnsibleFilterError, match=r"^host gpu-07: 12.1 is not a CUDA toolkit release"):
        plugin.cuda_toolkit_package(12.1, host="gpu-07")


def test_check_filter_turns_a_bad_release_into_a_report():
    report = plugin.cuda_toolkit_check("twelve")
    assert report["ok"] is False and "not a CUDA toolkit release" in report["problems"][0]
