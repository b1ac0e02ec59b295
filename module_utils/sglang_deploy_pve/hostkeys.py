"""SSH host public keys: an OpenSSH public key line checked and fingerprinted, and what a known_hosts file
holds for one name.

Stdlib only, Python >= 3.9. The proxmox_vm role reads a new guest's /etc/ssh/ssh_host_*_key.pub through its
QEMU guest agent (library/sglang_pve_guest.py: the node's TLS-verified, token-authenticated API) and records
the keys in the control node's known_hosts (library/sglang_known_hosts_plan.py says what must change,
ansible.builtin.known_hosts writes it), so the same run can go on over SSH with host keys checked. Nothing
reaches known_hosts that did not parse here: one line, a known key type, base64 that decodes, and a key
blob laid out as that type's (the type name inside it included). Unit tests: tests/unit/host/test_hostkeys.py.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

# The host keys cloud-init / sshd make, as files on the guest, and the key types each may hold. ed25519 is
# the one a run waits for (cloud-init writes it last of the three); the others are taken when present.
KEY_FILES = {
    "/etc/ssh/ssh_host_ed25519_key.pub": ("ssh-ed25519",),
    "/etc/ssh/ssh_host_ecdsa_key.pub": ("ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521"),
    "/etc/ssh/ssh_host_rsa_key.pub": ("ssh-rsa",),
}
REQUIRED_KEY_FILE = "/etc/ssh/ssh_host_ed25519_key.pub"
# ECDSA key type -> (curve name inside the blob, bytes of its uncompressed point 04||X||Y).
CURVES = {
    "ecdsa-sha2-nistp256": ("nistp256", 65),
    "ecdsa-sha2-nistp384": ("nistp384", 97),
    "ecdsa-sha2-nistp521": ("nistp521", 133),
}
KEY_TYPES = ("ssh-ed25519", *CURVES, "ssh-rsa")
# A user's keys (cloud-init's authorized_keys) may also live on a FIDO security key; a host key never does.
SK_ED25519 = "sk-ssh-ed25519@openssh.com"
SK_ECDSA = "sk-ecdsa-sha2-nistp256@openssh.com"
USER_KEY_TYPES = (*KEY_TYPES, SK_ED25519, SK_ECDSA)
# ssh-keygen -l's label of each type.
LABELS = {
    "ssh-ed25519": "ED25519",
    "ssh-rsa": "RSA",
    **{t: "ECDSA" for t in CURVES},
    SK_ED25519: "ED25519-SK",
    SK_ECDSA: "ECDSA-SK",
}
# OpenSSH refuses RSA keys below 1024 bits (SSH_RSA_MINIMUM_MODULUS_SIZE); 16384 is ssh-keygen's maximum.
RSA_MIN_BITS = 1024
RSA_MAX_BITS = 16384
# A 16384-bit RSA key's line is under 3 KiB; a longer "key" is something else.
MAX_LINE = 4096
BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")
# What a host name or address may hold as a known_hosts line's first field: no space, comma or pattern character.
HOST_NAME = re.compile(r"[A-Za-z0-9_.:-]+")
# The port ssh leaves out of a known_hosts name.
SSH_PORT = 22


class HostKeyError(ValueError):
    """Text that is not a usable SSH host public key; the message says why (never the whole text)."""


class HostNameError(ValueError):
    """A name that cannot be a known_hosts line's host field (a line break, a space, a comma, a pattern)."""


@dataclass(frozen=True)
class HostKey:
    """A parsed public key: its type and blob (the comment is kept for messages only)."""

    type: str
    blob: bytes
    bits: int
    comment: str = ""

    @property
    def base64(self) -> str:
        return base64.b64encode(self.blob).decode("ascii")

    @property
    def line(self) -> str:
        """``TYPE BASE64``: what a known_hosts line holds after the host name (no comment)."""
        return f"{self.type} {self.base64}"

    @property
    def fingerprint(self) -> str:
        """OpenSSH's SHA256 fingerprint, as ``ssh-keygen -lf`` and ssh's prompts show it."""
        digest = base64.b64encode(hashlib.sha256(self.blob).digest()).decode("ascii").rstrip("=")
        return f"SHA256:{digest}"

    @property
    def label(self) -> str:
        return LABELS[self.type]

    def describe(self) -> str:
        """``256 SHA256:... (ED25519)``: ssh-keygen -lf's words, to compare on the guest's console."""
        return f"{self.bits} {self.fingerprint} ({self.label})"


def _strings(blob: bytes) -> list[bytes]:
    """The SSH wire strings (uint32 length, bytes) a key blob is made of; every byte must belong to one."""
    out: list[bytes] = []
    offset = 0
    while offset < len(blob):
        if offset + 4 > len(blob):
            raise HostKeyError("the key data ends inside a length field")
        size = int.from_bytes(blob[offset : offset + 4], "big")
        offset += 4
        if size > len(blob) - offset:
            raise HostKeyError("the key data is shorter than a length inside it says")
        out.append(blob[offset : offset + size])
        offset += size
    return out


def _mpint_bits(value: bytes, what: str) -> int:
    """Bits of a positive SSH mpint (no sign bit set, no superfluous leading zero)."""
    if not value or value[0] & 0x80 or (len(value) > 1 and value[0] == 0 and not value[1] & 0x80):
        raise HostKeyError(f"the RSA {what} is not a positive integer in SSH's encoding")
    return int.from_bytes(value, "big").bit_length()


def _key_bits(key_type: str, parts: Sequence[bytes]) -> int:
    """The key's size as ssh-keygen -l gives it, after checking the blob's layout for its type."""
    # A security key's blob is the plain key's followed by its application string (usually "ssh:").
    fields = 3 if key_type == SK_ED25519 else 4 if key_type == SK_ECDSA else 0
    if fields and (len(parts) != fields or not parts[-1]):
        raise HostKeyError(f"an {key_type} key ends in its application string, this one is laid out otherwise")
    if key_type in ("ssh-ed25519", SK_ED25519):
        if len(parts) != (fields or 2) or len(parts[1]) != 32:
            raise HostKeyError(f"an {key_type} key is its type and 32 bytes, this one is laid out otherwise")
        return 256
    if key_type in CURVES or key_type == SK_ECDSA:
        curve, point = CURVES.get(key_type, CURVES["ecdsa-sha2-nistp256"])
        if len(parts) != (fields or 3) or parts[1] != curve.encode("ascii"):
            raise HostKeyError(f"an {key_type} key names the curve {curve} inside, this one does not")
        if len(parts[2]) != point or parts[2][:1] != b"\x04":
            raise HostKeyError(f"the {curve} point is not {point} bytes of an uncompressed point")
        return {"nistp256": 256, "nistp384": 384, "nistp521": 521}[curve]
    if len(parts) != 3:
        raise HostKeyError("an ssh-rsa key is its type, exponent and modulus, this one is laid out otherwise")
    _mpint_bits(parts[1], "exponent")
    bits = _mpint_bits(parts[2], "modulus")
    if not RSA_MIN_BITS <= bits <= RSA_MAX_BITS:
        raise HostKeyError(f"a {bits}-bit RSA key is outside {RSA_MIN_BITS}..{RSA_MAX_BITS} bits, which ssh accepts")
    return bits


def _start(text: str) -> str:
    """The first characters of refused text, printable, for a message."""
    return repr(text[:40] + ("..." if len(text) > 40 else ""))


def parse_public_key(text: str, types: Iterable[str] = KEY_TYPES) -> HostKey:
    """One OpenSSH public key line (``TYPE BASE64 [COMMENT]``, as a ``.pub`` file holds it) of one of
    ``types``; raises HostKeyError saying what is wrong with anything else."""
    allowed = tuple(types)
    if len(text) > MAX_LINE:
        raise HostKeyError(f"it is {len(text)} characters long, longer than any SSH public key line")
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise HostKeyError("it is empty")
    if len(lines) > 1:
        raise HostKeyError(f"it has {len(lines)} lines, a public key file has one (it starts with {_start(text)})")
    line = lines[0].strip()
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in line.replace("\t", " ")):
        raise HostKeyError(f"it holds control characters (it starts with {_start(line)})")
    fields = line.split()
    if fields[0] not in allowed:
        raise HostKeyError(f"its type {_start(fields[0])} is not one of {', '.join(allowed)}")
    if len(fields) < 2:
        raise HostKeyError("it has a key type but no key data")
    data = fields[1]
    if len(data) % 4 or not BASE64.fullmatch(data):
        raise HostKeyError(f"its key data {_start(data)} is not base64")
    try:
        blob = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise HostKeyError(f"its key data {_start(data)} does not decode as base64") from None
    parts = _strings(blob)
    embedded = parts[0].decode("ascii", errors="replace") if parts else ""
    if embedded != fields[0]:
        raise HostKeyError(f"the line says {fields[0]} but the key data inside says {_start(embedded)}")
    return HostKey(type=fields[0], blob=blob, bits=_key_bits(fields[0], parts), comment=" ".join(fields[2:]))


def parse_key_file(path: str, text: str) -> HostKey:
    """A guest's ``/etc/ssh/ssh_host_*_key.pub``: parse_public_key with the types that file may hold."""
    return parse_public_key(text, KEY_FILES.get(path, KEY_TYPES))


# ------------------------------------------------------------------ known_hosts


def known_hosts_name(host: str, port: int = SSH_PORT) -> str:
    """The name ssh looks ``host`` up by in known_hosts: lower case, ``[host]:port`` off port 22. Raises
    HostNameError for anything but a host name or address (whole: a line break would start another line)."""
    bracketed = re.fullmatch(r"\[([^\]]*)\]:([0-9]{1,5})", host)
    plain = bracketed.group(1) if bracketed else host
    if not HOST_NAME.fullmatch(plain):
        raise HostNameError(f"{_start(host)} is not a host name or IP address")
    if bracketed:
        return host.lower()
    return host.lower() if int(port) == SSH_PORT else f"[{host.lower()}]:{int(port)}"


def _hashed_match(field: str, name: str) -> bool:
    """A hashed name ``|1|SALT|HASH`` (HashKnownHosts yes) is HMAC-SHA1(SALT, name)."""
    parts = field.split("|")
    if len(parts) != 4 or parts[1] != "1":
        return False
    try:
        salt, want = base64.b64decode(parts[2]), base64.b64decode(parts[3])
    except (binascii.Error, ValueError):
        return False
    return hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), want)


def _pattern_match(pattern: str, name: str) -> bool:
    """ssh's host pattern: ``*`` and ``?`` are wildcards, everything else (brackets too) is literal."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern.lower())
    return re.fullmatch(regex, name) is not None


@dataclass(frozen=True)
class KnownLine:
    """A known_hosts line that names a host: 1-based line number, its names field, type and key data."""

    number: int
    hosts: str
    type: str
    data: str

    def names_only(self, name: str) -> bool:
        """The line is this name's alone: exactly this name, or its hash; no other name, no pattern."""
        return self.hosts.startswith("|1|") or self.hosts.lower() == name


def known_lines(text: str, name: str) -> list[KnownLine]:
    """Lines of a known_hosts text that ``ssh-keygen -F name`` finds (and ``-R`` deletes): the name
    itself, its hash, or a pattern it matches and no negation excludes. Marker lines (@cert-authority,
    @revoked) are not a host's own keys and are left out, as ssh-keygen -R leaves them."""
    found = []
    for number, raw in enumerate(text.splitlines(), 1):
        fields = raw.split()
        if len(fields) < 3 or fields[0].startswith("#") or fields[0].startswith("@"):
            continue
        hosts = fields[0]
        if hosts.startswith("|"):
            matched = _hashed_match(hosts, name)
        else:
            patterns = hosts.split(",")
            negated = any(p.startswith("!") and _pattern_match(p[1:], name) for p in patterns)
            matched = not negated and any(not p.startswith("!") and _pattern_match(p, name) for p in patterns)
        if matched:
            found.append(KnownLine(number=number, hosts=hosts, type=fields[1], data=fields[2]))
    return found


def entries_differ(text: str, name: str, keys: Sequence[HostKey]) -> bool:
    """True unless the lines that are ``name``'s alone hold exactly ``keys`` (in any order, repeats aside)."""
    have = {(line.type, line.data) for line in known_lines(text, name) if line.names_only(name)}
    return have != {(key.type, key.base64) for key in keys}


def conflicts(text: str, name: str, keys: Sequence[HostKey]) -> list[KnownLine]:
    """Lines ``name`` matches (its own, its hash, shared, a pattern) holding a key that is none of ``keys``:
    a key known for the host that differs from the host's - after a create or rebuild an old guest's key,
    otherwise what a man-in-the-middle looks like. Lines that only lack some of ``keys`` are no conflict."""
    have = {(key.type, key.base64) for key in keys}
    return [line for line in known_lines(text, name) if (line.type, line.data) not in have]


def describe_known(line: KnownLine) -> str:
    """``TYPE SHA256:...`` of a known_hosts line's key (its type and data as written when they do not parse)."""
    try:
        return f"{line.type} {parse_public_key(f'{line.type} {line.data}').fingerprint}"
    except HostKeyError:
        return f"{line.type} {_start(line.data)} (not a key that parses)"
