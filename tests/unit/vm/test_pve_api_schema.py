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


# -- the checker's own edges: whole values, both sides anchored --------------------------------------------------
@pytest.mark.parametrize(
    ("prop", "good", "bad"),
    [
        ({"type": "boolean"}, ["1", "on", "No", "FALSE"], ["1x", "yes!", "y", " 1", "01"]),
        ({"type": "integer", "minimum": 100, "maximum": 999999999}, ["100", "4101", "+4101", "999999999"], ["99", "1000000000", "12a", "a12", "1 2", "4.0"]),
        ({"type": "number"}, ["1", "1.5", ".5", "2e3"], ["1.5x", "x1", "1..5", "e3"]),
        ({"type": "string", "enum": ["q35", "pc"]}, ["q35"], ["q35 ", "Q35", "q3"]),
        ({"type": "string", "pattern": "(?^:q35|pc)"}, ["q35", "pc"], ["q35x", "xpc", "q35\n"]),
        ({"type": "string", "maxLength": 4}, ["abcd"], ["abcde"]),
        ({"type": "string", "format": "pve-configid"}, ["gpu0", "rtx-pro-6000-0"], ["0gpu", "gpu 0", "gpu0!", "g"]),
        ({"type": "string", "format": "pve-vmid"}, ["100", "4101"], ["99", "4101x", "04101", "1234567890"]),
        ({"type": "string", "format": "pve-node"}, ["pve1", "a-b"], ["pve1-", "-pve1", "pve 1", "pve1."]),
        ({"type": "string", "format": "mac-addr"}, ["BC:24:11:00:00:01"], ["BD:24:11:00:00:01", "BC:24:11:00:00:01:02", "BC:24:11:00:00"]),
        ({"type": "string", "format": "pve-qm-bootdev"}, ["scsi0", "scsi30", "net0"], ["scsi31", "xscsi0", "scsi0x"]),
        ({"type": "string", "format": "pve-ipv4-config"}, ["dhcp", "10.0.0.21/24"], ["10.0.0.21", "dhcp6", "::1/64", "10.0.0.21/33"]),
        ({"type": "string", "format": "pve-ipv6-config"}, ["auto", "fd00::5/64"], ["fd00::5", "10.0.0.1/24"]),
        ({"type": "string", "format": "ipv4"}, ["10.0.0.1"], ["10.0.0.1/24", "::1", "fe80::1%eth0"]),
        ({"type": "string", "format": "ipv6"}, ["fd00::1"], ["10.0.0.1", "fe80::1%eth0"]),
        ({"type": "string", "format": "pve-tag-list"}, ["sglang-deploy;gpu", "a b,c"], ["ok;-bad", "ok;b@d"]),
        ({"type": "string", "format": "pve-phys-bits"}, ["host", "8", "64"], ["7", "65", "hosts"]),
    ],
)  # fmt: skip
def test_each_check_takes_whole_values_only(prop: dict, good: list[str], bad: list[str]) -> None:
    """A value PVE refuses with junk before or after it, or one past a bound, is refused here: the checker
    matches whole values (an unanchored pattern or a bound off by one would pass them and the role's tests with
    them)."""
    for value in good:
        assert pve_api.check_plain(prop, value) == [], (prop, value)
    for value in bad:
        assert pve_api.check_plain(prop, value), (prop, value)


def test_a_property_string_is_read_key_by_key_as_pve_reads_it() -> None:
    named = pve_api.schema()["versions"]["9.1.3"]["named_formats"]
    hostpci = {"type": "string", "format": "pve-qm-hostpci"}
    assert pve_api.check_value(hostpci, "0000:41:00.0,pcie=1", named) == []
    assert pve_api.check_value(hostpci, "host=0000:41:00.0,pcie=1", named) == []
    assert pve_api.check_value(hostpci, "mapping=gpu0,mapping=gpu1", named) == ["key 'mapping' given twice"]
    assert pve_api.check_value(hostpci, "pcie=1,bogus=2", named) == ["unknown key 'bogus'"]
    assert pve_api.check_value({"type": "string", "format": {}}, "x", named) == ["the schema has no keys for this property string"]
    assert pve_api.check_value({"type": "string", "format": {"a": {"type": "string"}}}, "b", named) == [
        "'b' has no key and the format has no default key"
    ]
    # A bare value goes to the format's default key, and is checked as that key's value.
    assert pve_api.check_value({"type": "string", "format": {"m": {"type": "integer", "default_key": 1}}}, "7", named) == []
    assert pve_api.check_value({"type": "string", "format": {"m": {"type": "integer", "default_key": 1}}}, "x", named) == [
        "m: 'x' is not an integer"
    ]


def test_the_fixtures_check_fires_on_a_request_pve_refuses() -> None:
    """The `pve` fixture's teardown (tests/unit/pve_harness.py) fails a test whose role sent what PVE refuses:
    the same function on a good request and on two the real API refuses."""
    sys.path.insert(0, str(ROOT / "tests" / "unit"))
    from pve_harness import schema_refusals

    good = ("POST", CONFIG, _form(cpu="host", memory="786432"))
    assert schema_refusals([good]) == []
    bad = [good, ("POST", CONFIG, _form(memory="lots")), ("PATCH", CONFIG, b"")]
    refused = schema_refusals(bad)
    assert any("memory='lots'" in line or "memory=" in line for line in refused), refused
    assert any("PATCH /nodes/pve1/qemu/4101/config is not a request the schema has" in line for line in refused), refused
    assert {line.split(":", 1)[0] for line in refused} == {"PVE 8.4.2", "PVE 9.1.3"}


def test_every_problem_of_a_request_is_reported_not_only_the_first() -> None:
    """An unknown parameter, a part without its key, an unknown key, a keyAlias part: each is reported and the
    check goes on to the next one (a checker that stopped at the first would hide the rest)."""
    found = pve_api.problems("POST", CONFIG, _form(no_such_a="1", no_such_b="2", memory="lots"), "9.1.3")
    assert [line.split(": ", 2)[-1] for line in found] == [
        "unknown parameter 'no_such_a'", "unknown parameter 'no_such_b'", "memory='lots': current: 'lots' is not an integer"]
    named = pve_api.schema()["versions"]["9.1.3"]["named_formats"]
    keyless = {"type": "string", "format": {"a": {"type": "integer"}}}
    assert pve_api.check_value(keyless, "x,y,a=z", named) == [
        "'x' has no key and the format has no default key", "'y' has no key and the format has no default key",
        "a: 'z' is not an integer"]  # fmt: skip
    hostpci = {"type": "string", "format": "pve-qm-hostpci"}
    assert pve_api.check_value(hostpci, "bogus=1,pcie=maybe", named) == ["unknown key 'bogus'", "pcie: 'maybe' is not a boolean"]
    net = pve_api.schema()["versions"]["9.1.3"]["requests"]["POST /nodes/{node}/qemu/{vmid}/config"]["parameters"]["net[n]"]
    assert pve_api.check_value(net, "virtio=BC:24:11:00:00:01,bridge=vmbr 0", named) == ["bridge: 'vmbr 0' is not a valid pve-bridge-id"]
    assert pve_api.check_value(net, "virtio=BD:24:11:00:00:01,bridge=vmbr 0", named) == [
        "macaddr: 'BD:24:11:00:00:01' is not a valid mac-addr", "bridge: 'vmbr 0' is not a valid pve-bridge-id"]  # fmt: skip


def test_a_body_and_a_query_are_read_as_pve_reads_them() -> None:
    """JSON booleans are PVE's 1 and 0; a blank value is a value (PVE refuses an empty unknown or bad one too)."""
    assert pve_api._body(b'{"a": true, "b": false, "c": 3, "d": "x"}') == {"a": "1", "b": "0", "c": "3", "d": "x"}
    assert pve_api._body(b"a=&b=1") == {"a": "", "b": "1"}
    assert pve_api.problems("POST", CONFIG, json.dumps({"numa": True, "memory": 786432}).encode(), "9.1.3") == []
    assert pve_api.problems("POST", CONFIG, b"no_such_option=", "9.1.3") == [
        "PVE 9.1.3: POST /nodes/{node}/qemu/{vmid}/config: unknown parameter 'no_such_option'"]
    assert pve_api.problems("GET", "/api2/json/cluster/resources?type=vm&no_such=", version="9.1.3") == [
        "PVE 9.1.3: GET /cluster/resources: unknown parameter 'no_such'"]


@pytest.mark.parametrize(
    ("fmt", "good", "bad"),
    [
        ("address", ["10.0.0.1", "fd00::1", "pve1.lab", "pve1"], ["10.0.0.1/24", "pve 1", "-pve1", "fe80::1%eth0"]),
        ("pve-volume-id-or-qm-path", ["none", "cdrom", "/dev/sdb", "local:iso/d.iso"], ["cdroms", "local", "dev/sdb"]),
        ("pve-volume-id-or-absolute-path", ["/dev/sdb", "local:iso/d.iso"], ["none", "cdrom", "dev/sdb"]),
    ],
)
def test_each_alternative_of_a_format_passes_alone(fmt: str, good: list[str], bad: list[str]) -> None:
    """A format that takes one of several kinds (an IPv4 or IPv6 address or a DNS name; a volume or a path) takes
    each kind on its own, and nothing that is none of them."""
    for value in good:
        assert pve_api.check_format(fmt, value) is None, (fmt, value)
    for value in bad:
        assert pve_api.check_format(fmt, value), (fmt, value)


def test_every_key_alias_in_the_schema_is_also_an_alias_of_macaddr() -> None:
    """check_value reads `virtio=MAC` through the key's alias (macaddr): that holds while every key with a keyAlias
    (the NIC models) has the alias macaddr, in each shipped version."""
    keyed: list[tuple[str, str, object]] = []

    def walk(fmt: object, version: str) -> None:
        if isinstance(fmt, dict):
            keyed.extend((version, k, v.get("alias")) for k, v in fmt.items() if isinstance(v, dict) and v.get("keyAlias"))

    for version, entry in pve_api.schema()["versions"].items():
        for request in entry["requests"].values():
            for prop in request["parameters"].values():
                walk(prop.get("format"), version)
        for named in entry["named_formats"].values():
            walk(named["definition"], version)
    assert {version for version, _, _ in keyed} == {"8.4.2", "9.1.3"} and ("9.1.3", "virtio", "macaddr") in keyed
    assert all(alias == "macaddr" for _, _, alias in keyed), keyed
