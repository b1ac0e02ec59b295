"""Each host is resolved once per basis: playbooks/resolve.yml once per run however many lifecycle playbooks
import it (site.yml imports five), and the sglang_server role's resolve again only when what the resolver
reads changed (src/sglang_deploy/playbook/resolution.py). Real Ansible; the resolver's calls are counted
by tests/fixtures/resolve-counter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import server_inputs
from conftest import ROOT
from sglang_deploy.fleet import router
from sglang_deploy.playbook import resolution
from sglang_deploy.serving import server

ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))


def _run(tmp_path: Path, inventory: Path, play: list[dict[str, object]] | str, **env: str) -> tuple[str, Counter[str]]:
    playbook = tmp_path / "play.yml"
    playbook.write_text(play if isinstance(play, str) else json.dumps(play))
    log = tmp_path / "resolve.log"
    log.write_text("")
    done = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", str(inventory), str(playbook)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
             "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.default", "ANSIBLE_CACHE_PLUGIN": "memory",
             "ANSIBLE_FILTER_PLUGINS": f"{ROOT / 'tests' / 'fixtures' / 'resolve-counter'}:{ROOT / 'filter_plugins'}",
             "SGLANG_DEPLOY_REAL_FILTERS": str(ROOT / "filter_plugins" / "sglang_deploy.py"),
             "SGLANG_DEPLOY_RESOLVE_LOG": str(log), "SGLANG_API_KEY": "a-key-for-the-test-0123456789",
             "SGLANG_ROUTER_API_KEY": "a-router-key-for-the-test-0123456789", **env},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout, Counter(log.read_text().split())


def test_the_inventory_resolve_runs_once_per_run_however_often_it_is_imported(tmp_path: Path) -> None:
    resolve = ROOT / "playbooks" / "resolve.yml"
    imports = "".join(f"- ansible.builtin.import_playbook: {resolve}\n" for _ in range(3))
    show = (
        "- hosts: sglang_servers:sglang_routers\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.debug:\n        msg: \"RESOLVED {{ inventory_hostname }} "
        "{{ (sglang_server_resolved | default(sglang_router_resolved)).basis }}\"\n"
    )
    output, calls = _run(tmp_path, ROOT / "inventory" / "multi_host", imports + show)
    workers = ["glm5-01", "glm5-02", "glm5-03"]
    assert calls == dict.fromkeys(workers, 1), calls
    # The later imports leave every host (workers and the router) as the first one resolved it.
    assert output.count("TASK [Resolve the server from the inventory") == 1, output
    assert output.count("TASK [Resolve the router from the inventory") == 1, output
    for host in [*workers, "router-01"]:
        assert f"msg: RESOLVED {host} " in output, output


def _local_gpu_host(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    standin_bin = tmp_path / "bin"
    standin_bin.mkdir()
    (standin_bin / "nvidia-smi").symlink_to(ROOT / "tests" / "standin" / "nvidia-smi")
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        f"all:\n  hosts:\n    gpu-01:\n      ansible_connection: local\n      ansible_python_interpreter: {sys.executable}\n"
    )
    env = {"PATH": f"{standin_bin}:{os.environ['PATH']}",
           "NVIDIA_SMI_FIXTURE_DIR": str(ROOT / "tests/fixtures/nvidia-smi/rtx-pro-6000-8gpu-busy")}  # fmt: skip
    return inventory, env


def test_the_role_resolves_again_only_when_what_it_reads_changed(tmp_path: Path) -> None:
    """As host.yml then the role's main entry point do on a re-run: the second resolve with the same GPUs is
    skipped; a changed input (here the flags, as a driver or a venv would) resolves again, and says so."""
    inventory, env = _local_gpu_host(tmp_path)
    resolve = {"ansible.builtin.include_role": {"name": "sglang_server", "tasks_from": "resolve"}}
    show = {"ansible.builtin.debug": {"msg": "ARGV {{ sglang_server_resolved.launch.flag_argv | join(' ') }}"}}
    flags = {"tp-size": 8, "mem-fraction-static": "auto", "max-running-requests": 64, "kv-cache-dtype": "auto",
             "attention-backend": "flashinfer", "nsa-decode-backend": "trtllm", "nsa-prefill-backend": "trtllm"}
    plays = [
        {"hosts": "all", "gather_facts": False,
         "vars": {"sglang_server_flags": flags, "sglang_server_api_key": "",
                  "sglang_server_memory_plan": {"weights_gib_per_gpu": 60.95, "architecture": "glm-5"}},
         "tasks": [{"name": "First", **resolve}, {"name": "Second, nothing changed", **resolve}, show]},
        {"hosts": "all", "gather_facts": False,
         "vars": {"sglang_server_flags": {**flags, "max-running-requests": 32}, "sglang_server_api_key": "",
                  "sglang_server_memory_plan": {"weights_gib_per_gpu": 60.95, "architecture": "glm-5"}},
         "tasks": [{"name": "Third, the flags changed", **resolve}, show]},
    ]  # fmt: skip
    output, calls = _run(tmp_path, inventory, plays, **env)
    assert calls == {"gpu-01": 2}, (calls, output)
    assert "--max-running-requests 64" in output and "--max-running-requests 32" in output, output


def test_the_basis_leaves_out_secrets_and_what_moves_while_the_weights_download() -> None:
    unit = {"name": "sglang", "user": "sglang", "group": "sglang", "home": "/var/lib/sglang/home"}
    inputs = server.ServerInputs(flags={"port": 8000}, python="/opt/py", lane="cu128", unit=unit,
                                 api_key="k" * 32, secret_env={"HF_TOKEN": "hf_" + "x" * 30})  # fmt: skip
    other_secrets = server.ServerInputs(flags={"port": 8000}, python="/opt/py", lane="cu128", unit=unit,
                                        api_key="j" * 32, secret_env={"HF_TOKEN": "hf_" + "y" * 30})  # fmt: skip
    assert server.basis(inputs) == server.basis(other_secrets)
    no_key = server.ServerInputs(flags={"port": 8000}, python="/opt/py", lane="cu128", unit=unit)
    assert server.basis(inputs) != server.basis(no_key)
    facts = {"gpus": [{"index": 0, "memory_total_mib": 97887, "memory_used_mib": 0}], "disks": [{"free_mib": 10}]}
    moved = {**facts, "disks": [{"free_mib": 99999}]}
    used = {**facts, "gpus": [{"index": 0, "memory_total_mib": 97887, "memory_used_mib": 4000}]}
    assert server.basis(inputs, facts) == server.basis(inputs, moved)
    assert server.basis(inputs, facts) != server.basis(inputs, used)
    # No GPU read and an empty read resolve alike, so they are one basis.
    assert resolution.gpu_facts_basis({"gpus": [], "nvidia_smi_found": False}) == resolution.gpu_facts_basis(None) == {}
    assert router.basis({"port": 8080}, {}, api_key="a" * 32) == router.basis({"port": 8080}, {}, api_key="b" * 32)
    assert router.basis({"port": 8080}, {}, api_key="a" * 32) != router.basis({"port": 8080}, {}, api_key="")


def test_a_resolution_carries_its_basis_and_no_secret() -> None:
    gpus = server_inputs.facts("rtx-pro-6000-8gpu-passthrough")
    assert len(gpus["gpus"]) == 8
    resolved = server_inputs.resolve(gpu_facts=gpus)
    values = server.ServerInputs.from_vars(server_inputs.inputs())
    assert resolved["basis"] == server.basis(values, gpus) != server.basis(values)
    assert server_inputs.API_KEY not in json.dumps(resolved)


def test_a_bare_first_up_resolves_the_host_once_and_a_re_up_once(tmp_path: Path) -> None:
    """As site.yml: the inventory phase (playbooks/resolve.yml), then on the host before preflight (host.yml) and in
    the role before the unit. On a bare OS the host read before preflight finds no driver and no weights: nothing the
    inventory phase lacked, so no resolve; once the driver and the weights arrive, the role resolves once. A re-up
    resolves on the host before preflight (its GPUs and headers are there) and not again in the role."""
    standin_bin = tmp_path / "bin"
    standin_bin.mkdir()
    model = tmp_path / "models" / "tiny"
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        f"all:\n  hosts:\n    gpu-01:\n      ansible_connection: local\n      ansible_python_interpreter: {sys.executable}\n"
    )
    env = {"PATH": f"{standin_bin}:{os.environ['PATH']}",
           "NVIDIA_SMI_FIXTURE_DIR": str(ROOT / "tests/fixtures/nvidia-smi/rtx-pro-6000-8gpu-passthrough")}  # fmt: skip
    host_vars = {
        "sglang_server_flags": {"model-path": str(model), "tp-size": 8, "mem-fraction-static": "auto",
                                "max-running-requests": 64, "kv-cache-dtype": "auto"},
        "sglang_server_api_key": "",
        "sglang_server_memory_plan": {"weights_gib_per_gpu": 60.95, "architecture": "glm-5"},
    }  # fmt: skip
    resolve = {"ansible.builtin.include_role": {"name": "sglang_server", "tasks_from": "resolve"}}
    inventory_phase = {"hosts": "all", "gather_facts": False, "vars": host_vars,
                       "tasks": [{"name": "Inventory phase", **resolve, "vars": {"sglang_server_resolve_gpu_facts": False}}]}  # fmt: skip
    install = [
        {"name": "The driver arrives", "ansible.builtin.file": {
            "src": str(ROOT / "tests" / "standin" / "nvidia-smi"), "dest": str(standin_bin / "nvidia-smi"), "state": "link"}},
        {"name": "The weights arrive", "ansible.builtin.command": {
            "argv": [sys.executable, str(ROOT / "tests" / "fixtures" / "tiny_checkpoint.py"), str(model)],
            "creates": str(model / "config.json")}},
    ]  # fmt: skip
    show = {"ansible.builtin.debug": {"msg": "PLANNED {{ sglang_server_resolved.memory_plan.mem_fraction_static }} "
                                             "CHECKPOINT {{ sglang_server_resolved.checkpoint.inspected }}"}}  # fmt: skip
    host_phase = {"hosts": "all", "gather_facts": True, "vars": host_vars,
                  "tasks": [{"name": "Before preflight", **resolve}, *install, {"name": "Before the unit", **resolve}, show]}  # fmt: skip
    output, calls = _run(tmp_path, inventory, [inventory_phase, host_phase], **env)
    # One from the inventory, one on the host: the first host read had nothing the inventory phase lacked.
    assert calls == {"gpu-01": 2}, (calls, output)
    assert "PLANNED 0." in output and "CHECKPOINT True" in output, output
    output, calls = _run(tmp_path, inventory, [inventory_phase, host_phase], **env)
    assert calls == {"gpu-01": 2}, (calls, output)
    assert "PLANNED 0." in output and "CHECKPOINT True" in output, output


def test_the_resolve_before_preflight_and_preflight_judge_one_read_of_the_gpus(tmp_path: Path) -> None:
    """As playbooks/host.yml: preflight's `facts` entry point reads the GPUs, /dev/shm and the weights' disk once; the
    sglang_server resolve (sglang_server_gpu_facts) and the checks (preflight_gpu_facts) take that read, so nvidia-smi
    answers one read's queries, not two; the GPU checks before a (re)start (preflight tasks_from gpu) read afresh."""
    inventory, env = _local_gpu_host(tmp_path)
    env["NVIDIA_SMI_FIXTURE_DIR"] = str(ROOT / "tests/fixtures/nvidia-smi/rtx-pro-6000-8gpu-passthrough")
    smi_log = tmp_path / "nvidia-smi.log"
    env["NVIDIA_SMI_STANDIN_LOG"] = str(smi_log)
    host_vars = {
        "sglang_server_flags": {"tp-size": 8, "mem-fraction-static": "auto", "max-running-requests": 64,
                                "kv-cache-dtype": "auto"},
        "sglang_server_api_key": "", "sglang_server_p2p_adjust": True,
        "sglang_server_memory_plan": {"weights_gib_per_gpu": 60.95, "architecture": "glm-5"},
        "preflight_weights_path": str(tmp_path), "preflight_shm_min_free_mib": 1,
    }  # fmt: skip
    facts = {"name": "Read once", "ansible.builtin.include_role": {"name": "preflight", "tasks_from": "facts"}}
    resolve = {"name": "Resolve with that read", "ansible.builtin.include_role": {"name": "sglang_server", "tasks_from": "resolve"},
               "vars": {"sglang_server_gpu_facts": "{{ preflight_host_facts }}"}}  # fmt: skip
    checks = {"name": "Check with that read", "ansible.builtin.include_role": {"name": "preflight"},
              "vars": {"preflight_gpu_facts": "{{ preflight_host_facts }}"}}  # fmt: skip
    show = {"ansible.builtin.debug": {"msg": "PLANNED {{ sglang_server_resolved.memory_plan.mem_fraction_static }} "
                                             "ADJUSTED {{ sglang_server_resolved.adjustments.flags | list | join(',') }}"}}  # fmt: skip
    play = [{"hosts": "all", "gather_facts": False, "vars": host_vars, "tasks": [facts]}]
    _run(tmp_path, inventory, play, **env)
    one_read = len(smi_log.read_text().splitlines())
    assert one_read > 0
    smi_log.write_text("")
    play = [{"hosts": "all", "gather_facts": False, "vars": host_vars, "tasks": [facts, resolve, checks, show]}]
    output, calls = _run(tmp_path, inventory, play, **env)
    assert calls == {"gpu-01": 1}, (calls, output)
    # The resolve judged the read's GPUs (the plan and the P2P adjustment need them), and nothing read them again.
    assert "PLANNED 0." in output and "ADJUSTED disable-custom-all-reduce" in output, output
    assert len(smi_log.read_text().splitlines()) == one_read, (smi_log.read_text(), output)
    smi_log.write_text("")
    gpu_checks = {"name": "GPU checks before a start", "ansible.builtin.include_role": {"name": "preflight", "tasks_from": "gpu"}}
    play = [{"hosts": "all", "gather_facts": False, "vars": host_vars, "tasks": [facts, resolve, gpu_checks]}]
    _run(tmp_path, inventory, play, **env)
    assert len(smi_log.read_text().splitlines()) == 2 * one_read, smi_log.read_text()
