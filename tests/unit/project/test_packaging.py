"""The package builds without setuptools' warnings (scripts/setup printed 40 lines of them), the wheel carries
every data file the CLI reads at run time, and the CLI installed from it into a fresh venv works outside a
checkout (the project's Ansible content travels in the wheel: setup.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT

KEY = "a-key-for-the-test-0123456789"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(ROOT)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "warning" not in output.lower(), output
    (built,) = out.glob("sglang_deploy-*.whl")
    return built


def test_the_wheel_builds_quietly_with_its_data_files(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = [
        *(f"sglang_deploy/{p.relative_to(ROOT / 'src' / 'sglang_deploy')}" for p in (ROOT / "src" / "sglang_deploy").rglob("*")
          if p.suffix in {".yml", ".txt", ".json"} and "__pycache__" not in p.parts),
        *(f"sglang_deploy_host/{p.relative_to(ROOT / 'module_utils' / 'sglang_deploy_host')}"
          for p in (ROOT / "module_utils" / "sglang_deploy_host").rglob("*.yml")),
    ]  # fmt: skip
    assert wanted and not [name for name in wanted if name not in names]
    # The Ansible content a run needs, without caches: what project_dir() finds when no checkout is around.
    project = "sglang_deploy/_project"
    for name in ("site.yml", "ansible.cfg", "playbooks/render.yml", "roles/sglang_server/tasks/main.yml",
                 "library/sglang_wait_ready.py", "action_plugins/sglang_validate_tls.py", "filter_plugins/sglang_deploy.py",
                 "module_utils/sglang_deploy_host/serving/endpoint.py", "inventory/proxmox/hosts.yml", "tests/infra/test_endpoint.py"):
        assert f"{project}/{name}" in names, name
    assert not [name for name in names if "__pycache__" in name or "/artifacts/" in name]


def _nobodys(path: Path) -> Path:
    """A directory another user (nobody) owns: the test runs as root, as CI does (chown needs it)."""
    import pwd

    path.mkdir()
    uid = pwd.getpwnam("nobody").pw_uid
    os.chown(path, uid, uid)
    return path


def test_the_cli_installed_from_the_wheel_works_outside_a_checkout(wheel: Path, tmp_path: Path) -> None:
    """A fresh venv with the wheel (and its dependencies, from pip's configuration; uv's cache), an empty
    directory: `init` writes the starter inventory, `render` renders the shipped profile from it, the unit
    byte for byte the checkout's; the run's artifacts land in the state directory, not in the package."""
    venv = tmp_path / "venv"
    uv = str(Path(sys.executable).with_name("uv"))
    subprocess.run([uv, "venv", "-q", "-p", sys.executable, str(venv)], check=True, timeout=120)
    done = subprocess.run([uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), str(wheel)],
                          capture_output=True, text=True, timeout=900, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("SGLANG_DEPLOY_PROJECT", "VIRTUAL_ENV")}
    env.update(SGLANG_API_KEY=KEY, XDG_STATE_HOME=str(tmp_path / "state"), PATH=f"{venv / 'bin'}:/usr/bin:/bin")
    cli = str(venv / "bin" / "sglang-deploy")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([cli, *args], cwd=empty, env=env, capture_output=True, text=True, timeout=600, check=False)

    assert run("init", "site").returncode == 0
    done = run("render", "-i", "site", "--out", "out", "--no-validate")
    assert done.returncode == 0, done.stdout + done.stderr
    installed = next((venv / "lib").glob("python3*/site-packages/sglang_deploy/_project"))
    assert "cannot find the sglang-deploy project" not in done.stderr
    assert not (installed / "artifacts").exists() and (tmp_path / "state" / "sglang-deploy" / "artifacts" / "runs").is_dir()
    # A state directory that is a file, or another user's (issue 43): refused in one line before anything runs.
    (tmp_path / "a-file").write_text("")
    for state, needle in ((tmp_path / "a-file", "is a file, not a directory"), (_nobodys(tmp_path / "theirs"), "is owned by nobody")):
        refused = subprocess.run([cli, "render", "-i", "site", "--out", "out2", "--no-validate"], cwd=empty,
                                 env={**env, "SGLANG_DEPLOY_STATE": str(state)}, capture_output=True, text=True, timeout=600,
                                 check=False)  # fmt: skip
        assert refused.returncode == 2 and needle in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
        assert not (empty / "out2").exists()
    here = subprocess.run(
        [str(Path(sys.executable).with_name("sglang-deploy")), "render", "-i", "inventory/proxmox", "--out", str(tmp_path / "checkout"),
         "--no-validate"], cwd=ROOT, env={**os.environ, "SGLANG_API_KEY": KEY}, capture_output=True, text=True, timeout=600,
        check=False,
    )  # fmt: skip
    assert here.returncode == 0, here.stdout + here.stderr
    for name in ("sglang.service", "sglang.env"):
        assert (empty / "out" / "glm5-01" / name).read_bytes() == (tmp_path / "checkout" / "glm5-01" / name).read_bytes(), name
