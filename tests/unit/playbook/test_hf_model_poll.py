"""hf_model's wait (roles/hf_model/tasks/poll.yml) ends a round as soon as the background fetch's
result file says it is done: its search_regex must match what async_wrapper writes when the real
sglang_weights module finishes, and not the file it writes while the job runs. (A regex that missed
it made every first converge wait the whole hf_model_progress_interval, 300 s.)"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import yaml
from conftest import ROOT

sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
from tiny_checkpoint import make_checkpoint  # noqa: E402

from sglang_deploy_host.model import weights  # noqa: E402

# What async_wrapper writes before the module ends (ansible/modules/async_wrapper.py; older
# releases wrote 1/0).
RUNNING = [
    json.dumps({"started": True, "finished": False, "ansible_job_id": "j1.1"}),
    json.dumps({"started": 1, "finished": 0, "ansible_job_id": "j1.1", "results_file": "/x/j1.1"}),
]


def _running(text: str) -> bool:
    if not text.strip():
        return True
    data = json.loads(text)
    return bool(data.get("started")) and not data.get("finished")


def _poll_regex() -> re.Pattern[str]:
    tasks = yaml.safe_load((ROOT / "roles/hf_model/tasks/poll.yml").read_text())
    wait = next(task for task in tasks if "ansible.builtin.wait_for" in task)
    return re.compile(wait["ansible.builtin.wait_for"]["search_regex"])


def test_the_wait_ends_on_the_real_copy_result_and_not_before(tmp_path: Path):
    source, dest = tmp_path / "src", tmp_path / "dest"
    make_checkpoint(source)
    files = weights.source_manifest(source)  # name -> size, as start.yml passes the plan's files
    async_dir = tmp_path / "async"
    args = json.dumps({"src": str(source), "dest": str(dest), "files": files, "inventory_hostname": "gpu-01"})
    env = {**os.environ, "ANSIBLE_ASYNC_DIR": str(async_dir), "ANSIBLE_LIBRARY": str(ROOT / "library"),
           "ANSIBLE_MODULE_UTILS": str(ROOT / "module_utils"), "ANSIBLE_NOCOLOR": "1"}
    started = subprocess.run(
        [str(Path(sys.executable).with_name("ansible")), "localhost", "-c", "local", "-m", "sglang_weights",
         "-a", args, "-B", "60", "-P", "0", "-o"],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    )
    job = json.loads(started.stdout[started.stdout.index("{"):])
    results = Path(job["results_file"])
    deadline = time.monotonic() + 60
    while _running(results.read_text()):
        assert time.monotonic() < deadline, results.read_text()
        time.sleep(0.2)
    final = results.read_text()
    assert json.loads(final).get("changed") is True, final[:1000]
    regex = _poll_regex()
    assert regex.search(final), f"poll.yml's search_regex {regex.pattern!r} misses the finished copy's result: {final[:300]}"
    for running in RUNNING:
        assert not regex.search(running), f"poll.yml's search_regex matches a job that is still running: {running}"
