"""Proxmox VE: the serving VM's spec (the proxmox_vm role's variables, checked whole) as PVE configuration keys;
vmconfig.py compares them with what a node holds.

Stdlib only, Python >= 3.9. The proxmox_vm role's modules (library/sglang_pve_plan.py through
vmplan.py, library/sglang_pve_root_disk.py) use it on the control node; the API calls themselves are in
module_utils/sglang_deploy_pve/client.py (proxmoxer). Nothing here talks to a network, so every rule is
unit-tested on plain data (tests/unit/vm/test_proxmox_config.py).

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
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Sequence

try:  # shipped by Ansible beside this package
    from ansible.module_utils.sglang_deploy_host.fs.blockdev import SERIAL
except ImportError:  # the installed project: the CLI and the tests
    from sglang_deploy_host.fs.blockdev import SERIAL
from .hostkeys import USER_KEY_TYPES, HostKeyError, parse_public_key

# The root disk: re-imaged by a rebuild, never anything else. The cloud-init drive beside it.
ROOT_SLOT = "scsi0"
CLOUDINIT_SLOT = "ide2"
# Every pattern below is matched whole (fullmatch): re.match(...$) also takes "x\n", and each value leaves
# for the PVE API or cloud-init, where a line break or a comma starts another setting.
DRIVE_KEY = re.compile(r"ide[0-3]|sata[0-5]|scsi(?:[0-9]|[12][0-9]|30)|virtio(?:[0-9]|1[0-5])|efidisk0|tpmstate0")
DATA_SLOT = re.compile(r"sata[0-5]|scsi(?:[0-9]|[12][0-9]|30)|virtio(?:[0-9]|1[0-5])")
UNUSED_KEY = re.compile(r"unused\d+")
GPU_KEY = re.compile(r"hostpci\d+")
# What PVE's own schema takes (tests/fixtures/pve-api/schema.json): hostpci's host is lower-case hex only
# (qemu-server's PCIRE, as lspci -D prints it), a mapping ID is a pve-configid ([a-z][a-z0-9_-]+, any case).
BDF = re.compile(r"(?:[0-9a-f]{4}:)?[0-9a-f]{2}:[0-9a-f]{2}(?:\.[0-7])?")
MAPPING_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{1,127}")
STORAGE_ID = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")
# STORAGE:PATH; the path's parts are file names (no '..': PVE resolves them under the storage).
VOLUME_ID = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*:[A-Za-z0-9_.+@-]+(?:/[A-Za-z0-9_.+@-]+)*")
SNIPPET = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*:snippets/[A-Za-z0-9_.+@-]+")
# RFC 1123 labels: the VM's name, a node's name (one label), a search domain (labels joined by dots).
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
DNS_NAME = re.compile(rf"(?=.{{1,253}}\Z){_LABEL}(?:\.{_LABEL})*")
NODE_NAME = re.compile(_LABEL)
# Debian's useradd NAME_REGEX, 32 characters.
USER_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_+.-]*")
# A value inside a property string: plain words; ';' separates CPU flags and VLAN trunks, ':' a MAC's bytes.
PROP_VALUE = re.compile(r"[A-Za-z0-9_.+:;/-]+")
CPU_KEYS = ("cputype", "flags", "hidden", "hv-vendor-id", "phys-bits", "reported-model")
CPU_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
MACHINE_KEYS = ("type", "viommu", "enable-s3", "enable-s4")
# PCIe passthrough (pcie=1) needs q35: the current one, or a pinned version of it.
MACHINE_TYPE = re.compile(r"q35|pc-q35-\d+(?:\.\d+)+(?:\+pve\d+)?(?:\.pxe)?")
NET_KEYS = ("model", "bridge", "firewall", "link_down", "mtu", "queues", "rate", "tag", "trunks")
IPCONFIG_KEYS = ("ip", "gw", "ip6", "gw6")
# QEMU's x-nv-gpudirect-clique is 4 bits.
CLIQUE_IDS = range(16)
MMIO_MODES = ("phys-bits", "ovmf-option", "none")
HUGEPAGES = ("", "2", "1024", "any")
# Keys of a property string that is not key=value, by configuration key family.
DEFAULT_KEYS = {"cpu": "cputype", "agent": "enabled", "hostpci": "host", "drive": "file", "vga": "type"}
# Keys the role owns although a VM may lack them: present on the VM but not wanted means delete.
OPTIONAL_KEYS = re.compile(r"hostpci\d+|args|hugepages|cicustom|nameserver|searchdomain")
BOOL_KEYS = frozenset({"numa", "onboot", "ciupgrade", "pcie", "enabled", "backup", "replicate", "iothread", "ssd"})
INT_KEYS = frozenset({"memory", "balloon", "cores", "sockets"})
SIZE_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
GIB = 1024**3
# Bytes PVE allocates for the EFI vars disk (4m) and the cloud-init image.
EFIDISK_BYTES = 4 * 1024**2
CLOUDINIT_BYTES = 4 * 1024**2


class SpecError(ValueError):
    """A VM definition that cannot be built as asked; the message names the variable and the fix."""


def quoted(value: Any) -> str:
    """A value for a one-line message, as Python writes it (a line break as \\n), cut short."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def shown(value: Any) -> str:
    """A name for a one-line message: as it is when it is one printable word, else quoted."""
    return value if isinstance(value, str) and re.fullmatch(r"[!-~]+", value) else quoted(value)


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
    found = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]?)", str(text or "").strip())
    if not found:
        return 0
    return int(float(found.group(1)) * SIZE_UNITS[found.group(2)])


def normalize(key: str, value: Any) -> Any:
    """A configuration value in the form two equal settings share, whatever PVE or a client wrote."""
    if value is None:
        return None
    text = str(value).strip()
    if key in INT_KEYS:
        return str(int(float(text))) if re.fullmatch(r"\d+(\.0+)?", text) else text
    if key in BOOL_KEYS:
        return _bool_text(text)
    if key == "cpu":
        return _norm_props(parse_props(text, DEFAULT_KEYS["cpu"]))
    if key == "agent":
        return _norm_props(parse_props(text, DEFAULT_KEYS["agent"]))
    if GPU_KEY.fullmatch(key):
        return _norm_props(parse_props(text, DEFAULT_KEYS["hostpci"]))
    if re.fullmatch(r"ipconfig\d+|cicustom", key):
        return parse_props(text)
    if re.fullmatch(r"net\d+", key):
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
    if not isinstance(entries, (list, tuple)):
        raise SpecError(
            f"proxmox_vm_gpus={quoted(entries)} (type {type(entries).__name__}) is not a list. Fix: one GPU per entry"
        )
    gpus: list[Gpu] = []
    for index, entry in enumerate(entries):
        where = f"proxmox_vm_gpus[{index}]"
        if isinstance(entry, str):
            entry = {"mapping": entry}
        if not isinstance(entry, Mapping) or set(entry) - {"mapping", "host"} or len(entry) != 1:
            raise SpecError(
                f"{where}={quoted(entry)} is neither a mapping name nor {{mapping: NAME}} / {{host: BDF}}. "
                "Fix: list each GPU's PVE resource mapping name (Datacenter > Resource Mappings)."
            )
        mapping, host = entry.get("mapping"), entry.get("host")
        if mapping is not None and not (isinstance(mapping, str) and MAPPING_NAME.fullmatch(mapping)):
            raise SpecError(
                f"{where}: {quoted(mapping)} is not a PVE mapping name (a letter, then letters, digits, _ or -). "
                "Fix: use the mapping's ID as PVE shows it (Datacenter > Resource Mappings)."
            )
        if host is not None and not (isinstance(host, str) and BDF.fullmatch(host)):
            lower = isinstance(host, str) and BDF.fullmatch(host.lower())
            raise SpecError(
                f"{where}: {quoted(host)} is not a PCI address as PVE takes it (0000:41:00.0, lower-case hex). "
                + (f"Fix: write it {host.lower()} (lspci -D prints it so)." if lower else "Fix: use lspci -D's address.")
            )
        gpus.append(Gpu(mapping=mapping or "", host=host or ""))
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
    """Refuse a definition PVE would take but that cannot serve (or lose data), and any value that is not
    whole - the wrong type, a second line, a character that starts another setting - before it reaches the
    API or cloud-init; raises SpecError naming each variable and its fix."""
    problems = _type_problems(spec)
    if problems:
        raise SpecError("; ".join(problems))
    problems = [p for p in _value_problems(spec) if p]
    if not 100 <= spec.vmid <= 999999999:
        problems.append(f"proxmox_vm_vmid={spec.vmid} is not a PVE VM id (100..999999999). Fix: pick a free id")
    if not DATA_SLOT.fullmatch(spec.weights_disk_slot) or spec.weights_disk_slot == ROOT_SLOT:
        problems.append(
            f"proxmox_vm_weights_disk_slot={quoted(spec.weights_disk_slot)}: the weights disk needs its own slot. "
            f"Fix: scsi1..scsi30, virtio0..15 or sata0..5, never {ROOT_SLOT}, the root disk a rebuild re-images"
        )
    if spec.root_disk_gib < 8 or spec.weights_disk_gib < 1:
        problems.append(
            f"proxmox_vm_root_disk_gib={spec.root_disk_gib} / proxmox_vm_weights_disk_gib={spec.weights_disk_gib}: "
            "too small. Fix: the root disk needs at least 8 GiB (driver, CUDA, ml-env: plan 128), the weights disk 1"
        )
    if spec.bios != "ovmf":
        problems.append(
            f"proxmox_vm_bios={quoted(spec.bios)}: 8 GPUs with 128 GB BARs need OVMF (UEFI) and its 64-bit MMIO "
            "window. Fix: ovmf"
        )
    if _norm_props(parse_props(spec.cpu, "cputype")).get("hidden") == "1":
        problems.append(
            f"proxmox_vm_cpu={quoted(spec.cpu)} hides the hypervisor (hidden=1): the NVIDIA datacenter driver does "
            "not need it, and it breaks the GPUDirect clique. Fix: drop hidden=1 (host is the profile's)"
        )
    if spec.mmio not in MMIO_MODES:
        problems.append(f"proxmox_vm_mmio={quoted(spec.mmio)} is unknown. Fix: one of {', '.join(MMIO_MODES)}")
    if spec.mmio == "ovmf-option" and spec.mmio64_mb < 65536:
        problems.append(
            f"proxmox_vm_mmio64_mb={spec.mmio64_mb}: 8 GPUs x 128 GB BARs need a window of at least 1 TiB. "
            "Fix: the profile's 2097152 (2 TiB)"
        )
    if spec.gpudirect_clique_id not in CLIQUE_IDS:
        problems.append(f"proxmox_vm_gpudirect_clique_id={spec.gpudirect_clique_id} is outside 0..15. Fix: 0")
    if spec.sockets < 1 or spec.cores < 1 or spec.memory_mib < 1024:
        problems.append(
            f"proxmox_vm_sockets={spec.sockets}, proxmox_vm_cores={spec.cores}, proxmox_vm_memory_mib="
            f"{spec.memory_mib}: too small. Fix: at least 1 socket, 1 core and 1024 MiB"
        )
    if spec.hugepages not in HUGEPAGES:
        problems.append(f"proxmox_vm_hugepages={quoted(spec.hugepages)} is unknown. Fix: one of '', 2, 1024, any")
    if spec.hugepages == "1024" and spec.memory_mib % 1024:
        problems.append(
            f"proxmox_vm_memory_mib={spec.memory_mib} is not a multiple of 1024 MiB, which 1 GiB hugepages need. "
            "Fix: round it"
        )
    if spec.hugepages and not spec.numa:
        problems.append(
            "proxmox_vm_hugepages needs proxmox_vm_numa: true (PVE allocates hugepages per NUMA node). Fix: turn it on"
        )
    if not spec.gpus:
        problems.append("proxmox_vm_gpus is empty: the serving VM needs its GPUs. Fix: list the 8 GPUs' mapping names")
    if len(spec.gpus) > 16:
        problems.append(f"proxmox_vm_gpus has {len(spec.gpus)} entries; PVE has hostpci0..hostpci15. Fix: list fewer")
    if not parse_net(spec.net).get("model") or not spec.bridge():
        problems.append(f"proxmox_vm_net={quoted(spec.net)} lacks a model or a bridge. Fix: e.g. virtio,bridge=vmbr0")
    if "macaddr" in parse_net(spec.net):
        problems.append(f"proxmox_vm_net={quoted(spec.net)} fixes a MAC. Fix: leave it out (PVE assigns one at create)")
    if not spec.ci_ssh_keys:
        problems.append(
            "proxmox_vm_ci_ssh_keys is empty: the new guest would accept no SSH login. Fix: list the public keys "
            "of the machines that run ansible-playbook"
        )
    if problems:
        raise SpecError("; ".join(problems))


# The VmSpec field types a value must have, in words: the role passes the inventory's values through as they are.
_KINDS = {"int": "an integer", "str": "a string", "bool": "true or false", "list[str]": "a list of strings"}


def _variable(name: str) -> str:
    return "the VM's tags" if name == "tags" else f"proxmox_vm_{name}"


def _type_problems(spec: VmSpec) -> list[str]:
    """Each field whose value is not of its type (bool is no integer; the GPUs were parsed by parse_gpus)."""
    problems = []
    for item in fields(spec):
        kind, value, var = str(item.type), getattr(spec, item.name), _variable(item.name)
        ok = {
            "int": isinstance(value, int) and not isinstance(value, bool),
            "str": isinstance(value, str),
            "bool": isinstance(value, bool),
            "list[str]": isinstance(value, list),
        }.get(kind, True)
        if not ok:
            problems.append(
                f"{var}={quoted(value)} (type {type(value).__name__}) is not {_KINDS[kind]}. "
                f"Fix: write it as {_KINDS[kind]} in the inventory"
            )
        elif kind == "list[str]":
            problems += [
                f"{var}[{index}]={quoted(entry)} (type {type(entry).__name__}) is not a string. Fix: quote it"
                for index, entry in enumerate(value)
                if not isinstance(entry, str)
            ]
    return problems


def _whole(var: str, value: str, pattern: re.Pattern[str], what: str, fix: str) -> str:
    """'' when ``pattern`` matches all of ``value``, else the problem in words."""
    return "" if pattern.fullmatch(value) else f"{var}={quoted(value)} is not {what}. Fix: {fix}"


def storage_problem(var: str, sid: str) -> str:
    return _whole(var, sid, STORAGE_ID, "a PVE storage id", "use the storage's name (pvesm status)")


def volume_problem(var: str, volid: str) -> str:
    return _whole(
        var,
        volid,
        VOLUME_ID,
        "a PVE volume id (STORAGE:import/NAME.qcow2)",
        "name the cloud image's volume on the node (proxmox_vm_image_url downloads it there when missing)",
    )


def serial_problem(var: str, serial: str) -> str:
    return _whole(
        var, serial, SERIAL, "a disk serial", "1-20 of A-Z a-z 0-9 _ . - (the guest finds the weights disk by it)"
    )


def node_problem(node: Any) -> str:
    """'' for a PVE node name (one DNS label), else the problem: the name goes into every API path."""
    if isinstance(node, str) and NODE_NAME.fullmatch(node):
        return ""
    return (
        f"proxmox_vm_node_name={quoted(node)} is not a PVE node name (letters, digits, '-'). Fix: set the node "
        "host's proxmox_node_name to the node's name as PVE shows it (pvecm nodes)"
    )


def image_url_problem(url: Any) -> str:
    """'' for no URL or an https:// URL on one line with a host, else the problem (the node downloads it)."""
    if url == "":
        return ""
    if isinstance(url, str) and re.fullmatch(r"https://[!-~]+", url) and urllib.parse.urlsplit(url).hostname:
        return ""
    return (
        f"proxmox_vm_image_url={quoted(url)} is not an https:// URL on one line. Fix: the image's URL as its "
        "download page gives it (https://cloud.debian.org/images/cloud/...)"
    )


def _props_problem(
    var: str, text: str, keys: Sequence[str], default_key: str, fix: str, also: Sequence[str] = ()
) -> str:
    """'' for a PVE property string ``[DEFAULT,]KEY=VALUE,...`` of ``keys`` (or ``also``, not listed in the
    message), each once, with plain values; else the first problem in words."""
    seen = set()
    for index, part in enumerate(text.split(",")):
        key, sep, value = part.partition("=")
        if not sep and index == 0:
            key, value = default_key, part
        if key not in keys and key not in also:
            return f"{var}={quoted(text)}: {quoted(key)} is not one of its settings ({', '.join(keys)}). Fix: {fix}"
        if key in seen:
            return f"{var}={quoted(text)} sets {key} twice. Fix: {fix}"
        if not PROP_VALUE.fullmatch(value):
            return f"{var}={quoted(text)}: {key}={quoted(value)} is not a plain value (A-Z a-z 0-9 _ . + : ; / -). Fix: {fix}"
        seen.add(key)
    return ""


def address_ok(text: str, version: int, prefix: bool) -> bool:
    """``text`` is an IPv``version`` address (ADDRESS/PREFIX with ``prefix``; 0: either version), written
    plainly: no zone (%eth0), no netmask, nothing around it."""
    if not re.fullmatch(r"[0-9A-Fa-f.:]+" + (r"/[0-9]{1,3}" if prefix else ""), text):
        return False
    try:
        parsed = ipaddress.ip_interface(text) if prefix else ipaddress.ip_address(text)
    except ValueError:
        return False
    return version in (0, parsed.version)


def ipconfig_problems(text: str) -> list[str]:
    """What is wrong with a cloud-init ipconfigN (PVE's ip=, gw=, ip6=, gw6=), in words."""
    var, fix = f"proxmox_vm_ci_ipconfig={quoted(text)}", "Fix: ip=dhcp, or ip=ADDRESS/PREFIX,gw=GATEWAY"
    values: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or key not in IPCONFIG_KEYS:
            return [f"{var}: {quoted(key)} is not one of {', '.join(IPCONFIG_KEYS)}. {fix}"]
        if key in values:
            return [f"{var} sets {key}= twice. {fix}"]
        values[key] = value
    problems = []
    if "ip" not in values and "ip6" not in values:
        problems.append(f"{var} sets no address. {fix}")
    for ip, gw, version, auto in (("ip", "gw", 4, ("dhcp",)), ("ip6", "gw6", 6, ("dhcp", "auto"))):
        address, gateway = values.get(ip), values.get(gw)
        static = address is not None and address_ok(address, version, prefix=True)
        if address is not None and address not in auto and not static:
            words = " or ".join(auto)
            problems.append(f"{var}: {ip}={quoted(address)} is not {words} or an IPv{version} ADDRESS/PREFIX. {fix}")
        if gateway is not None and not address_ok(gateway, version, prefix=False):
            problems.append(f"{var}: {gw}={quoted(gateway)} is not an IPv{version} address. {fix}")
        elif gateway is not None and not static:
            problems.append(f"{var}: {gw}= needs a static {ip}= (a DHCP lease brings its own gateway). {fix}")
    return problems


def ssh_key_problem(index: int, key: str) -> str:
    """'' for one public key on one line, of a type cloud-init may install and laid out as that type."""
    var = f"proxmox_vm_ci_ssh_keys[{index}]"
    fix = "Fix: one key per entry, as its .pub file holds it (ssh-keygen -y -f KEY shows it)"
    if key and key.splitlines() != [key]:
        return f"{var} holds a line break: each entry is one key on one line. {fix}"
    try:
        parse_public_key(key, USER_KEY_TYPES)
    except HostKeyError as exc:
        return f"{var} is not a public key: {exc}. {fix}"
    return ""


def _value_problems(spec: VmSpec) -> list[str]:
    """Every value that goes into the create/update request or cloud-init, checked whole (one '' per good one)."""
    out = [
        _whole(
            "proxmox_vm_name",
            spec.name,
            DNS_NAME,
            "a DNS name",
            "letters, digits and '-' in dot-separated labels, no '-' at either end of a label",
        ),
        volume_problem("proxmox_vm_image", spec.image),
        serial_problem("proxmox_vm_weights_disk_serial", spec.weights_disk_serial),
        _whole("proxmox_vm_ci_user", spec.ci_user, USER_NAME, "a user name", "root, or a lower-case name of 1-32"),
        _props_problem(
            "proxmox_vm_cpu", spec.cpu, CPU_KEYS, "cputype", "a CPU type (host), then KEY=VALUE of PVE's cpu options"
        )
        or _whole(
            "proxmox_vm_cpu", parse_props(spec.cpu, "cputype").get("cputype", ""), CPU_MODEL, "a CPU type", "host"
        ),
        _props_problem("proxmox_vm_machine", spec.machine, MACHINE_KEYS, "type", "q35")
        or _whole(
            "proxmox_vm_machine",
            parse_props(spec.machine, "type").get("type", ""),
            MACHINE_TYPE,
            "a q35 machine, which PCIe passthrough (pcie=1) needs",
            "q35",
        ),
        _props_problem(
            "proxmox_vm_net", spec.net, NET_KEYS, "model", "a model and a bridge: virtio,bridge=vmbr0", also=NET_MODELS
        ),
    ]
    out += [
        storage_problem(var, sid)
        for var, sid in (
            ("proxmox_vm_storage", spec.storage),
            ("proxmox_vm_weights_disk_storage", spec.weights_disk_storage),
            ("proxmox_vm_efidisk_storage", spec.efidisk_storage),
            ("proxmox_vm_ci_storage", spec.ci_storage),
        )
    ]
    if spec.ci_vendor_snippet:
        out.append(
            _whole(
                "proxmox_vm_ci_vendor_snippet",
                spec.ci_vendor_snippet,
                SNIPPET,
                "STORAGE:snippets/NAME",
                "e.g. local:snippets/sglang-deploy-vendor.cfg",
            )
        )
    out += [ssh_key_problem(index, key) for index, key in enumerate(spec.ci_ssh_keys)]
    out += ipconfig_problems(spec.ci_ipconfig)
    out += [
        (
            ""
            if address_ok(server, 0, prefix=False)
            else f"proxmox_vm_ci_nameservers[{index}]={quoted(server)} is not an IP address. Fix: one DNS server's address "
            "per entry (192.0.2.53, 2001:db8::53)"
        )
        for index, server in enumerate(spec.ci_nameservers)
    ]
    out += [
        _whole(
            f"proxmox_vm_ci_searchdomains[{index}]",
            domain[:-1] if domain.endswith(".") else domain,
            DNS_NAME,
            "a DNS domain",
            "one domain per entry (example.com)",
        )
        for index, domain in enumerate(spec.ci_searchdomains)
    ]
    out += [
        _whole(f"the VM's tags[{index}]", tag, TAG, "a PVE tag", "letters, digits and _ + . -")
        for index, tag in enumerate(spec.tags)
    ]
    return out


def static_address(ipconfig: str) -> str:
    """The guest's address when cloud-init sets a static one (ip=ADDR/PREFIX), else ''."""
    ip = parse_props(ipconfig).get("ip", "")
    return ip.split("/")[0] if address_ok(ip, 4, prefix=True) else ""


# ------------------------------------------------------------------ the VM as PVE has it


# ------------------------------------------------------------------ API privileges


# ------------------------------------------------------------------ proxmox_kvm's parameters


# ------------------------------------------------------------------ the guest


