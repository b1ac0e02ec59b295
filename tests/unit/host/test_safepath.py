"""Root manages a directory only through directories and links root alone controls
(module_utils/sglang_deploy_host/safepath.py, the module sglang_directory).

The attack these stop: the service user owns a directory root manages things in; between two runs it
replaces an entry with a link to a system directory, and root's next chown/chmod lands there. The tests
plant exactly that (as root, giving directories to an unprivileged uid) and show the target untouched.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from sglang_deploy_host import safepath

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root: run as root")

SERVICE_UID = 65534  # nobody: a user that is not root


@pytest.fixture
def anchor(tmp_path: Path) -> Path:
    """A root-owned 0755 directory standing for "/" (the real / is checked in molecule)."""
    tmp_path.chmod(0o755)
    return tmp_path


def _state(path: Path) -> tuple[int, int, int]:
    info = path.lstat()
    return info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)


def _ensure(path: Path, anchor: Path, uid: int = 0, mode: int = 0o755, **kwargs: object) -> dict:
    return safepath.ensure_directory(str(path), uid, 0, mode, "sglang_test_dir", anchor=str(anchor), **kwargs)  # type: ignore[arg-type]


def test_missing_directories_are_made_root_above_and_the_owner_asked_at_the_end(anchor: Path) -> None:
    done = _ensure(anchor / "data" / "home", anchor, uid=SERVICE_UID, mode=0o700)
    assert done["changed"] and done["created"] == [str(anchor / "data"), str(anchor / "data" / "home")]
    assert _state(anchor / "data") == (0, 0, 0o755)
    assert _state(anchor / "data" / "home") == (SERVICE_UID, 0, 0o700)
    again = _ensure(anchor / "data" / "home", anchor, uid=SERVICE_UID, mode=0o700)
    assert not again["changed"] and again["created"] == []


def test_a_link_planted_by_the_service_user_is_not_followed_and_its_target_untouched(anchor: Path) -> None:
    """The old layout: the service's home held the models root; the service swapped it for a link."""
    victim = anchor / "etc-like"
    victim.mkdir(mode=0o755)
    home = anchor / "home"
    home.mkdir()
    os.chown(home, SERVICE_UID, 0)
    planted = home / "models"
    planted.symlink_to(victim)
    os.lchown(planted, SERVICE_UID, 0)
    with pytest.raises(safepath.UntrustedPathError, match=r"home on the way is owned by nobody with mode 0755"):
        _ensure(planted, anchor, uid=SERVICE_UID, mode=0o700)
    assert _state(victim) == (0, 0, 0o755)
    # Even in a root-owned directory, a link the service user owns (it could have replaced the whole
    # directory before it was root's) is not followed.
    os.chown(home, 0, 0)
    with pytest.raises(safepath.UntrustedPathError, match=r"models is a link owned by nobody, not root"):
        _ensure(planted, anchor, uid=SERVICE_UID, mode=0o700)
    assert _state(victim) == (0, 0, 0o755)


def test_a_directory_others_may_write_is_refused_on_the_way(anchor: Path) -> None:
    shared = anchor / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # /tmp's mode
    with pytest.raises(safepath.UntrustedPathError, match=r"shared on the way is owned by root with mode 1777"):
        _ensure(shared / "cache", anchor)
    assert not (shared / "cache").exists()
    group = anchor / "group"
    group.mkdir()
    os.chown(group, 0, 50)  # staff on Debian
    group.chmod(0o2775)
    with pytest.raises(safepath.UntrustedPathError, match="group on the way"):
        _ensure(group / "cache", anchor)


def test_an_operators_root_owned_link_is_followed_and_its_target_checked(anchor: Path) -> None:
    data = anchor / "data"
    data.mkdir()
    (anchor / "models").symlink_to(data)  # root's, in a root-only directory: put there by an administrator
    done = _ensure(anchor / "models", anchor, mode=0o750)
    assert done["path"] == str(data) and _state(data) == (0, 0, 0o750)
    done = _ensure(anchor / "models" / "repo", anchor)
    assert done["path"] == str(data / "repo") and (data / "repo").is_dir()
    # A root-owned link into a directory another user may write is refused all the same.
    loose = anchor / "loose"
    loose.mkdir()
    os.chown(loose, SERVICE_UID, 0)
    (anchor / "to-loose").symlink_to(loose)
    with pytest.raises(safepath.UntrustedPathError, match="loose on the way is owned by nobody"):
        _ensure(anchor / "to-loose" / "x", anchor)


def test_the_directory_itself_may_be_the_services_and_is_adjusted_without_following(anchor: Path) -> None:
    """The JIT key directory and the home are given to the service: root sets their owner and mode, and a
    directory there that the service already owns is taken as it is, not through a link."""
    key = anchor / "jit" / "0123456789abcdef"
    key.parent.mkdir()
    key.mkdir()
    os.chown(key, SERVICE_UID, 0)
    key.chmod(0o777)
    done = _ensure(key, anchor, uid=SERVICE_UID, mode=0o700)
    assert done["changed"] and done["before"] == {"uid": SERVICE_UID, "gid": 0, "mode": "0777"}
    assert _state(key) == (SERVICE_UID, 0, 0o700)
    # Something that is not a directory there is refused.
    (anchor / "jit" / "file").write_text("x")
    with pytest.raises(safepath.UntrustedPathError, match="is not a directory"):
        _ensure(anchor / "jit" / "file", anchor)


def test_check_mode_changes_nothing(anchor: Path) -> None:
    done = _ensure(anchor / "a" / "b", anchor, dry_run=True)
    assert done["changed"] and done["created"] == [str(anchor / "a"), str(anchor / "a" / "b")]
    assert not (anchor / "a").exists()


def test_the_ansible_module_refuses_an_untrusted_way_naming_the_variable(anchor: Path) -> None:
    """`ansible -m sglang_directory` as the roles run it, on a real path from /: the test's directory lies
    under /tmp, which any user may write, so the module refuses before creating anything."""
    (anchor / "hosts.yml").write_text(
        f"all:\n  hosts:\n    h:\n      ansible_connection: local\n      ansible_python_interpreter: {sys.executable}\n"
    )
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_STDOUT_CALLBACK": "json",
           "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_LOCAL_TEMP": str(anchor / "a-local"),
           "ANSIBLE_REMOTE_TEMP": str(anchor / "a-remote"), "ANSIBLE_NOCOLOR": "1"}  # fmt: skip
    args = {"path": str(anchor / "cache"), "owner": "nobody", "mode": "0700", "variable": "sglang_server_jit_cache_root"}
    done = subprocess.run(
        [str(Path(sys.executable).with_name("ansible")), "h", "-i", str(anchor / "hosts.yml"), "-m", "sglang_directory",
         "-a", json.dumps(args)],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120, check=False,
    )  # fmt: skip
    assert done.stdout.startswith("{"), done.stdout + done.stderr
    [result] = [task["hosts"]["h"] for play in json.loads(done.stdout)["plays"] for task in play["tasks"]]
    assert result.get("failed"), result
    assert result["msg"].startswith(f"sglang_server_jit_cache_root = {anchor / 'cache'}: /tmp on the way"), result["msg"]
    assert not (anchor / "cache").exists()


def test_a_dry_run_on_a_fresh_host_reports_the_directory_of_a_user_the_run_creates(anchor: Path) -> None:
    """`up --check` on a bare OS: the service user does not exist yet (its task only says it would create it),
    so the home directory is reported as to be created for it, not failed; a real run without the user fails."""
    (anchor / "hosts.yml").write_text(
        f"all:\n  hosts:\n    h:\n      ansible_connection: local\n      ansible_python_interpreter: {sys.executable}\n"
    )
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_STDOUT_CALLBACK": "json",
           "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_LOCAL_TEMP": str(anchor / "a-local"),
           "ANSIBLE_REMOTE_TEMP": str(anchor / "a-remote"), "ANSIBLE_NOCOLOR": "1"}  # fmt: skip
    # Under /run (root's, 0755): a trusted way, and nothing is left behind (the path is never created).
    path = f"/run/sglang-deploy-test-{os.getpid()}/home"
    args = {"path": path, "owner": "no-such-user-sgl", "group": "no-such-group-sgl", "mode": "0700", "variable": "sglang_server_home"}

    def run(*extra: str) -> dict:
        done = subprocess.run(
            [str(Path(sys.executable).with_name("ansible")), "h", "-i", str(anchor / "hosts.yml"), "-m", "sglang_directory",
             "-a", json.dumps(args), *extra],
            capture_output=True, text=True, env=env, cwd=ROOT, timeout=120, check=False,
        )  # fmt: skip
        assert done.stdout.startswith("{"), done.stdout + done.stderr
        [result] = [task["hosts"]["h"] for play in json.loads(done.stdout)["plays"] for task in play["tasks"]]
        return result

    dry = run("--check")
    assert not dry.get("failed") and dry["changed"], dry
    assert dry["created"] == [str(Path(path).parent), path]
    assert not Path(path).parent.exists()
    real = run()
    assert real.get("failed"), real
    assert real["msg"] == f"sglang_server_home = {path}: no such user or group user 'no-such-user-sgl', group 'no-such-group-sgl'"
    assert not Path(path).parent.exists()
