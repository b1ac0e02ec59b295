"""Root manages a directory only through directories and links root alone controls
(module_utils/sglang_deploy_host/fs/safepath.py, the module sglang_directory).

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

from sglang_deploy_host.fs import safepath

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


def test_a_swap_between_the_walk_and_the_open_is_refused_and_the_target_untouched(anchor: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk finds a plain directory; before root opens it, it is replaced by a link to a system directory (a
    race the walk alone cannot close): the O_NOFOLLOW open refuses it and root changes nothing."""
    victim = anchor / "etc-like"
    victim.mkdir(mode=0o755)
    managed = anchor / "home"
    managed.mkdir(mode=0o755)
    walk = safepath.resolve_trusted

    def walk_then_swap(path: str, variable: str, **kwargs: object) -> tuple[str, list[str]]:
        found = walk(path, variable, **kwargs)  # type: ignore[arg-type]
        managed.rmdir()
        managed.symlink_to(victim)
        return found

    monkeypatch.setattr(safepath, "resolve_trusted", walk_then_swap)
    with pytest.raises(safepath.UntrustedPathError, match=r"home became a link or a file while it was checked"):
        _ensure(managed, anchor, uid=SERVICE_UID, mode=0o700)
    assert _state(victim) == (0, 0, 0o755)
    managed.unlink()
    managed.write_text("now a file")
    monkeypatch.setattr(safepath, "resolve_trusted", lambda path, variable, **kw: (str(managed), []))
    with pytest.raises(safepath.UntrustedPathError, match="became a link or a file"):
        _ensure(managed, anchor)


@pytest.mark.parametrize("loop", ["self", "pair"])
def test_a_loop_of_root_owned_links_is_refused_not_followed_forever(anchor: Path, loop: str) -> None:
    first = anchor / "a"
    if loop == "self":
        first.symlink_to(first)
    else:
        first.symlink_to(anchor / "b")
        (anchor / "b").symlink_to(first)
    with pytest.raises(safepath.UntrustedPathError, match=f"more than {safepath.MAX_LINKS} links on the way"):
        _ensure(first / "x", anchor)


def test_a_chain_of_links_at_the_limit_is_followed_and_one_more_is_not(anchor: Path) -> None:
    target = anchor / "data"
    target.mkdir()
    previous = target
    for number in range(safepath.MAX_LINKS + 1):
        link = anchor / f"l{number}"
        link.symlink_to(previous)
        previous = link
    assert _ensure(anchor / f"l{safepath.MAX_LINKS - 1}" / "x", anchor)["path"] == str(target / "x")
    with pytest.raises(safepath.UntrustedPathError, match="links on the way"):
        _ensure(anchor / f"l{safepath.MAX_LINKS}" / "y", anchor)


def test_a_link_to_nowhere_and_a_file_on_the_way_are_refused(anchor: Path) -> None:
    (anchor / "dangling").symlink_to(anchor / "nowhere")
    with pytest.raises(safepath.UntrustedPathError, match=r"the link .*dangling points at .*nowhere, which does not exist"):
        _ensure(anchor / "dangling" / "x", anchor)
    (anchor / "file").write_text("x")
    with pytest.raises(safepath.UntrustedPathError, match=r"file on the way is not a directory"):
        _ensure(anchor / "file" / "x", anchor)


@pytest.mark.parametrize(
    ("path", "needle"),
    [("relative/dir", "is not an absolute path"), ("/a/../b", "is not normalized"), ("/a/./b", "is not normalized"),
     ("/a\0b", "is not an absolute path"), ("", "not a directory root may manage"), ("/", "not a directory root may manage")],
)  # fmt: skip
def test_paths_that_are_not_absolute_and_normal_are_refused(anchor: Path, path: str, needle: str) -> None:
    with pytest.raises(safepath.UntrustedPathError, match=needle):
        safepath.ensure_directory(path, 0, 0, 0o755, "v", anchor="/")
    with pytest.raises(safepath.UntrustedPathError, match="is outside"):
        _ensure(Path("/elsewhere/x"), anchor)


def test_group_write_is_trusted_only_for_roots_group(anchor: Path) -> None:
    """A directory group-writable by root's own group changes only by root; by another group, by its members."""
    wheel = anchor / "wheel"
    wheel.mkdir()
    wheel.chmod(0o775)
    assert _ensure(wheel / "ok", anchor)["created"] == [str(wheel / "ok")]
    os.chown(wheel, 0, 50)
    with pytest.raises(safepath.UntrustedPathError, match="wheel on the way is owned by root with mode 0775"):
        _ensure(wheel / "no", anchor)
    os.chown(wheel, 0, 0)
    wheel.chmod(0o757)
    with pytest.raises(safepath.UntrustedPathError, match="mode 0757"):
        _ensure(wheel / "no", anchor)
    wheel.chmod(0o755)
    os.chown(wheel, SERVICE_UID, 0)
    with pytest.raises(safepath.UntrustedPathError, match="owned by nobody with mode 0755"):
        _ensure(wheel / "no", anchor)


def test_the_group_asked_for_goes_to_the_managed_directory_only(anchor: Path) -> None:
    done = safepath.ensure_directory(str(anchor / "a" / "b"), SERVICE_UID, SERVICE_UID, 0o750, "v", anchor=str(anchor))
    assert done["created"] == [str(anchor / "a"), str(anchor / "a" / "b")]
    assert _state(anchor / "a") == (0, 0, 0o755) and _state(anchor / "a" / "b") == (SERVICE_UID, SERVICE_UID, 0o750)
    again = safepath.ensure_directory(str(anchor / "a" / "b"), SERVICE_UID, 0, 0o750, "v", anchor=str(anchor))
    assert again["changed"] and _state(anchor / "a" / "b") == (SERVICE_UID, 0, 0o750)


def test_a_root_owned_link_as_the_managed_directory_leads_to_a_directory_given_to_the_service(anchor: Path) -> None:
    """The last entry's owner is the caller's choice (a home given to the service): a root-owned link to it is
    followed and what it points at is adjusted, though the service owns it - only the directories on the way must
    be root's."""
    home = anchor / "srv-home"
    home.mkdir()
    os.chown(home, SERVICE_UID, 0)
    (anchor / "home").symlink_to(home)
    done = _ensure(anchor / "home", anchor, uid=SERVICE_UID, mode=0o700)
    assert done["path"] == str(home) and _state(home) == (SERVICE_UID, 0, 0o700)


def test_a_dry_run_on_an_existing_directory_reports_the_change_and_makes_none(anchor: Path) -> None:
    existing = anchor / "existing"
    existing.mkdir()
    existing.chmod(0o777)
    done = _ensure(existing, anchor, uid=SERVICE_UID, mode=0o700, dry_run=True)
    assert done["changed"] and done["before"] == {"uid": 0, "gid": 0, "mode": "0777"}
    assert _state(existing) == (0, 0, 0o777)
    same = _ensure(existing, anchor, uid=0, mode=0o777)
    assert not same["changed"] and _state(existing) == (0, 0, 0o777)


def test_an_owner_without_a_name_is_shown_by_uid(anchor: Path) -> None:
    stranger = anchor / "stranger"
    stranger.mkdir()
    os.chown(stranger, 4242421, 0)  # no passwd entry
    with pytest.raises(safepath.UntrustedPathError, match="stranger on the way is owned by uid 4242421 with mode 0755"):
        _ensure(stranger / "x", anchor)


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
