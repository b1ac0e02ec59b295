"""The Proxmox layer's logic on plain data: module_utils/sglang_deploy_pve/vmspec.py (the VM as PVE keys, the
diff, privileges, GPU users), vmplan.py (the planner on a stand-in API), pcidev.py (vfio readiness from
sysfs) and blockdev.py (what counts as blank). The role end to end against fakepve is
tests/unit/vm/test_proxmox_vm_*.py."""

from __future__ import annotations

import base64
import re
import struct
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT

from sglang_deploy_host.fs import blockdev
from sglang_deploy_host.gpu import pcidev
from sglang_deploy_pve import vmconfig, vmplan, vmspec

PROFILE = ROOT / "inventory" / "proxmox" / "group_vars" / "sglang_servers" / "proxmox_vm.yml"
# Made by ssh-keygen (the role checks each key whole: one line, a known type, the blob laid out as that type).
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIARYx9Qe9VCGOEWtIE8jmTZ7mSRLq/Nbc8GhlHBkDDAa ci@control"
KEY_DATA = KEY.split()[1]


# The VM as the role's variables give it (sglang_pve_plan's vm option).
VM: dict[str, Any] = {
    "vmid": 4101,
    "name": "glm5-01",
    "image": "local:import/debian-12-genericcloud-amd64.qcow2",
    "storage": "local-lvm",
    "root_disk_gib": 128,
    "weights_disk_slot": "scsi1",
    "weights_disk_storage": "",
    "weights_disk_gib": 1024,
    "weights_disk_serial": "sglang-weights",
    "weights_disk_backup": False,
    "sockets": 2,
    "cores": 32,
    "memory_mib": 786432,
    "gpus": [f"rtx-pro-6000-{i}" for i in range(8)],
    "ci_ssh_keys": [KEY],
}


def spec(**changes: Any) -> vmspec.VmSpec:
    base = {**VM, "gpus": vmspec.parse_gpus(VM["gpus"])}
    base.update(changes)
    return vmspec.VmSpec(**base)


def test_the_profile_builds_the_vm_the_issue_asks_for() -> None:
    profile = yaml.safe_load(PROFILE.read_text())
    assert len(profile["proxmox_vm_gpus"]) == 8 and profile["proxmox_vm_machine"] == "q35"
    assert profile["proxmox_vm_bios"] == "ovmf" and profile["proxmox_vm_gpudirect_clique"] is False
    settings = spec().settings(with_boot=True)
    assert settings["cpu"] == "host,phys-bits=host" and "hidden" not in settings["cpu"]
    assert settings["balloon"] == "0" and settings["agent"] == "enabled=1" and settings["boot"] == "order=scsi0"
    assert [settings[f"hostpci{i}"] for i in range(8)] == [f"mapping=rtx-pro-6000-{i},pcie=1" for i in range(8)]
    assert "args" not in settings  # nothing root-only: a token can build this VM
    assert spec().root_only() == []
    assert spec().weights_value() == "local-lvm:1024,serial=sglang-weights,discard=on,iothread=1,ssd=1,backup=0"


@pytest.mark.parametrize(
    "changes, variable",
    [
        ({"cpu": "host,hidden=1"}, "proxmox_vm_cpu"),
        ({"machine": "pc-i440fx-9.0"}, "proxmox_vm_machine"),
        ({"bios": "seabios"}, "proxmox_vm_bios"),
        ({"weights_disk_slot": "scsi0"}, "proxmox_vm_weights_disk_slot"),
        ({"weights_disk_serial": "a serial with spaces"}, "proxmox_vm_weights_disk_serial"),
        ({"gpus": []}, "proxmox_vm_gpus is empty"),
        ({"ci_ssh_keys": []}, "proxmox_vm_ci_ssh_keys is empty"),
        ({"ci_ssh_keys": ["not a key"]}, "proxmox_vm_ci_ssh_keys[0] is not a public key"),
        ({"hugepages": "1024", "memory_mib": 786433}, "multiple of 1024"),
        ({"hugepages": "2", "numa": False}, "needs proxmox_vm_numa"),
        ({"net": "virtio=BC:24:11:00:00:01,bridge=vmbr0"}, "fixes a MAC"),
        ({"image": "debian.qcow2"}, "proxmox_vm_image"),
        ({"ci_vendor_snippet": "/var/lib/vz/snippets/x.yml"}, "proxmox_vm_ci_vendor_snippet"),
        ({"mmio": "ovmf-option", "mmio64_mb": 4096}, "proxmox_vm_mmio64_mb"),
        ({"ci_ipconfig": "ip=10.0.0.5"}, "proxmox_vm_ci_ipconfig"),
    ],
)
def test_definitions_that_cannot_serve_are_refused_by_name(changes: dict[str, Any], variable: str) -> None:
    with pytest.raises(vmspec.SpecError, match=re.escape(variable)):
        vmspec.check_spec(spec(**changes))


def wire(*parts: bytes) -> str:
    """Base64 of SSH wire strings, as a key blob is laid out."""
    return base64.b64encode(b"".join(struct.pack(">I", len(p)) + p for p in parts)).decode()


SK_ED25519 = "sk-ssh-ed25519@openssh.com " + wire(b"sk-ssh-ed25519@openssh.com", bytes(range(32)), b"ssh:") + " yubi"
SK_ECDSA = "sk-ecdsa-sha2-nistp256@openssh.com " + wire(
    b"sk-ecdsa-sha2-nistp256@openssh.com", b"nistp256", b"\x04" + bytes(range(64)), b"ssh:"
)
RSA_KEY = "ssh-rsa " + wire(b"ssh-rsa", b"\x01\x00\x01", b"\x00\xc5" + bytes(255)) + " ops@laptop"


def test_values_pve_and_cloud_init_accept_pass_whole() -> None:
    vmspec.check_spec(spec())
    vmspec.check_spec(
        spec(
            ci_ssh_keys=[KEY, SK_ED25519, SK_ECDSA, RSA_KEY, f"ssh-ed25519 {KEY_DATA}"],
            ci_nameservers=["192.0.2.53", "2001:db8::53"],
            ci_searchdomains=["example.com", "lab.example.org."],
            ci_ipconfig="ip=192.0.2.10/24,gw=192.0.2.1,ip6=2001:db8::10/64,gw6=2001:db8::1",
            cpu="x86-64-v2-AES,flags=+aes;-pcid",
            machine="pc-q35-9.0+pve1,viommu=virtio",
            net="virtio,bridge=vmbr0,firewall=1,tag=20",
            ci_vendor_snippet="local:snippets/sglang-deploy-vendor.cfg",
            gpus=vmspec.parse_gpus(["rtx-pro-6000-0", {"host": "0000:41:00.0"}]),
        )
    )
    for ipconfig in ("ip=dhcp", "ip6=auto", "ip6=dhcp", "ip=dhcp,ip6=auto", "ip=192.0.2.10/32"):
        vmspec.check_spec(spec(ci_ipconfig=ipconfig))


@pytest.mark.parametrize(
    "changes, expected",
    [
        # What reached the create request before: each line of a value is a new cloud-init / PVE line.
        ({"ci_user": "root\n"}, "proxmox_vm_ci_user='root\\n' is not a user name"),
        ({"ci_user": "root\nssh_pwauth: true"}, "proxmox_vm_ci_user="),
        ({"ci_ssh_keys": [KEY + "\n"]}, "proxmox_vm_ci_ssh_keys[0]"),
        (
            {"ci_ssh_keys": [KEY + "\nssh-rsa AAAAB3NzaC1yc2E= intruder"]},
            "proxmox_vm_ci_ssh_keys[0] holds a line break",
        ),
        ({"ci_ssh_keys": [KEY, "not a key at all"]}, "proxmox_vm_ci_ssh_keys[1] is not a public key: its type 'not'"),
        ({"ci_ssh_keys": ["ssh-ed25519 not*base64"]}, "is not base64"),
        ({"ci_ssh_keys": ["ssh-rsa " + KEY_DATA]}, "the key data inside says 'ssh-ed25519'"),
        ({"ci_ssh_keys": ["ssh-dss " + KEY_DATA]}, "'ssh-dss' is not one of"),
        ({"ci_ssh_keys": ['from="*" ' + KEY]}, "is not one of"),
        ({"ci_ssh_keys": [KEY + " ci\x1b[31m"]}, "control characters"),
        ({"ci_ssh_keys": [KEY + " ci\u2028x"]}, "proxmox_vm_ci_ssh_keys[0]"),
        ({"ci_nameservers": ["not-an-ip; reboot"]}, "proxmox_vm_ci_nameservers[0]='not-an-ip; reboot' is not an IP"),
        ({"ci_nameservers": ["192.0.2.53\n"]}, "proxmox_vm_ci_nameservers[0]"),
        ({"ci_nameservers": ["192.0.2.53 192.0.2.54"]}, "proxmox_vm_ci_nameservers[0]"),
        ({"ci_nameservers": ["fe80::1%eth0;reboot"]}, "proxmox_vm_ci_nameservers[0]"),
        ({"ci_searchdomains": ["example.com; reboot"]}, "proxmox_vm_ci_searchdomains[0]"),
        ({"ci_searchdomains": ["example.com\n"]}, "proxmox_vm_ci_searchdomains[0]"),
        ({"ci_ipconfig": "ip=192.0.2.10/24,gw=not-an-ip"}, "gw='not-an-ip' is not an IPv4 address"),
        ({"ci_ipconfig": "ip=192.0.2.10/24,gw=2001:db8::1"}, "gw='2001:db8::1' is not an IPv4 address"),
        ({"ci_ipconfig": "ip6=2001:db8::10/64,gw6=192.0.2.1"}, "gw6='192.0.2.1' is not an IPv6 address"),
        ({"ci_ipconfig": "ip=dhcp,gw=192.0.2.1"}, "gw= needs a static ip="),
        ({"ci_ipconfig": "ip=192.0.2.10/24\n"}, "proxmox_vm_ci_ipconfig"),
        ({"ci_ipconfig": "ip=192.0.2.10/24,gw=192.0.2.1\n"}, "proxmox_vm_ci_ipconfig"),
        ({"ci_ipconfig": "ip=192.0.2.10/24,mtu=9000"}, "'mtu' is not one of ip, gw, ip6, gw6"),
        ({"ci_ipconfig": "ip=192.0.2.10/24,ip=192.0.2.11/24"}, "ip= twice"),
        ({"ci_ipconfig": "ip=2001:db8::10/64"}, "ip='2001:db8::10/64' is not dhcp or an IPv4 ADDRESS/PREFIX"),
        ({"ci_ipconfig": "ip=192.0.2.10/255.255.255.0"}, "proxmox_vm_ci_ipconfig"),
        ({"ci_ipconfig": ""}, "proxmox_vm_ci_ipconfig"),
        ({"name": "glm5-01\n"}, "proxmox_vm_name='glm5-01\\n' is not a DNS name"),
        ({"name": "glm5-"}, "proxmox_vm_name"),
        ({"storage": "local-lvm\n"}, "proxmox_vm_storage='local-lvm\\n' is not a PVE storage id"),
        ({"ci_storage": "local-lvm\n"}, "proxmox_vm_ci_storage"),
        ({"weights_disk_serial": "sglang-weights\n"}, "proxmox_vm_weights_disk_serial='sglang-weights\\n'"),
        ({"weights_disk_slot": "scsi1\n"}, "proxmox_vm_weights_disk_slot"),
        ({"image": "local:import/debian.qcow2\n"}, "proxmox_vm_image="),
        ({"image": "local:import/a b.qcow2"}, "proxmox_vm_image="),
        ({"ci_vendor_snippet": "local:snippets/v.cfg\n"}, "proxmox_vm_ci_vendor_snippet"),
        ({"cpu": "host\n"}, "proxmox_vm_cpu"),
        ({"cpu": "host,flags=+aes reboot"}, "proxmox_vm_cpu"),
        ({"cpu": "host,args=-foo"}, "proxmox_vm_cpu"),
        ({"machine": "q35\n"}, "proxmox_vm_machine"),
        ({"machine": "q35,foo=bar"}, "proxmox_vm_machine"),
        ({"net": "virtio,bridge=vmbr0\n"}, "proxmox_vm_net"),
        ({"net": "virtio,bridge=vmbr0,queues=4 8"}, "proxmox_vm_net"),
        ({"tags": ["sglang-deploy", "a;b"]}, "the VM's tags"),
        ({"gpudirect_clique": True, "gpudirect_clique_id": 16}, "proxmox_vm_gpudirect_clique_id=16"),
        # Wrong types (the role passes the inventory's values through): named, never a crash.
        ({"name": 4101}, "proxmox_vm_name=4101 (type int) is not a string"),
        ({"ci_ssh_keys": KEY}, "(type str) is not a list"),
        ({"ci_nameservers": [53]}, "proxmox_vm_ci_nameservers[0]=53 (type int) is not a string"),
        ({"cores": "32"}, "proxmox_vm_cores='32' (type str) is not an integer"),
        ({"numa": "yes"}, "proxmox_vm_numa='yes' (type str) is not true or false"),
        ({"vmid": True}, "proxmox_vm_vmid=True (type bool) is not an integer"),
    ],
)
def test_values_that_leave_for_pve_are_checked_whole(changes: dict[str, Any], expected: str) -> None:
    with pytest.raises(vmspec.SpecError) as refused:
        vmspec.check_spec(spec(**changes))
    message = str(refused.value)
    assert expected in message, message
    assert "Fix:" in message and "\n" not in message, message


def test_gpu_names_and_addresses_are_checked_whole() -> None:
    for bad, why in (
        (["rtx-pro-6000-0\n"], "proxmox_vm_gpus[0]: 'rtx-pro-6000-0\\n' is not a PVE mapping name"),
        ([{"mapping": "a/../b"}], "proxmox_vm_gpus[0]"),
        ([{"host": "0000:41:00.0\n"}], "proxmox_vm_gpus[0]: '0000:41:00.0\\n' is not a PCI address"),
        ("rtx-pro-6000-0", "proxmox_vm_gpus='rtx-pro-6000-0' (type str) is not a list"),
        # What PVE's API schema refuses (tests/fixtures/pve-api): upper-case hex in hostpci, a '.' in a mapping ID.
        ([{"host": "0000:C1:00.0"}], "'0000:C1:00.0' is not a PCI address as PVE takes it (0000:41:00.0, lower-case hex). Fix: write it 0000:c1:00.0"),
        (["rtx.pro.0"], "proxmox_vm_gpus[0]: 'rtx.pro.0' is not a PVE mapping name (a letter, then letters, digits, _ or -)"),
    ):
        with pytest.raises(vmspec.SpecError) as refused:
            vmspec.parse_gpus(bad)
        assert why in str(refused.value) and "\n" not in str(refused.value)


def test_the_node_name_and_the_image_url_are_checked_whole() -> None:
    assert vmspec.node_problem("pve1") == "" and vmspec.image_url_problem("") == ""
    assert vmspec.image_url_problem("https://cloud.debian.org/images/cloud/bookworm/latest/d.qcow2") == ""
    for node in ("pve1\n", "pve 1", "../pve1", "", 7):
        assert "proxmox_vm_node_name=" in vmspec.node_problem(node), node
    for url in (
        "https://cloud.example/d.qcow2\n",
        "http://cloud.example/d.qcow2",
        "https:///d.qcow2",
        "https://cloud.example/a b.qcow2",
        ["https://x"],
    ):
        assert "proxmox_vm_image_url=" in vmspec.image_url_problem(url), url


def test_gpus_accept_names_mappings_and_raw_addresses_only() -> None:
    assert vmspec.parse_gpus(["a-gpu", {"mapping": "b-gpu"}, {"host": "0000:41:00.0"}]) == [
        vmspec.Gpu(mapping="a-gpu"),
        vmspec.Gpu(mapping="b-gpu"),
        vmspec.Gpu(host="0000:41:00.0"),
    ]
    for bad, why in (
        (["gpu0", "gpu0"], "twice"),
        ([{"host": "41-00"}], "not a PCI address"),
        ([{"mapping": "x", "host": "41:00.0"}], "neither"),
        ([7], "neither"),
    ):
        with pytest.raises(vmspec.SpecError, match=why):
            vmspec.parse_gpus(bad)


def test_root_only_settings_are_named_with_their_variable() -> None:
    reasons = spec(
        gpudirect_clique=True,
        mmio="ovmf-option",
        mmio64_mb=2097152,
        gpus=vmspec.parse_gpus(["m0", {"host": "0000:42:00.0"}]),
    ).root_only()
    assert len(reasons) == 3
    assert "raw PCI addresses ['0000:42:00.0']" in reasons[0]
    assert "proxmox_vm_gpudirect_clique: true" in reasons[1] and "unverified on RTX PRO 6000" in reasons[1]
    assert "proxmox_vm_mmio: ovmf-option" in reasons[2]
    args = spec(gpudirect_clique=True, gpudirect_clique_id=3, mmio="ovmf-option", mmio64_mb=2097152).args()
    assert args.startswith(
        "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=2097152 -set device.hostpci0.x-nv-gpudirect-clique=3"
    )
    assert args.count("x-nv-gpudirect-clique=3") == 8


def test_equal_settings_in_the_forms_pve_writes_them_are_not_changes() -> None:
    desired = spec(ci_nameservers=["192.0.2.53"]).settings(with_boot=True)
    as_pve_has_it = {
        **desired,
        "memory": "786432",
        "sockets": 2,
        "numa": 1,
        "agent": "1",
        "cpu": "cputype=host,phys-bits=host",
        "hostpci0": "mapping=rtx-pro-6000-0,pcie=true",
        "tags": "sglang-deploy",
        "ciupgrade": 0,
        "onboot": "true",
        "sshkeys": urllib.parse.quote(KEY + "\n", safe=""),
        "net0": "virtio=BC:24:11:4D:11:C2,bridge=vmbr0",
        "digest": "0" * 40,
        "smbios1": "uuid=1",
    }
    assert vmconfig.config_diff(desired, as_pve_has_it) == ({}, [])


def test_differences_are_the_changed_keys_and_the_extra_gpus() -> None:
    desired = spec().settings(with_boot=True)
    actual = {**desired, "memory": "524288", "hostpci8": "mapping=other,pcie=1", "args": "-foo", "vga": "std"}
    del actual["hostpci7"]
    changed, deleted = vmconfig.config_diff(desired, actual)
    assert changed == {"memory": "786432", "hostpci7": "mapping=rtx-pro-6000-7,pcie=1"}
    assert deleted == ["args", "hostpci8"]  # vga is not the role's to remove
    assert vmconfig.kvm_params(changed) == {"memory": 786432, "hostpci": {"hostpci7": "mapping=rtx-pro-6000-7,pcie=1"}}


def test_pending_changes_count_as_the_vms_configuration() -> None:
    config = {"memory": "524288", "hostpci3": "mapping=a,pcie=1", "cores": "8"}
    pending = [
        {"key": "memory", "value": "524288", "pending": "786432"},
        {"key": "hostpci3", "delete": 1},
        {"key": "cores", "value": "8"},
    ]
    assert vmconfig.effective(config, pending) == {"memory": "786432", "cores": "8"}
    assert vmconfig.pending_keys(pending) == ["hostpci3", "memory"]


def test_the_weights_disk_is_found_by_serial_and_unused_disks_are_seen() -> None:
    config = {
        "scsi0": "local-lvm:vm-4101-disk-2,discard=on,size=128G",
        "scsi1": "local-lvm:vm-4101-disk-3,backup=0,serial=sglang-weights,size=1T",
        "ide2": "local-lvm:vm-4101-cloudinit,media=cdrom",
        "unused0": "local-lvm:vm-4101-disk-9",
    }
    (weights,) = vmconfig.find_serial(config, "sglang-weights")
    assert (weights.key, weights.volume, weights.size) == ("scsi1", "local-lvm:vm-4101-disk-3", 1024**4)
    assert vmconfig.unused_volumes(config) == {"unused0": "local-lvm:vm-4101-disk-9"}


def test_gpu_users_and_mapping_paths_read_pve_forms() -> None:
    mappings, hosts = vmconfig.gpu_users(
        {
            "hostpci0": "mapping=m0,pcie=1",
            "hostpci1": "41:00.0,pcie=1",
            "hostpci2": "host=0000:42:00.0;0000:42:00.1",
            "scsi0": "x",
        }
    )
    assert mappings == {"m0"} and hosts == {"0000:41:00.0", "0000:42:00.0", "0000:42:00.1"}
    mapping = {
        "map": ["id=10de:2bb1,node=pve2,path=0000:01:00.0", "id=10de:2bb1,iommugroup=40,node=pve1,path=0000:41:00.0"]
    }
    assert vmconfig.mapping_paths(mapping, "pve1") == (["0000:41:00.0"], "10de:2bb1")
    assert vmconfig.mapping_paths(mapping, "pve3") == ([], "")


def test_privileges_follow_what_the_run_does() -> None:
    vm_spec = spec()
    create = vmconfig.needs(vm_spec, "pve1", action="create", pve_major=9, download=True, restart=False)
    texts = [n.text() for n in create]
    assert any("VM.Allocate" in t and "/vms/4101" in t for t in texts)
    assert "Mapping.Use on /mapping/pci/rtx-pro-6000-0 (pass the GPU through)" in texts
    assert "SDN.Use on /sdn/zones/localnetwork/vmbr0 (attach the NIC to the bridge)" in texts
    assert any(t.startswith("VM.GuestAgent.Audit or VM.GuestAgent.Unrestricted on /vms/4101") for t in texts)
    settled = vmconfig.needs(vm_spec, "pve1", action="none", pve_major=8, download=False, restart=False)
    assert not any("VM.Allocate" in n.text() or "Mapping.Use on" in n.text() for n in settled)
    assert any(n.text().startswith("VM.Monitor on /vms/4101") for n in settled)  # PVE 8's agent privilege
    held: dict[str, set[str]] = {}
    for need in create:
        held.setdefault(need.path, set()).update(need.privs)
    assert vmconfig.missing(create, held) == []
    held["/nodes/pve1"], held["/"] = set(), {"Sys.Audit"}
    assert [n.privs for n in vmconfig.missing(create, held)] == [("Sys.AccessNetwork",)]
    held["/"] |= {"Sys.Modify"}  # download-url's other way in: Sys.Audit + Sys.Modify on /
    assert vmconfig.missing(create, held) == []
    # PVE 8.2+ takes either as well (its API schema, download-url's permissions): a token with only
    # Sys.AccessNetwork on the node is not refused on PVE 8 any more.
    create8 = vmconfig.needs(vm_spec, "pve1", action="create", pve_major=8, download=True, restart=False)
    held8: dict[str, set[str]] = {}
    for need in create8:
        held8.setdefault(need.path, set()).update(need.privs)
    assert held8["/nodes/pve1"] == {"Sys.AccessNetwork"} and vmconfig.missing(create8, held8) == []
    held8["/nodes/pve1"], held8["/"] = set(), {"Sys.Audit", "Sys.Modify"}
    assert vmconfig.missing(create8, held8) == []


def test_reading_the_guests_host_keys_needs_the_agents_file_read() -> None:
    """proxmox_vm_trust_host_keys_from_agent: PVE 9's VM.GuestAgent.FileRead (or Unrestricted), PVE 8's
    VM.Monitor, for every action that boots the guest; nothing more when it is off, and never to destroy."""
    why = "read the guest's SSH host keys through its agent (proxmox_vm_trust_host_keys_from_agent)"
    trusting = spec(trust_host_keys_from_agent=True)
    for action in ("create", "rebuild", "converge", "none"):
        texts = [
            n.text() for n in vmconfig.needs(trusting, "pve1", action=action, pve_major=9, download=False, restart=False)
        ]
        assert f"VM.GuestAgent.FileRead or VM.GuestAgent.Unrestricted on /vms/4101 ({why})" in texts, action
        texts = [
            n.text() for n in vmconfig.needs(trusting, "pve1", action=action, pve_major=8, download=False, restart=False)
        ]
        assert f"VM.Monitor on /vms/4101 ({why})" in texts, action
        off = vmconfig.needs(spec(), "pve1", action=action, pve_major=9, download=False, restart=False)
        assert not any("FileRead" in n.text() or "host keys" in n.text() for n in off), action
    absent = vmconfig.needs(trusting, "pve1", action="absent", pve_major=9, download=False, restart=False)
    assert not any("host keys" in n.text() for n in absent)
    create = vmconfig.needs(trusting, "pve1", action="create", pve_major=9, download=False, restart=False)
    held: dict[str, set[str]] = {}
    for need in create:
        held.setdefault(need.path, set()).update(need.privs)
    held["/vms/4101"] -= {"VM.GuestAgent.FileRead", "VM.GuestAgent.Unrestricted"}  # VM.GuestAgent.Audit only
    assert [n.why for n in vmconfig.missing(create, held)] == [why]
    assert vmconfig.missing(create, {**held, "/vms/4101": held["/vms/4101"] | {"VM.GuestAgent.FileRead"}}) == []
    assert vmconfig.missing(create, {**held, "/vms/4101": held["/vms/4101"] | {"VM.GuestAgent.Unrestricted"}}) == []


def test_the_guest_address_skips_loopback_interfaces_and_link_local() -> None:
    interfaces = [
        {"name": "lo", "ip-addresses": [{"ip-address": "127.0.0.1"}]},
        {
            "name": "eth0",
            "ip-addresses": [{"ip-address": "fe80::1"}, {"ip-address": "2001:db8::5"}, {"ip-address": "192.0.2.10"}],
        },
    ]
    assert vmconfig.pick_address(interfaces) == "192.0.2.10"
    assert vmconfig.pick_address(interfaces[:1]) == ""
    assert vmspec.static_address("ip=192.0.2.10/24,gw=192.0.2.1") == "192.0.2.10" and vmspec.static_address("ip=dhcp") == ""


def test_every_parameter_the_plan_can_produce_is_passed_by_the_role() -> None:
    text = (ROOT / "roles" / "proxmox_vm" / "tasks" / "kvm.yml").read_text()
    passed = set(re.findall(r"__proxmox_vm_kvm\.(\w+) \| default\(omit\)", text))
    full = spec(
        gpudirect_clique=True,
        hugepages="1024",
        ci_nameservers=["192.0.2.53"],
        ci_searchdomains=["example"],
        ci_vendor_snippet="local:snippets/v.yml",
        weights_disk_slot="virtio1",
    )
    produced = set(vmconfig.create_config(full)) | set(vmconfig.kvm_params(full.settings(with_boot=True)))
    produced |= set(vmconfig.create_config(spec(weights_disk_slot="sata1")))
    assert produced <= passed, produced - passed


# ------------------------------------------------------------------ pve_plan: the planner on a stand-in API

NODE = "pve1"
BDFS = [f"0000:{0x41 + i:02x}:00.0" for i in range(8)]


class ApiFailure(Exception):
    """The stand-in's failed call, shaped as sglang_deploy_pve.client.PveApiError (status 0: no answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class StandInApi:
    """GET answers by resource, as PVE sends them (a callable answer gets the request's parameters; an
    ApiFailure is raised); every request is recorded."""

    where = "the API at https://pve.test:8006 as sglang-deploy@pve!sglang"

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.calls: list[str] = []

    def get(self, resource: str, **params: Any) -> Any:
        self.calls.append(resource)
        answer = self.answers[resource]
        if isinstance(answer, ApiFailure):
            raise answer
        return answer(**params) if callable(answer) else answer


def node_answers(storage_type: str = "lvmthin") -> dict[str, Any]:
    """A PVE 9 node with the image, the eight mapped GPUs, room on local-lvm, every privilege; no VM yet."""
    granted = {
        priv
        for need in vmconfig.needs(spec(), NODE, action="create", pve_major=9, download=True, restart=True, start=True)
        for priv in need.privs
    }
    answers: dict[str, Any] = {
        "version": {"version": "9.0.3"},
        "nodes": [{"node": NODE, "status": "online"}],
        "cluster/resources": [],
        "access/permissions": lambda path: {path: {priv: 1 for priv in granted}},
        f"nodes/{NODE}/storage/local/content": [{"volid": VM["image"]}],
        f"nodes/{NODE}/hardware/pci": [{"id": bdf, "vendor": "0x10de", "device": "0x2bb1"} for bdf in BDFS],
        f"nodes/{NODE}/storage/local-lvm/status": {
            "active": 1,
            "enabled": 1,
            "content": "images,rootdir",
            "type": storage_type,
            "avail": 2 * 1024**4,
        },
    }
    for name, bdf in zip(VM["gpus"], BDFS):
        answers[f"cluster/mapping/pci/{name}"] = {"map": [f"node={NODE},path={bdf},id=10de:2bb1"]}
    return answers


def planner(api: StandInApi, vm: dict[str, Any] | None = None, **connector: Any) -> vmplan.Planner:
    params = {
        "node": NODE,
        "vm": vm or VM,
        "state": "present",
        "rebuild": False,
        "destroy_weights": False,
        "restart_allowed": False,
        "image_url": "",
        "inventory_hostname": "glm5-01",
        "api_user": "sglang-deploy@pve",
        "api_token_id": "sglang",
        "api_password": None,
    }
    return vmplan.Planner(
        params,
        vmplan.Connector(
            **{
                "connect": lambda _params: api,
                "error": ApiFailure,
                "unreachable_fix": lambda where, node: f"{where} (node {node}). Fix: UNREACHABLE",
                "credentials_fix": lambda where, node: f"{where} (node {node}). Fix: CREDENTIALS",
                **connector,
            }
        ),
    )


@pytest.mark.parametrize("storage_type, efidisk_format", [("lvmthin", "raw"), ("dir", "qcow2")])
def test_a_new_vm_is_planned_from_what_the_node_answers(storage_type: str, efidisk_format: str) -> None:
    result = planner(StandInApi(node_answers(storage_type))).run()
    assert result["action"] == "create" and not result["exists"] and result["status"] == "absent"
    assert result["gpu_paths"] == {name: [bdf] for name, bdf in zip(VM["gpus"], BDFS)}
    assert result["kvm_create"]["efidisk0"]["format"] == efidisk_format
    assert result["kvm_update"] == {} and result["delete"] == "" and not result["download"]
    assert result["notes"] == [] and result["changed"] is False


def test_root_only_options_under_a_token_are_refused_before_logging_in() -> None:
    def connect(_params: Any) -> Any:
        raise AssertionError("the planner logged in")

    raw = {**VM, "gpus": [{"host": BDFS[0]}]}
    with pytest.raises(vmplan.Refusal, match=r"^host glm5-01: VM 4101 \(glm5-01\) on node pve1: the API token "):
        planner(StandInApi({}), raw, connect=connect).run()
    with pytest.raises(vmplan.Refusal, match=r"proxmoxer is missing on the control node \(No module named"):
        planner(StandInApi({}), connect=connect, available=False, unavailable_reason="No module named 'x'").run()


def test_api_failures_become_refusals_that_name_the_fix() -> None:
    answers = node_answers()
    where = re.escape(StandInApi.where)
    for status, fix in ((0, "UNREACHABLE"), (401, "CREDENTIALS")):
        answers["version"] = ApiFailure(status, f"{status} went wrong")
        with pytest.raises(vmplan.Refusal, match=f"{status} went wrong.* {where} .*Fix: {fix}$"):
            planner(StandInApi(answers)).run()
    answers["version"] = ApiFailure(500, "500 broken")
    with pytest.raises(ApiFailure):  # the module reports it as "the API answered ..."
        planner(StandInApi(answers)).run()
    answers = node_answers()
    answers[f"cluster/mapping/pci/{VM['gpus'][3]}"] = ApiFailure(403, "403 Permission check failed")
    with pytest.raises(vmplan.Refusal, match=r"GPU mapping 'rtx-pro-6000-3' \(proxmox_vm_gpus\[3\]\) cannot be"):
        planner(StandInApi(answers)).run()


# ------------------------------------------------------------------ pcidev: the node's sysfs


def _sysfs(root: Path, devices: dict[str, tuple[str, str, str]], iommu: bool = True) -> Path:
    """address -> (driver, class, iommu group) in the kernel's layout."""
    for address, (driver, klass, group) in devices.items():
        dev = root / "devices" / "pci0000:00" / address
        dev.mkdir(parents=True)
        (dev / "vendor").write_text("0x10de\n")
        (dev / "device").write_text("0x2bb1\n")
        (dev / "class").write_text(f"{klass}\n")
        if iommu:
            members = root / "kernel" / "iommu_groups" / group / "devices"
            members.mkdir(parents=True, exist_ok=True)
            (members / address).symlink_to(dev)
            (dev / "iommu_group").symlink_to(members.parent)
        if driver:
            (root / "bus" / "pci" / "drivers" / driver).mkdir(parents=True, exist_ok=True)
            (dev / "driver").symlink_to(root / "bus" / "pci" / "drivers" / driver)
        (root / "bus" / "pci" / "devices").mkdir(parents=True, exist_ok=True)
        (root / "bus" / "pci" / "devices" / address).symlink_to(dev)
    return root


def test_vfio_bound_gpus_in_clean_groups_are_ready(tmp_path: Path) -> None:
    sysfs = _sysfs(
        tmp_path,
        {
            "0000:41:00.0": ("vfio-pci", "0x030000", "40"),
            "0000:41:00.1": ("vfio-pci", "0x040300", "40"),
            "0000:40:01.1": ("pcieport", "0x060400", "40"),
        },
    )
    (state,) = pcidev.check(["0000:41:00.0"], str(sysfs))
    assert state.problems == [] and (state.driver, state.iommu_group, state.vendor_device) == (
        "vfio-pci",
        "40",
        "10de:2bb1",
    )


def test_host_drivers_missing_devices_and_iommu_off_are_named(tmp_path: Path) -> None:
    sysfs = _sysfs(
        tmp_path / "a",
        {
            "0000:41:00.0": ("nvidia", "0x030000", "40"),
            "0000:41:00.1": ("snd_hda_intel", "0x040300", "40"),
            "0000:42:00.0": ("", "0x030000", "41"),
        },
    )
    bound, unbound, missing = pcidev.check(["0000:41:00.0", "0000:42:00.0", "0000:43:00.0"], str(sysfs))
    assert "is bound to nvidia, not vfio-pci" in bound.problems[0] and "ids=10de:2bb1" in bound.problems[0]
    assert "also holds 0000:41:00.1 (snd_hda_intel)" in bound.problems[1]
    assert "bound to no driver" in unbound.problems[0]
    assert missing.problems == ["0000:43:00.0 is not on this node's PCI bus (lspci -D)"]
    no_iommu = _sysfs(tmp_path / "b", {"0000:41:00.0": ("vfio-pci", "0x030000", "40")}, iommu=False)
    assert "IOMMU is off" in pcidev.check(["0000:41:00.0"], str(no_iommu))[0].problems[0]
    assert pcidev.main(["0000:41:00.0", "--sysfs", str(no_iommu)]) == 1


# ------------------------------------------------------------------ blockdev: what counts as blank


def test_large_disks_are_sampled_small_ones_read_whole(tmp_path: Path) -> None:
    image = tmp_path / "sparse.img"
    with image.open("wb") as handle:
        handle.truncate(8 * 1024**3)  # sparse: reads as zeros, costs nothing
    with image.open("rb") as handle:
        assert blockdev.reads_zero(handle)
    step = (8 * 1024**3 - blockdev.WINDOW_BYTES) // (blockdev.SAMPLES + 1)
    with image.open("r+b") as handle:
        handle.seek(500 * step + 4096)  # inside the 500th window
        handle.write(b"data")
    with image.open("rb") as handle:
        assert not blockdev.reads_zero(handle)
    small = tmp_path / "small.img"
    small.write_bytes(b"\0" * (3 * 1024 * 1024 + 17) + b"x")
    with small.open("rb") as handle:
        assert not blockdev.reads_zero(handle)


def test_a_serial_that_names_two_disks_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"")
    (tmp_path / "b").write_bytes(b"")
    (tmp_path / "scsi-0QEMU_QEMU_HARDDISK_w").symlink_to(tmp_path / "a")
    (tmp_path / "virtio-w").symlink_to(tmp_path / "b")
    with pytest.raises(blockdev.DiskError, match="names several disks"):
        blockdev.find("w", "", str(tmp_path))
    (tmp_path / "wwn-0x5000c500a1b2c3d4").symlink_to(tmp_path / "a")
    assert blockdev.find("", "0x5000C500A1B2C3D4", str(tmp_path)) == (
        str(tmp_path / "wwn-0x5000c500a1b2c3d4"),
        str(tmp_path / "a"),
    )
