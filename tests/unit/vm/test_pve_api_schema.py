"""tests/pve_api.py, the check of every request the role tests send against PVE's own API schema
(tests/fixtures/pve-api): it refuses what PVE refuses, passes what PVE takes, and holds the requests the VM
layer sends for both shipped versions."""

from __future__ import annotations

import json
import re
import sys
import urllib.parse
from pathlib import Path

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "tests"))
import pve_api  # noqa: E402

sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "pve-api"))
import extract  # noqa: E402

CONFIG = "/api2/json/nodes/pve1/qemu/4101/config"


def _form(**values: str) -> bytes:
    return urllib.parse.urlencode(values).encode()


def test_the_fixture_holds_every_request_the_vm_layer_sends_for_both_versions() -> None:
    schema = pve_api.schema()
    assert pve_api.versions() == ["8.4.2", "9.1.3"]
    readme = (ROOT / "tests" / "fixtures" / "pve-api" / "README.md").read_text()
    for version, entry in schema["versions"].items():
        assert set(entry["requests"]) == {f"{m} {p}" for m, p in extract.REQUESTS}, version
        assert entry["source"]["sha256"] in readme and entry["source"]["commit"] in readme
        assert set(entry["named_formats"]) == {"pve-qm-boot", "pve-qm-cicustom", "pve-qm-hostpci", "pve-qm-ipconfig", "pve-vm-cpu-conf"}


def test_what_the_role_sends_passes() -> None:
    body = _form(
        hostpci0="mapping=rtx-pro-6000-0,pcie=1", hostpci1="0000:41:00.0,pcie=1",
        scsi0="local-lvm:0,import-from=local:import/debian-12-genericcloud-amd64.qcow2,discard=on,iothread=1,ssd=1",
        scsi1="local-lvm:1024,serial=sglang-weights,discard=on", net0="virtio,bridge=vmbr0",
        ipconfig0="ip=10.0.0.21/24,gw=10.0.0.1", cicustom="vendor=local:snippets/sglang-deploy-vendor.cfg",
        boot="order=scsi0", cpu="host", machine="q35", bios="ovmf", agent="enabled=1", numa="1", memory="786432",
        tags="sglang-deploy;gpu",
    )  # fmt: skip
    assert pve_api.problems("POST", CONFIG, body) == []
    assert pve_api.problems("PUT", "/api2/json/nodes/pve1/qemu/4101/unlink", _form(idlist="scsi1", force="1")) == []
    assert pve_api.problems("GET", "/api2/json/cluster/resources?type=vm") == []
    assert pve_api.problems("POST", CONFIG, json.dumps({"delete": "hostpci7", "digest": "a" * 40}).encode()) == []


@pytest.mark.parametrize(
    "method, path, body, refused",
    [
        ("POST", CONFIG, _form(hostpci0="0000:C1:00.0,pcie=1"), r"hostpci0=.*host: '0000:C1:00.0' does not match"),
        ("POST", CONFIG, _form(hostpci0="mapping=rtx.pro.0"), r"mapping: 'rtx.pro.0' is not a valid pve-configid"),
        ("POST", CONFIG, _form(hostpci0="mapping=gpu0,pcie=maybe"), r"pcie: 'maybe' is not a boolean"),
        ("POST", CONFIG, _form(scsi1="local-lvm:1024,seriall=x"), r"scsi1=.*unknown key 'seriall'"),
        ("POST", CONFIG, _form(scsi1="local-lvm:1024,discard=on,discard=ignore"), r"key 'discard' given twice"),
        ("POST", CONFIG, _form(net0="virtio,bridge=vmbr 0"), r"bridge: 'vmbr 0' is not a valid pve-bridge-id"),
        ("POST", CONFIG, _form(ipconfig0="ip=10.0.0.300/24"), r"ip: '10.0.0.300/24' is not a valid pve-ipv4-config"),
        ("POST", CONFIG, _form(machine="q36"), r"machine=.*'q36' does not match"),
        ("POST", CONFIG, _form(no_such_option="1"), r"unknown parameter 'no_such_option'"),
        ("POST", CONFIG, _form(memory="1e9"), r"memory="),
        ("POST", "/api2/json/nodes/pve1/qemu", _form(name="x"), r"required parameter 'vmid' missing"),
        ("POST", "/api2/json/nodes/pve 1/qemu/4101/config", b"", r"node='pve 1': 'pve 1' is not a valid pve-node"),
        ("POST", "/api2/json/nodes/pve1/qemu/42/config", b"", r"vmid='42': 42 is below the minimum 100"),
        ("PATCH", CONFIG, b"", r"PATCH /nodes/pve1/qemu/4101/config is not a request the schema has"),
        ("GET", "/api2/json/cluster/resources?type=vms", b"", r"type='vms': 'vms' is not one of"),
        ("POST", "/api2/json/nodes/pve1/storage/local/download-url?content=import&filename=d.qcow2", b"",
         r"required parameter 'url' missing"),
    ],
)
def test_what_pve_refuses_is_refused_naming_version_request_parameter_and_why(
    method: str, path: str, body: bytes, refused: str
) -> None:
    found = pve_api.problems(method, path, body)
    assert found and all(re.search(refused, line) for line in found[:1]), found
    assert {line.split(":", 1)[0] for line in found} == {"PVE 8.4.2", "PVE 9.1.3"}, found


def test_a_format_without_a_verifier_here_is_a_failure_not_a_pass() -> None:
    assert "has no verifier here" in (pve_api.check_format("pve-unknown-format", "x") or "")
