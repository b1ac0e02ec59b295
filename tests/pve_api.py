"""Every request the proxmox_vm layer sends, checked against Proxmox VE's own API schema.

fakepve answers what the real API may refuse, so the role tests (tests/unit/vm/, through pve_harness) hand every
request fakepve recorded to :func:`problems`: its method and path must be one of PVE's, each parameter one the
path takes, each value of its type, enum, pattern and bounds, a property string (``hostpci0``, ``scsi0``,
``net0``, ...) made of the format's keys with values that pass them, and a named format (``pve-configid``,
``pve-volume-id``, ...) as PVE's verifier checks it (re-implemented below, each with its Perl source in
tests/fixtures/pve-api/README.md). The schema: tests/fixtures/pve-api/schema.json, PVE 9.1.3 and 8.4.2; a request
must pass both (the role supports both). Parameters come from the query string (PVE reads it for every method)
and the body (form-encoded or JSON).
"""

from __future__ import annotations

import ipaddress
import json
import re
import urllib.parse
from functools import lru_cache
from pathlib import Path
from typing import Any

SCHEMA = Path(__file__).resolve().parent / "fixtures" / "pve-api" / "schema.json"
API_PREFIX = "/api2/json"


@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    return json.loads(SCHEMA.read_text(encoding="utf-8"))


def versions() -> list[str]:
    return sorted(schema()["versions"])


def _route(version: str, method: str, path: str) -> tuple[str, dict[str, str]] | None:
    """The schema's ``METHOD /template`` for a concrete path, and the path's parameters."""
    for key in schema()["versions"][version]["requests"]:
        want_method, template = key.split(" ", 1)
        if want_method != method:
            continue
        names = re.findall(r"\{(\w+)\}", template)
        pattern = "^" + re.sub(r"\\\{\w+\\\}", "([^/]+)", re.escape(template)) + "$"
        match = re.match(pattern, path)
        if match:
            return key, {name: urllib.parse.unquote(value) for name, value in zip(names, match.groups())}
    return None


def _body(raw: bytes) -> dict[str, str]:
    """A request body as PVE reads it: form-encoded (proxmoxer) or JSON; every value as its text."""
    text = raw.decode("utf-8", errors="replace").strip()
    if not text:
        return {}
    if text.startswith("{"):
        values = json.loads(text)
        return {k: ("1" if v is True else "0" if v is False else str(v)) for k, v in values.items()}
    return dict(urllib.parse.parse_qsl(text, keep_blank_values=True))


def _schema_key(name: str, parameters: dict[str, Any]) -> str | None:
    if name in parameters:
        return name
    numbered = re.fullmatch(r"([a-z]+)(\d+)", name)
    if numbered and f"{numbered.group(1)}[n]" in parameters:
        return f"{numbered.group(1)}[n]"
    return None


def problems(method: str, path: str, body: bytes = b"", version: str | None = None) -> list[str]:
    """What the schema of ``version`` (each shipped version when None) refuses in one request; [] when it passes."""
    found: list[str] = []
    path, _, query = path.partition("?")
    local = path[len(API_PREFIX):] if path.startswith(API_PREFIX) else path
    for ver in [version] if version else versions():
        route = _route(ver, method, local)
        if route is None:
            found.append(f"PVE {ver}: {method} {local} is not a request the schema has (or not one the VM layer is known to send)")
            continue
        key, path_values = route
        parameters = schema()["versions"][ver]["requests"][key]["parameters"]
        named = schema()["versions"][ver]["named_formats"]
        values = {**dict(urllib.parse.parse_qsl(query, keep_blank_values=True)), **_body(body), **path_values}
        for name, value in values.items():
            schema_key = _schema_key(name, parameters)
            if schema_key is None:
                found.append(f"PVE {ver}: {key}: unknown parameter {name!r}")
                continue
            found += [f"PVE {ver}: {key}: {name}={value!r}: {why}" for why in check_value(parameters[schema_key], value, named)]
        if method in ("POST", "PUT"):
            missing = [n for n, p in parameters.items() if not p.get("optional") and "[n]" not in n and n not in values]
            found += [f"PVE {ver}: {key}: required parameter {n!r} missing" for n in missing]
    return found


# -- values ------------------------------------------------------------------------------------------------
def _python_pattern(perl: str) -> str:
    return perl.replace("(?^i:", "(?i:").replace("(?^:", "(?:")


def check_value(prop: dict[str, Any], value: str, named: dict[str, Any]) -> list[str]:
    """One parameter's value against its schema entry; a property string parsed as PVE parses it."""
    fmt = prop.get("format")
    if isinstance(fmt, str) and fmt in named:
        fmt = named[fmt]["definition"]
    if not isinstance(fmt, dict):
        return check_plain(prop, value)
    if prop.get("type") == "string" and not fmt:
        return [f"the schema has no keys for this property string"]
    found: list[str] = []
    default_key = next((k for k, v in fmt.items() if v.get("default_key")), None)
    seen: set[str] = set()
    for part in value.split(","):
        if "=" in part:
            key, item = part.split("=", 1)
        elif default_key:
            key, item = default_key, part
        else:
            found.append(f"{part!r} has no key and the format has no default key")
            continue
        # net: virtio=MAC stands for model=virtio,macaddr=MAC. Every key with a keyAlias (virtio, e1000, ...) also
        # has the alias macaddr in PVE's schema, so the value is checked as a macaddr.
        key = fmt.get(key, {}).get("alias", key)
        if key not in fmt:
            found.append(f"unknown key {key!r}")
            continue
        if key in seen:
            found.append(f"key {key!r} given twice")
        seen.add(key)
        found += [f"{key}: {why}" for why in check_plain(fmt[key], item)]
    return found


def check_plain(prop: dict[str, Any], value: str) -> list[str]:
    found: list[str] = []
    kind = prop.get("type")
    if kind == "boolean" and not re.fullmatch(r"(?i)1|true|yes|on|0|false|no|off", value):
        found.append(f"{value!r} is not a boolean")
    if kind == "integer":
        if not re.fullmatch(r"[+-]?\d+", value):
            found.append(f"{value!r} is not an integer")
        else:
            if "minimum" in prop and int(value) < prop["minimum"]:
                found.append(f"{value} is below the minimum {prop['minimum']}")
            if "maximum" in prop and int(value) > prop["maximum"]:
                found.append(f"{value} is above the maximum {prop['maximum']}")
    if kind == "number" and not re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", value):
        found.append(f"{value!r} is not a number")
    if prop.get("enum") and value not in prop["enum"]:
        found.append(f"{value!r} is not one of {prop['enum']}")
    if "pattern" in prop and not re.fullmatch(_python_pattern(prop["pattern"]), value):
        found.append(f"{value!r} does not match {prop['pattern']}")
    if "maxLength" in prop and len(value) > prop["maxLength"]:
        found.append(f"{len(value)} characters, more than {prop['maxLength']}")
    if isinstance(prop.get("format"), str):
        why = check_format(prop["format"], value)
        if why:
            found.append(why)
    return found


# PVE's verifiers of the named formats the VM layer's values use (Perl subs in pve-common's JSONSchema.pm,
# pve-storage's Storage.pm/Plugin.pm and qemu-server; README.md names each), as regular expressions.
_LABEL = r"[a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?"
_VOLUME_ID = r"(?i)[a-z][a-z0-9\-_.]*[a-z0-9]:.+"
_FORMATS: dict[str, str] = {
    "urlencoded": r"[-%a-zA-Z0-9_.!~*'()]*",
    "pve-configid": r"(?i)[a-z][a-z0-9_-]+",
    "pve-storage-id": r"(?i)[a-z][a-z0-9\-_.]*[a-z0-9]",
    "pve-vmid": r"[1-9][0-9]{2,8}",
    "pve-node": _LABEL,
    "dns-name": rf"({_LABEL}\.)*{_LABEL}",
    "pve-tag": r"(?i)[a-z0-9_][a-z0-9_\-+.]*",
    "pve-bridge-id": r"(?a)[-_.\w\d]+",
    "pve-volume-id": _VOLUME_ID,
    "mac-addr": r"(?i)[a-f0-9][02468ace](?::[a-f0-9]{2}){5}",
    "pve-qm-bootdev": r"ide[0-3]|sata[0-5]|scsi([0-9]|[12][0-9]|30)|virtio([0-9]|1[0-5])|efidisk0|tpmstate0|net\d+|usb\d+|hostpci\d+",
    "pve-storage-content": r"images|rootdir|vztmpl|iso|backup|snippets|import|none",
}


def check_format(fmt: str, value: str) -> str | None:
    """None when ``value`` passes PVE's verifier of ``fmt`` (``X-list``: each item of a , ; or space list)."""
    base = fmt[: -len("-list")] if fmt.endswith("-list") else fmt
    items = [i for i in re.split(r"[,;\s]+", value) if i] if fmt.endswith("-list") else [value]
    for item in items:
        if base in _FORMATS:
            ok = bool(re.fullmatch(_FORMATS[base], item))
        elif base in ("ipv4", "ipv6"):
            ok = _ip(item, int(base[-1]))
        elif base == "address":
            ok = _ip(item, 4) or _ip(item, 6) or bool(re.fullmatch(_FORMATS["dns-name"], item))
        elif base in ("pve-ipv4-config", "pve-ipv6-config"):
            words = ("dhcp", "manual") if base == "pve-ipv4-config" else ("auto", "dhcp", "manual")
            ok = item in words or _cidr(item, 4 if "ipv4" in base else 6)
        elif base in ("pve-volume-id-or-qm-path", "pve-volume-id-or-absolute-path"):
            ok = (base.endswith("qm-path") and item in ("none", "cdrom")) or item.startswith("/") or bool(
                re.fullmatch(_VOLUME_ID, item)
            )
        elif base == "pve-phys-bits":
            ok = item == "host" or (item.isdigit() and 8 <= int(item) <= 64)
        else:
            return f"format {base!r} has no verifier here: add PVE's (tests/pve_api.py) before the VM layer sends it"
        if not ok:
            return f"{item!r} is not a valid {base}"
    return None


def _ip(text: str, version: int) -> bool:
    try:
        return ipaddress.ip_address(text).version == version and "%" not in text
    except ValueError:
        return False


def _cidr(text: str, version: int) -> bool:
    try:
        return "/" in text and ipaddress.ip_interface(text).version == version
    except ValueError:
        return False
