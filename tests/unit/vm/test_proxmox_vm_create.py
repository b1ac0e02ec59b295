"""The proxmox_vm role against fakepve (the stand-ins: pve_harness.py): create, re-run, drift, check mode, the
image download, a rebuild of the root disk (the role and `sglang-deploy rebuild`), destroy's guard."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from conftest import ROOT
from fakepve import FakePve
from pve_harness import (
    ED25519_FILE,
    GPUS,
    Guest,
    HOST,
    IMAGE,
    NODE,
    SECRET,
    SNIPPET,
    TOKEN,
    VMID,
    assert_refused_before_any_change,
    calls,
    cli,
    fingerprint,
    host_key_files,
    known_for,
    playbook,
    record,
    vm_config,
    write_inventory,
    writes,
)


def test_create_rerun_rebuild_and_destroy_guard(
    tmp_path: Path, pve: FakePve, inventory: Path, agent_up: Guest, ssh_standin: int
) -> None:
    # known_hosts before: other hosts' lines, and a key of an earlier VM at the address this one will have.
    known = tmp_path / "known_hosts"
    names = [f"[127.0.0.1]:{ssh_standin}", f"[192.0.2.10]:{ssh_standin}"]  # the guest's address, the inventory's
    others = host_key_files()
    stale = " ".join(others[ED25519_FILE].split()[:2])
    kept = ["# the operator's own lines", f"192.0.2.2 {stale}", f"[127.0.0.1]:2222 {stale}", f"127.0.0.1 {stale}"]
    known.write_text("\n".join([kept[0], kept[1], f"{names[0]} {stale}", *kept[2:]]) + "\n")

    # 1. From nothing: the VM is created with every GPU, q35, OVMF, the CPU, memory and the weights disk.
    run = playbook(tmp_path, inventory)
    assert run.proc.returncode == 0, run.failure()
    config = vm_config(pve)
    for index, name in enumerate(GPUS):
        assert config[f"hostpci{index}"] == f"mapping={name},pcie=1"
    assert (config["machine"], config["bios"], config["cpu"]) == ("q35", "ovmf", "host,phys-bits=host")
    assert [str(config[k]) for k in ("sockets", "cores", "numa", "memory", "balloon")] == [
        "2",
        "32",
        "1",
        "786432",
        "0",
    ]
    assert config["agent"] == "enabled=1" and str(config["onboot"]) == "1" and config["serial0"] == "socket"
    assert config["efidisk0"].startswith("local-lvm:vm-4101-disk-") and "efitype=4m" in config["efidisk0"]
    weights = config["scsi1"]
    assert "serial=sglang-weights" in weights and "size=1T" in weights and "backup=0" in weights
    assert config["scsi0"].startswith("local-lvm:") and f"import-from={IMAGE}" in config["scsi0"]
    assert config["boot"] == "order=scsi0" and config["ide2"].startswith("local-lvm:vm-4101-disk-")
    assert config["cicustom"] == f"vendor={SNIPPET}" and config["ipconfig0"] == "ip=dhcp"
    assert pve.vm(VMID).status == "running"
    assert run.result("Keep the guest's address")["ansible_facts"]["proxmox_vm_address"] == "127.0.0.1"
    assert f"PUT /api2/json/nodes/{NODE}/qemu/{VMID}/resize" in writes(pve)
    assert SECRET not in run.output, "the token secret reached the output"
    # The new guest's host keys (read through its agent) replaced the earlier VM's for both names; the other
    # lines are as they were, in their order; the fingerprints are in the run's output.
    created = agent_up.keys()
    assert [known_for(known, name) for name in names] == [sorted(created)] * 2, known.read_text()
    assert [line for line in known.read_text().splitlines() if line.split()[0] not in names] == kept
    shown = run.result("Show the guest's SSH host key fingerprints")["msg"]
    assert all(fingerprint(key) in shown for key in created) and "(ED25519)" in shown, shown
    record("after_create", {"config": config, "seconds": round(run.seconds, 1), "changed": run.stats.get("changed")})
    weights_volume = weights.split(",")[0]
    root_before = config["scsi0"]
    known_after_create = known.read_text()

    # 2. The same run again changes nothing and writes nothing.
    before = len(pve.requests)
    run = playbook(tmp_path, inventory)
    assert run.proc.returncode == 0, run.failure()
    assert run.stats["changed"] == 0, [t for t, r in run.results() if r.get("changed")]
    assert calls(pve, before) == [f"POST nodes/{NODE}/qemu/{VMID}/agent/ping"], calls(pve, before)
    assert known.read_text() == known_after_create
    record("rerun", {"seconds": round(run.seconds, 1), "changed": run.stats["changed"]})

    # 2b. A name's lines gone (ssh-keygen -R by hand): check mode says it would add them and writes nothing;
    #     the run adds them (keys missing are no conflict) and leaves the other name's lines alone.
    pruned = "".join(line + "\n" for line in known_after_create.splitlines() if line.split()[0] != names[1])
    known.write_text(pruned)
    run = playbook(tmp_path, inventory, "--check", "--diff")
    assert run.proc.returncode == 0, run.failure()
    assert known.read_text() == pruned
    assert run.result("Add the guest's host keys")["changed"]
    assert run.stats["changed"] == 1, [t for t, r in run.results() if r.get("changed")]
    run = playbook(tmp_path, inventory)
    assert run.proc.returncode == 0, run.failure()
    assert [known_for(known, name) for name in names] == [sorted(created)] * 2, known.read_text()
    assert known.read_text().startswith(pruned)

    # 2c. A changed key for the VM this run neither created nor rebuilt is what a man-in-the-middle looks like:
    #     the run stops, naming the host, the name, the variable and the fix; known_hosts is left as it was
    #     (in check mode too).
    tampered = known.read_text().replace(f"{names[1]} {created[0]}", f"{names[1]} {stale}")
    assert tampered != known.read_text()
    known.write_text(tampered)
    for args in ((), ("--check",)):
        before = len(pve.requests)
        run = playbook(tmp_path, inventory, *args)
        assert run.proc.returncode != 0, args
        message = run.result("Compare known_hosts with the host keys")["msg"]
        assert f"host {HOST}: the SSH host key known for {names[1]} in {known} (proxmox_vm_known_hosts" in message
        assert f"ssh-ed25519 {fingerprint(stale)}" in message and fingerprint(created[0]) in message, message
        assert "did not create or rebuild the VM" in message and "man-in-the-middle" in message, message
        assert f"ssh-keygen -R {names[1]} -f {known}" in message and f"qm terminal {VMID}" in message, message
        assert known.read_text() == tampered
        assert calls(pve, before) == [f"POST nodes/{NODE}/qemu/{VMID}/agent/ping"], calls(pve, before)
        assert not any(task.endswith("Wait for SSH on the guest (proxmox_vm_ssh_timeout)") for task, _ in run.results())

    # 3. Rebuild: stop, the old root disk deleted, a fresh import, cloud-init regenerated, start. The weights
    #    disk keeps its value and volume, and no request ever names it.
    before = len(pve.requests)
    run = playbook(tmp_path, inventory, "-e", "proxmox_vm_rebuild=true")
    assert run.proc.returncode == 0, run.failure()
    made = calls(pve, before)
    base = f"nodes/{NODE}/qemu/{VMID}"
    expected = [
        f"POST {base}/status/shutdown",
        f"PUT {base}/unlink idlist=scsi0&force=1",
        f"POST {base}/config",
        f"PUT {base}/resize disk=scsi0&size=128G",
        f"PUT {base}/cloudinit",
        f"POST {base}/status/start",
        f"POST {base}/agent/ping",
    ]
    assert [c.split(" ")[0] + " " + c.split(" ")[1] for c in made] == [
        " ".join(e.split(" ")[:2]) for e in expected
    ], made
    assert made[1] == expected[1] and made[3] == expected[3]
    assert "scsi0=local-lvm%3A0%2Cimport-from%3Dlocal%3Aimport%2Fdebian-12-genericcloud-amd64.qcow2" in made[2]
    assert "boot=order%3Dscsi0" in made[2]
    assert not any("scsi1" in c or weights_volume.split(":")[1] in c for c in made), made
    assert not any(c.startswith("DELETE") for c in made)
    after = vm_config(pve)
    assert after["scsi1"] == weights, "the weights disk changed"
    assert weights_volume.split(":")[1] in pve.storages["local-lvm"]["volumes"], "the weights volume is gone"
    assert after["scsi0"] != root_before and after["scsi0"].startswith(f"local-lvm:0,import-from={IMAGE}")
    assert pve.vm(VMID).status == "running"
    # The fresh root disk's new host keys, and only those, for both names; no key of the created guest is left.
    rebuilt = agent_up.keys()
    assert not set(rebuilt) & set(created)
    assert [known_for(known, name) for name in names] == [sorted(rebuilt)] * 2, known.read_text()
    assert not any(key in known.read_text() for key in created)
    assert [line for line in known.read_text().splitlines() if line.split()[0] not in names] == kept
    record(
        "after_rebuild",
        {
            "config": after,
            "calls": made,
            "seconds": round(run.seconds, 1),
            "weights_volume_before": weights_volume,
            "weights_volume_after": after["scsi1"].split(",")[0],
        },
    )

    # 4. Destroy refuses while the weights disk is attached, before any change.
    before = len(pve.requests)
    run = playbook(tmp_path, inventory, "-e", "proxmox_vm_state=absent")
    assert run.proc.returncode != 0
    message = run.failure()
    assert f"host {HOST}: VM {VMID} ({HOST}) on node {NODE}: refusing to destroy the VM" in message
    assert "proxmox_vm_destroy_weights: true" in message and weights_volume in message
    assert calls(pve, before) == [] and pve.vm(VMID) is not None
    record("destroy_refused", {"message": message, "seconds": round(run.seconds, 1)})

    # 5. Asked on purpose, it goes, with every volume the VM owned (PVE's qm destroy).
    run = playbook(tmp_path, inventory, "-e", "proxmox_vm_state=absent", "-e", "proxmox_vm_destroy_weights=true")
    assert run.proc.returncode == 0, run.failure()
    assert pve.vm(VMID) is None
    assert weights_volume.split(":")[1] not in pve.storages["local-lvm"].get("volumes", {})



@pytest.mark.usefixtures("agent_up")
def test_check_mode_reports_and_changes_nothing(tmp_path: Path, pve: FakePve, inventory: Path) -> None:
    run = playbook(tmp_path, inventory, "--check")
    assert run.proc.returncode == 0, run.failure()
    assert writes(pve) == [] and pve.vm(VMID) is None
    assert run.stats["changed"] == 1 and "would create" in run.result("Count what check mode would change")["msg"]
    said = run.result("Say what check mode leaves for the real run")["msg"]
    assert "after the create the new guest's SSH host keys are read" in said and "nothing was written" in said
    assert not (tmp_path / "known_hosts").exists()


@pytest.mark.usefixtures("agent_up")
def test_a_drifted_vm_gets_only_the_differences(tmp_path: Path, pve: FakePve, inventory: Path) -> None:
    """A VM made by hand (7 GPUs, less memory, an extra args line) is converged key by key; its disks stay."""
    run = playbook(tmp_path, inventory)
    assert run.proc.returncode == 0, run.failure()
    vm = pve.vm(VMID)
    weights = vm.config["scsi1"]
    vm.config["memory"] = "524288"
    vm.config.pop("hostpci7")
    vm.config["hostpci8"] = "mapping=someone-elses,pcie=1"
    vm.status = vm.qmpstatus = "stopped"
    before = len(pve.requests)
    run = playbook(tmp_path, inventory)
    assert run.proc.returncode == 0, run.failure()
    made = calls(pve, before)
    base = f"nodes/{NODE}/qemu/{VMID}"
    method, path, body = made[0].split(" ")
    assert (method, path) == ("PUT", f"{base}/config") and sorted(body.split("&")) == [
        "hostpci7=mapping%3Drtx-pro-6000-7%2Cpcie%3D1",
        "memory=786432",
    ], made
    assert made[1] == f"PUT {base}/config delete=hostpci8", made
    assert made[2:] == [f"POST {base}/status/start", f"POST {base}/agent/ping"], made
    assert vm.config["memory"] == "786432" and "hostpci8" not in vm.config and vm.config["scsi1"] == weights
    run = playbook(tmp_path, inventory)
    assert run.proc.returncode == 0 and run.stats["changed"] == 0, run.failure()


@pytest.mark.usefixtures("agent_up")
def test_a_missing_image_is_downloaded_by_the_node_with_its_checksum(
    tmp_path: Path, pve: FakePve, inventory: Path
) -> None:
    pve.storages["local"]["volumes"].pop("import/debian-12-genericcloud-amd64.qcow2")
    # fakepve's download-url asks PVE 8's Sys.Audit + Sys.Modify on / (PVE 9 also takes Sys.AccessNetwork).
    pve.grant(TOKEN, "/", "Sys.Modify")
    run = playbook(tmp_path, inventory)
    assert run.proc.returncode == 0, run.failure()
    download = [c for c in calls(pve) if "/download-url" in c]
    assert download == [f"POST nodes/{NODE}/storage/local/download-url"], calls(pve)
    # proxmox_template sends its parameters in the query string, which pve.requests does not keep: the
    # module's own arguments, and what the fake's download task logged, show them.
    args = run.result("Download the cloud image")["invocation"]["module_args"]
    assert (args["content_type"], args["checksum_algorithm"], args["checksum"]) == ("import", "sha512", "ab" * 64)
    url = "https://cloud.debian.org/images/cloud/bookworm/latest/debian-12-genericcloud-amd64.qcow2"
    assert any(f"downloading {url} to debian-12-genericcloud-amd64.qcow2" in t["log"] for t in pve.tasklog)
    assert "import/debian-12-genericcloud-amd64.qcow2" in pve.storages["local"]["volumes"]
    assert calls(pve).index(download[0]) < next(
        i for i, c in enumerate(calls(pve)) if c.startswith(f"POST nodes/{NODE}/qemu ")
    )


def test_a_vmid_that_belongs_to_another_vm_is_refused(tmp_path: Path, pve: FakePve, inventory: Path) -> None:
    pve.add_vm(
        VMID, "someone-elses-vm", node=NODE, status="running", config={"scsi0": "local-lvm:vm-4101-disk-0,size=32G"}
    )
    run = playbook(tmp_path, inventory)
    assert_refused_before_any_change(
        run, pve, f"vmid {VMID} is the VM 'someone-elses-vm', not '{HOST}'", "proxmox_vm_vmid"
    )


def test_a_vm_with_detached_disks_but_no_weights_disk_is_refused(tmp_path: Path, pve: FakePve, inventory: Path) -> None:
    """An unused disk may be the weights someone detached: the role neither adds a blank one nor goes on."""
    pve.add_vm(
        VMID,
        HOST,
        node=NODE,
        status="stopped",
        config={"scsi0": "local-lvm:vm-4101-disk-0,size=128G", "unused0": "local-lvm:vm-4101-disk-1"},
    )
    run = playbook(tmp_path, inventory)
    assert_refused_before_any_change(
        run, pve, "detached disks {'unused0': 'local-lvm:vm-4101-disk-1'}", "re-attach it as scsi1"
    )


def test_the_rebuild_command_asks_then_rebuilds_only_the_root_disk(
    tmp_path: Path, pve: FakePve, inventory: Path, agent_up: Guest, ssh_standin: int
) -> None:
    run = playbook(tmp_path, inventory)
    assert run.proc.returncode == 0, run.failure()
    weights = vm_config(pve)["scsi1"]
    inventories = ["-i", str(ROOT / "inventory" / "proxmox"), "-i", str(inventory)]
    artifacts = tmp_path / "artifacts"

    before = len(pve.requests)
    declined = cli(tmp_path, *inventories, "-l", HOST, "--vm-only", "--artifacts", str(artifacts), stdin="yes\n")
    assert declined.returncode == 1 and "not confirmed; nothing was changed" in declined.stderr
    assert f"This rebuilds {HOST}: stop each VM, DELETE its root disk" in declined.stderr
    assert len(pve.requests) == before and not artifacts.exists()

    unlimited = cli(tmp_path, *inventories, "--yes")
    assert unlimited.returncode == 2 and "-l HOST is required" in unlimited.stderr
    nothing = cli(tmp_path, *inventories, "-l", "no-such-host", "--yes")
    assert nothing.returncode == 2 and "no serving hosts" in nothing.stderr
    assert len(pve.requests) == before

    done = cli(tmp_path, *inventories, "-l", HOST, "--vm-only", "--artifacts", str(artifacts), stdin="rebuild\n")
    assert done.returncode == 0, done.stdout + done.stderr
    made = calls(pve, before)
    assert f"PUT nodes/{NODE}/qemu/{VMID}/unlink idlist=scsi0&force=1" in made
    assert not any("scsi1" in c for c in made) and vm_config(pve)["scsi1"] == weights
    # One command: the rebuilt guest's new host keys are in known_hosts for the run's next step.
    assert len(agent_up.instances) == 2
    assert known_for(tmp_path / "known_hosts", f"[127.0.0.1]:{ssh_standin}") == sorted(agent_up.keys())
    leaked = [p for p in artifacts.rglob("*") if p.is_file() and SECRET in p.read_text(errors="replace")]
    assert leaked == [], f"the token secret is in {leaked}"


@pytest.mark.usefixtures("agent_up")
def test_the_ssh_wait_has_a_budget_and_says_what_did_not_come_up(
    tmp_path: Path, pve: FakePve, fakepve_cafile: str, sysfs: Path
) -> None:
    with socket.socket() as probe:  # sshd never answers there
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    path = tmp_path / "no-ssh.yml"
    write_inventory(path, pve, fakepve_cafile, closed, sysfs, {"proxmox_vm_ssh_timeout": 2})
    run = playbook(tmp_path, path)
    assert run.proc.returncode != 0
    message = run.result("Fail when SSH did not come up")["msg"]
    assert f"host {HOST}: VM {VMID} ({HOST}) on node {NODE} is running and its guest agent answers" in message
    assert f"SSH on 127.0.0.1:{closed} did not answer within proxmox_vm_ssh_timeout=2 s" in message
    assert "proxmox_vm_ci_ipconfig" in message and f"qm terminal {VMID}" in message
