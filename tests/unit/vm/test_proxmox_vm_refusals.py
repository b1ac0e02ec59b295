"""The proxmox_vm role refuses before any change (the stand-ins: pve_harness.py): a missing or busy GPU, a wrong
token, an unreachable API, missing privileges, root-only options, no vfio-pci, no room; and the budgets of
the agent and host-key waits."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import certifi
from fakepve import FakePve
from pve_harness import (
    BDFS,
    ED25519_FILE,
    GPUS,
    Guest,
    HOST,
    KEY_FILES,
    NODE,
    PLAYBOOK_TIMEOUT_S,
    TOKEN,
    TOKEN_PRIVS,
    VMID,
    assert_refused_before_any_change,
    gpu_inventory,
    known_for,
    playbook,
    sysfs_tree,
    write_inventory,
)


def test_a_missing_gpu_mapping_fails_before_any_change(tmp_path: Path, pve: FakePve, inventory: Path) -> None:
    gpu_inventory(pve, {name: [bdf] for name, bdf in zip(GPUS[:7], BDFS)}, BDFS)  # rtx-pro-6000-7 was never made
    run = playbook(tmp_path, inventory)
    assert_refused_before_any_change(
        run,
        pve,
        "GPU mapping 'rtx-pro-6000-7' (proxmox_vm_gpus[7])",
        "mapping 'rtx-pro-6000-7' not found",
        "Fix: create it (Datacenter > Resource Mappings > PCI Devices",
    )


def test_a_mapping_to_a_device_the_node_lacks_fails_before_any_change(
    tmp_path: Path, pve: FakePve, inventory: Path
) -> None:
    gpu_inventory(pve, {name: [bdf] for name, bdf in zip(GPUS, BDFS)}, BDFS[:7])  # a GPU fell off the bus
    run = playbook(tmp_path, inventory)
    assert_refused_before_any_change(
        run, pve, f"GPU rtx-pro-6000-7 is PCI device {BDFS[7]}, which node {NODE} does not have"
    )


def test_a_gpu_used_by_another_running_vm_fails_before_any_change(
    tmp_path: Path, pve: FakePve, inventory: Path
) -> None:
    pve.add_vm(4200, "other-gpu-vm", node=NODE, status="running", config={"hostpci0": "mapping=rtx-pro-6000-3,pcie=1"})
    pve.add_vm(4201, "raw-gpu-vm", node=NODE, status="running", config={"hostpci0": f"{BDFS[5][5:]},pcie=1"})
    pve.add_vm(4202, "stopped-vm", node=NODE, status="stopped", config={"hostpci0": "mapping=rtx-pro-6000-6,pcie=1"})
    run = playbook(tmp_path, inventory)
    message = assert_refused_before_any_change(
        run,
        pve,
        "rtx-pro-6000-3 is used by VM 4200 (other-gpu-vm)",
        f"rtx-pro-6000-5 ({BDFS[5]}) is used by VM 4201",
        "Fix: stop those VMs or remove the GPUs from them",
    )
    assert "4202" not in message  # a stopped VM holds nothing


def test_a_wrong_token_fails_before_any_change(tmp_path: Path, pve: FakePve, inventory: Path) -> None:
    run = playbook(tmp_path, inventory, env={"PROXMOX_TOKEN_SECRET": "not-the-secret"})
    assert_refused_before_any_change(
        run,
        pve,
        "401",
        f"as {TOKEN}",
        "refused the credentials",
        "proxmox_api_token_id the token's name only",
        "PROXMOX_TOKEN_SECRET",
    )
    assert "not-the-secret" not in run.output


def test_an_unreachable_api_fails_before_any_change(
    tmp_path: Path, pve: FakePve, fakepve_cafile: str, ssh_standin: int, sysfs: Path
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    path = tmp_path / "unreachable.yml"
    write_inventory(path, pve, fakepve_cafile, ssh_standin, sysfs, {}, {"proxmox_api_port": port})
    run = playbook(tmp_path, path)
    assert_refused_before_any_change(
        run,
        pve,
        f"no answer",
        f"https://{pve.host}:{port}",
        "Fix: check proxmox_api_host / proxmox_api_port of pve1",
    )


def test_a_certificate_that_does_not_verify_fails_before_any_change(
    tmp_path: Path, pve: FakePve, ssh_standin: int, sysfs: Path
) -> None:
    path = tmp_path / "no-ca.yml"
    other_ca = tmp_path / "other-ca.pem"
    other_ca.write_text(Path(certifi.where()).read_text())  # a real CA bundle, without the fake's certificate
    write_inventory(path, pve, str(other_ca), ssh_standin, sysfs, {})
    run = playbook(tmp_path, path)
    assert_refused_before_any_change(run, pve, "TLS verification failed", "proxmox_api_ca_path")


def test_missing_privileges_are_named_before_any_change(tmp_path: Path, pve: FakePve, inventory: Path) -> None:
    pve.acl = None
    pve.grant(
        TOKEN, "/", *[p for p in TOKEN_PRIVS if p not in ("Mapping.Use", "VM.Allocate", "VM.GuestAgent.FileRead")]
    )
    run = playbook(tmp_path, inventory)
    assert_refused_before_any_change(
        run,
        pve,
        f"the API at https://{pve.host}:{pve.port} as {TOKEN} lacks privileges this run needs",
        "Mapping.Use on /mapping/pci/rtx-pro-6000-0 (pass the GPU through)",
        f"VM.Allocate",
        f"on /vms/{VMID}",
        f"VM.GuestAgent.FileRead or VM.GuestAgent.Unrestricted on /vms/{VMID} (read the guest's SSH host keys",
    )


def test_root_only_options_are_refused_under_a_token(
    tmp_path: Path, pve: FakePve, fakepve_cafile: str, ssh_standin: int, sysfs: Path
) -> None:
    path = tmp_path / "clique.yml"
    write_inventory(
        path, pve, fakepve_cafile, ssh_standin, sysfs,
        {
            "proxmox_vm_gpudirect_clique": True,
            "proxmox_vm_gpus": GPUS[:7] + [{"host": BDFS[7]}],
        },
    )
    run = playbook(tmp_path, path)
    message = assert_refused_before_any_change(
        run,
        pve,
        f"the API token {TOKEN} cannot set root-only options",
        "proxmox_vm_gpudirect_clique: true",
        "unverified on RTX PRO 6000",
        f"raw PCI addresses ['{BDFS[7]}']",
    )
    assert [r for r in pve.requests if "/api2/" in r[1]] == [], "the refusal came after contacting the node"
    assert "x-nv-gpudirect-clique" in message


def test_a_gpu_not_on_vfio_pci_fails_before_any_change(
    tmp_path: Path, pve: FakePve, fakepve_cafile: str, ssh_standin: int
) -> None:
    sysfs = sysfs_tree(tmp_path / "sys", {bdf: ("nvidia" if bdf == BDFS[2] else "vfio-pci") for bdf in BDFS})
    path = tmp_path / "nvidia-bound.yml"
    write_inventory(path, pve, fakepve_cafile, ssh_standin, sysfs, {})
    run = playbook(tmp_path, path)
    assert_refused_before_any_change(
        run,
        pve,
        f"GPU rtx-pro-6000-2: {BDFS[2]} is bound to nvidia, not vfio-pci",
        "options vfio-pci ids=10de:2bb1",
    )


def test_no_room_on_the_storage_fails_before_any_change(tmp_path: Path, pve: FakePve, inventory: Path) -> None:
    pve.storages["local-lvm"]["total"] = 512 * 1024**3
    run = playbook(tmp_path, inventory)
    assert_refused_before_any_change(run, pve, "storage local-lvm has 512.0 GiB free, this create needs 1152.0 GiB")


def test_the_agent_wait_has_a_budget_and_says_what_did_not_come_up(
    tmp_path: Path, pve: FakePve, fakepve_cafile: str, ssh_standin: int, sysfs: Path
) -> None:
    path = tmp_path / "no-agent.yml"
    write_inventory(path, pve, fakepve_cafile, ssh_standin, sysfs, {"proxmox_vm_agent_timeout": 3})
    run = playbook(tmp_path, path)  # no agent_up: the image has no qemu-guest-agent
    assert run.proc.returncode != 0
    message = run.result("Wait for the guest agent")["msg"]
    assert f"host {HOST}: VM {VMID} on node {NODE}: after 3 s (proxmox_vm_agent_timeout)" in message
    assert "has no running guest agent (last: 500 QEMU guest agent is not running" in message
    assert "qemu-guest-agent" in message and f"qm terminal {VMID}" in message
    assert run.result("Wait for the guest agent")["waited"] < 15


def test_a_garbage_host_key_is_refused_and_the_opt_out_keeps_known_hosts_as_it_is(
    tmp_path: Path, pve: FakePve, inventory: Path, agent_up: Guest
) -> None:
    known = tmp_path / "known_hosts"
    agent_up.files = {ED25519_FILE: "<html><body>It works!</body></html>\n"}
    run = playbook(tmp_path, inventory)
    assert run.proc.returncode != 0
    message = run.result("Wait for the guest agent")["msg"]
    assert f"host {HOST}: VM {VMID} on node {NODE}: refusing the guest's SSH host key {ED25519_FILE}" in message
    assert "is not one of ssh-ed25519" in message and "Nothing was written to known_hosts" in message
    assert f"qm terminal {VMID}" in message and f"ssh-keygen -lf {ED25519_FILE}" in message
    assert not known.exists()

    # proxmox_vm_trust_host_keys_from_agent: false is today's behaviour: the keys are not read, known_hosts is
    # the operator's, and the run says so.
    before = len(pve.requests)
    run = playbook(tmp_path, inventory, "-e", "proxmox_vm_trust_host_keys_from_agent=false")
    assert run.proc.returncode == 0, run.failure()
    said = run.result("Say that known_hosts is the operator's")["msg"]
    assert "proxmox_vm_trust_host_keys_from_agent is false" in said and str(known) in said
    assert not any("file-read" in path for _, path, _ in pve.requests[before:]) and not known.exists()


def test_a_host_key_that_never_appears_fails_within_the_budget_and_one_that_comes_late_is_waited_for(
    tmp_path: Path, pve: FakePve, fakepve_cafile: str, ssh_standin: int, sysfs: Path, agent_up: Guest
) -> None:
    path = tmp_path / "slow-keys.yml"
    write_inventory(path, pve, fakepve_cafile, ssh_standin, sysfs, {"proxmox_vm_agent_timeout": 3})
    agent_up.files = {}  # the agent answers, the key files are not there
    run = playbook(tmp_path, path)
    assert run.proc.returncode != 0
    result = run.result("Wait for the guest agent")
    message = result["msg"]
    assert f"host {HOST}: VM {VMID} on node {NODE}: after 3 s (proxmox_vm_agent_timeout)" in message
    assert f"the guest agent answers (address 127.0.0.1) but the guest has no SSH host key {ED25519_FILE}" in message
    assert f"qm terminal {VMID}" in message and "proxmox_vm_trust_host_keys_from_agent: false" in message
    assert result["waited"] < 15 and not (tmp_path / "known_hosts").exists()
    reads = [a for a in pve.vm(VMID).agent_requests if a[0] == "file-read"]
    assert len(reads) >= 2 and {a[1]["file"] for a in reads} == {ED25519_FILE}  # retried, within the budget

    # Cloud-init still at work: the keys appear a second after the agent was first asked; the wait retries.
    write_inventory(path, pve, fakepve_cafile, ssh_standin, sysfs, {"proxmox_vm_agent_timeout": 30})
    vm = pve.vm(VMID)
    vm.agent_requests.clear()

    def keys_a_second_after_the_first_read() -> None:
        deadline = time.monotonic() + PLAYBOOK_TIMEOUT_S
        while time.monotonic() < deadline and not any(a[0] == "file-read" for a in list(vm.agent_requests)):
            time.sleep(0.05)
        time.sleep(1.0)
        agent_up.files = None

    threading.Thread(target=keys_a_second_after_the_first_read, daemon=True).start()
    run = playbook(tmp_path, path)
    assert run.proc.returncode == 0, run.failure()
    assert known_for(tmp_path / "known_hosts", f"[127.0.0.1]:{ssh_standin}") == sorted(agent_up.keys())
    reads = [a[1]["file"] for a in vm.agent_requests if a[0] == "file-read"]
    assert reads[:2] == [ED25519_FILE] * 2 and reads[-3:] == list(KEY_FILES), reads
