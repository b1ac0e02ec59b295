"""Hostile input to the proxmox_vm role (the stand-ins: pve_harness.py): wrong-typed variables and values that
would leave for the PVE API are refused before any request, and no secret reaches the output or artifacts/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT
from fakepve import FakePve
from pve_harness import (
    GPUS,
    HOST,
    NODE,
    SECRET,
    SSH_KEY,
    assert_refused_before_any_change,
    cli,
    playbook,
    write_inventory,
    writes,
)


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
    tmp_path: Path, pve: FakePve, fakepve_cafile: str, ssh_standin: int, sysfs: Path,
    host_vars: dict[str, Any], node_vars: dict[str, Any],
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
    tmp_path: Path, pve: FakePve, fakepve_cafile: str, ssh_standin: int, sysfs: Path,
    host_vars: dict[str, Any], node_vars: dict[str, Any],
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
        path, pve, fakepve_cafile, ssh_standin, sysfs,
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
