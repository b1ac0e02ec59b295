"""What root trusts on the control node (issue 43, class 1; sglang_deploy.ownpath): a directory a command writes is
made by it or the invoking user's own, reached through no link or directory another user controls - at its edges:
another user's empty directory, a parent others may write (and a sticky one, which is fine), a link another user
owns on the way (and root's own link, followed), a swap of the final directory for a link, a link loop, a file where
a directory should be, a lock file that is a planted link. Then the commands: `init` into another user's directory,
`scripts/tls-ca` with a planted CA and a planted key link. Another user is `nobody` (root makes its files)."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from sglang_deploy import ownpath
from sglang_deploy.playbook import runner

NOBODY = pwd.getpwnam("nobody").pw_uid
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root: run as root")


def _theirs(path: Path, mode: int = 0o755) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, NOBODY, NOBODY)
    path.chmod(mode)
    return path


def test_a_new_directory_is_made_with_its_parents_and_the_mode(tmp_path: Path) -> None:
    made = ownpath.directory(tmp_path / "a" / "b", "x", mode=0o700)
    assert made == tmp_path / "a" / "b" and (made.stat().st_mode & 0o777) == 0o700
    assert ownpath.directory(made, "x") == made  # the user's own, again


@needs_root
def test_another_users_empty_directory_is_refused_naming_its_owner(tmp_path: Path) -> None:
    theirs = _theirs(tmp_path / "site")
    with pytest.raises(ownpath.UnsafeDirectoryError) as raised:
        ownpath.directory(theirs, "sglang-deploy init DIR", empty=True)
    message = str(raised.value)
    assert f"{theirs} is owned by nobody with mode 0755" in message and "Fix:" in message and "\n" not in message


def test_a_directory_others_may_write_is_refused(tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    with pytest.raises(ownpath.UnsafeDirectoryError, match="group or other users may write into it"):
        ownpath.directory(loose, "x")


@needs_root
def test_a_parent_another_user_owns_is_refused_and_a_sticky_root_parent_is_not(tmp_path: Path) -> None:
    theirs = _theirs(tmp_path / "home-of-nobody")
    with pytest.raises(ownpath.UnsafeDirectoryError, match="another user can replace what lies in it"):
        ownpath.directory(theirs / "state", "the state directory")
    assert not (theirs / "state").exists()
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    assert ownpath.directory(sticky / "mine", "x").is_dir()
    open_parent = tmp_path / "open"
    open_parent.mkdir()
    open_parent.chmod(0o777)  # others may write, not sticky: they could swap what root makes in it
    with pytest.raises(ownpath.UnsafeDirectoryError, match="another user can replace"):
        ownpath.directory(open_parent / "mine", "x")


@needs_root
def test_a_link_on_the_way_is_followed_only_when_root_or_the_user_made_it(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    mine = tmp_path / "mine"
    mine.symlink_to(real)
    assert ownpath.directory(mine / "state", "x") == real / "state"
    planted = tmp_path / "planted"
    planted.symlink_to(real)
    os.lchown(planted, NOBODY, NOBODY)
    with pytest.raises(ownpath.UnsafeDirectoryError, match="a link on the way .* that root did not make"):
        ownpath.directory(planted / "other", "the state directory")


def test_the_users_own_link_in_a_sticky_directory_is_followed(tmp_path: Path) -> None:
    """A sticky directory others may write (/tmp) keeps the user's own link theirs: it is followed, as a link in
    any directory only its owner may write is."""
    real = tmp_path / "real"
    real.mkdir()
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    (sticky / "link").symlink_to(real)
    assert ownpath.directory(sticky / "link" / "state", "x") == real / "state"


def test_a_directory_that_appears_while_it_is_made_or_cannot_be_made_is_one_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing can make a directory on procfs: the mkdir's own error, in one line.
    with pytest.raises(ownpath.UnsafeDirectoryError, match=r"^x: cannot make /proc/sglang-deploy-test \(.+\)\. Fix:"):
        ownpath.directory("/proc/sglang-deploy-test/state", "x")
    with pytest.raises(ownpath.UnsafeDirectoryError, match=r"^x: cannot read .*/a{300} \(File name too long\)\. Fix:"):
        ownpath.directory(tmp_path / ("a" * 300) / "state", "x")
    # Made by someone else between the walk and the mkdir: by whom is unknown, so it is not used.
    (tmp_path / "raced").mkdir()
    monkeypatch.setattr(ownpath, "_walk", lambda path, what: (str(tmp_path), ["raced", "state"]))
    with pytest.raises(ownpath.UnsafeDirectoryError, match=r"raced appeared while it was being made\. Fix: run the command again"):
        ownpath.directory(tmp_path / "raced" / "state", "x")
    assert not (tmp_path / "raced" / "state").exists()


def test_a_link_loop_and_a_file_are_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(ownpath.UnsafeDirectoryError, match="more than 16 links on the way"):
        ownpath.directory(tmp_path / "a" / "x", "x")
    (tmp_path / "file").write_text("")
    with pytest.raises(ownpath.UnsafeDirectoryError, match="is a file, not a directory"):
        ownpath.directory(tmp_path / "file", "x")
    with pytest.raises(ownpath.UnsafeDirectoryError, match="is a file, not a directory"):
        ownpath.directory(tmp_path / "file" / "below", "x")


@needs_root
def test_group_write_is_trusted_only_for_roots_or_the_users_group(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o775)  # root's group (the user's too, as root): nobody else may write
    assert ownpath.directory(shared / "a", "x").is_dir()
    os.chown(shared, 0, NOBODY)  # another group may write: its members could swap what is made in it
    with pytest.raises(ownpath.UnsafeDirectoryError, match="another user can replace what lies in it"):
        ownpath.directory(shared / "b", "x")
    assert ownpath.parent_of_new_file(tmp_path / "f", "x") == tmp_path / "f"
    with pytest.raises(ownpath.UnsafeDirectoryError, match="another user can replace what this command writes"):
        ownpath.parent_of_new_file(shared / "f", "x")


@needs_root
def test_an_owner_and_a_user_without_a_name_are_shown_by_uid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stranger = _theirs(tmp_path / "stranger")
    os.chown(stranger, 4242421, 4242421)  # no passwd entry
    with pytest.raises(ownpath.UnsafeDirectoryError, match="is owned by uid 4242421 with mode 0755"):
        ownpath.directory(stranger, "x")
    # The command run by a uid without a name (this process's uid told so: the venv's Python under /root cannot run
    # as another user here): the message names it by uid.
    monkeypatch.setattr(ownpath.os, "geteuid", lambda: 4242422)
    with pytest.raises(ownpath.UnsafeDirectoryError, match="it is not uid 4242422's own, and uid 4242422 did not make it"):
        ownpath.directory(_theirs(tmp_path / "nobodys"), "x")


def test_a_chain_of_links_at_the_limit_is_followed_and_one_more_is_not(tmp_path: Path) -> None:
    target = tmp_path / "data"
    target.mkdir()
    previous = target
    for number in range(ownpath.MAX_LINKS + 1):
        link = tmp_path / f"l{number}"
        link.symlink_to(previous)
        previous = link
    assert ownpath.directory(tmp_path / f"l{ownpath.MAX_LINKS - 1}" / "x", "x") == target / "x"
    with pytest.raises(ownpath.UnsafeDirectoryError, match="links on the way"):
        ownpath.directory(tmp_path / f"l{ownpath.MAX_LINKS}" / "y", "x")


@needs_root
def test_the_final_directory_swapped_for_another_users_link_is_refused(tmp_path: Path) -> None:
    """The walk's last step: a state directory that is now a link to another user's directory."""
    theirs = _theirs(tmp_path / "theirs", 0o700)
    state = tmp_path / "state"
    state.symlink_to(theirs)
    os.lchown(state, NOBODY, NOBODY)
    with pytest.raises(ownpath.UnsafeDirectoryError, match="that root did not make"):
        ownpath.private_directory(state, "the state directory")
    os.lchown(state, 0, 0)  # root's own link to another user's directory: the directory is still not root's
    with pytest.raises(ownpath.UnsafeDirectoryError, match="is owned by nobody .* it is not root's own"):
        ownpath.private_directory(state, "the state directory")


def test_a_new_file_is_never_written_through_a_link(tmp_path: Path) -> None:
    (tmp_path / "key").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(FileExistsError):
        ownpath.new_file(tmp_path / "key")
    assert not (tmp_path / "elsewhere").exists()


def test_a_lock_file_that_is_a_planted_link_is_refused_and_creates_nothing(tmp_path: Path) -> None:
    artifacts = ownpath.private_directory(tmp_path / "artifacts", "x")
    (artifacts / "runs").mkdir()
    (artifacts / ".runs.lock").symlink_to(tmp_path / "created-by-root")
    with pytest.raises(ownpath.UnsafeDirectoryError, match=r"\.runs\.lock is a link .* not opened"):
        runner.rotate_runs(artifacts, 5)
    assert not (tmp_path / "created-by-root").exists()


@needs_root
def test_init_refuses_another_users_empty_directory_and_writes_nothing(tmp_path: Path) -> None:
    theirs = _theirs(tmp_path / "site")
    done = subprocess.run([sys.executable, "-m", "sglang_deploy.cli", "init", str(theirs)], capture_output=True,
                          text=True, timeout=120, check=False, cwd=ROOT)  # fmt: skip
    assert done.returncode == 2 and "is owned by nobody" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert list(theirs.iterdir()) == []


@needs_root
def test_tls_ca_refuses_a_planted_ca_a_planted_key_link_and_another_users_directory(tmp_path: Path) -> None:
    def tls_ca(directory: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(ROOT / "scripts" / "tls-ca"), str(directory), "gpu-01.lab", "127.0.0.1"],
                              capture_output=True, text=True, timeout=120, check=False)  # fmt: skip

    theirs = _theirs(tmp_path / "theirs")
    done = tls_ca(theirs)
    assert done.returncode == 2 and "is owned by nobody" in done.stderr and list(theirs.iterdir()) == []
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    (mine / "ca.key").write_text("a key someone else made\n")
    os.chown(mine / "ca.key", NOBODY, NOBODY)
    done = tls_ca(mine)
    assert done.returncode == 2 and "ca.key is not a file of yours (owner nobody): not reused" in done.stderr
    (mine / "ca.key").unlink()
    (mine / "gpu-01.lab.key").symlink_to(tmp_path / "stolen.key")
    done = tls_ca(mine)
    assert done.returncode == 2 and "gpu-01.lab.key is a link: not followed" in done.stderr
    assert not (tmp_path / "stolen.key").exists()
    (mine / "gpu-01.lab.key").unlink()
    done = tls_ca(mine)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in mine.iterdir()) == ["ca.crt", "ca.key", "gpu-01.lab.crt", "gpu-01.lab.key"]
    assert (mine / "gpu-01.lab.key").stat().st_mode & 0o777 == 0o600


@needs_root
def test_a_reference_is_not_written_into_another_users_directory(tmp_path: Path) -> None:
    theirs = _theirs(tmp_path / "theirs")
    done = subprocess.run([sys.executable, "-m", "sglang_deploy.cli", "quality", "record", "--endpoint", "http://127.0.0.1:9",
                           "--model", "m", "--out", str(theirs / "ref.json")], capture_output=True, text=True, timeout=120,
                          check=False, cwd=ROOT)  # fmt: skip
    assert done.returncode == 2 and "another user can replace what this command writes in it" in done.stderr, done.stderr
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    assert ownpath.parent_of_new_file(sticky / "ref.json", "--out") == sticky / "ref.json"


@needs_root
def test_the_validator_cache_and_the_benchmark_results_refuse_another_users_directory(tmp_path: Path) -> None:
    """The validator cache holds code the CLI runs; bench's results are the evidence of a run: neither is written
    into a directory another user controls, and neither through a link."""
    from sglang_deploy.bench import runs as bench_runs
    from sglang_deploy.launch import validator_venv

    theirs = _theirs(tmp_path / "theirs")
    with pytest.raises(validator_venv.ValidatorError, match=r"the validator cache \(SGLANG_DEPLOY_CACHE\).*is owned by nobody"):
        validator_venv.validators_directory(theirs / "validators")
    with pytest.raises(ownpath.UnsafeDirectoryError, match="the benchmark's results directory"):
        bench_runs.write_run(theirs / "run", bench_runs.Run(meta={}, steps=[]))
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "validators").symlink_to(theirs, target_is_directory=True)
    with pytest.raises(validator_venv.ValidatorError):
        validator_venv.validators_directory(mine / "validators")
