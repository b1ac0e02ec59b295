"""Proxmox VE: the serving VM as PVE configuration keys, compared with what a node holds.

Stdlib only, Python >= 3.9. The proxmox_vm role's modules (library/sglang_pve_plan.py,
library/sglang_pve_root_disk.py) use it on the control node; the API calls themselves are in
module_utils/sglang_pve_client.py (proxmoxer). Nothing here talks to a network, so every rule is
unit-tested on plain data (tests/unit/test_proxmox_config.py).

Facts the rules rest on (qemu-server and pve-manager, PVE 8 and 9):

- ``args`` and a raw ``hostpciN: <BDF>`` may only be set by root@pam logged in with a password (an
  API token of root is not root@pam); a resource mapping (``mapping=NAME``) needs Mapping.Use on
  /mapping/pci/NAME and works with a token.
- ``qm destroy`` frees every volume the VM owns, unusedN included, so the weights disk survives a
  rebuild only because a rebuild never destroys the VM: it re-images the root disk alone.
- ``PUT .../unlink force=1`` frees that disk's volume; without force the volume becomes unusedN.
- A running VM keeps most changes pending until its next start; the effective configuration is
  the current one with the pending changes applied.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

# The root disk: re-imaged by a rebuild, never anything else. The cloud-init drive beside it.
ROOT_SLOT = "scsi0"
CLOUDINIT_SLOT = "ide2"
DRIVE_KEY = re.compile(r"^(ide[0-3]|sata[0-5]|scsi(?:[0-9]|[12][0-9]|30)|virtio(?:[0-9]|1[0-5])|efidisk0|tpmstate0)$")
DATA_SLOT = re.compile(r"^(sata[0-5]|scsi(?:[0-9]|[12][0-9]|30)|virtio(?:[0-9]|1[0-5]))$")
UNUSED_KEY = re.compile(r"^unused\d+$")
GPU_KEY = re.compile(r"^hostpci\d+$")
BDF = re.compile(r"^(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?$")
MAPPING_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{1,127}$")
VOLUME_ID = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*:[^\s,]+$")
STORAGE_ID = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")
# What a QEMU serial number may hold (PVE: url-encoded, at most 20 bytes).
SERIAL = re.compile(r"^[A-Za-z0-9_.-]{1,20}$")
WWN = re.compile(r"^0x[0-9a-fA-F]{16}$")
MMIO_MODES = ("phys-bits", "ovmf-option", "none")
HUGEPAGES = ("", "2", "1024", "any")
# Keys of a property string that is not key=value, by configuration key family.
DEFAULT_KEYS = {"cpu": "cputype", "agent": "enabled", "hostpci": "host", "drive": "file", "vga": "type"}
# Keys the role owns although a VM may lack them: present on the VM but not wanted means delete.
OPTIONAL_KEYS = re.compile(r"^(hostpci\d+|args|hugepages|cicustom|nameserver|searchdomain)$")
BOOL_KEYS = frozenset({"numa", "onboot", "ciupgrade", "pcie", "enabled", "backup", "replicate", "iothread", "ssd"})
INT_KEYS = frozenset({"memory", "balloon", "cores", "sockets"})
SIZE_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
GIB = 1024**3
# Bytes PVE allocates for the EFI vars disk (4m) and the cloud-init image.
EFIDISK_BYTES = 4 * 1024**2
CLOUDINIT_BYTES = 4 * 1024**2


class SpecError(ValueError):
    """A VM definition that cannot be built as asked; the message names the variable and the fix."""


# ------------------------------------------------------------------ property strings


def parse_props(value: Any, default_key: str = "") -> dict[str, str]:
    """``a,b=c,d=e`` as PVE's property strings: the part without ``=`` is the default key's value."""
    out: dict[str, str] = {}
    for part in str(value if value is not None else "").split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, val = part.partition("=")
        if sep:
            out[key.strip()] = val.strip()
        elif default_key:
            out[default_key] = key
        else:
            out[key] = ""
    return out


def _bool_text(value: str) -> str:
    lowered = value.strip().lower()
    if lowered in ("1", "on", "yes", "true"):
        return "1"
    if lowered in ("0", "off", "no", "false"):
        return "0"
    return value.strip()


def _norm_props(props: Mapping[str, str]) -> dict[str, str]:
    return {k: (_bool_text(v) if k in BOOL_KEYS else v) for k, v in props.items()}


def parse_net(value: Any) -> dict[str, str]:
    """A netN value with the MAC split off: ``virtio=BC:24:..,bridge=vmbr0`` -> model + macaddr + rest."""
    props = parse_props(value)
    out: dict[str, str] = {}
    for key, val in props.items():
        if key in NET_MODELS:
            out["model"] = key
            if val:
                out["macaddr"] = val.upper()
        else:
            out[key] = val
    return out


NET_MODELS = frozenset(
    {
        "e1000",
        "e1000-82540em",
        "e1000-82544gc",
        "e1000-82545em",
        "e1000e",
        "i82551",
        "i82557b",
        "i82559er",
        "ne2k_isa",
        "ne2k_pci",
        "pcnet",
        "rtl8139",
        "virtio",
        "vmxnet3",
    }
)


def parse_size(text: Any) -> int:
    """A drive size (``1T``, ``1024G``, ``528K``, plain bytes) in bytes; 0 when absent or unreadable."""
    found = re.match(r"^(\d+(?:\.\d+)?)([KMGT]?)$", str(text or "").strip())
    if not found:
        return 0
    return int(float(found.group(1)) * SIZE_UNITS[found.group(2)])


def normalize(key: str, value: Any) -> Any:
    """A configuration value in the form two equal settings share, whatever PVE or a client wrote."""
    if value is None:
        return None
    text = str(value).strip()
    if key in INT_KEYS:
        return str(int(float(text))) if re.match(r"^\d+(\.0+)?$", text) else text
    if key in BOOL_KEYS:
        return _bool_text(text)
    if key == "cpu":
        return _norm_props(parse_props(text, DEFAULT_KEYS["cpu"]))
    if key == "agent":
        return _norm_props(parse_props(text, DEFAULT_KEYS["agent"]))
    if GPU_KEY.match(key):
        return _norm_props(parse_props(text, DEFAULT_KEYS["hostpci"]))
    if re.match(r"^(ipconfig\d+|cicustom)$", key):
        return parse_props(text)
    if re.match(r"^net\d+$", key):
        return {k: v for k, v in parse_net(text).items() if k != "macaddr"}
    if key == "sshkeys":
        return sorted(line.strip() for line in urllib.parse.unquote(text).splitlines() if line.strip())
    if key == "tags":
        return sorted({t.lower() for t in re.split(r"[;, ]+", text) if t})
    if key in ("nameserver", "searchdomain"):
        return text.split()
    return text


def same(key: str, want: Any, have: Any) -> bool:
    """True when a VM holding ``have`` for ``key`` already has the setting ``want``."""
    return normalize(key, want) == normalize(key, have)


# ------------------------------------------------------------------ the VM as data


@dataclass(frozen=True)
class Gpu:
    """One passed-through GPU: a PVE resource mapping (works with an API token) or a raw BDF (root@pam)."""

    mapping: str = ""
    host: str = ""

    def value(self) -> str:
        return f"mapping={self.mapping},pcie=1" if self.mapping else f"{self.host},pcie=1"

    def label(self) -> str:
        return f"mapping {self.mapping}" if self.mapping else f"host {self.host}"


def parse_gpus(entries: Sequence[Any]) -> list[Gpu]:
    """proxmox_vm_gpus: a mapping name, or {mapping: NAME}, or {host: BDF} per GPU."""
    gpus: list[Gpu] = []
    for index, entry in enumerate(entries or []):
        where = f"proxmox_vm_gpus[{index}]"
        if isinstance(entry, str):
            entry = {"mapping": entry}
        if not isinstance(entry, Mapping) or set(entry) - {"mapping", "host"} or len(entry) != 1:
            raise SpecError(
                f"{where}={entry!r} is neither a mapping name nor {{mapping: NAME}} / {{host: BDF}}. "
                "Fix: list each GPU's PVE resource mapping name (Datacenter > Resource Mappings)."
            )
        mapping, host = str(entry.get("mapping", "")), str(entry.get("host", ""))
        if mapping and not MAPPING_NAME.match(mapping):
            raise SpecError(
                f"{where}: {mapping!r} is not a PVE mapping name. Fix: use the mapping's ID as PVE shows it."
            )
        if host and not BDF.match(host):
            raise SpecError(f"{where}: {host!r} is not a PCI address (0000:41:00.0). Fix: use lspci -D's address.")
        gpus.append(Gpu(mapping=mapping, host=host))
    seen = [g.mapping or g.host for g in gpus]
    duplicates = sorted({s for s in seen if seen.count(s) > 1})
    if duplicates:
        raise SpecError(f"proxmox_vm_gpus names {duplicates} twice. Fix: list each GPU once.")
    return gpus


@dataclass
class VmSpec:
    """The VM the role builds: every field comes from one proxmox_vm_* variable (same name)."""

    vmid: int
    name: str
    image: str
    storage: str
    root_disk_gib: int
    weights_disk_slot: str
    weights_disk_storage: str
    weights_disk_gib: int
    weights_disk_serial: str
    weights_disk_backup: bool
    machine: str = "q35"
    bios: str = "ovmf"
    efidisk_storage: str = ""
    efidisk_pre_enrolled_keys: bool = False
    cpu: str = "host"
    mmio: str = "phys-bits"
    mmio64_mb: int = 0
    sockets: int = 1
    cores: int = 1
    numa: bool = True
    memory_mib: int = 1024
    hugepages: str = ""
    gpus: list[Gpu] = field(default_factory=list)
    gpudirect_clique: bool = False
    gpudirect_clique_id: int = 0
    net: str = "virtio,bridge=vmbr0"
    ci_user: str = "root"
    ci_ssh_keys: list[str] = field(default_factory=list)
    ci_ipconfig: str = "ip=dhcp"
    ci_nameservers: list[str] = field(default_factory=list)
    ci_searchdomains: list[str] = field(default_factory=list)
    ci_vendor_snippet: str = ""
    ci_storage: str = ""
    onboot: bool = True
    # Not a PVE setting: the run reads the guest's SSH host keys through its agent (file-read privilege).
    trust_host_keys_from_agent: bool = False
    tags: list[str] = field(default_factory=lambda: ["sglang-deploy"])

    def __post_init__(self) -> None:
        self.efidisk_storage = self.efidisk_storage or self.storage
        self.ci_storage = self.ci_storage or self.storage
        self.weights_disk_storage = self.weights_disk_storage or self.storage

    # Root-only settings: a password login of root@pam may set them, an API token never.
    def root_only(self) -> list[str]:
        """Why this VM needs root@pam with a password, one reason per variable (empty: a token suffices)."""
        reasons = []
        raw = [g.host for g in self.gpus if g.host]
        if raw:
            reasons.append(
                f"proxmox_vm_gpus has raw PCI addresses {raw} (hostpciN: <BDF>): PVE lets only root@pam set those. "
                "Fix: create a resource mapping per GPU (Datacenter > Resource Mappings > PCI) and list the "
                "mapping names"
            )
        if self.gpudirect_clique:
            reasons.append(
                "proxmox_vm_gpudirect_clique: true needs QEMU 'args' (-set device.hostpciN.x-nv-gpudirect-clique), "
                "which only root@pam with a password may set; it is also unverified on RTX PRO 6000. Fix: set "
                "proxmox_vm_gpudirect_clique: false (NCCL P2P stays off, as the profile has it), or run as root@pam "
                "with proxmox_api_password"
            )
        if self.mmio == "ovmf-option":
            reasons.append(
                "proxmox_vm_mmio: ovmf-option needs QEMU 'args' (-fw_cfg opt/ovmf/X-PciMmio64Mb), which only "
                "root@pam with a password may set. Fix: proxmox_vm_mmio: phys-bits (cpu phys-bits=host sizes "
                "OVMF's 64-bit window from the host's address width), or run as root@pam with proxmox_api_password"
            )
        return reasons

    def args(self) -> str:
        """QEMU's extra arguments: the OVMF MMIO option and the GPUDirect clique (both opt-in, root@pam)."""
        parts = []
        if self.mmio == "ovmf-option":
            parts.append(f"-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string={self.mmio64_mb}")
        if self.gpudirect_clique:
            parts += [
                f"-set device.hostpci{i}.x-nv-gpudirect-clique={self.gpudirect_clique_id}"
                for i in range(len(self.gpus))
            ]
        return " ".join(parts)

    def cpu_value(self) -> str:
        props = parse_props(self.cpu, "cputype")
        if self.mmio == "phys-bits":
            props.setdefault("phys-bits", "host")
        head = props.pop("cputype", "host")
        return ",".join([head] + [f"{k}={v}" for k, v in props.items()])

    def weights_value(self) -> str:
        """The weights disk as created: its own serial (the guest finds it by that), never in backups by default."""
        options = [f"serial={self.weights_disk_serial}", "discard=on", "iothread=1", "ssd=1"]
        if not self.weights_disk_backup:
            options.append("backup=0")
        return ",".join([f"{self.weights_disk_storage}:{self.weights_disk_gib}"] + options)

    def root_value(self) -> str:
        """The root disk as (re-)imaged: a fresh import of the cloud image; the size comes after, by resize."""
        return f"{self.storage}:0,import-from={self.image},discard=on,iothread=1,ssd=1"

    def settings(self, with_boot: bool) -> dict[str, str]:
        """The configuration keys the role converges (not disks, not the NIC), as PVE stores them."""
        config = {
            "name": self.name,
            "ostype": "l26",
            "machine": self.machine,
            "bios": self.bios,
            "scsihw": "virtio-scsi-single",
            "cpu": self.cpu_value(),
            "sockets": str(self.sockets),
            "cores": str(self.cores),
            "numa": "1" if self.numa else "0",
            "memory": str(self.memory_mib),
            # Ballooning off: the model's host-pinned buffers and NCCL must never see memory taken back.
            "balloon": "0",
            "agent": "enabled=1",
            "onboot": "1" if self.onboot else "0",
            "serial0": "socket",
            "tags": ";".join(sorted(self.tags)),
            "ciuser": self.ci_user,
            "citype": "nocloud",
            "ciupgrade": "0",
            "ipconfig0": self.ci_ipconfig,
        }
        for index, gpu in enumerate(self.gpus):
            config[f"hostpci{index}"] = gpu.value()
        if self.hugepages:
            config["hugepages"] = self.hugepages
        if self.args():
            config["args"] = self.args()
        if self.ci_ssh_keys:
            config["sshkeys"] = "\n".join(self.ci_ssh_keys)
        if self.ci_nameservers:
            config["nameserver"] = " ".join(self.ci_nameservers)
        if self.ci_searchdomains:
            config["searchdomain"] = " ".join(self.ci_searchdomains)
        if self.ci_vendor_snippet:
            config["cicustom"] = f"vendor={self.ci_vendor_snippet}"
        if with_boot:
            config["boot"] = f"order={ROOT_SLOT}"
        return config

    def bridge(self) -> str:
        return parse_net(self.net).get("bridge", "")

    def storages(self) -> list[str]:
        return sorted({self.storage, self.efidisk_storage, self.ci_storage, self.weights_disk_storage})


def check_spec(spec: VmSpec) -> None:
    """Refuse a definition PVE would take but that cannot serve (or lose data); raises SpecError."""
    problems = []
    if not 100 <= spec.vmid <= 999999999:
        problems.append(f"proxmox_vm_vmid={spec.vmid} is not a PVE VM id (100..999999999). Fix: pick a free id")
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9.-]*$", spec.name):
        problems.append(f"proxmox_vm_name={spec.name!r} is not a DNS name. Fix: letters, digits, '-' and '.'")
    if not VOLUME_ID.match(spec.image):
        problems.append(
            f"proxmox_vm_image={spec.image!r} is not a PVE volume id (STORAGE:import/NAME.qcow2). Fix: name the "
            "cloud image's volume on the node (proxmox_vm_image_url downloads it there when missing)"
        )
    for var, sid in (
        ("proxmox_vm_storage", spec.storage),
        ("proxmox_vm_weights_disk_storage", spec.weights_disk_storage),
        ("proxmox_vm_efidisk_storage", spec.efidisk_storage),
        ("proxmox_vm_ci_storage", spec.ci_storage),
    ):
        if not STORAGE_ID.match(sid):
            problems.append(f"{var}={sid!r} is not a PVE storage id. Fix: use the storage's name (pvesm status)")
    if not DATA_SLOT.match(spec.weights_disk_slot) or spec.weights_disk_slot == ROOT_SLOT:
        problems.append(
            f"proxmox_vm_weights_disk_slot={spec.weights_disk_slot!r}: the weights disk needs its own slot "
            f"(scsi1..scsi30, virtio0..15, sata0..5), never {ROOT_SLOT}, the root disk a rebuild re-images"
        )
    if not SERIAL.match(spec.weights_disk_serial):
        problems.append(
            f"proxmox_vm_weights_disk_serial={spec.weights_disk_serial!r}: the guest finds the weights disk by this "
            "serial; use 1-20 of A-Z a-z 0-9 _ . -"
        )
    if spec.root_disk_gib < 8 or spec.weights_disk_gib < 1:
        problems.append(
            f"proxmox_vm_root_disk_gib={spec.root_disk_gib} / proxmox_vm_weights_disk_gib={spec.weights_disk_gib}: "
            "the root disk needs at least 8 GiB (driver, CUDA, ml-env: plan 128), the weights disk at least 1"
        )
    if spec.machine.split(",")[0].split("-")[0] != "q35":
        problems.append(f"proxmox_vm_machine={spec.machine!r}: PCIe passthrough (pcie=1) needs q35. Fix: q35")
    if spec.bios != "ovmf":
        problems.append(
            f"proxmox_vm_bios={spec.bios!r}: 8 GPUs with 128 GB BARs need OVMF (UEFI) and its 64-bit MMIO "
            "window. Fix: ovmf"
        )
    cpu = _norm_props(parse_props(spec.cpu, "cputype"))
    if cpu.get("hidden") == "1":
        problems.append(
            f"proxmox_vm_cpu={spec.cpu!r} hides the hypervisor (hidden=1): the NVIDIA datacenter driver does not need "
            "it, and it breaks the GPUDirect clique. Fix: drop hidden=1 (host is the profile's)"
        )
    if spec.mmio not in MMIO_MODES:
        problems.append(f"proxmox_vm_mmio={spec.mmio!r} is not one of {', '.join(MMIO_MODES)}")
    if spec.mmio == "ovmf-option" and spec.mmio64_mb < 65536:
        problems.append(
            f"proxmox_vm_mmio64_mb={spec.mmio64_mb}: 8 GPUs x 128 GB BARs need a window of at least 1 TiB; "
            "the profile uses 2097152 (2 TiB)"
        )
    if spec.sockets < 1 or spec.cores < 1 or spec.memory_mib < 1024:
        problems.append(
            f"proxmox_vm_sockets={spec.sockets}, proxmox_vm_cores={spec.cores}, proxmox_vm_memory_mib="
            f"{spec.memory_mib}: at least 1 socket, 1 core and 1024 MiB"
        )
    if spec.hugepages not in HUGEPAGES:
        problems.append(f"proxmox_vm_hugepages={spec.hugepages!r} is not one of '', 2, 1024, any")
    if spec.hugepages == "1024" and spec.memory_mib % 1024:
        problems.append(
            f"proxmox_vm_memory_mib={spec.memory_mib} is not a multiple of 1024 MiB, which 1 GiB hugepages need"
        )
    if spec.hugepages and not spec.numa:
        problems.append("proxmox_vm_hugepages needs proxmox_vm_numa: true (PVE allocates hugepages per NUMA node)")
    if not spec.gpus:
        problems.append("proxmox_vm_gpus is empty: the serving VM needs its GPUs. Fix: list the 8 GPUs' mapping names")
    if len(spec.gpus) > 16:
        problems.append(f"proxmox_vm_gpus has {len(spec.gpus)} entries; PVE has hostpci0..hostpci15")
    if not parse_net(spec.net).get("model") or not spec.bridge():
        problems.append(f"proxmox_vm_net={spec.net!r} needs a model and a bridge, e.g. virtio,bridge=vmbr0")
    if "macaddr" in parse_net(spec.net):
        problems.append(f"proxmox_vm_net={spec.net!r} fixes a MAC: leave it out (PVE assigns one at create)")
    if not re.match(r"^[a-z_][a-z0-9_-]*$", spec.ci_user):
        problems.append(f"proxmox_vm_ci_user={spec.ci_user!r} is not a user name")
    if not spec.ci_ssh_keys:
        problems.append(
            "proxmox_vm_ci_ssh_keys is empty: the new guest would accept no SSH login. Fix: list the public keys "
            "of the machines that run ansible-playbook"
        )
    bad_keys = [k for k in spec.ci_ssh_keys if not re.match(r"^(ssh-|ecdsa-|sk-)\S+ \S+", str(k).strip())]
    if bad_keys:
        problems.append(f"proxmox_vm_ci_ssh_keys has entries that are not public keys: {bad_keys}")
    ip = parse_props(spec.ci_ipconfig).get("ip", "")
    if ip not in ("dhcp", "") and not _is_cidr(ip):
        problems.append(f"proxmox_vm_ci_ipconfig={spec.ci_ipconfig!r}: ip must be dhcp or ADDRESS/PREFIX")
    if spec.ci_vendor_snippet and not re.match(r"^[A-Za-z][A-Za-z0-9_.-]*:snippets/[^\s,/]+$", spec.ci_vendor_snippet):
        problems.append(
            f"proxmox_vm_ci_vendor_snippet={spec.ci_vendor_snippet!r} is not STORAGE:snippets/NAME "
            "(e.g. local:snippets/sglang-deploy-vendor.cfg)"
        )
    if problems:
        raise SpecError("; ".join(problems))


def _is_cidr(text: str) -> bool:
    try:
        ipaddress.ip_interface(text)
    except ValueError:
        return False
    return "/" in text


def static_address(ipconfig: str) -> str:
    """The guest's address when cloud-init sets a static one (ip=ADDR/PREFIX), else ''."""
    ip = parse_props(ipconfig).get("ip", "")
    return ip.split("/")[0] if _is_cidr(ip) else ""


# ------------------------------------------------------------------ the VM as PVE has it


@dataclass(frozen=True)
class Drive:
    key: str
    volume: str
    props: dict[str, str]

    @property
    def size(self) -> int:
        return parse_size(self.props.get("size"))


def drives(config: Mapping[str, Any]) -> list[Drive]:
    """Every drive of a config (not unusedN), in key order."""
    out = []
    for key in sorted(config):
        if DRIVE_KEY.match(key):
            props = parse_props(config[key], "file")
            out.append(Drive(key=key, volume=props.pop("file", ""), props=props))
    return out


def unused_volumes(config: Mapping[str, Any]) -> dict[str, str]:
    """unusedN -> volume: disks detached from the VM but still owned (and freed) by it."""
    return {k: str(v).split(",")[0] for k, v in sorted(config.items()) if UNUSED_KEY.match(k)}


def find_serial(config: Mapping[str, Any], serial: str) -> list[Drive]:
    """The drives that carry this serial (the guest sees them as .../by-id/*_<serial>)."""
    return [d for d in drives(config) if d.props.get("serial") == serial]


def effective(config: Mapping[str, Any], pending: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The configuration the VM runs with after its next start: current plus GET .../pending."""
    out = {k: v for k, v in config.items() if k != "digest"}
    for item in pending or []:
        key = str(item.get("key", ""))
        if item.get("delete"):
            out.pop(key, None)
        elif "pending" in item:
            out[key] = item["pending"]
    return out


def pending_keys(pending: Sequence[Mapping[str, Any]]) -> list[str]:
    return sorted(str(i["key"]) for i in pending or [] if i.get("delete") or "pending" in i)


def config_diff(desired: Mapping[str, str], actual: Mapping[str, Any]) -> tuple[dict[str, str], list[str]]:
    """(keys to set with their values, keys to delete) to turn ``actual`` into ``desired``."""
    changed = {k: v for k, v in desired.items() if not same(k, v, actual.get(k))}
    deleted = sorted((k for k in actual if k not in desired and OPTIONAL_KEYS.match(k)), key=_natural)
    return changed, deleted


def _natural(key: str) -> tuple[str, int]:
    found = re.match(r"^(\D+)(\d+)$", key)
    return (found.group(1), int(found.group(2))) if found else (key, 0)


def gpu_users(config: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """(mapping names, PCI addresses) a VM's hostpciN entries hold."""
    mappings, hosts = set(), set()
    for key, value in config.items():
        if GPU_KEY.match(key):
            props = parse_props(value, "host")
            if props.get("mapping"):
                mappings.add(props["mapping"])
            for bdf in props.get("host", "").split(";"):
                if bdf:
                    hosts.add(full_bdf(bdf))
    return mappings, hosts


def full_bdf(bdf: str) -> str:
    """0000:41:00.0 from 41:00.0 or 41:00 (PVE's short forms)."""
    bdf = bdf.strip().lower()
    if bdf.count(":") == 1:
        bdf = "0000:" + bdf
    if "." not in bdf:
        bdf += ".0"
    return bdf


def mapping_paths(mapping: Mapping[str, Any], node: str) -> tuple[list[str], str]:
    """(the PCI addresses a cluster mapping gives on ``node``, its vendor:device id) from GET
    /cluster/mapping/pci/{id} (``map`` entries: ``node=pve1,path=0000:41:00.0,id=10de:2bb1,...``)."""
    for entry in mapping.get("map") or []:
        props = parse_props(entry) if isinstance(entry, str) else {k: str(v) for k, v in dict(entry).items()}
        if props.get("node") == node:
            return [full_bdf(p) for p in props.get("path", "").split(";") if p], props.get("id", "")
    return [], ""


# ------------------------------------------------------------------ API privileges


@dataclass(frozen=True)
class Need:
    """Privileges a step needs on one ACL path (all of them, or any one when ``any``)."""

    path: str
    privs: tuple[str, ...]
    why: str
    any: bool = False

    def held(self, held: set[str]) -> bool:
        return any(p in held for p in self.privs) if self.any else all(p in held for p in self.privs)

    def text(self) -> str:
        joined = (" or " if self.any else " + ").join(self.privs)
        return f"{joined} on {self.path} ({self.why})"


def needs(
    spec: VmSpec, node: str, *, action: str, pve_major: int, download: bool, restart: bool, start: bool = False
) -> list[Need]:
    """What the API user (token) must hold for this run: reads always, writes for ``action`` (create,
    converge, rebuild, absent, none), VM.PowerMgmt to ``start`` or ``restart`` a VM that needs nothing else,
    and the agent's file-read when the run takes the guest's SSH host keys from it (trust_host_keys_from_agent)."""
    vm = f"/vms/{spec.vmid}"
    agent = ("VM.GuestAgent.Audit", "VM.GuestAgent.Unrestricted") if pve_major >= 9 else ("VM.Monitor",)
    # PVE 9 split the agent's privileges; PVE 8 asks VM.Monitor for every agent call, file-read included.
    file_read = ("VM.GuestAgent.FileRead", "VM.GuestAgent.Unrestricted") if pve_major >= 9 else ("VM.Monitor",)
    guest = [Need(vm, agent, "ask the guest agent for the guest's address", any=True)]
    if spec.trust_host_keys_from_agent:
        why = "read the guest's SSH host keys through its agent (proxmox_vm_trust_host_keys_from_agent)"
        guest.append(Need(vm, file_read, why, any=True))
    out = [
        Need(vm, ("VM.Audit",), "read the VM's configuration"),
        Need("/vms", ("VM.Audit",), "see every VM, to find one that already uses a GPU"),
        Need("/", ("Sys.Audit", "Sys.Modify"), "list the node's PCI devices", any=True),
    ]
    out += [
        Need(f"/storage/{sid}", ("Datastore.Audit", "Datastore.AllocateSpace"), "read its free space", any=True)
        for sid in spec.storages()
    ]
    image_sid = spec.image.split(":")[0]
    out.append(
        Need(f"/storage/{image_sid}", ("Datastore.Audit", "Datastore.AllocateSpace"), "read the cloud image", any=True)
    )
    out += [
        Need(
            f"/mapping/pci/{g.mapping}",
            ("Mapping.Audit", "Mapping.Use", "Mapping.Modify"),
            "read the GPU mapping",
            any=True,
        )
        for g in spec.gpus
        if g.mapping
    ]
    if action == "none":
        if restart or start:
            out.append(Need(vm, ("VM.PowerMgmt",), "start or restart the VM"))
        return out + guest
    if action == "absent":
        return out + [Need(vm, ("VM.Allocate", "VM.PowerMgmt"), "stop and destroy the VM")]
    writes = ["VM.PowerMgmt"]
    if action in ("create", "rebuild"):
        writes += ["VM.Config.Disk", "VM.Config.Cloudinit"]
        out += [
            Need(f"/storage/{sid}", ("Datastore.AllocateSpace",), "allocate the VM's disks") for sid in spec.storages()
        ]
    if action == "create":
        writes = (
            ["VM.Allocate"]
            + writes
            + [
                "VM.Config.CPU",
                "VM.Config.Memory",
                "VM.Config.Network",
                "VM.Config.HWType",
                "VM.Config.Options",
            ]
        )
        if pve_major >= 8 and spec.bridge():
            out.append(Need(f"/sdn/zones/localnetwork/{spec.bridge()}", ("SDN.Use",), "attach the NIC to the bridge"))
    if action in ("create", "converge", "rebuild"):
        writes += ["VM.Config.CPU", "VM.Config.Memory", "VM.Config.HWType", "VM.Config.Options", "VM.Config.Cloudinit"]
        out += [
            Need(f"/mapping/pci/{g.mapping}", ("Mapping.Use",), "pass the GPU through") for g in spec.gpus if g.mapping
        ]
    if download:
        out.append(Need(f"/storage/{image_sid}", ("Datastore.AllocateTemplate",), "download the cloud image"))
        if pve_major >= 9:  # PVE 9: Sys.AccessNetwork on the node, or (as PVE 8 needs) Sys.Audit + Sys.Modify on /
            out.append(Need(f"/nodes/{node}", ("Sys.AccessNetwork",), "let the node download the cloud image"))
        else:
            out.append(Need("/", ("Sys.Audit", "Sys.Modify"), "let the node download the cloud image"))
    out.append(Need(vm, tuple(dict.fromkeys(writes)), f"{action} the VM"))
    return out + guest


def missing(required: Sequence[Need], held_by_path: Mapping[str, set[str]]) -> list[Need]:
    """The needs the privileges PVE reports (GET /access/permissions?path=P, per path) do not cover.

    Sys.AccessNetwork on the node may also come as Sys.Audit + Sys.Modify on / (download-url's rule)."""
    out = []
    for need in required:
        if need.held(held_by_path.get(need.path, set())):
            continue
        if need.privs == ("Sys.AccessNetwork",) and {"Sys.Audit", "Sys.Modify"} <= held_by_path.get("/", set()):
            continue
        out.append(need)
    return out


# ------------------------------------------------------------------ proxmox_kvm's parameters


def kvm_params(config: Mapping[str, str]) -> dict[str, Any]:
    """PVE configuration keys as community.proxmox.proxmox_kvm's parameters (it flattens them back)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        group = re.match(r"^(hostpci|ipconfig|net|scsi|ide|sata|virtio|serial|numa)(\d+)$", key)
        if group:
            out.setdefault(group.group(1), {})[key] = value
        elif key == "numa":
            out["numa_enabled"] = value == "1"
        elif key in ("onboot", "ciupgrade"):
            out[key] = value == "1"
        elif key in INT_KEYS:
            out[key] = int(value)
        elif key in ("nameserver", "searchdomain"):
            out[key + "s"] = value.split()
        elif key == "tags":
            out["tags"] = [t for t in re.split(r"[;, ]+", value) if t]
        elif key == "smbios1":
            out["smbios"] = value
        else:
            out[key] = value
    return out


def create_config(spec: VmSpec) -> dict[str, Any]:
    """proxmox_kvm's parameters for a new VM: the settings, the root disk imported from the cloud image,
    the EFI vars disk, the cloud-init drive, the weights disk and the NIC (the root disk's size comes after,
    by resize, as after a rebuild's import)."""
    params = kvm_params(
        {
            **spec.settings(with_boot=True),
            ROOT_SLOT: spec.root_value(),
            CLOUDINIT_SLOT: f"{spec.ci_storage}:cloudinit",
            spec.weights_disk_slot: spec.weights_value(),
            "net0": spec.net,
        }
    )
    params["efidisk0"] = {
        "storage": spec.efidisk_storage,
        "efitype": "4m",
        "pre_enrolled_keys": spec.efidisk_pre_enrolled_keys,
    }
    return params


def create_bytes(spec: VmSpec) -> dict[str, int]:
    """Bytes a new VM allocates per storage (root, weights, EFI vars, cloud-init)."""
    need: dict[str, int] = {}
    for sid, size in (
        (spec.storage, spec.root_disk_gib * GIB),
        (spec.weights_disk_storage, spec.weights_disk_gib * GIB),
        (spec.efidisk_storage, EFIDISK_BYTES),
        (spec.ci_storage, CLOUDINIT_BYTES),
    ):
        need[sid] = need.get(sid, 0) + size
    return need


# ------------------------------------------------------------------ the guest


def pick_address(interfaces: Sequence[Mapping[str, Any]]) -> str:
    """The guest's first global address the agent reports (network-get-interfaces), IPv4 first."""
    found: list[tuple[int, str]] = []
    for iface in interfaces or []:
        if iface.get("name") == "lo":
            continue
        for entry in iface.get("ip-addresses") or []:
            text = str(entry.get("ip-address", ""))
            try:
                address = ipaddress.ip_address(text)
            except ValueError:
                continue
            if address.is_link_local or address.is_multicast or address.is_unspecified:
                continue
            found.append((0 if address.version == 4 else 1, text))
    return sorted(found, key=lambda pair: pair[0])[0][1] if found else ""
