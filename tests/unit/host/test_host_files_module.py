"""library/sglang_host_files.py by real Ansible: the programs systemd runs, and the watchdog's copy of the host
package with its domains' subpackages, installed from the source Ansible ships with the module; a module an older
flat layout left in that copy is removed; a second run changes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

PACKAGE = ROOT / "module_utils" / "sglang_deploy_host"
WATCHDOG_COPY = {
    "__init__.py", "watchdog.py", "fs/__init__.py", "fs/files.py", "gpu/__init__.py", "gpu/gpufacts.py",
    "serving/__init__.py", "serving/endpoint.py", "serving/sglang_launcher.py", "serving/systemd.py",
    "serving/unit_flags.py", "watch/__init__.py", "watch/model.py", "watch/observe.py",
}  # fmt: skip

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the module makes everything root-owned: run as root")


def _run(tmp_path: Path, args: dict[str, Any], *, check: bool = False) -> dict[str, Any]:
    (tmp_path / "hosts.yml").write_text(
        f"all:\n  hosts:\n    gpu-01:\n      ansible_connection: local\n      ansible_python_interpreter: {sys.executable}\n"
    )
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_STDOUT_CALLBACK": "json",
           "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-local"),
           "ANSIBLE_REMOTE_TEMP": str(tmp_path / "ansible-remote"), "ANSIBLE_NOCOLOR": "1"}  # fmt: skip
    argv = [str(Path(sys.executable).with_name("ansible")), "gpu-01", "-i", str(tmp_path / "hosts.yml"),
            "-m", "sglang_host_files", "-a", json.dumps(args), "--diff", *(["--check"] if check else [])]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, check=False)
    assert done.stdout.startswith("{"), done.stdout + done.stderr
    [result] = [task["hosts"]["gpu-01"] for play in json.loads(done.stdout)["plays"] for task in play["tasks"]]
    return result


def test_the_programs_and_the_watchdogs_package_copy_are_installed_from_the_source(tmp_path: Path) -> None:
    dest = tmp_path / "libexec"
    first = _run(tmp_path, {"dest": str(dest), "names": ["gpufacts", "sglang_launcher", "unitcheck", "watchdog"]})
    assert first.get("changed") is True and not first.get("failed"), first
    for name, source in (("gpufacts", "gpu/gpufacts"), ("sglang_launcher", "serving/sglang_launcher"),
                         ("unitcheck", "serving/unitcheck")):  # fmt: skip
        installed = dest / f"{name}.py"
        assert installed.read_bytes() == (PACKAGE / f"{source}.py").read_bytes(), name
        assert installed.stat().st_mode & 0o7777 == 0o755 and installed.stat().st_uid == 0
    copy = dest / "python" / "sglang_deploy_host"
    assert {str(p.relative_to(copy)) for p in copy.rglob("*.py")} == WATCHDOG_COPY
    for member in WATCHDOG_COPY:
        assert (copy / member).read_bytes() == (PACKAGE / member).read_bytes(), member
        assert (copy / member).stat().st_mode & 0o7777 == 0o644
    helped = subprocess.run([sys.executable, "-I", "-c", "import sys, runpy; sys.path.insert(0, sys.argv[1]); "
                             "sys.argv = ['w', '--help']; runpy.run_module('sglang_deploy_host.watchdog', run_name='__main__')",
                             str(dest / "python")], capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    assert helped.returncode == 0 and "check" in helped.stdout, helped.stderr
    again = _run(tmp_path, {"dest": str(dest), "names": ["gpufacts", "sglang_launcher", "unitcheck", "watchdog"]})
    assert again.get("changed") is False and again["changed_files"] == [], again


def test_a_module_left_by_the_flat_layout_is_removed_and_check_mode_only_says_so(tmp_path: Path) -> None:
    dest = tmp_path / "libexec"
    assert _run(tmp_path, {"dest": str(dest), "names": ["watchdog"]}).get("changed") is True
    copy = dest / "python" / "sglang_deploy_host"
    stale = [copy / "endpoint.py", copy / "serving" / "old.py"]
    for path in stale:
        path.write_text("# the flat layout's copy\n")
    checked = _run(tmp_path, {"dest": str(dest), "names": ["watchdog"]}, check=True)
    assert sorted(checked["changed_files"]) == sorted(map(str, stale)), checked
    assert all(path.exists() for path in stale), "check mode removed a file"
    done = _run(tmp_path, {"dest": str(dest), "names": ["watchdog"]})
    assert sorted(done["changed_files"]) == sorted(map(str, stale)), done
    assert not any(path.exists() for path in stale)
    assert {str(p.relative_to(copy)) for p in copy.rglob("*.py")} == WATCHDOG_COPY
