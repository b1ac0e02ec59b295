"""The stand-ins and the runner of the proxmox_vm role's tests (test_proxmox_vm_*.py): the role for real: playbooks/proxmox.yml with inventory/proxmox, run by ansible-playbook with the
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

import pytest
import yaml
from conftest import ROOT
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
# A test dependency (pyproject [test]); its pytest plugin provides the fakepve and fakepve_cafile fixtures.
from fakepve import FakePve, PveError

from sglang_deploy_pve import hostkeys

sys.path.insert(0, str(ROOT / "tests"))
import pve_api  # noqa: E402 - tests/pve_api.py, beside the fixtures it reads

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
def pve(fakepve: FakePve) -> Iterator[FakePve]:
    """A PVE 9 node pve1 with the cloud image, the vendor snippet, 8 mapped GPUs and a token for the role.
    After the test, every request the role sent is checked against PVE's own API schema (tests/pve_api.py):
    fakepve accepts what the real API may refuse."""
    fakepve.apitokens[TOKEN] = SECRET
    fakepve.grant(TOKEN, "/", *TOKEN_PRIVS)
    fakepve.storages["local"]["content"] = "iso,vztmpl,backup,import,snippets"
    fakepve.storages["local-lvm"]["total"] = 8 * 1024**4
    fakepve.store_file("local", "debian-12-genericcloud-amd64.qcow2", 3 * 1024**3, content="import")
    fakepve.store_file("local", "sglang-deploy-vendor.cfg", 512, content="snippets")
    gpu_inventory(fakepve, {name: [bdf] for name, bdf in zip(GPUS, BDFS)}, BDFS)
    # fakepve records a request's path without its query string, where PVE takes parameters too (a GET's, and
    # community.proxmox's checksummed download-url): keep each request with it, body as fakepve redacted it.
    sent: list[tuple[str, str, bytes]] = []
    record = fakepve._record

    def record_with_query(request: Any, body: bytes) -> None:
        record(request, body)
        sent.append((request.method, request.path_qs, fakepve.requests[-1][2]))

    fakepve._record = record_with_query  # type: ignore[method-assign]
    yield fakepve
    refused = schema_refusals(sent)
    if refused:
        pytest.fail("requests PVE's API schema refuses (fakepve took them):\n" + "\n".join(refused), pytrace=False)


def schema_refusals(sent: list[tuple[str, str, bytes]]) -> list[str]:
    """What PVE's API schema refuses in the requests a test sent (method, path with its query, body): the check
    the ``pve`` fixture makes after each test (tests/unit/vm/test_pve_api_schema.py shows it firing)."""
    return sorted({why for method, path, body in sent for why in pve_api.problems(method, path, body)})


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
