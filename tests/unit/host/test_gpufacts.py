"""gpufacts: parsing nvidia-smi (real H200 output and constructed RTX PRO 6000 fixtures), the idle
check's exit codes and messages, the script run as a host would run it, and the nvidia-smi stand-in."""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from sglang_deploy_host.gpu import gpufacts

FIXTURES = ROOT / "tests" / "fixtures" / "nvidia-smi"
STANDIN = ROOT / "tests" / "standin" / "nvidia-smi"
SCRIPT = ROOT / "module_utils" / "sglang_deploy_host" / "gpu" / "gpufacts.py"
ALL_FIXTURES = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())


def facts_of(name: str) -> gpufacts.GpuFacts:
    return gpufacts.collect(from_dir=FIXTURES / name)


def test_fixture_set() -> None:
    assert ALL_FIXTURES == [
        "h200-1gpu",
        "h200-1gpu-busy",
        "rtx-pro-6000-8gpu-busy",
        "rtx-pro-6000-8gpu-ecc",
        "rtx-pro-6000-8gpu-lost",
        "rtx-pro-6000-8gpu-passthrough",
    ]


def test_real_h200() -> None:
    facts = facts_of("h200-1gpu")
    assert facts.errors == []
    assert (facts.driver_version, facts.cuda_version, facts.gpu_count) == ("580.159.04", "13.0", 1)
    gpu = facts.gpus[0]
    assert gpu.index == 0
    assert gpu.name == "NVIDIA H200"
    assert gpu.uuid == "GPU-80344a1f-05e9-41aa-aae4-6f3fd67cc86b"
    assert gpu.bus_id == "00000000:00:06.0"
    assert (gpu.memory_total_mib, gpu.memory_used_mib) == (143771, 0)
    assert gpu.compute_cap == "9.0"
    assert gpu.driver_version == "580.159.04"
    assert gpu.persistence_mode is True
    assert gpu.pstate == "P0"
    assert gpu.ecc_mode == "Enabled"
    assert (gpu.ecc_volatile_uncorrectable, gpu.ecc_aggregate_uncorrectable) == (0, 0)
    assert gpu.retired_pages_pending is None  # N/A on H200: it remaps rows instead
    assert (gpu.remapped_rows_pending, gpu.remapped_rows_failure) == (False, False)
    assert gpu.recovery_action == "None"
    assert gpu.processes == [] and gpu.health_problems == []
    # One GPU: the matrix has only the diagonal, so no pairs.
    assert facts.p2p_read == []


def test_real_h200_with_a_cuda_process() -> None:
    facts = facts_of("h200-1gpu-busy")
    gpu = facts.gpus[0]
    assert gpu.memory_used_mib == 8811
    assert gpu.processes == [
        gpufacts.GpuProcess(
            pid=567, type="C", name="/opt/torch/.venv/bin/python3", used_memory_mib=8802
        )
    ]
    assert gpu.compute_processes == gpu.processes


def test_passthrough_box() -> None:
    facts = facts_of("rtx-pro-6000-8gpu-passthrough")
    assert facts.errors == []
    assert facts.gpu_count == 8
    assert [g.index for g in facts.gpus] == list(range(8))
    assert {g.name for g in facts.gpus} == {"NVIDIA RTX PRO 6000 Blackwell Server Edition"}
    assert {g.memory_total_mib for g in facts.gpus} == {97887}
    assert {g.compute_cap for g in facts.gpus} == {"12.0"}
    assert [g.bus_id for g in facts.gpus] == [f"00000000:0{i}:00.0" for i in range(1, 9)]
    assert len({g.uuid for g in facts.gpus}) == 8
    # 8 x 7 ordered pairs, all NS: no peer-to-peer under passthrough.
    assert len(facts.p2p_read) == 56
    assert {link.status for link in facts.p2p_read} == {"NS"}
    assert {(link.gpu, link.peer) for link in facts.p2p_read} == {
        (a, b) for a in range(8) for b in range(8) if a != b
    }
    assert facts.healthy_gpus() == facts.gpus


def test_p2p_matrix_parser_strips_ansi_and_reads_ok() -> None:
    text = (
        " \t\x1b[4mGPU0\tGPU1\tGPU2\t\x1b[0m\n"
        " GPU0\tX\tOK\tNS\t\n GPU1\tOK\tX\tCNS\t\n GPU2\tNS\tCNS\tX\t\n\nLegend:\n\n  X    = Self\n"
    )
    links = {(link.gpu, link.peer): link.status for link in gpufacts.parse_p2p(text)}
    assert links == {
        (0, 1): "OK",
        (0, 2): "NS",
        (1, 0): "OK",
        (1, 2): "CNS",
        (2, 0): "NS",
        (2, 1): "CNS",
    }


def test_lost_gpu() -> None:
    facts = facts_of("rtx-pro-6000-8gpu-lost")
    assert facts.gpu_count == 8
    lost = [g for g in facts.gpus if g.health_problems]
    assert [g.bus_id for g in lost] == ["00000000:06:00.0"]
    assert lost[0].index == 7  # after the seven nvidia-smi could number
    assert "GPU is lost" in lost[0].health_problems[0]
    assert len(facts.healthy_gpus()) == 7
    assert len(facts.errors) == 3
    assert all("exited 15 (a GPU has fallen off the bus" in e for e in facts.errors)


def test_ecc_and_err_states() -> None:
    facts = facts_of("rtx-pro-6000-8gpu-ecc")
    problems = {g.index: g.health_problems for g in facts.gpus if g.health_problems}
    assert sorted(problems) == [2, 6]
    assert facts.gpus[2].ecc_volatile_uncorrectable == 3
    assert facts.gpus[2].remapped_rows_pending is True
    assert any("3 uncorrectable ECC errors" in p for p in problems[2])
    assert any("row remapping pending" in p for p in problems[2])
    # The CSV cannot read it; the XML's value stands in, the GPU is flagged either way.
    assert facts.gpus[6].memory_used_mib == 0
    assert any("memory.used=ERR!" in p for p in problems[6])
    assert any("'GPU Reset'" in p for p in problems[6])


def test_older_ecc_schema_double_bit() -> None:
    xml = """<nvidia_smi_log><driver_version>535.1</driver_version><gpu id="0000:3B:00.0">
      <ecc_errors><volatile><single_bit><total>5</total></single_bit>
      <double_bit><total>2</total></double_bit></volatile></ecc_errors></gpu></nvidia_smi_log>"""
    details, _ = gpufacts.parse_query_xml(xml)
    assert details["00000000:3B:00.0"]["ecc_volatile_uncorrectable"] == 2


def test_to_dict_round_trip() -> None:
    facts = facts_of("rtx-pro-6000-8gpu-busy")
    facts.disks = [gpufacts.measure_disk(str(ROOT))]
    data = json.loads(json.dumps(facts.to_dict()))
    assert data["gpu_count"] == 8
    assert gpufacts.GpuFacts.from_dict(data) == facts


def test_busy_and_health_problems() -> None:
    busy = facts_of("rtx-pro-6000-8gpu-busy")
    problems = gpufacts.busy_problems(busy, 1024)
    assert len(problems) == 3
    assert "GPU 0 (00000000:01:00.0) is busy: 91240 MiB used" in problems[0]
    assert "48213 (sglang::scheduler_TP0)" in problems[0]
    assert "GPU 4 (00000000:05:00.0) is busy: 90112 MiB used" in problems[2]
    assert "none visible" in problems[2]
    assert gpufacts.busy_problems(facts_of("rtx-pro-6000-8gpu-passthrough"), 1024) == []
    # GPU 4 (no process, 90112 MiB) is busy only from the limit down; "used < limit" is idle.
    assert [p[:5] for p in gpufacts.busy_problems(busy, 90113)] == ["GPU 0", "GPU 1"]
    assert [p[:5] for p in gpufacts.busy_problems(busy, 90112)] == ["GPU 0", "GPU 1", "GPU 4"]
    # A compute process makes a GPU busy whatever its memory.
    assert [p[:5] for p in gpufacts.busy_problems(busy, 10**9)] == ["GPU 0", "GPU 1"]


def test_no_nvidia_smi() -> None:
    facts = gpufacts.collect(nvidia_smi="/nonexistent/nvidia-smi")
    assert facts.nvidia_smi_found is False
    assert facts.gpus == []
    assert gpufacts.health_problems(facts)[0].startswith("no GPU reported by nvidia-smi")


def test_version_tuple() -> None:
    assert gpufacts.version_tuple("580.159.04") == (580, 159, 4)
    assert gpufacts.version_tuple("580.65.06") < gpufacts.version_tuple("580.159.04")
    with pytest.raises(ValueError):
        gpufacts.version_tuple("580.x")


def test_measure_disk_of_a_missing_path(tmp_path: Path) -> None:
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "shard").write_bytes(b"\1" * (3 * 1024 * 1024))
    present = gpufacts.measure_disk(str(tmp_path / "w"))
    assert present.path_mib >= 3 and present.free_mib > 0
    missing = gpufacts.measure_disk(str(tmp_path / "not" / "yet"))
    assert missing.measured_path == str(tmp_path)
    assert missing.path_mib == 0


def test_measure_disk_leaves_out_tagged_caches(tmp_path: Path) -> None:
    # The kept disk: weights and, beside them, the caches a rebuild keeps (CACHEDIR.TAG at their root).
    models = tmp_path / "models"
    (models / "repo" / "rev").mkdir(parents=True)
    (models / "repo" / "rev" / "shard").write_bytes(b"\1" * (3 * 1024 * 1024))
    cache = models / ".sglang-deploy-cache"
    (cache / "uv").mkdir(parents=True)
    (cache / "uv" / "wheel").write_bytes(b"\1" * (8 * 1024 * 1024))
    assert gpufacts.measure_disk(str(models)).path_mib >= 11
    (cache / gpufacts.CACHEDIR_TAG).write_bytes(gpufacts.CACHEDIR_SIGNATURE + b"\n# a comment\n")
    assert 3 <= gpufacts.measure_disk(str(models)).path_mib < 8
    (cache / gpufacts.CACHEDIR_TAG).write_bytes(b"Signature: not the one\n")  # a wrong tag counts
    assert gpufacts.measure_disk(str(models)).path_mib >= 11


# -- the script, as the unit's ExecStartPre= and the preflight role run it ----------------------
def run_script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # -I: isolated, like a host without this package (only the stdlib may be imported).
    return subprocess.run(
        [sys.executable, "-I", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


@pytest.mark.parametrize(
    ("fixture", "rc"),
    [
        (name, 0 if name in ("h200-1gpu", "rtx-pro-6000-8gpu-passthrough") else 1)
        for name in ALL_FIXTURES
    ],
)
def test_idle_exit_codes(fixture: str, rc: int) -> None:
    done = run_script("idle", "--max-used-mib", "1024", "--from-dir", str(FIXTURES / fixture))
    assert done.returncode == rc, done.stderr


def test_idle_message_names_gpus_pids_and_fix() -> None:
    done = run_script(
        "--from-dir", str(FIXTURES / "rtx-pro-6000-8gpu-busy"), "idle", "--max-used-mib", "1024"
    )
    assert done.returncode == 1
    assert "GPU 1 (00000000:02:00.0) is busy: 91240 MiB used" in done.stderr
    assert "48214 (sglang::scheduler_TP1)" in done.stderr
    assert "systemctl stop sglang" in done.stderr and "pkill -9 -f sglang" in done.stderr
    assert "0 MiB" in done.stderr


def test_idle_message_for_a_lost_gpu_asks_for_a_reset() -> None:
    done = run_script(
        "idle", "--max-used-mib", "1024", "--from-dir", str(FIXTURES / "rtx-pro-6000-8gpu-lost")
    )
    assert done.returncode == 1
    assert "GPU 00000000:06:00.0: GPU is lost" in done.stderr
    assert "nvidia-smi -r -i" in done.stderr
    assert "pkill" not in done.stderr  # nothing to stop: the GPU itself is gone


def test_idle_requires_a_limit() -> None:
    done = run_script("idle")
    assert done.returncode == 2
    assert "--max-used-mib" in done.stderr


def test_facts_json_through_the_standin(tmp_path: Path) -> None:
    """The script run against the stand-in on PATH, as in a molecule container."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").symlink_to(STANDIN)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    env["NVIDIA_SMI_FIXTURE_DIR"] = str(FIXTURES / "rtx-pro-6000-8gpu-passthrough")
    env["NVIDIA_SMI_STANDIN_LOG"] = str(tmp_path / "calls.log")
    done = run_script("facts", "--json", "--disk", str(tmp_path), env=env)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["gpu_count"] == 8 and data["errors"] == [] and data["nvidia_smi_found"] is True
    assert data["disks"][0]["path"] == str(tmp_path)
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert calls == ["nvidia-smi " + " ".join(args) for args in gpufacts.FIXTURE_FILES.values()]


def test_standin_answers_exactly_the_recorded_invocations(tmp_path: Path) -> None:
    conf = tmp_path / "standin.conf"
    conf.write_text(f"NVIDIA_SMI_FIXTURE_DIR={FIXTURES / 'h200-1gpu'}\n")
    env = {"PATH": os.environ["PATH"], "NVIDIA_SMI_STANDIN_CONF": str(conf)}

    def standin(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(STANDIN), *args],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )

    for name, args in gpufacts.FIXTURE_FILES.items():
        done = standin(*args)
        assert done.returncode == 0
        assert done.stdout == (FIXTURES / "h200-1gpu" / name).read_text()
    assert standin("-L").returncode == 2
    assert standin("--query-gpu=index", "--format=csv,noheader,nounits").returncode == 2
    # A fixture's recorded exit status and stderr are replayed.
    conf.write_text(f"NVIDIA_SMI_FIXTURE_DIR={FIXTURES / 'rtx-pro-6000-8gpu-lost'}\n")
    done = standin(*gpufacts.QUERY_ARGS)
    assert done.returncode == 15 and "GPU is lost" in done.stderr


def test_standin_field_list_matches_gpufacts() -> None:
    namespace = runpy.run_path(str(STANDIN), run_name="nvidia_smi_standin")
    assert namespace["QUERY_FIELDS"] == ",".join(gpufacts.QUERY_FIELDS)


def test_script_is_stdlib_only() -> None:
    """Hosts have no sglang_deploy and no third-party packages."""
    allowed = set(sys.stdlib_module_names) | {"__future__"}
    imports = [
        line.split()[1].split(".")[0]
        for line in SCRIPT.read_text().splitlines()
        if line.startswith(("import ", "from "))
    ]
    assert imports and set(imports) <= allowed
