"""Proxmox VE: the node's preflight and the plan for the serving VM (library/sglang_pve_plan.py's logic).

Stdlib only, Python >= 3.9. ``Planner`` reads the node through its API - the VM, its pending changes, the
other guests, GPU mappings and PCI devices, storages, the caller's privileges - checks that the run can do
what it must, and answers the plan (create, rebuild, converge, none or absent) with community.proxmox's
proxmox_kvm parameters; it changes nothing. The VM as PVE keys, the diff and the privileges are vmspec.py.

This package cannot import proxmoxer: the module hands the planner the API client of
module_utils/sglang_deploy_pve/client.py as a ``Connector`` (tests hand it a stand-in). Every refusal is a
``Refusal`` whose message starts with host, VM and node; an API error the planner does not turn into one
is the connector's ``error``, raised on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol

from . import vmconfig, vmspec

# Settings a running VM applies at once; any other change waits for the next start.
HOTPLUG = frozenset(
    {
        "name",
        "onboot",
        "tags",
        "description",
        "agent",
        "ciuser",
        "sshkeys",
        "ipconfig0",
        "nameserver",
        "searchdomain",
        "cicustom",
        "citype",
        "ciupgrade",
    }
)


# Storage types that hold disks as files (qcow2); the others are block devices (raw).
FILE_STORAGES = frozenset({"dir", "nfs", "cifs", "glusterfs", "cephfs", "btrfs"})


class Refusal(Exception):
    """A reason not to touch the node; the module fails with it before any change."""


class Client(Protocol):
    """A logged-in API connection (client.PveClient)."""

    where: str  # the API and the login, for messages

    def get(self, resource: str, **params: Any) -> Any: ...


@dataclass(frozen=True)
class Connector:
    """The way to the node's API (client.py's names): ``connect`` logs in with the module's
    parameters, every failed call raises ``error`` (``status``: the HTTP status, 0 for no answer;
    ``message``), and the two fixes name what to check when the API does not answer or refuses the login."""

    connect: Callable[[Mapping[str, Any]], Client]
    error: type[Exception]
    unreachable_fix: Callable[[str, str], str]
    credentials_fix: Callable[[str, str], str]
    available: bool = True  # proxmoxer imports
    unavailable_reason: str = ""


class Planner:
    """One run's plan: ``params`` are the sglang_pve_plan module's (its options and community.proxmox's
    authentication options); ``run()`` answers its RETURN values or raises Refusal."""

    def __init__(self, params: Mapping[str, Any], connector: Connector) -> None:
        self.params = params
        self.connector = connector
        self.node: str = params["node"]
        self.host: str = params["inventory_hostname"] or "?"
        self.vm_raw = dict(params["vm"])
        self.spec: vmspec.VmSpec | None = None
        self.client: Client | None = None

    def where(self) -> str:
        # shown(): a name with a line break (refused below) must not break the message in two.
        vmid, name = vmspec.shown(self.vm_raw.get("vmid", "?")), vmspec.shown(self.vm_raw.get("name", "?"))
        return f"host {self.host}: VM {vmid} ({name}) on node {vmspec.shown(self.node)}"

    def refuse(self, message: str) -> None:
        raise Refusal(f"{self.where()}: {message}")

    def api(self, fn: str, resource: str, **params: Any) -> Any:
        assert self.client is not None
        try:
            return getattr(self.client, fn)(resource, **params)
        except self.connector.error as exc:
            if exc.status == 0:
                self.refuse(f"{exc.message} from {self.connector.unreachable_fix(self.client.where, self.node)}")
            if exc.status == 401:
                self.refuse(f"{exc.message}: {self.connector.credentials_fix(self.client.where, self.node)}")
            raise

    def run(self) -> dict[str, Any]:
        p = self.params
        # Every value that goes to the API - in a request's path or body - is checked whole before the first request.
        problems = [vmspec.node_problem(self.node), vmspec.image_url_problem(p["image_url"])]
        try:
            self.spec = spec = vmspec.VmSpec(**{**self.vm_raw, "gpus": vmspec.parse_gpus(self.vm_raw.get("gpus") or [])})
            vmspec.check_spec(spec)
        except (vmspec.SpecError, TypeError) as exc:
            problems.append(str(exc))
        if any(problems):
            self.refuse("; ".join(filter(None, problems)) + ". Nothing was changed.")
        assert self.spec is not None
        spec = self.spec
        if p["state"] == "present":
            reasons = spec.root_only()
            login_is_root = p["api_user"] == "root@pam" and p["api_password"] and not p["api_token_id"]
            if reasons and not login_is_root:
                how = f"API token {p['api_user']}!{p['api_token_id']}" if p["api_token_id"] else f"user {p['api_user']}"
                self.refuse(f"the {how} cannot set root-only options: " + "; ".join(reasons) + ". Nothing was changed.")
        if not self.connector.available:
            self.refuse(
                f"the Python package proxmoxer is missing on the control node ({self.connector.unavailable_reason}). "
                "Fix: pip install proxmoxer in the venv that runs ansible-playbook (scripts/setup installs it)"
            )
        try:
            self.client = self.connector.connect(p)
        except self.connector.error as exc:
            self.refuse(f"{exc.message}: cannot log in")
        version = self.api("get", "version")
        pve_version = str(version.get("version", "0"))
        major = int(pve_version.split(".")[0] or 0)
        if major < 8:
            self.refuse(f"PVE {pve_version} is older than 8.0 (import-from, resource mappings). Fix: upgrade the node")
        nodes = {n["node"]: n for n in self.api("get", "nodes")}
        if self.node not in nodes:
            self.refuse(
                f"the cluster has no node {self.node} (it has {sorted(nodes)}). Fix: proxmox_node_name of the node"
            )
        if nodes[self.node].get("status") not in (None, "online"):
            self.refuse(f"node {self.node} is {nodes[self.node].get('status')}. Fix: bring it online first")

        guests = self.api("get", "cluster/resources", type="vm")
        mine = [g for g in guests if int(g.get("vmid", 0)) == spec.vmid]
        exists = bool(mine)
        config: dict[str, Any] = {}
        pending: list[dict[str, Any]] = []
        status = "absent"
        if exists:
            found = mine[0]
            if found.get("type") != "qemu" or found.get("node") != self.node:
                self.refuse(
                    f"vmid {spec.vmid} is taken by {found.get('type')} {found.get('name')!r} on node "
                    f"{found.get('node')}. Fix: choose a free proxmox_vm_vmid, or set proxmox_vm_node to its node"
                )
            if found.get("name") != spec.name:
                self.refuse(
                    f"vmid {spec.vmid} is the VM {found.get('name')!r}, not {spec.name!r}: refusing to manage "
                    "another VM. Fix: choose a free proxmox_vm_vmid, or set proxmox_vm_name to its name"
                )
            status = str(found.get("status") or "stopped")
            config = self.api("get", f"nodes/{self.node}/qemu/{spec.vmid}/config")
            pending = self.api("get", f"nodes/{self.node}/qemu/{spec.vmid}/pending")
            if found.get("lock") or config.get("lock"):
                self.refuse(
                    f"the VM is locked ({found.get('lock') or config.get('lock')}): a backup, migration or "
                    f"snapshot is running or was interrupted. Fix: wait, or clear it with qm unlock {spec.vmid}"
                )

        result: dict[str, Any] = {
            "exists": exists,
            "status": status,
            "pve_version": pve_version,
            "kvm_create": {},
            "kvm_update": {},
            "delete": "",
            "changes": {},
            "restart_needed": False,
            "download": False,
            "add_weights": False,
            "weights_disk": {},
            "root_disk": "",
            "gpu_paths": {},
            "notes": [],
            "changed": False,
            "guest_address": vmspec.static_address(spec.ci_ipconfig),
        }
        weights = self.weights(config, result) if exists else []
        if p["state"] == "absent":
            return self.plan_absent(result, config, weights, major)

        root = config.get(vmspec.ROOT_SLOT)
        result["root_disk"] = str(root).split(",")[0] if root else ""
        actual = vmconfig.effective(config, pending)
        desired = spec.settings(with_boot=bool(root) or p["rebuild"])
        changed, deleted = vmconfig.config_diff(desired, actual) if exists else ({}, [])
        result["changes"] = {k: {"have": actual.get(k), "want": v} for k, v in changed.items()}
        result["kvm_update"] = vmconfig.kvm_params(changed)
        result["delete"] = ",".join(deleted)
        result["kvm_create"] = vmconfig.create_config(spec)
        if not exists:
            action = "create"
        elif p["rebuild"]:
            action = "rebuild"
        elif changed or deleted or not root:
            action = "converge"
        else:
            action = "none"
        result["action"] = action
        waiting = vmconfig.pending_keys(pending)
        result["restart_needed"] = (
            status == "running" and action != "rebuild" and bool(waiting or set(changed) - HOTPLUG or deleted)
        )
        self.net_drift(config, result)

        # Privileges first: without them, listings come back short and the other checks would mislead.
        restart = result["restart_needed"] and bool(p["restart_allowed"])
        self.check_privileges(
            vmconfig.needs(
                spec,
                self.node,
                action=action,
                pve_major=major,
                download=False,
                restart=restart,
                start=status != "running",
            )
        )
        result["download"] = self.check_image(action)
        if result["download"]:
            self.check_privileges(
                vmconfig.needs(spec, self.node, action=action, pve_major=major, download=True, restart=restart)
            )
        self.check_snippet(action, result["notes"])
        result["gpu_paths"] = self.check_gpus(guests)
        self.check_storage(action, config, result)
        return result

    # ---------------------------------------------------------------- the weights disk

    def weights(self, config: dict[str, Any], result: dict[str, Any]) -> list[vmconfig.Drive]:
        assert self.spec is not None
        serial = self.spec.weights_disk_serial
        found = vmconfig.find_serial(config, serial)
        if len(found) > 1:
            self.refuse(
                f"{len(found)} disks carry the weights serial {serial} ({', '.join(d.key for d in found)}): the guest "
                "could mount either. Fix: give only the weights disk serial=" + serial
            )
        if found and found[0].key == vmspec.ROOT_SLOT:
            self.refuse(
                f"the disk with the weights serial {serial} is {vmspec.ROOT_SLOT}, the root disk a rebuild re-images. "
                f"Fix: move the weights to their own disk ({self.spec.weights_disk_slot}) by hand first"
            )
        if found:
            disk = found[0]
            result["weights_disk"] = {"key": disk.key, "volume": disk.volume, "size": disk.size}
            if disk.size and disk.size < self.spec.weights_disk_gib * vmspec.GIB:
                result["notes"].append(
                    f"the weights disk {disk.key} ({disk.volume}) has {disk.size // vmspec.GIB} GiB, "
                    f"proxmox_vm_weights_disk_gib asks for {self.spec.weights_disk_gib}: grow it with "
                    f"qm disk resize {self.spec.vmid} {disk.key} {self.spec.weights_disk_gib}G (never shrunk here)"
                )
            return found
        unused = vmconfig.unused_volumes(config)
        if unused and self.params["state"] == "present":
            self.refuse(
                f"no disk carries the weights serial {serial}, but the VM holds detached disks {unused}: one of them "
                f"may be the weights. Fix: re-attach it as {self.spec.weights_disk_slot} with serial={serial} "
                f"(qm set {self.spec.vmid} --{self.spec.weights_disk_slot} VOLUME,serial={serial}), or remove the "
                "unused disks you do not need"
            )
        result["add_weights"] = True
        return []

    def plan_absent(
        self, result: dict[str, Any], config: dict[str, Any], weights: list[vmconfig.Drive], major: int
    ) -> dict[str, Any]:
        assert self.spec is not None
        result["action"] = "absent" if result["exists"] else "none"
        if not result["exists"]:
            return result
        unused = vmconfig.unused_volumes(config)
        at_risk = [f"{d.key} {d.volume}" for d in weights] + [f"{k} {v}" for k, v in unused.items()]
        if at_risk and not self.params["destroy_weights"]:
            self.refuse(
                f"refusing to destroy the VM: PVE would delete its disks with it, among them {', '.join(at_risk)} "
                "(the weights: hours to download again). Nothing was changed. Fix: keep the VM and rebuild it "
                "instead (proxmox_vm_rebuild: true re-images only the root disk), or move the weights volume to "
                "another VM first (Hardware > Disk Action > Reassign Owner), or set proxmox_vm_destroy_weights: true "
                "to delete them on purpose"
            )
        self.check_privileges(
            vmconfig.needs(self.spec, self.node, action="absent", pve_major=major, download=False, restart=False)
        )
        return result

    # ---------------------------------------------------------------- node resources

    def check_image(self, action: str) -> bool:
        """True when the node must download the image first; refuses when it is missing without a URL."""
        assert self.spec is not None
        if action not in ("create", "rebuild"):
            return False
        sid = self.spec.image.split(":")[0]
        try:
            content = self.api("get", f"nodes/{self.node}/storage/{sid}/content")
        except self.connector.error as exc:
            self.refuse(f"cannot list storage {sid} for proxmox_vm_image={self.spec.image}: {exc.message}")
        if any(item.get("volid") == self.spec.image for item in content):
            return False
        url = self.params["image_url"]
        if url and self.spec.image.split(":", 1)[1].startswith("import/"):
            return True
        self.refuse(
            f"the cloud image {self.spec.image} (proxmox_vm_image) is not on storage {sid} of node {self.node}"
            + ("" if not url else " and proxmox_vm_image_url can only fill STORAGE:import/NAME volumes")
            + ". Nothing was changed. Fix: set proxmox_vm_image_url (+ proxmox_vm_image_checksum) so the node "
            "downloads it, or put it there yourself (Storage > Import > Download from URL)"
        )
        return False

    def check_snippet(self, action: str, notes: list[str]) -> None:
        assert self.spec is not None
        snippet = self.spec.ci_vendor_snippet
        if not snippet or action == "none":
            return
        sid = snippet.split(":")[0]
        try:
            content = self.api("get", f"nodes/{self.node}/storage/{sid}/content", content="snippets")
        except self.connector.error as exc:
            content = []
            detail = exc.message
        else:
            detail = "not listed"
        if not any(item.get("volid") == snippet for item in content):
            # PVE lists snippets only to Datastore.Allocate on the storage (check_volume_access); a token
            # without it cannot tell a missing snippet from a hidden one, and PVE checks it at start anyway.
            held = self.api("get", "access/permissions", path=f"/storage/{sid}") or {}
            if not any(dict(privs).get("Datastore.Allocate") for privs in held.values()):
                notes.append(
                    f"the vendor snippet {snippet} could not be checked (listing snippets needs Datastore.Allocate "
                    f"on /storage/{sid}); PVE refuses to start the VM if it is missing"
                )
                return
            name = snippet.split("/")[-1]
            self.refuse(
                f"the cloud-init vendor snippet {snippet} (proxmox_vm_ci_vendor_snippet) is not on node {self.node} "
                f"({detail}). Nothing was changed. Fix: enable snippets on storage {sid} (pvesm set {sid} --content "
                f"...,snippets) and copy roles/proxmox_vm/files/sglang-deploy-vendor.cfg there as {name} "
                f"(/var/lib/vz/snippets/{name} for local)"
            )

    def check_privileges(self, needs: list[vmconfig.Need]) -> None:
        assert self.client is not None
        held: dict[str, set[str]] = {}
        for path in dict.fromkeys(n.path for n in needs):
            answer = self.api("get", "access/permissions", path=path) or {}
            held[path] = {priv for privs in answer.values() for priv, on in dict(privs).items() if on}
        lacking = vmconfig.missing(needs, held)
        if lacking:
            self.refuse(
                f"{self.client.where} lacks privileges this run needs: "
                + "; ".join(n.text() for n in lacking)
                + ". Nothing was changed. Fix: grant them to the token's user and the token (pveum acl modify "
                "PATH --tokens USER@REALM!TOKEN --roles ROLE; README 'Pointing it at a real node' lists a role)"
            )

    def check_gpus(self, guests: list[dict[str, Any]]) -> dict[str, list[str]]:
        """Every GPU is on this node with the mapped id and no other running VM holds it."""
        assert self.spec is not None
        hardware = {vmconfig.full_bdf(d["id"]): d for d in self.api("get", f"nodes/{self.node}/hardware/pci") if d.get("id")}
        paths: dict[str, list[str]] = {}
        ids: dict[str, str] = {}
        for index, gpu in enumerate(self.spec.gpus):
            name = gpu.mapping or gpu.host
            if gpu.host:
                paths[name] = [vmconfig.full_bdf(gpu.host)]
                continue
            try:
                mapping = self.api("get", f"cluster/mapping/pci/{gpu.mapping}")
            except self.connector.error as exc:
                self.refuse(
                    f"GPU mapping {gpu.mapping!r} (proxmox_vm_gpus[{index}]) cannot be read: {exc.message}. Nothing "
                    "was changed. Fix: create it (Datacenter > Resource Mappings > PCI Devices: node "
                    f"{self.node}, the GPU's address) or correct proxmox_vm_gpus, and grant Mapping.Use on "
                    f"/mapping/pci/{gpu.mapping}"
                )
            paths[name], ids[name] = vmconfig.mapping_paths(mapping or {}, self.node)
            if not paths[name]:
                self.refuse(
                    f"GPU mapping {gpu.mapping!r} (proxmox_vm_gpus[{index}]) has no device on node {self.node}. "
                    f"Nothing was changed. Fix: add node {self.node}'s GPU to the mapping (Datacenter > Resource "
                    "Mappings > PCI Devices > Edit)"
                )
        for name, bdfs in paths.items():
            for bdf in bdfs:
                device = hardware.get(bdf)
                if device is None:
                    self.refuse(
                        f"GPU {name} is PCI device {bdf}, which node {self.node} does not have (lspci -D there). "
                        "Nothing was changed. Fix: correct the mapping's path for this node, or check that the GPU "
                        "is seated and powered (and IOMMU is on: the README's checklist)"
                    )
                assert device is not None
                want = ids.get(name, "")
                have = f"{_hex4(device.get('vendor'))}:{_hex4(device.get('device'))}"
                if want and want.lower() != have:
                    self.refuse(
                        f"GPU mapping {name} expects device id {want} at {bdf}, node {self.node} has {have} there. "
                        "Nothing was changed. Fix: update the mapping after a hardware change (PVE refuses to start "
                        "the VM otherwise)"
                    )
        taken = self.gpu_holders(guests, paths)
        if taken:
            self.refuse(
                "GPUs are assigned to other running VMs: " + "; ".join(taken) + ". Nothing was changed. Fix: stop "
                "those VMs or remove the GPUs from them, or pick other GPUs in proxmox_vm_gpus"
            )
        return paths

    def gpu_holders(self, guests: list[dict[str, Any]], paths: dict[str, list[str]]) -> list[str]:
        assert self.spec is not None
        wanted_bdfs = {bdf: name for name, bdfs in paths.items() for bdf in bdfs}
        other_mappings: dict[str, list[str]] = {}
        taken = []
        for guest in guests:
            vmid = int(guest.get("vmid", 0))
            if vmid == self.spec.vmid or guest.get("node") != self.node or guest.get("status") != "running":
                continue
            if guest.get("type") != "qemu":
                continue
            config = self.api("get", f"nodes/{self.node}/qemu/{vmid}/config")
            mappings, hosts = vmconfig.gpu_users(config)
            for mapping in sorted(mappings):
                if mapping in paths:
                    taken.append(f"{mapping} is used by VM {vmid} ({guest.get('name')})")
                    continue
                if mapping not in other_mappings:
                    try:
                        other_mappings[mapping] = vmconfig.mapping_paths(
                            self.api("get", f"cluster/mapping/pci/{mapping}") or {}, self.node
                        )[0]
                    except self.connector.error:
                        other_mappings[mapping] = []
                hosts |= set(other_mappings[mapping])
            for bdf in sorted(hosts):
                if bdf in wanted_bdfs and not any(t.startswith(f"{wanted_bdfs[bdf]} ") for t in taken):
                    taken.append(f"{wanted_bdfs[bdf]} ({bdf}) is used by VM {vmid} ({guest.get('name')})")
        return taken

    def check_storage(self, action: str, config: dict[str, Any], result: dict[str, Any]) -> None:
        assert self.spec is not None
        if action == "create":
            need = vmconfig.create_bytes(self.spec)
        elif action == "rebuild":
            # The old root disk is freed before the new one is imported.
            old = next((d.size for d in vmconfig.drives(config) if d.key == vmspec.ROOT_SLOT), 0)
            need = {self.spec.storage: max(self.spec.root_disk_gib * vmspec.GIB - old, 0)}
        elif result["add_weights"]:
            need = {self.spec.weights_disk_storage: self.spec.weights_disk_gib * vmspec.GIB}
        else:
            return
        if result["add_weights"] and action != "create":
            need[self.spec.weights_disk_storage] = (
                need.get(self.spec.weights_disk_storage, 0) + self.spec.weights_disk_gib * vmspec.GIB
            )
        for sid, size in sorted(need.items()):
            try:
                state = self.api("get", f"nodes/{self.node}/storage/{sid}/status")
            except self.connector.error as exc:
                self.refuse(
                    f"storage {sid} cannot be read on node {self.node}: {exc.message}. Fix: check the storage id"
                )
            if not state.get("active") or not state.get("enabled", 1):
                self.refuse(f"storage {sid} is not active on node {self.node}. Fix: pvesm status there")
            if "images" not in str(state.get("content", "")).split(","):
                self.refuse(
                    f"storage {sid} does not hold VM disks (content {state.get('content')}). Fix: pick one that does"
                )
            if action == "create" and sid == self.spec.efidisk_storage:
                # proxmox_kvm writes format=None unless told; file storages keep qcow2, block storages raw.
                result["kvm_create"]["efidisk0"]["format"] = "qcow2" if state.get("type") in FILE_STORAGES else "raw"
            avail = int(state.get("avail") or 0)
            if avail < size:
                self.refuse(
                    f"storage {sid} has {avail / vmspec.GIB:.1f} GiB free, this {action} needs {size / vmspec.GIB:.1f} GiB "
                    "(root disk proxmox_vm_root_disk_gib, weights disk proxmox_vm_weights_disk_gib). Nothing was "
                    "changed. Fix: free space there or point proxmox_vm_storage at a larger storage"
                )

    def net_drift(self, config: dict[str, Any], result: dict[str, Any]) -> None:
        assert self.spec is not None
        if config and "net0" in config and not vmspec.same("net0", self.spec.net, config["net0"]):
            result["notes"].append(
                f"net0 is {config['net0']!r}, proxmox_vm_net asks for {self.spec.net!r}: the role does not change a "
                "NIC of an existing VM (its MAC would change); edit it in PVE if you mean it"
            )


def _hex4(value: Any) -> str:
    text = str(value or "").lower()
    return text[2:] if text.startswith("0x") else text
