"""module_utils/sglang_deploy_pve/hostkeys.py on plain data: what counts as an SSH host public key (and
what is refused before it could reach known_hosts), its fingerprint as ssh-keygen prints it, and which
known_hosts lines are a name's. The role end to end (agent -> known_hosts) is in test_proxmox_vm_create.py and test_proxmox_vm_refusals.py."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from sglang_deploy_pve import hostkeys

# Made by ssh-keygen (OpenSSH 9.2); the fingerprints and sizes are what ssh-keygen -lf printed for them.
ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIARYx9Qe9VCGOEWtIE8jmTZ7mSRLq/Nbc8GhlHBkDDAa root@glm5-01"
ECDSA256 = (
    "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBCeYkxZTeJvxJ3u987CAKqZIeN/omYKbxbr6Y2Vs"
    "DYHYBme34hell/UjkF/DZpz3Yc/6/Y5SEtcvCLAsYL73M/k= root@glm5-01"
)
ECDSA384 = (
    "ecdsa-sha2-nistp384 AAAAE2VjZHNhLXNoYTItbmlzdHAzODQAAAAIbmlzdHAzODQAAABhBF7fwJw82LmI/9GmmRHOZTU2iWi3LOjLeGtw4wep"
    "8WX3m0lryNNqKFvWZNkicb4XT4pLKy2+npJ/VZD3M+IqmstnWO81n5bqdDkV0VOhjyWo7kGld+AcEc4rYvFpVflX3w== "
)
ECDSA521 = (
    "ecdsa-sha2-nistp521 AAAAE2VjZHNhLXNoYTItbmlzdHA1MjEAAAAIbmlzdHA1MjEAAACFBABwYT70KXQrRIvDGfSgA51IC3tEwFcVWeGjcd6a"
    "Vor8DtcAECV7xPvpeI82qPhnsP3Mqb/QCYlXFOoye2WZeHua9gHHEcfBNIPTeaT9ifnhVLe324I34emD4+an7BAbgNW0hdIBBy/D+a+UPu2mWjNm"
    "qLyNZb7upGc48U/x5EVZhivZgA== x"
)
RSA3072 = (
    "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABgQDXqG9gLTd1vG+H4ZLennPMMeWkYeoG2CYsnbW+FhrFi73wGxLELjNPGO976a/+662bo6FRGbWTR"
    "fNhl5aFBitx7ERVmljvAvCBXdp0WMUG4m4I6Clzyu2cqHcWvLvl+SuXmo2luYEUDmYSUvcsQCe0UmxbabcSZfzvAH6aFyI/U2tKHeTADO7W7mJB6H"
    "kNnx5rOMnPIS5YdPXrkyFIU1fJZisk9pP4x9RoWzHT69ITp49kRrpa0+upgLYonPGuAffNQmSRWD3jfgcgA7G8alyiBoh4vELdfiQwbQim6RV8MFz"
    "Tm8H9L+K1QOsvGYtIkwAY1b7BP4n2xdBagDphvuG4OR+3HHIDR+ijKmVbWkY66f55QGBtWb90CVRWjwl/eSPjdx1ALnTzo7Fku5UfreuGvGWlmqu"
    "5b03Y6ehqiHj0Z+cm/LTzgpPPSNVScO2aDNBqYRY8A3WwZQYAXvKjCFiotvJoR8bia8fSMyTemQNVuONblKq4ZVuAilhexJuHRqs= root@glm5-01"
)
RSA1024 = (
    "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQDFvpu5yMoB4rU7qImAoDbAcjSisRbT+/f8DMFGUMo5e6FYBTiGQB6KF7LFobPy/Yo+EhJlNwPkB"
    "b73NDN3c6b07YxVngKwptS+pobLGh4JBuNbOzvGI3JMfSWrWS7zm3XKcGrEoskNDcJz7vpdQSaQSdwZEYT9houS+JFit5t0/Q== root@vm"
)
KEYS = {
    ED25519: "256 SHA256:gRMpnQm77qqy4gc65xKXtxYnG7P4727iaEEKI0pgllc (ED25519)",
    ECDSA256: "256 SHA256:DadnlRqLrQReOdTKvu547eQRTpsl10XAakOS09c8ExI (ECDSA)",
    ECDSA384: "384 SHA256:CA+weYF4NG3ZkDxrisqSPkQl933ZFshCHQbEd+ICyRo (ECDSA)",
    ECDSA521: "521 SHA256:vnXmFyzKP5XDvdLP556M52hre1lJ+oTewEJ6qBnQjFs (ECDSA)",
    RSA3072: "3072 SHA256:wiEL5Uodx2/uGahoQx1UaX1mYlhWE1RaqITcarUfm2Q (RSA)",
    RSA1024: "1024 SHA256:/LGYfq8AByTXdWx9c67h60zEb4bthHHp3FhWgUkKBlw (RSA)",
}


def wire(*parts: bytes) -> str:
    """Base64 of SSH wire strings, as a key blob is laid out."""
    return base64.b64encode(b"".join(struct.pack(">I", len(p)) + p for p in parts)).decode()


@pytest.mark.parametrize("line", list(KEYS), ids=["ed25519", "ecdsa256", "ecdsa384", "ecdsa521", "rsa3072", "rsa1024"])
def test_each_host_key_type_parses_with_ssh_keygens_fingerprint(line: str) -> None:
    key = hostkeys.parse_public_key(line + "\n")
    assert key.describe() == KEYS[line]
    assert key.line == " ".join(line.split()[:2])  # what known_hosts gets: no comment
    assert key.comment == " ".join(line.split()[2:])


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs OpenSSH's ssh-keygen")
def test_fingerprints_agree_with_ssh_keygen_here(tmp_path: Path) -> None:
    for index, line in enumerate(KEYS):
        path = tmp_path / f"k{index}.pub"
        path.write_text(line + "\n")
        printed = subprocess.run(["ssh-keygen", "-lf", str(path)], capture_output=True, text=True, check=True).stdout
        key = hostkeys.parse_public_key(line)
        assert printed.split()[:2] == [str(key.bits), key.fingerprint] and printed.rstrip().endswith(f"({key.label})")


ED25519_DATA = ED25519.split()[1]
ED25519_BLOB = base64.b64decode(ED25519_DATA)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "it is empty"),
        ("\n  \n", "it is empty"),
        ("<html><body>502 Bad Gateway</body></html>", "is not one of ssh-ed25519, ecdsa-sha2-nistp256"),
        (f"{ED25519}\n{ECDSA256}\n", "it has 2 lines"),
        (f"ssh-dss {ED25519_DATA}", "'ssh-dss' is not one of"),
        (f"ssh-ed25519-cert-v01@openssh.com {ED25519_DATA}", "is not one of"),
        (f"sk-ssh-ed25519@openssh.com {ED25519_DATA}", "is not one of"),
        (f'from="*" {ED25519}', "is not one of"),  # authorized_keys options are not a host key
        (f"@cert-authority * {ED25519}", "is not one of"),
        ("ssh-ed25519", "no key data"),
        ("ssh-ed25519 not*base64", "is not base64"),
        (f"ssh-ed25519 {ED25519_DATA[:-1]}", "is not base64"),  # length not a multiple of 4
        (f"ssh-ed25519 {ED25519_DATA[:-4]}AAA=", "the key data is shorter than a length inside it says"),
        (f"ssh-rsa {ED25519_DATA}", "the line says ssh-rsa but the key data inside says 'ssh-ed25519'"),
        (f"ssh-ed25519 {wire(b'ssh-ed25519', bytes(31))}", "32 bytes"),
        (f"ssh-ed25519 {wire(b'ssh-ed25519', bytes(32), b'x')}", "32 bytes"),  # trailing data
        ("ssh-ed25519 " + base64.b64encode(ED25519_BLOB + bytes(1)).decode(), "ends inside a length field"),
        ("ecdsa-sha2-nistp256 " + wire(b"ecdsa-sha2-nistp256", b"nistp384", b"\x04" + bytes(64)), "curve nistp256"),
        ("ecdsa-sha2-nistp256 " + wire(b"ecdsa-sha2-nistp256", b"nistp256", b"\x02" + bytes(32)), "not 65 bytes"),
        ("ssh-rsa " + wire(b"ssh-rsa", b"\x01\x00\x01", b"\x00\xc5" + bytes(63)), "a 512-bit RSA key is outside"),
        ("ssh-rsa " + wire(b"ssh-rsa", b"\x01\x00\x01", b"\x85" + bytes(255)), "modulus is not a positive integer"),
        ("ssh-ed25519 " + ED25519_DATA + " root\x1b[31m", "control characters"),
        ("ssh-ed25519 " + "A" * 5000, "longer than any SSH public key line"),
    ],
)
def test_anything_else_is_refused_saying_why(text: str, why: str) -> None:
    with pytest.raises(hostkeys.HostKeyError) as refused:
        hostkeys.parse_public_key(text)
    assert why in str(refused.value)
    assert len(str(refused.value)) < 400, "the message quotes too much of what it refused"


def test_a_key_file_holds_only_its_own_type() -> None:
    assert hostkeys.parse_key_file("/etc/ssh/ssh_host_ed25519_key.pub", ED25519).type == "ssh-ed25519"
    assert hostkeys.parse_key_file("/etc/ssh/ssh_host_ecdsa_key.pub", ECDSA384).bits == 384
    with pytest.raises(hostkeys.HostKeyError, match="is not one of ssh-ed25519$"):
        hostkeys.parse_key_file("/etc/ssh/ssh_host_ed25519_key.pub", RSA3072)
    assert list(hostkeys.KEY_FILES)[0] == hostkeys.REQUIRED_KEY_FILE


def test_known_hosts_names_are_ssh_lookups() -> None:
    assert hostkeys.known_hosts_name("192.0.2.10") == "192.0.2.10"
    assert hostkeys.known_hosts_name("GLM5-01.Example", 22) == "glm5-01.example"
    assert hostkeys.known_hosts_name("127.0.0.1", 2222) == "[127.0.0.1]:2222"
    assert hostkeys.known_hosts_name("2001:db8::5", 22) == "2001:db8::5"
    assert hostkeys.known_hosts_name("2001:db8::5", 2222) == "[2001:db8::5]:2222"


@pytest.mark.parametrize(
    "name",
    [
        "192.0.2.10\n",
        "glm5-01 evil.example",
        "a,b",
        "[192.0.2.10]:22\nx",
        "[a b]:22",
        "",
        " 192.0.2.10",
        "host\x00",
        "*",
    ],
)
def test_known_hosts_names_are_checked_whole(name: str) -> None:
    """A name goes into known_hosts as a line's first field: a line break or a space there is another line
    or another field, a comma another name, * a pattern."""
    with pytest.raises(hostkeys.HostNameError, match="is not a host name or IP address"):
        hostkeys.known_hosts_name(name, 22)


SK_ED25519 = "sk-ssh-ed25519@openssh.com " + wire(b"sk-ssh-ed25519@openssh.com", bytes(range(32)), b"ssh:")
SK_ECDSA = "sk-ecdsa-sha2-nistp256@openssh.com " + wire(
    b"sk-ecdsa-sha2-nistp256@openssh.com", b"nistp256", b"\x04" + bytes(64), b"ssh:"
)


def test_security_key_types_are_user_keys_only() -> None:
    """cloud-init installs a user's keys, FIDO ones included; a host key is never one of those."""
    for line, label in ((SK_ED25519, "ED25519-SK"), (SK_ECDSA, "ECDSA-SK")):
        key = hostkeys.parse_public_key(line + " yubikey", hostkeys.USER_KEY_TYPES)
        assert (key.bits, key.label, key.comment) == (256, label, "yubikey")
        with pytest.raises(hostkeys.HostKeyError, match="is not one of"):
            hostkeys.parse_public_key(line)
    assert hostkeys.parse_public_key(ED25519, hostkeys.USER_KEY_TYPES).type == "ssh-ed25519"
    for bad, why in (
        ("sk-ssh-ed25519@openssh.com " + wire(b"sk-ssh-ed25519@openssh.com", bytes(32)), "laid out otherwise"),
        (
            "sk-ecdsa-sha2-nistp256@openssh.com "
            + wire(b"sk-ecdsa-sha2-nistp256@openssh.com", b"nistp384", b"\x04" + bytes(64), b"ssh:"),
            "curve nistp256",
        ),
        ("sk-ssh-ed25519@openssh.com " + ED25519_DATA, "the key data inside says 'ssh-ed25519'"),
    ):
        with pytest.raises(hostkeys.HostKeyError, match=re.escape(why)):
            hostkeys.parse_public_key(bad, hostkeys.USER_KEY_TYPES)


def hashed(name: str, salt: bytes = b"0123456789abcdefghij") -> str:
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


def test_a_names_lines_are_found_plain_hashed_and_by_pattern() -> None:
    new, old = hostkeys.parse_public_key(ED25519), hostkeys.parse_public_key(ECDSA256)
    text = "\n".join(
        [
            "# a comment naming 192.0.2.10",
            f"192.0.2.10 {old.line}",  # 2: the name's own
            f"{hashed('192.0.2.10')} {old.line}",  # 3: its hash
            f"192.0.2.10,glm5-01 {old.line}",  # 4: shared with another name
            f"192.0.2.* {old.line}",  # 5: a pattern
            f"192.0.2.*,!192.0.2.10 {old.line}",  # negated: not this name
            f"@revoked 192.0.2.10 {old.line}",  # a marker line is not the host's key
            f"192.0.2.100 {old.line}",
            f"[192.0.2.10]:2222 {old.line}",
            f"{hashed('192.0.2.11')} {old.line}",
            "",
        ]
    )
    lines = hostkeys.known_lines(text, "192.0.2.10")
    assert [line.number for line in lines] == [2, 3, 4, 5]
    assert [line.names_only("192.0.2.10") for line in lines] == [True, True, False, False]
    assert [line.number for line in hostkeys.known_lines(text, "[192.0.2.10]:2222")] == [9]
    assert hostkeys.entries_differ(text, "192.0.2.10", [new])
    assert not hostkeys.entries_differ(text, "192.0.2.10", [old])  # shared and pattern lines do not count
    assert hostkeys.entries_differ(text, "192.0.2.10", [old, new])  # a key it lacks
    assert hostkeys.entries_differ("", "192.0.2.10", [new])


def test_exactly_the_keys_in_any_order_are_no_difference() -> None:
    keys = [hostkeys.parse_public_key(k) for k in (ED25519, ECDSA256, RSA3072)]
    text = "".join(f"[127.0.0.1]:2222 {k.line}\n" for k in reversed(keys)) + f"[127.0.0.1]:2222 {keys[0].line}\n"
    assert not hostkeys.entries_differ(text, "[127.0.0.1]:2222", keys)
    assert hostkeys.entries_differ(text, "[127.0.0.1]:2222", keys[:2])  # an old RSA key would stay


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs OpenSSH's ssh-keygen")
def test_hashed_names_match_as_ssh_keygen_hashes_them(tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    key = hostkeys.parse_public_key(ED25519)
    path.write_text(f"192.0.2.10 {key.line}\n[127.0.0.1]:2222 {key.line}\nother {key.line}\n")
    subprocess.run(["ssh-keygen", "-H", "-f", str(path)], capture_output=True, check=True)
    text = path.read_text()
    assert "192.0.2.10" not in text
    assert [line.number for line in hostkeys.known_lines(text, "192.0.2.10")] == [1]
    assert [line.number for line in hostkeys.known_lines(text, "[127.0.0.1]:2222")] == [2]
    assert not hostkeys.entries_differ(text, "192.0.2.10", [key])


def test_a_key_known_for_the_name_that_is_none_of_the_hosts_is_a_conflict() -> None:
    new, other = hostkeys.parse_public_key(ED25519), hostkeys.parse_public_key(ECDSA256)
    rsa = hostkeys.parse_public_key(RSA3072)
    text = "\n".join(
        [
            f"192.0.2.10 {new.line}",  # 1: the host's own key
            f"{hashed('192.0.2.10')} {other.line}",  # 2: hashed, a key the host does not have
            f"192.0.2.*,glm5-01 {rsa.line}",  # 3: a pattern with another key
            f"192.0.2.11 {other.line}",  # another host's
            f"@revoked 192.0.2.10 {other.line}",  # markers are not the host's keys
            "",
        ]
    )
    assert [line.number for line in hostkeys.conflicts(text, "192.0.2.10", [new])] == [2, 3]
    assert [line.number for line in hostkeys.conflicts(text, "192.0.2.10", [new, other, rsa])] == []
    # Lines that only lack some of the host's keys are no conflict (they get completed, not refused).
    assert hostkeys.conflicts(f"192.0.2.10 {new.line}\n", "192.0.2.10", [new, other, rsa]) == []
    assert hostkeys.conflicts("", "192.0.2.10", [new]) == []
    (line,) = hostkeys.conflicts(f"192.0.2.10 {other.line}\n", "192.0.2.10", [new])
    assert hostkeys.describe_known(line) == f"ecdsa-sha2-nistp256 {other.fingerprint}"
    (line,) = hostkeys.conflicts("192.0.2.10 ssh-ed25519 AAAA\n", "192.0.2.10", [new])
    assert hostkeys.describe_known(line).endswith("(not a key that parses)")
