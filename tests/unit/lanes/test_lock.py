"""The lanes' ml-env locks (no network): committed locks match their lanes, stale ones are caught,
the real uv resolves a lane from a local index, and the ml-env's check (mlenv) works in a venv
that does not have this project, as the sglang_ml_env module runs it."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sglang_deploy.lanes import catalog, lock
from sglang_deploy.cli import main
from sglang_deploy.lanes.catalog import LaneError, LockSpec, Override, lane_names, load_lane
from sglang_deploy_host import interp
from sglang_deploy_host.stack import lockfile, mlenv

LOCKED_LANES = [name for name in lane_names() if load_lane(name).lock is not None]


# --- the committed locks ----------------------------------------------------------------------


def test_the_mission_lane_has_locks_for_debian_12_and_ubuntu_24_04() -> None:
    assert "cu128" in LOCKED_LANES
    spec = load_lane("cu128").lock
    assert spec is not None
    assert spec.pythons == ("3.11", "3.12")


@pytest.mark.parametrize("name", LOCKED_LANES)
def test_committed_locks_are_not_stale(name: str) -> None:
    """CI fails here when a lane's lock inputs change without `sglang-deploy lock`."""
    for target in lock.targets(load_lane(name)):
        assert lock.is_stale(target) is None, f"{lock.is_stale(target)}. Fix: sglang-deploy lock --lane {name}"


@pytest.mark.parametrize("name", LOCKED_LANES)
def test_committed_locks_pin_the_lane_with_hashes(name: str) -> None:
    lane = load_lane(name)
    for target in lock.targets(lane):
        text = lock.lock_path(target).read_text(encoding="utf-8")
        pins = lockfile.pins(text)
        assert {k: pins[k] for k in ("sglang", "torch", "sglang-kernel", "transformers")} == {
            "sglang": lane.sglang,
            "torch": lane.torch,
            "sglang-kernel": lane.sglang_kernel,
            "transformers": lane.transformers,
        }
        assert "flashinfer-python" in pins
        # glm_moe_dsa (GLM-5) first appears in transformers 5.2.0.
        assert tuple(int(p) for p in pins["transformers"].split(".")[:2]) >= (5, 2)
        # Every pin is followed by at least one hash: `uv pip sync --require-hashes` accepts it.
        blocks = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", text.count("\n# ") + 1)[-1])
        pinned_blocks = [b for b in blocks if lockfile.pins(b)]
        assert len(pinned_blocks) == len(pins)
        assert all("--hash=sha256:" in block for block in pinned_blocks)
        assert lockfile.header_fields(text) == {
            "lane": name,
            "python": target.python,
            "platform": lane.lock.platform,  # type: ignore[union-attr]
            "cuda": lane.cuda,
            "inputs-sha256": lock.inputs_digest(target),
        }


def test_cu128_lock_resolves_the_checked_stack() -> None:
    """docs/architecture.md, "Stack lanes": 182 packages, flashinfer 0.6.7.post3, triton 3.5.1, nccl 2.27.5."""
    pins = lockfile.pins(lock.lock_path(lock.targets(load_lane("cu128"))[0]).read_text())
    assert len(pins) == 182
    assert pins["flashinfer-python"] == "0.6.7.post3"
    assert pins["triton"] == "3.5.1"
    assert pins["nvidia-nccl-cu12"] == "2.27.5"


# --- the digest -------------------------------------------------------------------------------


def _target(**changes: object) -> lock.LockTarget:
    lane = load_lane("cu128")
    assert lane.lock is not None
    python = str(changes.pop("python", "3.11"))
    cuda = str(changes.pop("cuda", lane.cuda))
    return lock.LockTarget(dataclasses.replace(lane, cuda=cuda, lock=dataclasses.replace(lane.lock, **changes)), python)


@pytest.mark.parametrize(
    "changes",
    [
        {"requirements": ("sglang==0.5.10.post1", "torch==2.9.1")},
        {"overrides": (Override("transformers==5.3.0", "why"),)},
        {"python": "3.12"},
        {"platform": "x86_64-manylinux_2_28"},
        {"index_url": "https://mirror.invalid/simple"},
        {"exclude_newer": "2027-01-01T00:00:00Z"},
        {"cuda": "12.9"},
    ],
)
def test_every_input_changes_the_digest(changes: dict[str, object]) -> None:
    assert lock.inputs_digest(_target(**changes)) != lock.inputs_digest(_target())


def test_an_override_reason_is_documentation_not_an_input() -> None:
    one = _target(overrides=(Override("transformers==5.3.0", "one reason"),))
    other = _target(overrides=(Override("transformers==5.3.0", "another reason"),))
    assert lock.inputs_digest(one) == lock.inputs_digest(other)


def test_compile_argv_passes_overrides_and_cutoff_only_when_set() -> None:
    plain = lock.compile_argv(_target(exclude_newer=""), "uv")
    assert "--overrides" not in plain and "--exclude-newer" not in plain
    for option in ("--generate-hashes", "--no-build", "--no-header"):
        assert option in plain
    assert plain[plain.index("--python-version") + 1] == "3.11"
    assert plain[plain.index("--python-platform") + 1] == "x86_64-manylinux_2_36"
    full = lock.compile_argv(_target(overrides=(Override("transformers==5.3.0", "r"),)), "uv")
    assert full[full.index("--overrides") + 1] == "overrides.txt"
    assert full[full.index("--exclude-newer") + 1] == "2026-11-29T00:00:00Z"


# --- a lane locked for real with uv, from a local index ---------------------------------------


def _wheel(index: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    """A minimal pure-Python wheel in a PEP 503 directory index."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"VERSION = {version!r}\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(body.encode()).digest()).rstrip(b'=').decode()},{len(body)}"
        for path, body in files.items()
    ]
    files[f"{dist}/RECORD"] = "\n".join([*record, f"{dist}/RECORD,,"]) + "\n"
    project = index / name
    project.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(project / f"{name}-{version}-py3-none-any.whl", "w") as wheel:
        for path, body in files.items():
            wheel.writestr(path, body)
    links = "".join(f'<a href="{w.name}">{w.name}</a>' for w in sorted(project.glob("*.whl")))
    (project / "index.html").write_text(f"<html><body>{links}</body></html>")


LOCAL_LANE = """\
name: cu128
cuda: "12.8"
sglang: "1.0"
torch: "1.0"
sglang_kernel: "1.0"
transformers: "1.0"
required_archs: ["sm_120"]
validator: {{torch: "torch==1.0", torch_index: "", packages: [], stand_ins: []}}
lock:
  pythons: ["3.11"]
  platform: "x86_64-manylinux_2_36"
  index_url: "{index}"
  exclude_newer: ""
  requirements: ["app"]
  overrides: {overrides}
"""


@pytest.fixture
def local_lane(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A lane directory whose lane resolves `app` (needs `lib>=1`; lib 1.0 and 2.0 exist) locally."""
    index = tmp_path / "simple"
    _wheel(index, "app", "1.0", ("lib>=1",))
    _wheel(index, "lib", "1.0")
    _wheel(index, "lib", "2.0")
    lane_dir = tmp_path / "lanes"
    lane_dir.mkdir()
    (lane_dir / "cu128.yml").write_text(LOCAL_LANE.format(index=index.as_uri(), overrides="[]"))
    monkeypatch.setattr(catalog, "_lane_dir", lambda: lane_dir)
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    return lane_dir


def test_lock_command_writes_checks_and_detects_a_stale_lock(
    local_lane: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["lock", "--lane", "cu128"]) == 0
    written = local_lane / "locks" / "cu128-py3.11.txt"
    text = written.read_text()
    assert lockfile.pins(text) == {"app": "1.0", "lib": "2.0"}
    assert text.count("--hash=sha256:") == 2
    assert "written" in capsys.readouterr().out

    assert main(["lock", "--lane", "cu128", "--check"]) == 0
    assert main(["lock", "--lane", "cu128"]) == 0
    assert "unchanged" in capsys.readouterr().out

    # The override: lib is pinned back against app's own >=1 choice of the newest, with a reason.
    lane_file = local_lane / "cu128.yml"
    lane_file.write_text(
        lane_file.read_text().replace(
            "overrides: []", 'overrides: [{requirement: "lib==1.0", reason: "lib 2.0 breaks the model"}]'
        )
    )
    target = lock.targets(load_lane("cu128"))[0]
    assert "made from other inputs" in (lock.is_stale(target) or "")
    assert main(["lock", "--lane", "cu128", "--check"]) == 1
    assert "STALE" in capsys.readouterr().out
    assert main(["lock", "--lane", "cu128"]) == 0
    relocked = written.read_text()
    assert lockfile.pins(relocked)["lib"] == "1.0"
    assert "# override: lib==1.0 because lib 2.0 breaks the model" in relocked
    assert lock.is_stale(target) is None


def test_check_fails_when_the_index_now_resolves_differently(local_lane: Path) -> None:
    assert main(["lock", "--lane", "cu128"]) == 0
    index = Path(load_lane("cu128").lock.index_url.removeprefix("file://"))  # type: ignore[union-attr]
    _wheel(index, "lib", "3.0")
    target = lock.targets(load_lane("cu128"))[0]
    assert lock.check_lock(target).problem == "cu128-py3.11.txt: resolving its inputs again gives other pins or hashes"


def test_a_lane_without_lock_cannot_be_locked(local_lane: Path) -> None:
    lane_file = local_lane / "cu128.yml"
    lane_file.write_text(lane_file.read_text().split("lock:")[0])
    with pytest.raises(lock.LockError, match=r"lane cu128 has no lock: section"):
        lock.targets(load_lane("cu128"))


@pytest.mark.parametrize(
    ("replace", "error"),
    [
        ("overrides: []", 'overrides: [{requirement: "lib==1.0", reason: " "}]'),
        ('pythons: ["3.11"]', 'pythons: ["3"]'),
        ('  exclude_newer: ""\n', ""),
        ("overrides: []", 'overrides: [{requirement: "lib==1.0"}]'),
    ],
)
def test_malformed_lock_sections_are_refused(local_lane: Path, replace: str, error: str) -> None:
    lane_file = local_lane / "cu128.yml"
    lane_file.write_text(lane_file.read_text().replace(replace, error))
    with pytest.raises(LaneError, match=r"lanes/cu128\.yml: lock"):
        load_lane("cu128")


def test_lock_spec_is_parsed_from_the_lane_file() -> None:
    spec = load_lane("cu128").lock
    assert isinstance(spec, LockSpec)
    assert spec.index_url == "https://pypi.org/simple"
    assert "transformers>=5.2" in spec.requirements


# --- the ml-env's check (mlenv, stdlib only), in a venv without this project ---------------------


def test_pins_reads_pins_and_normalizes_names() -> None:
    text = "# header\nSglang_Kernel==0.4.1 \\\n    --hash=sha256:ab\n    # via sglang\nzope.interface==7.0 ; python_version >= '3'\n"
    assert lockfile.pins(text) == {"sglang-kernel": "0.4.1", "zope-interface": "7.0"}


def test_compare_versions_names_every_difference() -> None:
    problems = mlenv.compare_versions(
        {"torch": "2.9.1", "sglang": "0.5.10.post1", "six": "1.17.0"},
        {"torch": "2.9.0", "sglang": "0.5.10.post1", "pip": "25.0"},
    )
    assert problems == [
        "six==1.17.0 is in the lock but not installed",
        "torch is 2.9.0, the lock pins 2.9.1",
        "pip==25.0 is installed but not in the lock",
    ]


def _run_check(venv_python: str, lock_file: Path, *extra: str) -> tuple[int, dict[str, object]]:
    """mlenv's check as the sglang_ml_env module runs it: the venv's python, this package copied in."""
    proc = interp.run_module(
        venv_python, "stack.mlenv", ["check", "--lock", str(lock_file), *extra], names=list(mlenv.CHECK_MODULES), timeout=120
    )
    return proc.returncode, json.loads(proc.stdout)


def test_check_passes_on_a_venv_that_matches_its_lock_and_fails_otherwise(tmp_path: Path) -> None:
    """A real venv (python -m venv, no pip) whose only distribution is a wheel we install by hand."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    index = tmp_path / "simple"
    _wheel(index, "lib", "2.0")
    with zipfile.ZipFile(index / "lib" / "lib-2.0-py3-none-any.whl") as wheel:
        wheel.extractall(purelib)
    good = tmp_path / "good.txt"
    good.write_text("# cuda: 12.8\nlib==2.0 \\\n    --hash=sha256:00\n")
    rc, report = _run_check(python, good, "--import", "lib", "--import", "json")
    assert (rc, report["ok"], report["problems"], report["imported"]) == (0, True, [], ["lib", "json"])
    assert report["lock"] == {"cuda": "12.8"}
    assert report["site_packages"] == purelib

    bad = tmp_path / "bad.txt"
    bad.write_text("lib==1.0 \\\n    --hash=sha256:00\n")
    rc, report = _run_check(python, bad, "--import", "no_such_module", "--cuda", "12.8", "--model-type", "glm_moe_dsa")
    assert rc == 1 and report["ok"] is False
    problems = report["problems"]
    assert isinstance(problems, list)
    assert problems[0] == "lib is 2.0, the lock pins 1.0"
    assert problems[1].startswith("import no_such_module failed: ModuleNotFoundError")
    assert problems[2].startswith("cannot read torch.version.cuda: ModuleNotFoundError")
    assert problems[3].startswith("cannot read transformers' model types: ModuleNotFoundError")


def test_driver_imports_wait_for_a_driver(tmp_path: Path) -> None:
    lock_file = tmp_path / "empty.txt"
    lock_file.write_text("")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    rc, report = _run_check(str(venv / "bin" / "python"), lock_file, "--driver-import", "no_such_kernels")
    assert report["problems"][0] == f"{lock_file} holds no name==version pins"  # type: ignore[index]
    if mlenv.driver_present():
        assert any("import no_such_kernels failed" in p for p in report["problems"])  # type: ignore[union-attr]
    else:
        assert report["not_imported"] == {"no_such_kernels": "no NVIDIA driver (libcuda.so.1) on this host"}
    assert rc == 1


def _venv_dir(store: Path, name: str, mtime: float | None) -> Path:
    path = store / name
    path.mkdir()
    if mtime is not None:
        marker = path / mlenv.MARKER
        marker.write_text("{}")
        os.utime(marker, (mtime, mtime))
    return path


@pytest.mark.parametrize(("keep", "removed"), [(0, {"old", "older", "half"}), (1, {"older", "half"}), (5, {"half"})])
def test_prune_keeps_current_and_the_newest_complete_venvs(tmp_path: Path, keep: int, removed: set[str]) -> None:
    _venv_dir(tmp_path, "current", None)  # even without its marker, the current one is never removed
    _venv_dir(tmp_path, "old", 2000.0)
    _venv_dir(tmp_path, "older", 1000.0)
    _venv_dir(tmp_path, "half", None)
    # A hand-made venv moved into the store is the operator's: never removed, not counted.
    _venv_dir(tmp_path, f"{mlenv.PREEXISTING}20260101T000000Z", 3000.0)
    (tmp_path / "stray-file").write_text("")
    assert {p.name for p in mlenv.prune_plan(tmp_path, "current", keep)} == removed


def test_prune_keeps_the_venv_served_before_the_switch_first(tmp_path: Path) -> None:
    """The rollback target is what served until now, even when another venv was checked later."""
    _venv_dir(tmp_path, "new", None)
    _venv_dir(tmp_path, "served", 1000.0)
    _venv_dir(tmp_path, "built-later", 2000.0)
    assert [p.name for p in mlenv.prune_plan(tmp_path, "new", 1, previous="served")] == ["built-later"]


def test_prune_of_a_store_not_made_yet_removes_nothing(tmp_path: Path) -> None:
    """Check mode on a fresh host: the module lists what to prune before the store exists."""
    assert mlenv.prune_plan(tmp_path / "ml-env.d", "abc", 1) == []


def test_kernel_exemptions_need_a_reason(local_lane: Path) -> None:
    lane_file = local_lane / "cu128.yml"
    text = lane_file.read_text()
    lane_file.write_text(text + 'kernel_exemptions: [{object: "x/y.so", reason: "JIT-compiled instead"}]\n')
    assert [e.object for e in load_lane("cu128").kernel_exemptions] == ["x/y.so"]
    lane_file.write_text(text + 'kernel_exemptions: [{object: "x/y.so", reason: ""}]\n')
    with pytest.raises(LaneError, match=r"kernel_exemptions\[0\]: reason is empty"):
        load_lane("cu128")
