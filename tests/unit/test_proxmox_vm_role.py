"""The proxmox_vm role for real: playbooks/proxmox.yml with inventory/proxmox, run by ansible-playbook with the
real community.proxmox modules and proxmoxer against fakepve, a stand-in of the PVE 9 API on 127.0.0.1.

What fakepve does not model, and how it is covered here (README "What is tested where"):
- PCI resource mappings and the node's PCI device list: the fake answers every unmodelled GET with a
  synthesised placeholder. ``gpu_inventory`` makes those two read-only answers the test's data (shaped as PVE
  sends them) by wrapping the fake's own generic answer; the fake's schema and permission checks still run.
- Disk writes after create (``PUT unlink``, ``import-from`` on an existing VM, ``resize``, ``PUT cloudinit``):
  the fake stores config values verbatim and answers unlink/resize/cloudinit without acting. A rebuild is
  therefore checked by the exact API calls made (and not made) plus the fake's state of what it does model
  (the weights disk's value and volume, the VM's existence, destroy).
- ``args`` / raw ``hostpci`` being root@pam-only: the fake lets any user set them; the role refuses before any
  call, which is what is asserted.
- vfio-pci binding is not in the API at all: the vfio check reads a sysfs tree built here (real directories
  and symlinks in the kernel's layout), through the node host of the inventory.
- The guest: the fake's guest agent answers once the test says the guest is up (``agent_up``); SSH is a
  listener on 127.0.0.1 that sends an OpenSSH banner.
- The guest's SSH host keys: the fake's agent answers file-read from ``vm.agent['files']``; ``agent_up`` puts
  there what cloud-init makes on the first boot of each root disk (new real keys for a rebuild's fresh one).
  The known_hosts they go to is a file of the test (proxmox_vm_known_hosts), written by the real
  ansible.builtin.known_hosts with this machine's ssh-keygen.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import certifi
import pytest
import yaml
from conftest import ROOT
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

# A test dependency (pyproject [test]); its pytest plugin provides the fakepve and fakepve_cafile fixtures.
from fakepve import FakePve, PveError

from sglang_deploy_host import hostkeys

NODE = "pve1"
VMID = 4101
HOST = "glm5-01"
TOKEN_USER = "sglang-deploy@pve"
TOKEN = f"{TOKEN_USER}!sglang"
SECRET = "c0ffee00-5ec2-4e7a-9d1b-7e57ab1e5ec2"
IMAGE = "local:import/debian-12-genericcloud-amd64.qcow2"
SNIPPET = "local:snippets/sglang-deploy-vendor.cfg"
GPUS = [f"rtx-pro-6000-{i}" for i in range(8)]
BDFS = [f"0000:{0x41 + i:02x}:00.0" for i in range(8)]
GPU_ID = "10de:2bb1"
# A real key (the role checks each key whole: one line, a known type, the blob laid out as that type).
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIARYx9Qe9VCGOEWtIE8jmTZ7mSRLq/Nbc8GhlHBkDDAa ci@control"
# What the role needs, as a PVE role would grant it (README: the token's privileges).
TOKEN_PRIVS = (
    "VM.Allocate",
    "VM.Audit",
    "VM.PowerMgmt",
    "VM.Config.Disk",
    "VM.Config.CPU",
    "VM.Config.Memory",
    "VM.Config.Network",
    "VM.Config.HWType",
    "VM.Config.Options",
    "VM.Config.Cloudinit",
    "VM.Config.CDROM",
    "VM.GuestAgent.Audit",
    "VM.GuestAgent.FileRead",
    "Datastore.AllocateSpace",
    "Datastore.Audit",
    "Datastore.AllocateTemplate",
    "Mapping.Audit",
    "Mapping.Use",
    "Sys.Audit",
    "Sys.AccessNetwork",
    "SDN.Use",
)
# The guest's SSH host keys as files, the one every run waits for first.
ED25519_FILE = "/etc/ssh/ssh_host_ed25519_key.pub"
KEY_FILES = (ED25519_FILE, "/etc/ssh/ssh_host_ecdsa_key.pub", "/etc/ssh/ssh_host_rsa_key.pub")
# Where the closing note's evidence goes (the fake's VM config after create and after rebuild).
EVIDENCE = ROOT / ".cache" / "proxmox-evidence.json"
PLAYBOOK_TIMEOUT_S = 300


# ------------------------------------------------------------------ the stand-ins


def gpu_inventory(pve: FakePve, mappings: dict[str, list[str]], devices: list[str]) -> None:
    """Answer GET /cluster/mapping/pci[/{id}] and /nodes/{node}/hardware/pci from this data (fakepve
    synthesises placeholders there). Shapes as PVE 8/9 send them; a missing mapping gets PVE's own error."""
    synthesise = pve.synthesise

    def entry(name: str) -> dict[str, Any]:
        maps = [
            f"id={GPU_ID},iommugroup={40 + BDFS.index(p)},node={NODE},path={p},subsystem-id=10de:204b"
            for p in mappings[name]
        ]
        return {"id": name, "type": "pci", "map": maps, "description": "RTX PRO 6000", "digest": "0" * 40}

    async def answer(match: Any, method: str, info: Any, user: Any, values: dict[str, Any]) -> Any:
        if method == "GET" and match.template == "/cluster/mapping/pci/{id}":
            if values["id"] not in mappings:
                raise PveError(500, f"mapping '{values['id']}' not found")  # pve-manager Mapping/PCI.pm
            return entry(values["id"])
        if method == "GET" and match.template == "/cluster/mapping/pci":
            return [entry(name) for name in sorted(mappings)]
        if method == "GET" and match.template == "/nodes/{node}/hardware/pci":
            return [
                {
                    "id": bdf,
                    "class": "0x030000",
                    "vendor": "0x10de",
                    "device": "0x2bb1",
                    "iommugroup": 40 + i,
                    "vendor_name": "NVIDIA Corporation",
                    "device_name": "RTX PRO 6000 Blackwell",
                }
                for i, bdf in enumerate(devices)
            ] + [{"id": "0000:00:1f.0", "class": "0x060100", "vendor": "0x8086", "device": "0x1234", "iommugroup": 1}]
        return await synthesise(match, method, info, user, values)

    pve.synthesise = answer


def sysfs_tree(root: Path, devices: dict[str, str]) -> Path:
    """/sys as the kernel lays it out for these PCI devices: address -> driver ("" = none)."""
    for index, (bdf, driver) in enumerate(devices.items()):
        dev = root / "devices" / "pci0000:00" / bdf
        dev.mkdir(parents=True)
        (dev / "vendor").write_text("0x10de\n")
        (dev / "device").write_text("0x2bb1\n")
        (dev / "class").write_text("0x030000\n")
        group = root / "kernel" / "iommu_groups" / str(40 + index) / "devices"
        group.mkdir(parents=True)
        (group / bdf).symlink_to(dev)
        (dev / "iommu_group").symlink_to(group.parent)
        if driver:
            (root / "bus" / "pci" / "drivers" / driver).mkdir(parents=True, exist_ok=True)
            (dev / "driver").symlink_to(root / "bus" / "pci" / "drivers" / driver)
        (root / "bus" / "pci" / "devices").mkdir(parents=True, exist_ok=True)
        (root / "bus" / "pci" / "devices" / bdf).symlink_to(dev)
    return root


@pytest.fixture()
def pve(fakepve: FakePve) -> FakePve:
    """A PVE 9 node pve1 with the cloud image, the vendor snippet, 8 mapped GPUs and a token for the role."""
    fakepve.apitokens[TOKEN] = SECRET
    fakepve.grant(TOKEN, "/", *TOKEN_PRIVS)
    fakepve.storages["local"]["content"] = "iso,vztmpl,backup,import,snippets"
    fakepve.storages["local-lvm"]["total"] = 8 * 1024**4
    fakepve.store_file("local", "debian-12-genericcloud-amd64.qcow2", 3 * 1024**3, content="import")
    fakepve.store_file("local", "sglang-deploy-vendor.cfg", 512, content="snippets")
    gpu_inventory(fakepve, {name: [bdf] for name, bdf in zip(GPUS, BDFS)}, BDFS)
    return fakepve


@pytest.fixture()
def ssh_standin() -> Iterator[int]:
    """A TCP port on 127.0.0.1 that greets like sshd (what the role's SSH wait looks for)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    done.set()
    thread.join(5)
    server.close()


def host_key_files() -> dict[str, str]:
    """What cloud-init writes on a root disk's first boot: a new host key of each type, as the .pub files hold it."""
    made = (
        ed25519.Ed25519PrivateKey.generate(),
        ec.generate_private_key(ec.SECP256R1()),
        rsa.generate_private_key(public_exponent=65537, key_size=2048),
    )
    openssh = serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    return {
        path: key.public_key().public_bytes(*openssh).decode() + f" root@{HOST}\n" for path, key in zip(KEY_FILES, made)
    }


class Guest:
    """The guest behind the fake's agent: its host keys per root disk (cloud-init makes them on the disk's first
    boot, so a rebuild's fresh root disk has new ones). A test may set ``files`` (what file-read finds instead)
    or ``keys_after_s`` (the key files appear that long after the start)."""

    def __init__(self) -> None:
        self.instances: dict[str, dict[str, str]] = {}
        self.root = ""
        self.files: dict[str, str] | None = None
        self.keys_after_s = 0.0

    def keys(self) -> list[str]:
        """The current root disk's keys as known_hosts holds them (TYPE BASE64)."""
        return [" ".join(text.split()[:2]) for text in self.instances[self.root].values()]


@pytest.fixture()
def agent_up(pve: FakePve) -> Iterator[Guest]:
    """The guest's agent answers while the VM runs (as qemu-guest-agent does after boot), with the guest's
    address 127.0.0.1 on eth0 and the SSH host key files of its root disk."""
    guest = Guest()
    done = threading.Event()
    interfaces = [
        {
            "name": "lo",
            "ip-addresses": [{"ip-address": "127.0.0.1", "ip-address-type": "ipv4", "prefix": 8}],
        },
        {
            "name": "eth0",
            "hardware-address": "bc:24:11:00:00:01",
            "ip-addresses": [
                {"ip-address": "fe80::be24:11ff:fe00:1", "ip-address-type": "ipv6", "prefix": 64},
                {"ip-address": "127.0.0.1", "ip-address-type": "ipv4", "prefix": 8},
            ],
        },
    ]

    def watch() -> None:
        while not done.is_set():
            vm = pve.vm(VMID)
            if vm is not None and vm.status != "running":
                vm.agent = None  # down with the VM: a rebuilt guest never answers with the old one's files
            elif vm is not None:
                root = str(vm.config.get("scsi0", ""))
                if root not in guest.instances:
                    guest.instances[root] = host_key_files()
                guest.root = root
                booted = time.time() - (vm.started_at or 0) >= guest.keys_after_s
                files = guest.files if guest.files is not None else guest.instances[root] if booted else {}
                vm.agent = {"interfaces": interfaces, "files": dict(files)}
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    yield guest
    done.set()
    thread.join(5)


@pytest.fixture()
def sysfs(tmp_path: Path) -> Path:
    return sysfs_tree(tmp_path / "sys", {bdf: "vfio-pci" for bdf in BDFS})


@pytest.fixture()
def inventory(tmp_path: Path, pve: FakePve, fakepve_cafile: str, ssh_standin: int, sysfs: Path) -> Path:
    """inventory/proxmox's values overridden for the fake: its address and CA, a DHCP guest on 127.0.0.1."""
    path = tmp_path / "fake.yml"
    write_inventory(path, pve, fakepve_cafile, ssh_standin, sysfs, {})
    return path


def write_inventory(
    path: Path,
    pve: FakePve,
    cafile: str,
    ssh_port: int,
    sysfs: Path,
    host_vars: dict[str, Any],
    node_vars: dict[str, Any] | None = None,
) -> None:
    node = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "proxmox_api_host": pve.host,
        "proxmox_api_port": pve.port,
        "proxmox_api_ca_path": cafile,
        **(node_vars or {}),
    }
    host = {
        "proxmox_vm_ci_ipconfig": "ip=dhcp",
        "proxmox_vm_ci_ssh_keys": [SSH_KEY],
        "proxmox_vm_image_checksum": "sha512:" + "ab" * 64,
        "proxmox_vm_ssh_port": ssh_port,
        "proxmox_vm_node_sysfs": str(sysfs),
        "proxmox_vm_agent_timeout": 30,
        "proxmox_vm_ssh_timeout": 10,
        "proxmox_vm_known_hosts": str(path.parent / "known_hosts"),
        **host_vars,
    }
    path.write_text(
        yaml.safe_dump(
            {
                "proxmox_nodes": {"hosts": {NODE: node}},
                "sglang_servers": {"hosts": {HOST: host}},
            }
        )
    )


# ------------------------------------------------------------------ running the playbook


class Run:
    def __init__(self, proc: subprocess.CompletedProcess[str], seconds: float) -> None:
        self.proc = proc
        self.seconds = seconds
        self.output = proc.stdout + proc.stderr
        try:
            self.data = json.loads(proc.stdout)
        except ValueError:
            self.data = {}

    @property
    def stats(self) -> dict[str, int]:
        return (self.data.get("stats") or {}).get(HOST, {})

    def results(self, host: str = HOST) -> list[tuple[str, dict[str, Any]]]:
        return [
            (t["task"]["name"], t["hosts"][host])
            for play in self.data.get("plays", [])
            for t in play["tasks"]
            if host in t["hosts"]
        ]

    def result(self, name: str) -> dict[str, Any]:
        found = [res for task, res in self.results() if task.split(" : ")[-1].startswith(name)]
        assert found, f"no task {name!r} ran: {[t for t, _ in self.results()]}"
        return found[-1]

    def failure(self) -> str:
        failed = [f"{task}: {res.get('msg')}" for task, res in self.results() if res.get("failed")]
        return "\n".join(failed) or self.output[-3000:]


def playbook(tmp_path: Path, inventory: Path, *extra: str, env: dict[str, str] | None = None) -> Run:
    environ = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_STDOUT_CALLBACK": "json",
        "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-local"),
        "ANSIBLE_CACHE_PLUGIN": "memory",
        "ANSIBLE_NOCOLOR": "1",
        "PROXMOX_TOKEN_SECRET": SECRET,
        **(env or {}),
    }
    command = [
        "ansible-playbook",
        str(ROOT / "playbooks" / "proxmox.yml"),
        "-i",
        str(ROOT / "inventory" / "proxmox"),
        "-i",
        str(inventory),
        *extra,
    ]
    start = time.monotonic()
    proc = subprocess.run(
        [str(Path(sys.executable).with_name(command[0])), *command[1:]],
        capture_output=True,
        text=True,
        env=environ,
        cwd=ROOT,
        timeout=PLAYBOOK_TIMEOUT_S,
        check=False,
    )
    return Run(proc, time.monotonic() - start)


def writes(pve: FakePve) -> list[str]:
    """Every request that could change something (logins aside), as METHOD path."""
    return [
        f"{method} {path}"
        for method, path, _ in pve.requests
        if method not in ("GET", "HEAD") and not path.endswith("/access/ticket")
    ]


def calls(pve: FakePve, since: int = 0) -> list[str]:
    """Write requests with their bodies, in order (the fake redacts secrets)."""
    return [
        f"{method} {path.replace('/api2/json/', '')} {body.decode(errors='replace')}".strip()
        for method, path, body in pve.requests[since:]
        if method not in ("GET", "HEAD")
    ]


def vm_config(pve: FakePve) -> dict[str, Any]:
    vm = pve.vm(VMID)
    assert vm is not None, "the VM does not exist in the fake"
    return dict(sorted(vm.config.items()))


def record(stage: str, data: Any) -> None:
    EVIDENCE.parent.mkdir(parents=True, exist_ok=True)
    evidence = json.loads(EVIDENCE.read_text()) if EVIDENCE.exists() else {}
    evidence[stage] = data
    EVIDENCE.write_text(json.dumps(evidence, indent=2, sort_keys=True))


def known_for(path: Path, name: str) -> list[str]:
    """The keys (TYPE BASE64) of the known_hosts lines for exactly this name, sorted."""
    return sorted(" ".join(line.split()[1:3]) for line in path.read_text().splitlines() if line.split()[:1] == [name])


def fingerprint(key: str) -> str:
    return hostkeys.parse_public_key(key).fingerprint


# ------------------------------------------------------------------ the scenarios


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


def assert_refused_before_any_change(run: Run, pve: FakePve, *fragments: str) -> str:
    """The run failed, wrote nothing to the fake, and its message names host, VM, node and each fragment."""
    assert run.proc.returncode != 0, run.output[-2000:]
    message = run.failure()
    assert writes(pve) == [], writes(pve)
    assert f"host {HOST}" in message and str(VMID) in message and NODE in message, message
    for fragment in fragments:
        assert fragment in message, message
    assert SECRET not in run.output
    return message


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
        path,
        pve,
        fakepve_cafile,
        ssh_standin,
        sysfs,
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


# ------------------------------------------------------------------ sglang-deploy rebuild


def cli(tmp_path: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sglang_deploy.cli", "rebuild", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=PLAYBOOK_TIMEOUT_S,
        check=False,
        env={
            **os.environ,
            "PROXMOX_TOKEN_SECRET": SECRET,
            "ANSIBLE_CACHE_PLUGIN": "memory",
            "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-local"),
        },
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


# ------------------------------------------------------------------ hostile input

PASSWORD = "pw-7e57-never-in-the-output"
ROOT_LOGIN = {"proxmox_api_user": "root@pam", "proxmox_api_token_id": "", "proxmox_api_password": PASSWORD}


@pytest.mark.parametrize(
    ("host_vars", "node_vars", "variable"),
    [
        ({"proxmox_vm_vmid": "four-thousand"}, {}, "proxmox_vm_vmid"),
        ({"proxmox_vm_cores": [32]}, {}, "proxmox_vm_cores"),
        ({"proxmox_vm_numa": "maybe"}, {}, "proxmox_vm_numa"),
        ({"proxmox_vm_state": "gone"}, {}, "proxmox_vm_state"),
        ({"proxmox_vm_ci_ssh_keys": {"ci": SSH_KEY}}, {}, "proxmox_vm_ci_ssh_keys"),
        ({}, {"proxmox_api_port": "pveproxy"}, "proxmox_vm_api_port"),
        ({"proxmox_vm_api_token_secret": [SECRET]}, {}, "proxmox_vm_api_token_secret"),
        ({"proxmox_vm_hugepages": 3}, ROOT_LOGIN, "proxmox_vm_hugepages"),
        ({"proxmox_vm_gpudirect_clique_id": {"id": 1}}, ROOT_LOGIN, "proxmox_vm_gpudirect_clique_id"),
        ({"proxmox_vm_node": [NODE]}, {}, "proxmox_vm_node"),
        ({}, {"proxmox_api_token_secret": {"secret": SECRET}}, "proxmox_vm_api_token_secret"),
    ],
    ids=[
        "vmid-str",
        "cores-list",
        "numa-str",
        "state-choice",
        "keys-dict",
        "port-str",
        "secret-list",
        "hugepages-int",
        "clique-dict",
        "node-list",
        "node-secret-dict",
    ],
)
def test_a_wrong_typed_variable_is_refused_without_printing_a_secret(
    tmp_path: Path,
    pve: FakePve,
    fakepve_cafile: str,
    ssh_standin: int,
    sysfs: Path,
    host_vars: dict[str, Any],
    node_vars: dict[str, Any],
    variable: str,
) -> None:
    """Ansible's argument-spec check of the role prints the spec when a variable fails it; the secrets'
    defaults used to be templates of the node's secrets, so that print held them in clear."""
    path = tmp_path / "wrong.yml"
    write_inventory(path, pve, fakepve_cafile, ssh_standin, sysfs, host_vars, node_vars)
    run = playbook(tmp_path, path)
    assert run.proc.returncode != 0, run.output[-2000:]
    assert writes(pve) == [], writes(pve)
    assert variable in run.failure(), run.failure()
    assert SECRET not in run.output, "the token secret reached the output"
    assert PASSWORD not in run.output, "the API password reached the output"


def test_no_secret_option_has_a_templated_default() -> None:
    """What the runs above catch, for any variable: Ansible renders the spec's defaults into its failure
    output, so a no_log option's default must not be a template (of the node's secret, an environment variable)."""
    specs = yaml.safe_load((ROOT / "roles" / "proxmox_vm" / "meta" / "argument_specs.yml").read_text())
    templated = [
        name
        for entry in specs["argument_specs"].values()
        for name, option in entry["options"].items()
        if option.get("no_log") and "{{" in str(option.get("default", ""))
    ]
    assert templated == [], templated


def test_a_wrong_typed_variable_leaves_no_secret_in_the_runs_artifacts(
    tmp_path: Path, pve: FakePve, fakepve_cafile: str, ssh_standin: int, sysfs: Path
) -> None:
    path = tmp_path / "wrong.yml"
    write_inventory(path, pve, fakepve_cafile, ssh_standin, sysfs, {"proxmox_vm_vmid": "four-thousand"})
    artifacts = tmp_path / "artifacts"
    inventories = ["-i", str(ROOT / "inventory" / "proxmox"), "-i", str(path)]
    done = cli(tmp_path, *inventories, "-l", HOST, "--yes", "--vm-only", "--artifacts", str(artifacts))
    assert done.returncode == 1, done.stdout + done.stderr
    assert writes(pve) == []
    assert SECRET not in done.stdout + done.stderr
    files = [p for p in artifacts.rglob("*") if p.is_file()]
    assert any("proxmox_vm_vmid" in p.read_text(errors="replace") for p in files), "the run's failure is not recorded"
    leaked = [str(p.relative_to(artifacts)) for p in files if SECRET in p.read_text(errors="replace")]
    assert leaked == [], f"the token secret is in {leaked}"


@pytest.mark.parametrize(
    ("host_vars", "node_vars", "fragments"),
    [
        (
            {"proxmox_vm_ci_nameservers": ["192.0.2.53", "not-an-ip; reboot"]},
            {},
            ["proxmox_vm_ci_nameservers[1]='not-an-ip; reboot' is not an IP address"],
        ),
        (
            {"proxmox_vm_ci_ssh_keys": [SSH_KEY + "\nssh-ed25519 AAAAC3NzaC1lZDI1NTE5 intruder"]},
            {},
            ["proxmox_vm_ci_ssh_keys[0]", "one line"],
        ),
        ({"proxmox_vm_ci_ssh_keys": ["not a key at all"]}, {}, ["proxmox_vm_ci_ssh_keys[0]", "is not one of"]),
        ({"proxmox_vm_ci_user": "root\nssh_pwauth: true"}, {}, ["proxmox_vm_ci_user='root\\nssh_pwauth: true'"]),
        (
            {"proxmox_vm_ci_ipconfig": "ip=192.0.2.10/24,gw=192.0.2.1;reboot"},
            {},
            ["proxmox_vm_ci_ipconfig", "gw='192.0.2.1;reboot' is not an IPv4 address"],
        ),
        ({"proxmox_vm_name": HOST + "\n"}, {}, ["proxmox_vm_name='glm5-01\\n'"]),
        ({"proxmox_vm_storage": "local-lvm\n"}, {}, ["proxmox_vm_storage='local-lvm\\n'"]),
        ({"proxmox_vm_gpus": [*GPUS[:7], GPUS[7] + "\n"]}, {}, ["proxmox_vm_gpus[7]"]),
        ({"proxmox_vm_weights_disk_serial": "sglang-weights\n"}, {}, ["proxmox_vm_weights_disk_serial"]),
        ({"proxmox_vm_image_url": "https://cloud.example/d.qcow2\n"}, {}, ["proxmox_vm_image_url"]),
        ({}, {"proxmox_node_name": NODE + "\n"}, ["proxmox_vm_node_name='pve1\\n'"]),
    ],
    ids=[
        "nameserver",
        "key-2-lines",
        "not-a-key",
        "ciuser",
        "gw",
        "name",
        "storage",
        "mapping",
        "serial",
        "url",
        "node",
    ],
)
def test_a_hostile_value_is_refused_before_any_request(
    tmp_path: Path,
    pve: FakePve,
    fakepve_cafile: str,
    ssh_standin: int,
    sysfs: Path,
    host_vars: dict[str, Any],
    node_vars: dict[str, Any],
    fragments: list[str],
) -> None:
    """Every value that goes to the PVE API (config, cloud-init, request paths) is checked whole, on the
    control node, before the first request; the message is one line naming host, VM, node, variable, fix."""
    path = tmp_path / "hostile.yml"
    write_inventory(
        path, pve, fakepve_cafile, ssh_standin, sysfs, {"proxmox_vm_agent_timeout": 2, **host_vars}, node_vars
    )
    run = playbook(tmp_path, path)
    message = assert_refused_before_any_change(run, pve, *fragments, "Fix:")
    assert [r for r in pve.requests if "/api2/" in r[1]] == [], "the refusal came after contacting the node"
    assert "\n" not in message, message


def test_a_checksum_with_a_trailing_newline_is_refused(
    tmp_path: Path, pve: FakePve, fakepve_cafile: str, ssh_standin: int, sysfs: Path
) -> None:
    path = tmp_path / "checksum.yml"
    checksum = "sha512:" + "ab" * 64 + "\n"
    write_inventory(
        path,
        pve,
        fakepve_cafile,
        ssh_standin,
        sysfs,
        {"proxmox_vm_agent_timeout": 2, "proxmox_vm_image_checksum": checksum},
    )
    run = playbook(tmp_path, path)
    assert_refused_before_any_change(run, pve, "proxmox_vm_image_checksum=", "Fix")
    assert [r for r in pve.requests if "/api2/" in r[1]] == []


@pytest.mark.parametrize(
    "secret", [SECRET + "\n", f"{SECRET}\r\nX-Injected: 1", SECRET + " "], ids=["lf", "crlf", "space"]
)
def test_a_token_secret_with_a_line_break_is_refused_without_printing_it(
    tmp_path: Path, pve: FakePve, inventory: Path, secret: str
) -> None:
    """The secret goes into an HTTP header; requests refuses a line break there with an error that quotes
    the whole header, which, raised through a module, bypasses no_log."""
    run = playbook(tmp_path, inventory, env={"PROXMOX_TOKEN_SECRET": secret})
    assert_refused_before_any_change(run, pve, "proxmox_api_token_secret", "Fix:")
    assert [r for r in pve.requests if "/api2/" in r[1]] == []
