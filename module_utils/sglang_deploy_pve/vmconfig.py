"""The serving VM as Proxmox VE keeps it: its drives, the configuration with pending changes applied, the diff
against what the spec asks, which GPU mappings other VMs use, the privileges a plan needs, and the parameters
and sizes of a new VM. Stdlib only, Python >= 3.9; control-node code (the proxmox_vm role's modules). The spec
itself (the role's variables, checked) is vmspec.py.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .vmspec import (
    CLOUDINIT_BYTES,
    CLOUDINIT_SLOT,
    DRIVE_KEY,
    EFIDISK_BYTES,
    GIB,
    GPU_KEY,
    INT_KEYS,
    OPTIONAL_KEYS,
    ROOT_SLOT,
    UNUSED_KEY,
    VmSpec,
    address_ok,
    parse_props,
    parse_size,
    same,
)


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
        if DRIVE_KEY.fullmatch(key):
            props = parse_props(config[key], "file")
            out.append(Drive(key=key, volume=props.pop("file", ""), props=props))
    return out


def unused_volumes(config: Mapping[str, Any]) -> dict[str, str]:
    """unusedN -> volume: disks detached from the VM but still owned (and freed) by it."""
    return {k: str(v).split(",")[0] for k, v in sorted(config.items()) if UNUSED_KEY.fullmatch(k)}


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
    deleted = sorted((k for k in actual if k not in desired and OPTIONAL_KEYS.fullmatch(k)), key=_natural)
    return changed, deleted


def _natural(key: str) -> tuple[str, int]:
    found = re.fullmatch(r"(\D+)(\d+)", key)
    return (found.group(1), int(found.group(2))) if found else (key, 0)


def gpu_users(config: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """(mapping names, PCI addresses) a VM's hostpciN entries hold."""
    mappings, hosts = set(), set()
    for key, value in config.items():
        if GPU_KEY.fullmatch(key):
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
        # PVE 8.2+ and 9 (their API schema: download-url's permissions): Sys.AccessNetwork on the node, or
        # Sys.Audit + Sys.Modify on / (missing() takes either; PVE 8.0/8.1 know only the second).
        out.append(Need(f"/nodes/{node}", ("Sys.AccessNetwork",), "let the node download the cloud image"))
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


def kvm_params(config: Mapping[str, str]) -> dict[str, Any]:
    """PVE configuration keys as community.proxmox.proxmox_kvm's parameters (it flattens them back)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        group = re.fullmatch(r"(hostpci|ipconfig|net|scsi|ide|sata|virtio|serial|numa)(\d+)", key)
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


def pick_address(interfaces: Sequence[Mapping[str, Any]]) -> str:
    """The guest's first global address the agent reports (network-get-interfaces), IPv4 first."""
    found: list[tuple[int, str]] = []
    for iface in interfaces or []:
        if iface.get("name") == "lo":
            continue
        for entry in iface.get("ip-addresses") or []:
            text = str(entry.get("ip-address", ""))
            # Plainly written only: the address goes to known_hosts and ssh (ipaddress takes a zone, %eth0, too).
            if not address_ok(text, 0, prefix=False):
                continue
            address = ipaddress.ip_address(text)
            if address.is_link_local or address.is_multicast or address.is_unspecified:
                continue
            found.append((0 if address.version == 4 else 1, text))
    return sorted(found, key=lambda pair: pair[0])[0][1] if found else ""
