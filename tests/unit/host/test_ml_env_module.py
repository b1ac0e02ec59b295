"""The ml_env role's modules and lookup, run by real Ansible on this machine (local connection).

sglang_ml_env builds a tiny real lock (six from PyPI, resolved here by uv with hashes) with the
real uv, bootstrapped by pip from roles/ml_env/files/uv-bootstrap.txt, into directories under
tmp_path: check mode on nothing, build + switch, idempotence, a new lock beside the old one with
pruning, a failed check that keeps the old venv, a hand-made directory that is kept; then the
whole role the same way. sglang_kernel_proof runs on the committed nvcc-built fatbin fixtures.
The lookup's errors are called directly. Needs root (the module makes everything root-owned) and
PyPI (like `sglang-deploy lock`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Sequence

import pytest
from conftest import ROOT

from sglang_deploy.lanes import catalog, lock
from sglang_deploy_host.stack import lockfile, mlenv

PYTHON = "%d.%d" % sys.version_info[:2]
BIN = Path(sys.executable).parent
FATBIN_FIXTURES = ROOT / "tests" / "fixtures" / "fatbin"
UV_REQUIREMENTS = (ROOT / "roles" / "ml_env" / "files" / "uv-bootstrap.txt").read_text()
INDEX = "https://pypi.org/simple"
# One ansible run: a build of the tiny lock takes seconds; the bound only stops a hung index.
ANSIBLE_TIMEOUT_S = 600

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the module makes everything root-owned: run as root")


def _env(tmp: Path) -> dict[str, str]:
    return {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_STDOUT_CALLBACK": "default",
        "ANSIBLE_LOCAL_TEMP": str(tmp / "ansible-tmp"),
    }


def run_module(
    tmp: Path, name: str, args: dict[str, Any], *, check: bool = False, async_s: int = 0,
    env: dict[str, str] | None = None,
) -> tuple[dict[str, Any], str]:
    """``ansible localhost -m NAME`` (with --check --diff, or async as the role runs it); its
    result as --tree writes it, and what the callback printed (the diff)."""
    tree = tmp / f"tree-{len(list(tmp.glob('tree-*')))}"
    argv = [str(BIN / "ansible"), "localhost", "-i", "localhost,", "-c", "local"]
    argv += ["-e", f"ansible_python_interpreter={sys.executable}", "-m", name, "-a", json.dumps(args)]
    argv += ["--tree", str(tree)]
    argv += ["--check", "--diff"] if check else []
    argv += ["-B", str(async_s), "-P", "1"] if async_s else []
    proc = subprocess.run(
        argv, capture_output=True, text=True, env={**_env(tmp), **(env or {})}, cwd=tmp, timeout=ANSIBLE_TIMEOUT_S,
        check=False,
    )
    result_file = tree / "localhost"
    assert result_file.is_file(), proc.stdout + proc.stderr
    result = json.loads(result_file.read_text())
    # The tree of a failed async task has no "failed" key; ansible's exit status says it (2).
    assert proc.returncode in (0, 2), proc.stdout + proc.stderr
    result["failed"] = proc.returncode == 2
    return result, proc.stdout


# --- sglang_ml_env ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_lock() -> str:
    """six, resolved now from PyPI with hashes, under the header `sglang-deploy lock` writes."""
    proc = subprocess.run(
        [lock.uv_binary(), "pip", "compile", "-", "--generate-hashes", "--no-header", "--python-version", PYTHON,
         "--index-url", INDEX],
        input="six\n", capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "UV_NO_CONFIG": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    header = lockfile.format_header(
        lane="cu128", python=PYTHON, platform="x86_64-manylinux_2_36", uv_version="uv (test)",
        inputs_sha256="0" * 64, cuda="12.8",
    )  # fmt: skip
    return header + proc.stdout


def variant(text: str, name: str) -> str:
    """The same pins under another digest: a changed lock."""
    return f"{text}# variant {name}\n"


@pytest.fixture(scope="session")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """uv's bootstrap venv and cache, shared by the tests (each would fetch the same uv wheel)."""
    return tmp_path_factory.mktemp("shared")


@dataclass
class Host:
    root: Path
    shared: Path

    @property
    def path(self) -> Path:
        return self.root / "opt" / "ml-env"

    @property
    def store(self) -> Path:
        return self.root / "opt" / "ml-env.d"

    def args(self, lock_text: str, **changes: Any) -> dict[str, Any]:
        args = {
            "path": str(self.path),
            "store": str(self.store),
            "lock": lock_text,
            "lock_name": "six.txt",
            "python": sys.executable,
            "uv_venv": str(self.shared / "uv"),
            "uv_requirements": UV_REQUIREMENTS,
            "uv_cache_dir": str(self.shared / "uv-cache"),
            "index_url": INDEX,
            "keep": 1,
            "timeout": 300,
            "imports": ["six"],
        }
        return {**args, **changes}

    def venv(self, lock_text: str) -> Path:
        return self.store / lockfile.venv_name(lock_text)


@pytest.fixture
def host(tmp_path: Path, shared: Path) -> Host:
    return Host(tmp_path / "host", shared)


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


@needs_root
def test_check_mode_on_a_fresh_host_reports_everything_and_creates_nothing(tmp_path: Path, host: Host, tiny_lock: str) -> None:
    fresh = host.args(tiny_lock, uv_venv=str(host.root / "opt" / "uv"), uv_cache_dir=str(host.root / "cache" / "uv"))
    result, out = run_module(tmp_path, "sglang_ml_env", fresh, check=True)
    assert result["changed"] is True and not result["failed"], result
    venv = host.venv(tiny_lock)
    assert result["actions"] == [
        f"create {host.root / 'opt'} (root, 0755)",
        f"create {host.store} (root, 0755)",
        f"create {host.root / 'cache' / 'uv'} (root, 0700)",
        f"install uv 0.13.9 into {host.root / 'opt' / 'uv'} (pip, hashes checked)",
        f"build venv {venv} from six.txt (1 pinned packages, Python {PYTHON}, CUDA 12.8), then check it",
        f"switch {host.path} from nothing to {venv}",
    ]
    assert (result["switched"], result["venv"], result["report"]) == (True, str(venv), {})
    assert f"--- before: {host.path} (symlink target)\n+++ after: {host.path} (symlink target)" in out
    assert f"-absent\n+{venv}" in out
    assert f"-(no store)\n+{venv.name} (complete)" in out
    assert files_under(host.root) == []


@needs_root
def test_build_switch_then_nothing_to_do(tmp_path: Path, host: Host, tiny_lock: str) -> None:
    # Async, as the role runs it.
    result, _ = run_module(tmp_path, "sglang_ml_env", host.args(tiny_lock), async_s=300)
    assert result["changed"] is True and not result["failed"], result
    venv = host.venv(tiny_lock)
    assert os.readlink(host.path) == str(venv) and result["switched"] is True
    report = json.loads((venv / mlenv.MARKER).read_text())
    assert report == result["report"]
    assert (report["ok"], report["problems"], report["imported"], report["packages"]) == (True, [], ["six"], 1)
    assert report["lock"]["cuda"] == "12.8" and report["torch_cuda"] is None  # no torch pinned: no CUDA build
    assert (venv / mlenv.LOCK_NAME).read_text() == tiny_lock
    writable = [p for p in [venv, *venv.rglob("*")] if not p.is_symlink() and p.lstat().st_mode & 0o022]
    assert writable == []
    for directory in (host.store, host.path.parent):
        info = directory.stat()
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o755)
    assert stat.S_IMODE((host.shared / "uv-cache").stat().st_mode) == 0o700

    again, out = run_module(tmp_path, "sglang_ml_env", host.args(tiny_lock))
    assert (again["changed"], again["actions"], again["switched"], again["removed"]) == (False, [], False, [])
    assert again["report"] == report
    checked, out = run_module(tmp_path, "sglang_ml_env", host.args(tiny_lock), check=True)
    assert (checked["changed"], checked["actions"]) == (False, [])
    assert "--- before" not in out


@needs_root
def test_a_rebuild_with_the_kept_uv_cache_installs_offline_and_fetches_nothing(tmp_path: Path, host: Host, tiny_lock: str) -> None:
    # The first build with an empty cache of its own fetches six; a rebuilt host (a new store, the same
    # cache: the kept disk) installs the same lock from the cache alone, with no way out to the network
    # (every request goes to a proxy that refuses: the index would fail, as the last assert shows).
    cache = host.root / "kept" / "uv"
    first, _ = run_module(tmp_path, "sglang_ml_env", host.args(tiny_lock, uv_cache_dir=str(cache)))
    assert not first["failed"], first
    assert (first["uv"]["offline"], first["uv"]["cache_dir"]) == (False, str(cache))
    # six's wheel (11 KB) came in; what was there before is uv's own bookkeeping (interpreter info, tags).
    assert first["uv"]["fetched_bytes"] > 10_000 > first["uv"]["reused_bytes"]
    assert any(a.startswith(f"built {host.venv(tiny_lock)} from six.txt with the index: ") for a in first["actions"])
    rebuilt = Host(tmp_path / "rebuilt", host.shared)
    no_network = {name: "http://127.0.0.1:9" for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy")}
    no_network.update(NO_PROXY="", no_proxy="")
    args = rebuilt.args(tiny_lock, uv_cache_dir=str(cache))
    again, _ = run_module(tmp_path, "sglang_ml_env", args, async_s=300, env=no_network)
    assert not again["failed"] and again["switched"], again
    assert (again["uv"]["offline"], again["uv"]["fetched_bytes"]) == (True, 0)
    assert again["uv"]["reused_bytes"] >= first["uv"]["fetched_bytes"]
    assert (
        f"built {rebuilt.venv(tiny_lock)} from six.txt from the uv cache alone (--offline): 0 bytes fetched, "
        f"{again['uv']['reused_bytes']} bytes reused from {cache}; checked it"
    ) in again["actions"]
    assert json.loads((rebuilt.venv(tiny_lock) / mlenv.MARKER).read_text())["ok"] is True
    # The same without the kept cache: the index is needed, and out of reach.
    bare = Host(tmp_path / "bare", host.shared)
    failed, _ = run_module(tmp_path, "sglang_ml_env", bare.args(tiny_lock, uv_cache_dir=str(bare.root / "uv")), env=no_network)
    assert failed["failed"] is True and "(uv pip sync) failed" in failed["msg"], failed


@needs_root
def test_a_rebuild_with_the_store_on_the_kept_disk_reuses_the_venv_unless_its_python_differs(
    tmp_path: Path, host: Host, tiny_lock: str
) -> None:
    # The store and uv's cache on the kept disk, the symlink on the root disk: a rebuilt host has the
    # store but no symlink. The venv is switched to, not installed (and nothing can be fetched).
    kept = host.root / "kept"
    first, _ = run_module(tmp_path, "sglang_ml_env", host.args(tiny_lock, store=str(kept / "ml-env.d")))
    assert not first["failed"] and first["uv"]["reused_venv"] is False, first
    venv = kept / "ml-env.d" / lockfile.venv_name(tiny_lock)
    marker = (venv / mlenv.MARKER).stat().st_mtime_ns
    rebuilt = Host(tmp_path / "rebuilt", host.shared)
    no_network = {name: "http://127.0.0.1:9" for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy")}
    args = rebuilt.args(tiny_lock, store=str(kept / "ml-env.d"))
    plan, _ = run_module(tmp_path, "sglang_ml_env", args, check=True)
    assert plan["actions"][-2:] == [
        f"reuse the complete venv {venv} (kept; same lock, same Python build) once it passes a new venv's checks again",
        f"switch {rebuilt.path} from nothing to {venv}",
    ]
    again, _ = run_module(tmp_path, "sglang_ml_env", args, async_s=300, env=no_network)
    assert not again["failed"] and again["switched"], again
    assert again["uv"] == {
        "offline": True, "fetched_bytes": 0, "reused_bytes": 0, "cache_dir": str(host.shared / "uv-cache"),
        "reused_venv": True,
    }  # fmt: skip
    assert os.readlink(rebuilt.path) == str(venv) and (venv / mlenv.MARKER).stat().st_mtime_ns == marker
    assert again["report"] == json.loads((venv / mlenv.MARKER).read_text())

    # A rebuilt OS with another Python build: the kept venv is stale, so it is built again (from the cache).
    os.unlink(rebuilt.path)
    python = venv / "bin" / "python"
    target = os.readlink(python)
    python.unlink()
    python.write_text("#!/bin/sh\nprintf '3.11.99 (another build)'\n")
    python.chmod(0o755)
    other = Host(tmp_path / "other", host.shared)
    plan, _ = run_module(tmp_path, "sglang_ml_env", other.args(tiny_lock, store=str(kept / "ml-env.d")), check=True)
    stale = [a for a in plan["actions"] if "stale" in a]
    assert stale and "made by Python 3.11.99 (another build)" in stale[0], plan["actions"]
    result, _ = run_module(tmp_path, "sglang_ml_env", other.args(tiny_lock, store=str(kept / "ml-env.d")))
    assert not result["failed"] and result["uv"]["reused_venv"] is False, result
    assert python.is_symlink() and os.readlink(python) == target
    assert os.readlink(other.path) == str(venv)


def _marker(venv: Path, **changes: Any) -> None:
    report = json.loads((venv / mlenv.MARKER).read_text())
    (venv / mlenv.MARKER).write_text(json.dumps({**report, **changes}))


def _site(venv: Path) -> Path:
    return mlenv.site_packages(venv)


# How a kept venv can be other than its marker says: each must be caught before the switch.
TAMPERED = {
    "another lock inside": (lambda v: (v / mlenv.LOCK_NAME).write_text(variant((v / mlenv.LOCK_NAME).read_text(), "x")),
                            "is not the wanted lock"),
    "a planted module": (lambda v: (_site(v) / "sitecustomize.py").write_text("import os\n"),
                         "holds files no installed package lists: sitecustomize.py"),
    "a planted .pth": (lambda v: (_site(v) / "zz.pth").write_text("import os\n"), "no installed package lists: zz.pth"),
    "the import check's package missing": (lambda v: (_site(v) / "six.py").unlink(), "its check failed again"),
    "a marker saying only ok": (lambda v: (v / mlenv.MARKER).write_text('{"ok": true}'), "does not record a passed check"),
    "a marker of a failed check": (lambda v: _marker(v, ok=False, problems=["import six failed"]),
                                   "does not record a passed check (import six failed)"),
    "a file others may write": (lambda v: (_site(v) / "six.py").chmod(0o666), "six.py is not root's alone"),
}  # fmt: skip


@needs_root
@pytest.mark.parametrize("case", sorted(TAMPERED))
def test_a_kept_venv_is_switched_to_only_after_a_new_venvs_checks(tmp_path: Path, host: Host, tiny_lock: str, case: str) -> None:
    """A store entry that is not what its marker says is set aside (kept for inspection, never pruned) and the
    lock built beside it, saying why; the ml-env never points at it."""
    tamper, why = TAMPERED[case]
    kept = host.root / "kept" / "ml-env.d"
    assert not run_module(tmp_path, "sglang_ml_env", host.args(tiny_lock, store=str(kept)))[0]["failed"]
    venv = kept / lockfile.venv_name(tiny_lock)
    tamper(venv)
    rebuilt = Host(tmp_path / "rebuilt", host.shared)
    result, _ = run_module(tmp_path, "sglang_ml_env", rebuilt.args(tiny_lock, store=str(kept)))
    assert not result["failed"] and result["uv"]["reused_venv"] is False, result
    rejected = [p for p in kept.iterdir() if p.name.startswith(mlenv.REJECTED)]
    assert len(rejected) == 1 and rejected[0].name.startswith(f"{mlenv.REJECTED}{venv.name}-"), list(kept.iterdir())
    assert any(why in action for action in result["actions"]), result["actions"]
    # The new venv passes what the kept one did not, and is the one served; the rejected one stays.
    assert os.readlink(rebuilt.path) == str(venv) and mlenv.kept_venv_problem(venv, tiny_lock) == ""
    again, _ = run_module(tmp_path, "sglang_ml_env", rebuilt.args(tiny_lock, store=str(kept), keep=0))
    assert rejected[0].is_dir() and str(rejected[0]) not in again["removed"]


@needs_root
def test_a_new_lock_builds_beside_switches_prunes_and_rolls_back(tmp_path: Path, host: Host, tiny_lock: str) -> None:
    a, b, c = tiny_lock, variant(tiny_lock, "b"), variant(tiny_lock, "c")
    for text in (a, b):
        assert not run_module(tmp_path, "sglang_ml_env", host.args(text))[0]["failed"]
    assert os.readlink(host.path) == str(host.venv(b))
    assert sorted(p.name for p in host.store.iterdir()) == sorted([host.venv(a).name, host.venv(b).name])

    plan, out = run_module(tmp_path, "sglang_ml_env", host.args(c), check=True)
    assert plan["removed"] == [str(host.venv(a))]
    assert f"remove {host.venv(a)} (incomplete, or beyond keep)" in plan["actions"]
    assert f"-{host.venv(a).name} (complete)" in out and f"+{host.venv(c).name} (complete)" in out

    result, _ = run_module(tmp_path, "sglang_ml_env", host.args(c))
    assert (result["switched"], result["previous"], result["removed"]) == (True, str(host.venv(b)), [str(host.venv(a))])
    assert sorted(p.name for p in host.store.iterdir()) == sorted([host.venv(b).name, host.venv(c).name])

    # Rollback: the kept venv is switched back to, not rebuilt.
    marker = host.venv(b) / mlenv.MARKER
    built = marker.stat().st_mtime_ns
    back, _ = run_module(tmp_path, "sglang_ml_env", host.args(b))
    assert back["actions"] == [
        f"reused {host.venv(b)} (kept complete venv of six.txt, same Python build): nothing installed, its checks passed again",
        f"switch {host.path} from {host.venv(c)} to {host.venv(b)}",
    ]
    assert back["uv"]["reused_venv"] is True and back["uv"]["fetched_bytes"] == 0
    assert os.readlink(host.path) == str(host.venv(b)) and marker.stat().st_mtime_ns == built

    # keep 0: only the current venv stays; an incomplete (interrupted) build is removed too.
    (host.store / "0123456789abcdef").mkdir()
    pruned, _ = run_module(tmp_path, "sglang_ml_env", host.args(b, keep=0))
    assert pruned["changed"] is True
    assert sorted(pruned["removed"]) == sorted([str(host.store / "0123456789abcdef"), str(host.venv(c))])
    assert [p.name for p in host.store.iterdir()] == [host.venv(b).name]


@needs_root
def test_a_failed_check_removes_the_new_venv_and_keeps_the_old_one(tmp_path: Path, host: Host, tiny_lock: str) -> None:
    assert not run_module(tmp_path, "sglang_ml_env", host.args(tiny_lock))[0]["failed"]
    broken = variant(tiny_lock, "broken")
    result, _ = run_module(tmp_path, "sglang_ml_env", host.args(broken, imports=["six", "no_such_module"]), async_s=300)
    assert result["failed"] is True, result
    assert "import no_such_module failed: ModuleNotFoundError" in result["msg"]
    assert f"It was removed; {host.path} still points at {host.venv(tiny_lock)}." in result["msg"]
    assert "Fix the lock (sglang-deploy lock --lane cu128)" in result["msg"]
    assert result["switched"] is False
    assert not host.venv(broken).exists()
    assert os.readlink(host.path) == str(host.venv(tiny_lock))


@needs_root
def test_a_lock_that_does_not_install_fails_before_the_switch(tmp_path: Path, host: Host, tiny_lock: str) -> None:
    wrong_hash = re.sub(r"sha256:[0-9a-f]{64}", "sha256:" + "0" * 64, tiny_lock)
    result, _ = run_module(tmp_path, "sglang_ml_env", host.args(wrong_hash))
    assert result["failed"] is True
    assert f"installing six.txt into {host.venv(wrong_hash)} (uv pip sync) failed" in result["msg"]
    assert f"{host.path} was not switched (nothing served before)" in result["msg"]
    assert not host.path.exists() and not host.venv(wrong_hash).exists()


@needs_root
def test_a_hand_made_directory_is_kept_in_the_store(tmp_path: Path, host: Host, tiny_lock: str) -> None:
    host.path.mkdir(parents=True)
    (host.path / "hand-made.txt").write_text("the seeds' venv\n")
    failed, _ = run_module(tmp_path, "sglang_ml_env", host.args(tiny_lock, imports=["no_such_module"]))
    assert failed["failed"] is True
    assert f"{host.path} is still the directory it was (not moved)" in failed["msg"]
    assert (host.path / "hand-made.txt").is_file()

    plan, out = run_module(tmp_path, "sglang_ml_env", host.args(tiny_lock), check=True)
    assert any(a.startswith(f"move the directory {host.path} into {host.store}") for a in plan["actions"])
    assert f"-a directory\n+{host.venv(tiny_lock)}" in out
    result, _ = run_module(tmp_path, "sglang_ml_env", host.args(tiny_lock))
    assert not result["failed"], result
    (kept,) = [p for p in host.store.iterdir() if p.name.startswith(mlenv.PREEXISTING)]
    assert (kept / "hand-made.txt").read_text() == "the seeds' venv\n"
    assert json.loads((kept / mlenv.MARKER).read_text()) == {"preexisting": True, "moved_from": str(host.path)}
    assert os.readlink(host.path) == str(host.venv(tiny_lock))
    # Never pruned, whatever keep says.
    run_module(tmp_path, "sglang_ml_env", host.args(variant(tiny_lock, "next"), keep=0))
    assert kept.is_dir() and sorted(p.name for p in host.store.iterdir()) == sorted(
        [kept.name, host.venv(variant(tiny_lock, "next")).name]
    )


@needs_root
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"keep": -1}, "keep (ml_env_keep) is -1; set it to 0 or more"),
        ({"lock": "# cuda: 12.8\n"}, "six.txt holds no name==version pins"),
        ({"lock": "six==1.17.0 \\\n    --hash=sha256:00\n"}, "six.txt has no '# cuda:' header line"),
    ],
)
def test_bad_input_fails_before_anything_changes(
    tmp_path: Path, host: Host, tiny_lock: str, changes: dict[str, Any], message: str
) -> None:
    result, _ = run_module(tmp_path, "sglang_ml_env", host.args(tiny_lock, **changes))
    assert result["failed"] is True and message in result["msg"], result
    assert files_under(host.root) == []


@needs_root
def test_a_file_where_the_symlink_goes_is_refused(tmp_path: Path, host: Host, tiny_lock: str) -> None:
    host.path.parent.mkdir(parents=True)
    host.path.write_text("")
    result, _ = run_module(tmp_path, "sglang_ml_env", host.args(tiny_lock))
    assert f"{host.path} is neither a symlink nor a directory; move it away" in result["msg"]
    assert files_under(host.root) == ["opt", "opt/ml-env"]


# --- the role, with the same tiny lock -------------------------------------------------------


def run_role(tmp: Path, host: Host, lock_file: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    play = [{
        "hosts": "all",
        "gather_facts": False,
        "roles": [{
            "role": "ml_env",
            "ml_env_lock_file": str(lock_file),
            "ml_env_python": sys.executable,
            "ml_env_path": str(host.path),
            "ml_env_uv_venv": str(host.shared / "uv"),
            "ml_env_uv_cache_dir": str(host.shared / "uv-cache"),
            "ml_env_install_poll_s": 1,
            "ml_env_check_imports": ["six"],
            "ml_env_check_driver_imports": [],
            "ml_env_model_types": [],
            "ml_env_kernel_packages": [],
        }],
    }]  # fmt: skip
    (tmp / "play.yml").write_text(json.dumps(play))
    (tmp / "hosts.yml").write_text(
        f"all:\n  hosts:\n    gpu-01:\n      ansible_connection: local\n      ansible_python_interpreter: {sys.executable}\n"
    )
    return subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(tmp / "hosts.yml"), str(tmp / "play.yml"), *extra],
        capture_output=True, text=True, env=_env(tmp), cwd=tmp, timeout=ANSIBLE_TIMEOUT_S, check=False,
    )  # fmt: skip


def recap(proc: subprocess.CompletedProcess[str]) -> dict[str, int]:
    line = next(line for line in proc.stdout.splitlines() if line.startswith("gpu-01 "))
    return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", line)}


@needs_root
def test_the_role_checks_builds_and_converges(tmp_path: Path, host: Host, tiny_lock: str) -> None:
    lock_file = tmp_path / "six.txt"
    lock_file.write_text(tiny_lock)
    dry = run_role(tmp_path, host, lock_file, "--check", "--diff")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert recap(dry)["changed"] == 1 and files_under(host.root) == []
    assert f"+{host.venv(tiny_lock)}" in dry.stdout

    built = run_role(tmp_path, host, lock_file)
    assert built.returncode == 0, built.stdout + built.stderr
    assert os.readlink(host.path) == str(host.venv(tiny_lock))
    for extra in ([], ["--check", "--diff"]):
        again = run_role(tmp_path, host, lock_file, *extra)
        assert again.returncode == 0 and recap(again)["changed"] == 0, again.stdout


@needs_root
def test_the_role_refuses_a_lock_for_another_python(tmp_path: Path, host: Host, tiny_lock: str) -> None:
    lock_file = tmp_path / "other.txt"
    lock_file.write_text(tiny_lock.replace(f"for Python {PYTHON} on", "for Python 3.99 on"))
    proc = run_role(tmp_path, host, lock_file)
    assert proc.returncode != 0
    assert f"host gpu-01: lane cu128, Python {PYTHON}: {lock_file} is made for lane cu128, Python 3.99" in " ".join(
        proc.stdout.split()
    )
    assert files_under(host.root) == []


# --- sglang_kernel_proof ---------------------------------------------------------------------


@pytest.fixture
def kernel_site(tmp_path: Path) -> Path:
    """A site-packages with kernels made of objects nvcc compiled for known archs, and bare cubins."""
    site = tmp_path / "site-packages"
    package = site / "kern"
    (package / "sm100").mkdir(parents=True)
    shutil.copy(FATBIN_FIXTURES / "sm90a_sm120a.so", package / "ops.abi3.so")
    shutil.copy(FATBIN_FIXTURES / "sm100_sm120_ptx120.so", package / "sm100" / "ops.abi3.so")
    shutil.copy(FATBIN_FIXTURES / "no_cuda.so", package / "host_only.so")
    shutil.copy(FATBIN_FIXTURES / "ptx_only_compute120.so", package / "ptx.so")
    (site / "cubins" / "a").mkdir(parents=True)
    shutil.copy(FATBIN_FIXTURES / "sm120a.cubin", site / "cubins" / "a" / "k.cubin")
    return site


def proof(
    tmp_path: Path, site: Path, archs: list[str], exemptions: Sequence[str] = (), packages: Sequence[str] = ("kern",)
) -> dict[str, Any]:
    """sglang_kernel_proof's result (in check mode: it is read-only)."""
    args = {"path": str(site), "packages": list(packages), "required_archs": archs, "exemptions": list(exemptions)}
    return run_module(tmp_path, "sglang_kernel_proof", args, check=True)[0]


def test_kernel_proof_passes_when_every_object_with_cubins_has_the_arch(tmp_path: Path, kernel_site: Path) -> None:
    result = proof(tmp_path, kernel_site, ["sm_120"])
    assert not result["failed"], result
    assert result["required"] == ["kern/ops.abi3.so", "kern/sm100/ops.abi3.so"]  # no cubins: not judged
    assert result["archs"] == {"kern/ops.abi3.so": ["sm_90a", "sm_120a"], "kern/sm100/ops.abi3.so": ["sm_100", "sm_120"]}
    assert result["changed"] is False


def test_kernel_proof_names_each_object_without_the_arch_unless_exempt(tmp_path: Path, kernel_site: Path) -> None:
    result = proof(tmp_path, kernel_site, ["sm_90"])
    assert result["failed"] is True
    assert result["problems"] == ["kern/sm100/ops.abi3.so has no sm_90 cubin (has sm_100 sm_120)"]
    assert result["msg"].startswith(f"kernel proof of {kernel_site} for sm_90: ")
    exempt = proof(tmp_path, kernel_site, ["sm_90"], ["kern/sm100/*"])
    assert not exempt["failed"], exempt
    assert exempt["required"] == ["kern/ops.abi3.so"] and "kern/sm100/ops.abi3.so" in exempt["archs"]


def test_an_exempt_object_that_has_the_arch_fails_the_proof(tmp_path: Path, kernel_site: Path) -> None:
    result = proof(tmp_path, kernel_site, ["sm_120"], ["kern/sm100/ops.abi3.so", "cubins/**/*.cubin"])
    assert result["problems"] == [
        "cubins/**/*.cubin now has sm_120 (cubins sm_120a): drop cubins/**/*.cubin from the lane's kernel_exemptions",
        "kern/sm100/ops.abi3.so now has sm_120 (cubins sm_100 sm_120): "
        "drop kern/sm100/ops.abi3.so from the lane's kernel_exemptions",
    ]
    # Still true for another arch: the bare cubins outside `packages` are found through their glob.
    assert not proof(tmp_path, kernel_site, ["sm_100"], ["kern/ops.abi3.so", "cubins/**/*.cubin"])["failed"]


def test_an_exemption_that_matches_nothing_fails_the_proof(tmp_path: Path, kernel_site: Path) -> None:
    result = proof(tmp_path, kernel_site, ["sm_120"], ["kern/gone.so"])
    assert result["problems"] == [
        f"kernel_exemptions entry kern/gone.so matches no object with cubins under {kernel_site}: drop it from the lane"
    ]


def test_a_missing_or_empty_kernel_package_fails_the_proof(tmp_path: Path, kernel_site: Path) -> None:
    (kernel_site / "hostonly").mkdir()
    shutil.copy(FATBIN_FIXTURES / "no_cuda.so", kernel_site / "hostonly" / "x.so")
    result = proof(tmp_path, kernel_site, ["sm_120"], packages=["kern", "missing_kernels", "hostonly"])
    assert result["problems"] == [
        f"kernel package missing_kernels is not installed in {kernel_site}",
        f"kernel package hostonly has no object with CUDA cubins in {kernel_site / 'hostonly'}: nothing to prove",
    ]


def test_kernel_proof_reads_a_venvs_site_packages(tmp_path: Path, kernel_site: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "lib" / f"python{PYTHON}").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    kernel_site.rename(venv / "lib" / f"python{PYTHON}" / "site-packages")
    result = proof(tmp_path, venv, ["sm_120"])
    assert result["site_packages"] == str(venv / "lib" / f"python{PYTHON}" / "site-packages")
    assert result["required"] == ["kern/ops.abi3.so", "kern/sm100/ops.abi3.so"]


@pytest.mark.parametrize(
    ("archs", "packages", "message"),
    [
        (["sm120"], ["kern"], "not an SM architecture: 'sm120'"),
        (["sm_120"], ["kern/sub"], "kernel package 'kern/sub' is not a directory name"),
    ],
)
def test_kernel_proof_bad_input(tmp_path: Path, kernel_site: Path, archs: list[str], packages: list[str], message: str) -> None:
    result = proof(tmp_path, kernel_site, archs, packages=packages)
    assert result["failed"] is True and message in result["msg"]


# --- the lookup sglang_deploy_lane --------------------------------------------------------------


def _lookup_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sglang_deploy_lane", ROOT / "lookup_plugins" / "sglang_deploy_lane.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lookup = _lookup_module()


def test_lookup_returns_the_lane_and_its_lock() -> None:
    data = lookup.lane_data("cu128", "3.11", host="gpu-01")
    path = lock.lock_path(lock.LockTarget(catalog.load_lane("cu128"), "3.11"))
    text = path.read_text()
    assert {k: v for k, v in data.items() if k != "lock"} == {
        "name": "cu128",
        "cuda": "12.8",
        "required_archs": ["sm_120"],
        "kernel_exemptions": [e.object for e in catalog.load_lane("cu128").kernel_exemptions],
    }
    assert data["lock"] == {
        "path": str(path),
        "name": "cu128-py3.11.txt",
        "text": text,
        "header": lockfile.header_fields(text),
        "venv": lockfile.venv_name(text),
    }


def test_lookup_through_ansible(tmp_path: Path) -> None:
    expression = "{{ lookup('sglang_deploy_lane', 'cu130', python='3.12').lock.header }}"
    result, _ = run_module(tmp_path, "ansible.builtin.debug", {"msg": expression})
    assert result["msg"]["python"] == "3.12" and result["msg"]["cuda"] == "13.0"


@pytest.mark.parametrize(
    ("lane", "python", "message"),
    [
        ("cu999", "3.11", "host gpu-01: ml_env_lane: unknown lane 'cu999'; known lanes: cu128, cu130. Fix: set ml_env_lane"),
        ("cu128", "3.13", "host gpu-01: lane cu128, Python 3.13: the lane has no lock for this Python (cu128-py3.13.txt); "
                          "its locks: cu128-py3.11.txt, cu128-py3.12.txt. Fix: set ml_env_python to a Python the lane "
                          "lists under lock.pythons (3.11, 3.12)"),
        ("cu128", "3", "host gpu-01: lane cu128, Python 3: '3' is not a Python minor version"),
    ],
)  # fmt: skip
def test_lookup_errors_name_the_lane_the_python_and_the_fix(lane: str, python: str, message: str) -> None:
    with pytest.raises(lookup.AnsibleLookupError) as error:
        lookup.lane_data(lane, python, host="gpu-01")
    assert str(error.value).startswith(message)


def test_lookup_checks_an_explicit_lock_file(tmp_path: Path) -> None:
    with pytest.raises(lookup.AnsibleLookupError, match=r"ml_env_lock_file /nonexistent is not a file on the control node"):
        lookup.lane_data("cu128", "3.11", "/nonexistent")
    other = tmp_path / "other.txt"
    other.write_text(lock.lock_path(lock.LockTarget(catalog.load_lane("cu130"), "3.11")).read_text())
    with pytest.raises(lookup.AnsibleLookupError, match=r"is made for lane cu130, Python 3.11, CUDA 13.0"):
        lookup.lane_data("cu128", "3.11", str(other))
    assert lookup.lane_data("cu130", "3.11", str(other))["lock"]["path"] == str(other)


def test_lookup_refuses_a_stale_lock_and_a_lane_without_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lane_dir = tmp_path / "lanes"
    shutil.copytree(Path(str(catalog._lane_dir())), lane_dir)
    monkeypatch.setattr(catalog, "_lane_dir", lambda: lane_dir)
    lane_file = lane_dir / "cu128.yml"
    lane_file.write_text(lane_file.read_text().replace("    - transformers>=5.2\n", "    - transformers>=5.3\n"))
    with pytest.raises(lookup.AnsibleLookupError, match=r"made from other inputs.*Fix: run `sglang-deploy lock --lane cu128`"):
        lookup.lane_data("cu128", "3.11")
    lane_file.write_text(lane_file.read_text().split("\nlock:")[0].split("# The ml-env's lock")[0])
    with pytest.raises(lookup.AnsibleLookupError, match=r"the lane has no lock: section"):
        lookup.lane_data("cu128", "3.11")
