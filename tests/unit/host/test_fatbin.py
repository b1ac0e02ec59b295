"""The .nv_fatbin parser and ``sglang-deploy kernels`` on objects compiled with nvcc for known archs.

The committed fixtures (tests/fixtures/fatbin, made by its build.sh) let every test but the
rebuild run without nvcc; the rebuild test compiles them afresh with nvcc 13.0 (present on this
machine kind and on CI) and the cuobjdump tests hold the parser against NVIDIA's own tool.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT

from sglang_deploy import cli
from sglang_deploy_host.gpu import fatbin

FIXTURES = ROOT / "tests" / "fixtures" / "fatbin"
BUILD = FIXTURES / "build.sh"
SCRIPT = ROOT / "module_utils" / "sglang_deploy_host" / "gpu" / "fatbin.py"
NVCC = Path(os.environ.get("NVCC", "/usr/local/cuda-13.0/bin/nvcc"))

# What build.sh asks nvcc for, per fixture: (cubin targets, PTX targets).
EXPECTED: dict[str, tuple[set[str], set[str]]] = {
    "sm90a_sm120a.so": ({"sm_90a", "sm_120a"}, set()),
    "sm100_sm120_ptx120.so": ({"sm_100", "sm_120"}, {"compute_120"}),
    "sm89_sm120f_zstd.so": ({"sm_89", "sm_120f"}, set()),
    "ptx_only_compute120.so": (set(), {"compute_120"}),
    "no_cuda.so": (set(), set()),
    "sm120a.cubin": ({"sm_120a"}, set()),
}
FAT_OBJECTS = [name for name in EXPECTED if name.endswith(".so") and name != "no_cuda.so"]


CUOBJDUMP_WHEEL = "nvidia-cuda-cuobjdump==13.2.51"  # NVIDIA's cuobjdump from PyPI (340 KB)


@pytest.fixture(scope="session")
def cuobjdump() -> str:
    """NVIDIA's cuobjdump: $SGLANG_DEPLOY_CUOBJDUMP, PATH, a CUDA toolkit, the
    nvidia-cuda-cuobjdump wheel in this Python, or else that wheel fetched from PyPI into
    ~/.cache/sglang-deploy (the CUDA 13.0 pip toolkit here and on CI has no cuobjdump)."""
    candidates = [os.environ.get("SGLANG_DEPLOY_CUOBJDUMP", ""), shutil.which("cuobjdump") or ""]
    candidates += sorted(glob.glob("/usr/local/cuda*/bin/cuobjdump"), reverse=True)
    spec = importlib.util.find_spec("nvidia")
    bases = [Path.home() / ".cache" / "sglang-deploy" / "tools"]
    bases += [Path(p) / "nvidia" for p in spec.submodule_search_locations or []] if spec is not None else []
    for base in bases:
        candidates += sorted(glob.glob(f"{base}/**/cu*/bin/cuobjdump", recursive=True), reverse=True)
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    cache = Path.home() / ".cache" / "sglang-deploy" / "tools" / CUOBJDUMP_WHEEL.replace("==", "-")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(cache), CUOBJDUMP_WHEEL],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"cuobjdump not found and {CUOBJDUMP_WHEEL} not fetched:\n{proc.stderr}"
    (wheel,) = cache.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        member = next(n for n in archive.namelist() if n.endswith("/bin/cuobjdump"))
        tool = Path(archive.extract(member, cache))
    tool.chmod(0o755)
    return str(tool)


def _cuobjdump_list(tool: str, path: Path, kind: str) -> list[str]:
    """Targets that ``cuobjdump --list-elf``/``--list-ptx`` prints, in file order ('sm_120a')."""
    proc = subprocess.run(
        [tool, f"--list-{kind}", str(path)], check=False, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    suffix = "cubin" if kind == "elf" else "ptx"
    return re.findall(rf"\.(sm_\d+a?)\.{suffix}$", proc.stdout, flags=re.MULTILINE)


def _as_cuobjdump_names(entries: list[fatbin.FatbinEntry], *, ptx: bool) -> list[str]:
    # cuobjdump 13.2 prints "a" but not "f" (sm_120f is listed as sm_120), PTX as sm_N too.
    return [f"sm_{e.target.sm}{e.target.variant.replace('f', '')}" for e in entries if e.target.ptx == ptx]


def _script(*args: str) -> subprocess.CompletedProcess[str]:
    # -I -S: isolated, no site-packages, as on a target host where only the stdlib exists.
    return subprocess.run(
        [sys.executable, "-I", "-S", str(SCRIPT), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def fresh_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixtures compiled now with nvcc (a failure, not a skip, without it: CI has nvcc)."""
    assert NVCC.is_file(), f"nvcc not found at {NVCC} (set NVCC): needed to rebuild the fixtures"
    out = tmp_path_factory.mktemp("fatbin-build")
    proc = subprocess.run(
        ["bash", str(BUILD), str(out)],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NVCC": str(NVCC)},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_committed_fixture_targets(name: str) -> None:
    report = fatbin.scan_file(FIXTURES / name)
    assert (report.cubins, report.ptx) == EXPECTED[name]


def test_committed_fixtures_are_small() -> None:
    for name in EXPECTED:
        assert (FIXTURES / name).stat().st_size < 50_000, name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fresh_nvcc_build_parses_to_the_requested_targets(fresh_build: Path, name: str) -> None:
    report = fatbin.scan_file(fresh_build / name)
    assert (report.cubins, report.ptx) == EXPECTED[name]


@pytest.mark.parametrize("where", ["committed", "fresh"])
@pytest.mark.parametrize("name", FAT_OBJECTS)
def test_entries_match_cuobjdump_in_order(
    where: str, name: str, cuobjdump: str, request: pytest.FixtureRequest
) -> None:
    base = FIXTURES if where == "committed" else request.getfixturevalue("fresh_build")
    tool = cuobjdump
    entries = fatbin.read_entries(base / name)
    assert _as_cuobjdump_names(entries, ptx=False) == _cuobjdump_list(tool, base / name, "elf")
    assert _as_cuobjdump_names(entries, ptx=True) == _cuobjdump_list(tool, base / name, "ptx")


def test_bare_cubin_variant_matches_cuobjdump(cuobjdump: str) -> None:
    # ptxas 13.0 writes the same e_flags for sm_120 and sm_120a; the "a" comes from its note.
    assert _cuobjdump_list(cuobjdump, FIXTURES / "sm120a.cubin", "elf") == ["sm_120a"]
    assert fatbin.cubin_sm((FIXTURES / "sm120a.cubin").read_bytes()) == (120, False)
    assert fatbin.scan_file(FIXTURES / "sm120a.cubin").cubins == {"sm_120a"}


def test_compressed_entries_keep_their_target_in_the_entry_header() -> None:
    entries = fatbin.read_entries(FIXTURES / "sm89_sm120f_zstd.so")
    assert entries and all(e.compressed for e in entries)
    assert {e.target.name for e in entries} == {"sm_89", "sm_120f"}
    stored = fatbin.read_entries(FIXTURES / "sm90a_sm120a.so")
    assert stored and not any(e.compressed for e in stored)


def test_object_without_device_code() -> None:
    assert fatbin.read_entries(FIXTURES / "no_cuda.so") == []
    assert not fatbin.scan_file(FIXTURES / "no_cuda.so").has_device_code


def test_section_table_agrees_with_readelf() -> None:
    path = FIXTURES / "sm90a_sm120a.so"
    proc = subprocess.run(["readelf", "-SW", str(path)], capture_output=True, text=True, check=True)
    line = next(line for line in proc.stdout.splitlines() if " .nv_fatbin " in line)
    fields = line.split("]", 1)[1].split()
    # Name Type Address Off Size
    assert fatbin.elf_sections(path.read_bytes())[".nv_fatbin"] == (int(fields[3], 16), int(fields[4], 16))


@pytest.mark.parametrize(
    ("archs", "required", "met"),
    [
        ({"sm_120"}, "sm_120", True),
        ({"sm_120a"}, "sm_120", True),
        ({"sm_120f"}, "sm_120", True),
        ({"sm_121"}, "sm_120", False),
        ({"sm_90a", "sm_100a"}, "sm_120", False),
        ({"sm_12"}, "sm_120", False),
        ({"sm_120"}, "sm_120a", False),
        ({"sm_120f"}, "sm_120a", False),
        ({"sm_120a"}, "sm_120a", True),
        ({"sm_120a"}, "sm_120f", True),
        ({"sm_120f"}, "sm_120f", True),
        ({"sm_120"}, "sm_120f", False),
        ({"compute_120"}, "sm_120", False),
    ],
)
def test_require_rules(archs: set[str], required: str, met: bool) -> None:
    assert fatbin.meets(archs, required) is met


@pytest.mark.parametrize("bad", ["120", "sm120", "sm_120b", "compute_120", ""])
def test_require_rejects_what_is_not_an_sm_arch(bad: str) -> None:
    with pytest.raises(ValueError, match="not an SM architecture"):
        fatbin.meets({"sm_120"}, bad)


def _patched(tmp_path: Path, name: str, at: int, value: bytes) -> Path:
    """A copy of a fixture with ``value`` written ``at`` bytes into its .nv_fatbin section."""
    data = bytearray((FIXTURES / name).read_bytes())
    offset, _ = fatbin.elf_sections(bytes(data))[".nv_fatbin"]
    data[offset + at : offset + at + len(value)] = value
    path = tmp_path / name
    path.write_bytes(bytes(data))
    return path


def test_bad_magic_is_an_error(tmp_path: Path) -> None:
    path = _patched(tmp_path, "sm90a_sm120a.so", 0, struct.pack("<I", 0x12345678))
    with pytest.raises(fatbin.FatbinError, match="no fat binary magic"):
        fatbin.scan_file(path)


def test_container_larger_than_its_section_is_an_error(tmp_path: Path) -> None:
    path = _patched(tmp_path, "sm90a_sm120a.so", 8, struct.pack("<Q", 1 << 40))
    with pytest.raises(fatbin.FatbinError, match="runs past"):
        fatbin.scan_file(path)


def test_header_arch_is_checked_against_a_stored_cubin(tmp_path: Path) -> None:
    # The first entry's SM number (container header 16 + entry offset 28) says 100; its ELF says 90.
    path = _patched(tmp_path, "sm90a_sm120a.so", 16 + 28, struct.pack("<I", 100))
    with pytest.raises(fatbin.FatbinError, match="header says SM 100, its ELF image says SM 90"):
        fatbin.scan_file(path)


def test_venv_scan_reads_site_packages_only(tmp_path: Path) -> None:
    venv = tmp_path / "ml-env"
    site = venv / "lib" / "python3.11" / "site-packages"
    (site / "pkg").mkdir(parents=True)
    (venv / "include").mkdir()
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    shutil.copy(FIXTURES / "sm90a_sm120a.so", site / "pkg" / "ops.abi3.so")
    shutil.copy(FIXTURES / "sm100_sm120_ptx120.so", venv / "include" / "outside.so")
    (site / "pkg" / "ops.so.1").symlink_to("ops.abi3.so")  # a symlink is not read twice
    (site / "pkg" / "linker-script.so").write_text("INPUT(-lfoo)\n")  # not ELF: skipped
    shutil.copy(FIXTURES / "no_cuda.so", site / "pkg" / "plain.so")
    result = fatbin.scan([venv])
    assert result.errors == []
    assert {r.path: r.cubins for r in result.reports} == {site / "pkg" / "ops.abi3.so": {"sm_90a", "sm_120a"}}


def test_script_json_maps_objects_to_sorted_archs() -> None:
    proc = _script("--json", str(FIXTURES))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {
        str(FIXTURES / "ptx_only_compute120.so"): ["compute_120"],
        str(FIXTURES / "sm100_sm120_ptx120.so"): ["sm_100", "sm_120", "compute_120"],
        str(FIXTURES / "sm89_sm120f_zstd.so"): ["sm_89", "sm_120f"],
        str(FIXTURES / "sm90a_sm120a.so"): ["sm_90a", "sm_120a"],
    }


def test_script_table() -> None:
    proc = _script(str(FIXTURES), str(FIXTURES / "sm120a.cubin"))
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line.split()[1:] for line in proc.stdout.splitlines()[1:]}
    assert rows[str(FIXTURES / "sm90a_sm120a.so")] == ["sm_90a", "sm_120a", "-"]
    assert rows[str(FIXTURES / "ptx_only_compute120.so")] == ["-", "compute_120", "PTX", "only"]
    assert rows[str(FIXTURES / "sm120a.cubin")] == ["sm_120a", "-"]
    assert str(FIXTURES / "no_cuda.so") not in rows


@pytest.mark.parametrize(
    ("required", "rc", "missing"),
    [
        ("sm_120", 0, set()),
        ("sm_120f", 1, {"sm100_sm120_ptx120.so"}),
        ("sm_120a", 1, {"sm100_sm120_ptx120.so", "sm89_sm120f_zstd.so"}),
        ("sm_90", 1, {"sm100_sm120_ptx120.so", "sm89_sm120f_zstd.so"}),  # sm_90a meets sm_90
        ("sm_100a", 1, {"sm100_sm120_ptx120.so", "sm89_sm120f_zstd.so", "sm90a_sm120a.so"}),
    ],
)
def test_script_require_exit_status(required: str, rc: int, missing: set[str]) -> None:
    proc = _script("--require", required, str(FIXTURES))
    assert proc.returncode == rc, proc.stdout + proc.stderr
    named = {
        Path(line.split(":")[0]).name for line in proc.stderr.splitlines() if f"no {required} cubin" in line
    }
    assert named == missing  # the PTX-only object never fails --require


def test_script_require_without_device_code_is_status_3() -> None:
    proc = _script("--require", "sm_120", str(FIXTURES / "no_cuda.so"))
    assert proc.returncode == 3, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--require", "sm120", str(FIXTURES)],
        [str(FIXTURES / "does-not-exist")],
        [str(FIXTURES / "kernel.cu")],  # named explicitly, so not skipped like a non-ELF .so in a walk
    ],
)
def test_script_bad_input_is_status_2(args: list[str]) -> None:
    proc = _script(*args)
    assert proc.returncode == 2, proc.stdout + proc.stderr


def test_script_malformed_object_is_status_2(tmp_path: Path) -> None:
    path = _patched(tmp_path, "sm90a_sm120a.so", 0, struct.pack("<I", 0x12345678))
    proc = _script("--require", "sm_120", str(path))
    assert proc.returncode == 2
    assert f"{path}: no fat binary magic" in proc.stderr


def test_script_cubins_sums_up_a_directory_of_cubins(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        shutil.copy(FIXTURES / "sm120a.cubin", tmp_path / name / "k.cubin")
    proc = _script("--json", "--cubins", "--require", "sm_120a", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {str(tmp_path / "**" / "*.cubin"): ["sm_120a"]}
    assert json.loads(_script("--json", str(tmp_path)).stdout) == {}  # without --cubins: not read


def test_sglang_deploy_kernels_command(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["kernels", "--json", "--require", "sm_120a", str(FIXTURES / "sm90a_sm120a.so")])
    assert rc == 0
    assert json.loads(capsys.readouterr().out) == {str(FIXTURES / "sm90a_sm120a.so"): ["sm_90a", "sm_120a"]}
    assert cli.main(["kernels", "--require", "sm_120a", str(FIXTURES / "sm100_sm120_ptx120.so")]) == 1


@pytest.mark.parametrize(
    ("abi_version", "e_flags", "expected"),
    [
        (8, 0x0600670A, (103, True)),  # flashinfer-cubin 0.6.7.post3 (CUDA 12.9): sm_103a per cuobjdump
        (8, 0x06006402, (100, False)),  # the same wheel's sm_100 cubins
        (8, 0x06007802, (120, False)),  # ptxas 13.0, sm_120 and sm_120a alike
        (7, 0x005A0D5A, (90, True)),  # pre-ABI-8 layout: SM in the low byte, "a" = 0x800
        (7, 0x0050055A, (90, False)),
    ],
)
def test_cubin_e_flags_layouts(abi_version: int, e_flags: int, expected: tuple[int, bool]) -> None:
    image = bytearray((FIXTURES / "sm120a.cubin").read_bytes())
    image[8] = abi_version
    struct.pack_into("<I", image, 48, e_flags)
    assert fatbin.cubin_sm(bytes(image)) == expected


def test_non_cuda_elf_is_not_a_cubin() -> None:
    with pytest.raises(fatbin.FatbinError, match="not CUDA"):
        fatbin.cubin_sm((FIXTURES / "no_cuda.so").read_bytes())


# --- only regular files, under a cap ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "/dev/urandom", "directory"])
def test_what_is_not_a_regular_file_is_not_opened(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "ops.so"
    if kind == "fifo":
        os.mkfifo(path)  # no writer: a plain open would wait forever
    elif kind == "directory":
        path.mkdir()
    else:
        path = Path(kind)
    with pytest.raises(fatbin.UnreadableFileError, match="a directory|not a regular file"):
        fatbin.open_regular_file(path)


def test_a_file_over_the_cap_is_not_opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "huge.so"
    with path.open("wb") as handle:
        handle.truncate(fatbin.MAX_OBJECT_BYTES + 1)  # sparse
    with pytest.raises(fatbin.UnreadableFileError, match="4,294,967,297 bytes, more than the 4,294,967,296"):
        fatbin.scan_file(path)
    monkeypatch.setattr(fatbin, "MAX_OBJECT_BYTES", 100)
    with pytest.raises(fatbin.UnreadableFileError, match="more than the 100 this reads"):
        fatbin.read_entries(FIXTURES / "sm90a_sm120a.so")
    with fatbin.open_regular_file(FIXTURES / "sm90a_sm120a.so", max_bytes=1 << 30) as handle:
        assert handle.read(4) == fatbin.ELF_MAGIC


def test_a_named_path_that_is_not_a_regular_file_is_an_error(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo.so")
    result = fatbin.scan([tmp_path / "fifo.so", Path("/dev/zero"), tmp_path / "missing.so"])
    assert result.reports == []
    assert result.errors == [
        f"{tmp_path / 'fifo.so'}: not a regular file (a device, pipe or socket)",
        "/dev/zero: not a regular file (a device, pipe or socket)",
        f"{tmp_path / 'missing.so'}: no such file or directory",
    ]


def test_a_walk_skips_what_is_not_a_regular_file_and_refuses_what_is_too_large(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    shutil.copy(FIXTURES / "sm90a_sm120a.so", tree / "pkg" / "ops.so")
    os.mkfifo(tree / "pkg" / "fifo.so")
    (tree / "pkg" / "zero.so").symlink_to("/dev/zero")
    (tree / "dev").symlink_to("/dev", target_is_directory=True)  # not followed
    result = fatbin.scan([tree])
    assert result.errors == []
    assert [r.path for r in result.reports] == [tree / "pkg" / "ops.so"]
    monkeypatch.setattr(fatbin, "MAX_OBJECT_BYTES", 100)
    result = fatbin.scan([tree])
    assert result.reports == []
    assert result.errors == [f"{tree / 'pkg' / 'ops.so'}: {(tree / 'pkg' / 'ops.so').stat().st_size:,} bytes, more than the 100 this reads"]


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_script_refuses_a_device_in_one_line(json_flag: list[str]) -> None:
    proc = _script(*json_flag, "/dev/zero")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == "error: /dev/zero: not a regular file (a device, pipe or socket)\n"
