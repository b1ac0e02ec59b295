"""The hf_model role's modules, sglang_weights_info and sglang_weights (library/), run by real Ansible.

Each call is `ansible -m MODULE` (or, for the background copy, a playbook with async as the role runs
it) with the project's ansible.cfg, a local connection and everything under tmp_path: Ansible ships
module_utils/sglang_deploy_host with the module, as it does to a host. The checkpoint is the tiny real
one of tests/fixtures/tiny_checkpoint.py; tests/unit/host/test_weights.py tests the logic underneath.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ansible.module_utils.common.text.formatters import bytes_to_human
from conftest import ROOT

sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
from tiny_checkpoint import make_checkpoint  # noqa: E402

SHARD1 = "model-00001-of-00003.safetensors"
SHARD3 = "model-00003-of-00003.safetensors"
GIB = 1024**3


@pytest.fixture()
def ansible_env(tmp_path: Path) -> dict[str, str]:
    """The project's ansible.cfg, JSON results, Ansible's temporary and async files under tmp_path."""
    (tmp_path / "hosts.yml").write_text(
        "all:\n  hosts:\n    weights-host:\n      ansible_connection: local\n"
        f"      ansible_python_interpreter: {sys.executable}\n"
    )
    return {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_STDOUT_CALLBACK": "json",
        "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-local"),
        "ANSIBLE_REMOTE_TEMP": str(tmp_path / "ansible-remote"),
        "ANSIBLE_ASYNC_DIR": str(tmp_path / "ansible-async"),
        "ANSIBLE_NOCOLOR": "1",
    }


@pytest.fixture()
def source(tmp_path: Path) -> dict[str, int]:
    """A tiny real checkpoint in tmp_path/src; returns its files and sizes."""
    return make_checkpoint(tmp_path / "src")


def _results(proc: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    """Every task's result for the one host, from the json stdout callback."""
    assert proc.stdout.startswith("{"), proc.stdout + proc.stderr
    plays = json.loads(proc.stdout)["plays"]
    return [task["hosts"]["weights-host"] for play in plays for task in play["tasks"]]


def run_module(tmp_path: Path, env: dict[str, str], module: str, args: dict[str, Any],
               *, check: bool = False) -> dict[str, Any]:
    """`ansible weights-host -m module -a JSON [--check] --diff`: the module's result."""
    argv = [str(Path(sys.executable).with_name("ansible")), "weights-host", "-i", str(tmp_path / "hosts.yml"),
            "-m", module, "-a", json.dumps(args), "--diff", *(["--check"] if check else [])]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, check=False)
    [result] = _results(proc)
    return result


def _write_manifest(path: Path, files: dict[str, int]) -> Path:
    path.write_text(json.dumps({"files": files}))
    return path


def test_info_plans_a_fresh_target_from_a_local_source_in_check_mode(tmp_path, ansible_env, source):
    dest = tmp_path / "models" / "org--name" / "rev"
    info = run_module(tmp_path, ansible_env, "sglang_weights_info",
                      {"dest": str(dest), "src": str(tmp_path / "src"), "margin_gib": 0.5,
                       "require": ["source_complete", "space"]}, check=True)
    total = sum(source.values())
    assert not info.get("failed") and info["changed"] is False
    assert (info["complete"], info["source_complete"], info["enough_space"]) == (False, True, True)
    assert info["files"] == source and info["file_count"] == len(source) == 6
    assert (info["total_bytes"], info["missing_bytes"], info["needed_bytes"]) == (total, total, total + GIB // 2)
    assert info["missing_files"] == sorted(source)
    assert info["free_path"] == str(tmp_path)  # the nearest existing parent
    assert info["progress"] == {"bytes": 0, "expected_bytes": total, "percent": 0.0}
    assert not (tmp_path / "models").exists()


def test_info_takes_the_hubs_file_sizes(tmp_path, ansible_env, source):
    info = run_module(tmp_path, ansible_env, "sglang_weights_info", {"dest": str(tmp_path / "t"), "files": source})
    assert (info["complete"], info["source_complete"], info["missing_bytes"]) == (False, None, sum(source.values()))


def test_info_refuses_a_disk_without_room_naming_the_margin(tmp_path, ansible_env, source):
    info = run_module(tmp_path, ansible_env, "sglang_weights_info",
                      {"dest": str(tmp_path / "t"), "files": source, "margin_gib": 100000, "model": "org/name@abc",
                       "require": ["space"]}, check=True)
    total = sum(source.values())
    assert info["failed"] is True
    assert f"{tmp_path} has " in info["msg"]
    assert f"org/name@abc needs {bytes_to_human(total)} more in hf_model_dir={tmp_path / 't'} plus" in info["msg"]
    assert f"hf_model_disk_margin_gib=100000 = {bytes_to_human(total + 100000 * GIB)}." in info["msg"]
    assert "Fix: free space there, or point sglang_common_models_root at a larger disk." in info["msg"]


def test_info_refuses_a_truncated_local_source(tmp_path, ansible_env, source):
    os.truncate(tmp_path / "src" / SHARD3, source[SHARD3] - 100)
    info = run_module(tmp_path, ansible_env, "sglang_weights_info",
                      {"dest": str(tmp_path / "t"), "src": str(tmp_path / "src"), "inventory_hostname": "gpu-01",
                       "require": ["source_complete", "space"]})
    assert info["failed"] is True
    assert info["msg"] == (
        f"host gpu-01: hf_model_local_path={tmp_path / 'src'} is not a complete checkpoint: {SHARD3} truncated (expected "
        f"{source[SHARD3]} bytes, found {source[SHARD3] - 100}). Nothing was copied. Fix: repair or re-copy the "
        "source (every shard of model.safetensors.index.json, full size)."
    )
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"src": "/nonexistent/ckpt"}, "(source /nonexistent/ckpt is not a directory). Fix: hf_model_local_path must"),
        ({"manifest": "/nonexistent/m.json"}, "(manifest /nonexistent/m.json: not readable"),
        ({"manifest": "/nonexistent/m.json"}, "Fix: re-run the role's start step, which records the source's files"),
        ({"files": {"../escape": 1}}, "(manifest files: bad entry '../escape': 1). Fix: check what the hub or mirror"),
    ],
)
def test_info_says_when_the_source_cannot_be_listed(tmp_path, ansible_env, args, message):
    info = run_module(tmp_path, ansible_env, "sglang_weights_info", {"dest": str(tmp_path / "t"), **args})
    assert info["failed"] is True
    assert info["msg"].startswith("the source of the weights could not be listed ")
    assert message in info["msg"]


def test_copy_in_check_mode_reports_files_bytes_and_a_diff_and_writes_nothing(tmp_path, ansible_env, source):
    dest = tmp_path / "models" / "rev"
    result = run_module(tmp_path, ansible_env, "sglang_weights",
                        {"src": str(tmp_path / "src"), "dest": str(dest), "files": source}, check=True)
    total = sum(source.values())
    assert (result["changed"], result["copied"], result["bytes_copied"], result["total_bytes"]) == (
        True, sorted(source), total, total)
    assert result["diff"]["after_header"] == f"{dest} (from {tmp_path / 'src'}: 6 files, {total} bytes to write)"
    assert result["diff"]["before"] == "".join(f"{name}: absent\n" for name in sorted(source))
    assert result["diff"]["after"] == "".join(f"{name}: {size} bytes\n" for name, size in sorted(source.items()))
    assert not (tmp_path / "models").exists()


def test_copy_then_again_changes_nothing_and_the_target_is_complete(tmp_path, ansible_env, source):
    dest = tmp_path / "models" / "rev"
    args = {"src": str(tmp_path / "src"), "dest": str(dest), "files": source}
    first = run_module(tmp_path, ansible_env, "sglang_weights", args)
    assert (first["changed"], first["copied"]) == (True, sorted(source))
    assert all((dest / name).read_bytes() == (tmp_path / "src" / name).read_bytes() for name in source)
    assert oct(dest.stat().st_mode & 0o777) == "0o755" and oct((dest / SHARD1).stat().st_mode & 0o777) == "0o644"
    again = run_module(tmp_path, ansible_env, "sglang_weights", args)
    assert (again["changed"], again["copied"], again["bytes_copied"], "diff" in again) == (False, [], 0, False)
    manifest = _write_manifest(tmp_path / "rev.manifest.json", source)
    info = run_module(tmp_path, ansible_env, "sglang_weights_info",
                      {"dest": str(dest), "manifest": str(manifest), "require": ["complete"]}, check=True)
    assert (info.get("failed", False), info["complete"], info["missing_bytes"], info["problems"]) == (False, True, 0, [])
    assert info["progress"]["percent"] == 100.0


def test_a_truncated_shard_is_found_shown_in_check_mode_and_resumed(tmp_path, ansible_env, source):
    dest = tmp_path / "models" / "rev"
    args = {"src": str(tmp_path / "src"), "dest": str(dest), "files": source}
    run_module(tmp_path, ansible_env, "sglang_weights", args)
    os.truncate(dest / SHARD1, source[SHARD1] - 300)
    manifest = _write_manifest(tmp_path / "rev.manifest.json", source)
    check_args = {"dest": str(dest), "manifest": str(manifest), "model": "org/name@rev"}

    info = run_module(tmp_path, ansible_env, "sglang_weights_info", check_args, check=True)
    assert (info["complete"], info["missing_files"], info["missing_bytes"]) == (False, [SHARD1], 300)
    assert [(p["name"], p["state"], p["expected_bytes"], p["present_bytes"]) for p in info["problems"]] == [
        (SHARD1, "truncated", source[SHARD1], source[SHARD1] - 300)]
    refused = run_module(tmp_path, ansible_env, "sglang_weights_info", {**check_args, "require": ["complete"]})
    assert refused["failed"] is True
    assert refused["msg"].startswith(
        f"{dest} is not a complete copy of org/name@rev: {SHARD1} truncated (expected {source[SHARD1]} bytes, "
        f"found {source[SHARD1] - 300}). Fix: re-run the play")

    preview = run_module(tmp_path, ansible_env, "sglang_weights", args, check=True)
    assert (preview["changed"], preview["copied"], preview["bytes_copied"]) == (True, [SHARD1], 300)
    assert (preview["diff"]["before"], preview["diff"]["after"]) == (
        f"{SHARD1}: {source[SHARD1] - 300} bytes\n", f"{SHARD1}: {source[SHARD1]} bytes\n")
    assert (dest / SHARD1).stat().st_size == source[SHARD1] - 300

    resumed = run_module(tmp_path, ansible_env, "sglang_weights", args)
    assert (resumed["copied"], resumed["bytes_copied"]) == ([SHARD1], 300)
    assert (dest / SHARD1).read_bytes() == (tmp_path / "src" / SHARD1).read_bytes()
    assert run_module(tmp_path, ansible_env, "sglang_weights_info", check_args)["complete"] is True


def test_copy_refuses_a_source_that_no_longer_matches_before_writing(tmp_path, ansible_env, source):
    dest = tmp_path / "t"
    result = run_module(tmp_path, ansible_env, "sglang_weights",
                        {"src": str(tmp_path / "src"), "dest": str(dest), "files": {**source, SHARD3: 5},
                         "inventory_hostname": "gpu-01"})
    assert result["failed"] is True
    assert result["msg"] == (
        f"host gpu-01: copying hf_model_local_path={tmp_path / 'src'} into hf_model_dir={dest} failed: source "
        f"{tmp_path / 'src' / SHARD3} is {source[SHARD3]} bytes, the manifest says 5. What is in {dest} is kept; a "
        "re-run resumes from it. Fix: repair the source (or let the role list it again), then re-run."
    )
    assert not dest.exists()


def test_copy_runs_in_the_background_as_the_role_starts_it(tmp_path, ansible_env, source):
    dest = tmp_path / "models" / "rev"
    play = [{
        "name": "Background copy", "hosts": "all", "gather_facts": False,
        "tasks": [
            {"name": "Start", "sglang_weights": {"src": str(tmp_path / "src"), "dest": str(dest), "files": source},
             "async": 120, "poll": 0, "register": "job"},
            {"name": "Wait", "ansible.builtin.async_status": {"jid": "{{ job.ansible_job_id }}"},
             "register": "done", "until": "done.finished", "retries": 60, "delay": 1},
        ],
    }]
    (tmp_path / "play.yml").write_text(json.dumps(play))
    proc = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(tmp_path / "hosts.yml"),
                           str(tmp_path / "play.yml")], capture_output=True, text=True, env=ansible_env,
                          cwd=tmp_path, timeout=180, check=False)
    started, done = _results(proc)
    assert started["started"] and not started.get("failed"), started
    assert (done["finished"], done["copied"], done["bytes_copied"]) == (True, sorted(source), sum(source.values()))
    assert all((dest / name).stat().st_size == size for name, size in source.items())
