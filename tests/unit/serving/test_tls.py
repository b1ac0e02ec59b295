"""serving/tls.py: the inventory's certificate, key and CA judged before any host changes, with real
certificates (tests/tls_certs.py). Each refusal names the variable and the file; all of them at once."""

from __future__ import annotations

import datetime
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_deploy.serving import tls

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tls_certs import NOW, TestCA, write  # noqa: E402

NAMES = ["127.0.0.1", "gpu-01.lab"]


def _file(path: str, content: bytes, mode: int = 0o600, vaulted: bool = False) -> tls.TlsFile:
    return tls.TlsFile(path, content, mode, vaulted)


def _judge(ca: TestCA, issued, *, names=NAMES, key_mode: int = 0o600, anchor: bytes | None = None, now=NOW):  # type: ignore[no-untyped-def]
    return tls.judge(
        _file("/inv/server.crt", issued.cert), _file("/inv/server.key", issued.key, key_mode),
        _file("/inv/ca.crt", anchor if anchor is not None else ca.pem), names=names, now=now,
    )  # fmt: skip


def test_a_good_certificate_is_summarized_without_any_secret() -> None:
    ca = TestCA()
    summary = _judge(ca, ca.issue(["gpu-01.lab", "127.0.0.1"]))
    assert summary["subject"] == "CN=gpu-01.lab" and summary["names"] == ["gpu-01.lab", "127.0.0.1"]
    assert len(str(summary["sha256"])) == 64 and summary["warnings"] == []
    assert "PRIVATE" not in repr(summary)


def test_a_wildcard_names_one_label_and_an_ipv6_url_host_is_compared_without_brackets() -> None:
    ca = TestCA()
    assert _judge(ca, ca.issue(["*.lab", "::1"]), names=["gpu-01.lab", "[::1]"])["names"] == ["*.lab", "::1"]
    with pytest.raises(tls.TlsError, match=r"does not name a\.gpu-01\.lab"):
        _judge(ca, ca.issue(["*.lab"]), names=["a.gpu-01.lab"])


def test_a_missing_name_is_refused_naming_it_the_names_it_has_and_the_fix() -> None:
    ca = TestCA()
    with pytest.raises(tls.TlsError) as err:
        _judge(ca, ca.issue(["gpu-01.lab"]))
    message = str(err.value)
    assert message.startswith("sglang_server_tls_certfile=/inv/server.crt: the certificate does not name 127.0.0.1")
    assert "(its names: gpu-01.lab)" in message and "subjectAltName" in message


@pytest.mark.parametrize(
    "not_before, not_after, expected",
    [
        (NOW - datetime.timedelta(days=30), NOW - datetime.timedelta(days=1), "the certificate expired on"),
        (NOW + datetime.timedelta(days=2), NOW + datetime.timedelta(days=30), "the certificate is not valid before"),
    ],
)
def test_an_expired_or_future_certificate_is_refused(not_before, not_after, expected: str) -> None:  # type: ignore[no-untyped-def]
    ca = TestCA()
    with pytest.raises(tls.TlsError, match=f"sglang_server_tls_certfile=/inv/server.crt: {expected}"):
        _judge(ca, ca.issue(NAMES, not_before=not_before, not_after=not_after))


def test_a_certificate_about_to_expire_is_served_with_a_warning() -> None:
    ca = TestCA()
    summary = _judge(ca, ca.issue(NAMES, not_after=NOW + datetime.timedelta(days=5)))
    assert len(summary["warnings"]) == 1 and "renew it" in summary["warnings"][0]  # type: ignore[index]


def test_a_key_that_is_not_the_certificates_is_refused() -> None:
    ca = TestCA()
    good, other = ca.issue(NAMES), ca.issue(NAMES)
    with pytest.raises(tls.TlsError, match=r"sglang_server_tls_keyfile=/inv/server.key: this key is not the certificate's"):
        _judge(ca, type(good)(good.cert, other.key))


def test_an_encrypted_key_is_refused_with_how_to_keep_it_in_vault_instead() -> None:
    ca = TestCA()
    with pytest.raises(tls.TlsError, match="the private key is encrypted.*ansible-vault"):
        _judge(ca, ca.issue(NAMES, password=b"secret"))


@pytest.mark.parametrize("mode, whom", [(0o600, None), (0o640, "the file's group"), (0o644, "every user"), (0o604, "every user")])
def test_a_plain_key_others_can_read_is_refused_a_vault_file_is_not_judged_by_mode(mode: int, whom: str | None) -> None:
    """A group-readable key is refused as a group-readable API-key file is (issue 43): the group is other users."""
    ca = TestCA()
    issued = ca.issue(NAMES)
    if whom:
        with pytest.raises(tls.TlsError, match=rf"readable by {whom} of the control node \(mode 0{mode:o}\)"):
            _judge(ca, issued, key_mode=mode)
    else:
        _judge(ca, issued, key_mode=mode)
    tls.judge(_file("/c", issued.cert), _file("/k", issued.key, 0o644, vaulted=True), _file("/a", ca.pem), names=NAMES, now=NOW)


def test_a_ca_that_did_not_issue_the_certificate_is_refused() -> None:
    ca, other = TestCA(), TestCA("another CA")
    with pytest.raises(tls.TlsError, match=r"sglang_server_tls_cafile=/inv/ca.crt does not vouch for sglang_server_tls_certfile"):
        _judge(ca, ca.issue(NAMES), anchor=other.pem)


def test_a_self_signed_server_certificate_is_refused_as_its_own_ca() -> None:
    """openssl req -x509 makes a CA:TRUE certificate: the web PKI rules (smg's rustls) refuse it as a server's."""
    ca = TestCA("127.0.0.1")
    from cryptography import x509  # the CA's own certificate, as a server's
    from cryptography.hazmat.primitives import hashes, serialization

    cert = (
        x509.CertificateBuilder().subject_name(ca.name).issuer_name(ca.name).public_key(ca.key.public_key())
        .serial_number(1).not_valid_before(ca.cert.not_valid_before_utc).not_valid_after(ca.cert.not_valid_after_utc)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("gpu-01.lab")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca.key, hashes.SHA256())
    )  # fmt: skip
    pem = cert.public_bytes(serialization.Encoding.PEM)
    key = ca.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    with pytest.raises(tls.TlsError, match="a self-signed server certificate is not a CA"):
        tls.judge(_file("/c", pem), _file("/k", key), _file("/a", pem), names=["gpu-01.lab"], now=NOW)


def test_every_problem_is_reported_at_once_and_garbage_is_named() -> None:
    with pytest.raises(tls.TlsError) as err:
        tls.judge(_file("/c", b"junk"), _file("/k", b"junk", 0o644), _file("/a", b""), names=NAMES, now=NOW)
    message = str(err.value)
    for part in ("sglang_server_tls_certfile=/c: no PEM certificate", "sglang_server_tls_cafile=/a: no PEM certificate",
                 "sglang_server_tls_keyfile=/k: the private key is readable", "sglang_server_tls_keyfile=/k: no PEM private key"):
        assert part in message, message


def test_judge_resolved_reads_each_file_and_refuses_a_ca_in_vault(tmp_path: Path) -> None:
    ca = TestCA()
    issued = ca.issue(NAMES)
    (tmp_path / "c").write_bytes(issued.cert)
    (tmp_path / "k").write_bytes(issued.key)
    (tmp_path / "k").chmod(0o600)
    (tmp_path / "a").write_bytes(ca.pem)
    resolved = {"source": {kind: str(tmp_path / name) for kind, name in (("certfile", "c"), ("keyfile", "k"), ("cafile", "a"))},
                "names": NAMES}  # fmt: skip
    assert sorted(tls.judge_resolved(resolved, tls.read_file, NOW)["names"]) == sorted(NAMES)  # type: ignore[arg-type]

    def vaulted(path: str) -> tls.TlsFile:
        file = tls.read_file(path)
        return tls.TlsFile(file.path, file.content, file.mode, vaulted=path.endswith("/a"))

    with pytest.raises(tls.TlsError, match="sglang_server_tls_cafile=.*/a: a CA certificate is public"):
        tls.judge_resolved(resolved, vaulted, NOW)
    (tmp_path / "k").unlink()
    with pytest.raises(tls.TlsError, match=r"sglang_server_tls_keyfile=.*/k: cannot read it \(No such file or directory\)"):
        tls.judge_resolved(resolved, tls.read_file, NOW)


def test_read_file_is_bounded_and_reads_regular_files_only(tmp_path: Path) -> None:
    big = tmp_path / "big.pem"
    big.write_bytes(b"x" * (tls.MAX_FILE_BYTES + 1))
    with pytest.raises(ValueError, match="is larger than"):
        tls.read_file(str(big))
    with pytest.raises(ValueError, match="is not a regular file"):
        tls.read_file(str(tmp_path))
    vault = tmp_path / "key.vault"
    vault.write_bytes(b"$ANSIBLE_VAULT;1.1;AES256\n6162\n")
    plain = tmp_path / "key.plain"
    plain.write_bytes(b"PLAIN")
    read = tls.read_file(str(vault), str(plain))
    assert read.vaulted and read.content == b"PLAIN" and read.path == str(vault)


# -- keys the server and its clients cannot use, a CA near its end, names without case (issue 43, class 4) -----------
def _keys() -> dict[str, object]:
    from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa

    return {
        "rsa-1024": rsa.generate_private_key(65537, 1024), "rsa-2048": rsa.generate_private_key(65537, 2048),
        "dsa-2048": dsa.generate_private_key(2048), "ed25519": ed25519.Ed25519PrivateKey.generate(),
        "ed448": ed448.Ed448PrivateKey.generate(), "secp256k1": ec.generate_private_key(ec.SECP256K1()),
        "p384": ec.generate_private_key(ec.SECP384R1()),
    }  # fmt: skip


KEYS = _keys()


@pytest.mark.parametrize(
    ("kind", "refusal"),
    [
        ("rsa-1024", "an RSA key of 1024 bits: Python's ssl (what sglang serves with) refuses to load one under 2048 bits"),
        ("dsa-2048", "a DSA key, which no TLS 1.3 client takes"),
        ("ed448", "a Ed448 key, which no TLS 1.3 client takes"),
        ("secp256k1", "an EC key on secp256k1, a curve TLS clients"),
        ("rsa-2048", None), ("ed25519", None), ("p384", None),
    ],
)  # fmt: skip
def test_a_key_the_server_or_its_clients_cannot_use_is_refused(kind: str, refusal: str | None) -> None:
    ca = TestCA()
    issued = ca.issue(NAMES, key=KEYS[kind])
    if refusal is None:
        _judge(ca, issued)
        return
    with pytest.raises(tls.TlsError, match=re.escape(refusal)) as raised:
        _judge(ca, issued)
    assert "Fix: issue the certificate for an RSA key of at least 2048 bits or an ECDSA P-256 key" in str(raised.value)


@pytest.mark.parametrize(("kind", "loads"), [("rsa-1024", False), ("rsa-2048", True), ("p384", True)])
def test_the_key_rule_is_what_pythons_ssl_takes(tmp_path: Path, kind: str, loads: bool) -> None:
    """The premise, checked against the real thing: a server context of Python's ssl (sglang's uvicorn) loads what
    the judge passes and refuses the RSA key it refuses."""
    import ssl

    paths = write(tmp_path, TestCA(), TestCA().issue(NAMES, key=KEYS[kind]))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    if loads:
        context.load_cert_chain(paths["certfile"], paths["keyfile"])
    else:
        with pytest.raises(ssl.SSLError, match="too small"):
            context.load_cert_chain(paths["certfile"], paths["keyfile"])


def test_a_ca_that_ends_soon_warns_and_an_expired_one_is_refused() -> None:
    soon = TestCA(not_after=NOW + datetime.timedelta(days=10))
    summary = _judge(soon, soon.issue(NAMES, not_after=NOW + datetime.timedelta(days=5)))
    assert any("the CA CN=sglang-deploy test CA expires on" in w and "stops being trusted then" in w for w in summary["warnings"])
    gone = TestCA(not_after=NOW - datetime.timedelta(days=1))
    with pytest.raises(tls.TlsError, match="the CA CN=sglang-deploy test CA expired on .* no client trusts what it signed"):
        _judge(gone, gone.issue(NAMES))


def test_dns_names_compare_without_case() -> None:
    ca = TestCA()
    _judge(ca, ca.issue(["127.0.0.1", "GLM5-01.Example.ORG"]), names=["127.0.0.1", "glm5-01.example.org"])
    _judge(ca, ca.issue(["127.0.0.1", "*.Example.ORG"]), names=["127.0.0.1", "glm5-01.EXAMPLE.org"])


# -- a chain with an intermediate (docs/security.md tells users to put it after the certificate) -----------------
def test_a_chain_through_an_intermediate_passes_only_with_the_intermediate_after_the_certificate() -> None:
    root = TestCA("root CA", path_length=1)
    intermediate = TestCA("intermediate CA", issuer=root)
    issued = intermediate.issue(NAMES)
    chained = type(issued)(issued.cert + intermediate.pem, issued.key)
    summary = _judge(root, chained)
    assert sorted(summary["names"]) == sorted(NAMES) and summary["warnings"] == []
    with pytest.raises(tls.TlsError, match=r"does not vouch for .* as 127\.0\.0\.1 .*put any intermediate after the certificate"):
        _judge(root, issued)  # the intermediate left out
    with pytest.raises(tls.TlsError, match="its first certificate .CN=intermediate CA. is a CA's, not the server's. Fix: put the server's certificate first"):
        _judge(root, type(issued)(intermediate.pem + issued.cert, issued.key))
    # The intermediate as the trust anchor is enough for clients that trust it (it is a CA certificate).
    assert sorted(_judge(intermediate, issued, anchor=intermediate.pem)["names"]) == sorted(NAMES)


def test_an_intermediate_that_may_not_issue_or_has_expired_breaks_the_chain() -> None:
    root = TestCA("root CA", path_length=0)  # may sign no intermediate
    intermediate = TestCA("intermediate CA", issuer=root)
    issued = intermediate.issue(NAMES)
    with pytest.raises(tls.TlsError, match="does not vouch for"):
        _judge(root, type(issued)(issued.cert + intermediate.pem, issued.key))
    root = TestCA("root CA", path_length=1)
    expired = TestCA("intermediate CA", issuer=root, not_after=NOW - datetime.timedelta(days=1))
    issued = expired.issue(NAMES)
    with pytest.raises(tls.TlsError, match="does not vouch for"):
        _judge(root, type(issued)(issued.cert + expired.pem, issued.key))


# -- the edges: validity to the second, the renewal warning's day, one problem at a time (issue 44) ----------------
SECOND = datetime.timedelta(seconds=1)


def _cert(pem: bytes):  # type: ignore[no-untyped-def]
    from cryptography import x509

    return x509.load_pem_x509_certificate(pem)


def test_a_certificate_is_valid_from_its_first_to_its_last_second() -> None:
    """X.509 validity includes both of its ends (RFC 5280, 4.1.2.5)."""
    ca = TestCA()
    issued = ca.issue(NAMES, not_before=NOW - datetime.timedelta(days=1), not_after=NOW + datetime.timedelta(days=90))
    start, end = _cert(issued.cert).not_valid_before_utc, _cert(issued.cert).not_valid_after_utc
    assert _judge(ca, issued, now=start)["warnings"] == []
    assert _judge(ca, issued, now=end)["warnings"]  # its last second: served, with the renewal warning
    with pytest.raises(tls.TlsError, match="the certificate expired on"):
        _judge(ca, issued, now=end + SECOND)
    with pytest.raises(tls.TlsError, match="the certificate is not valid before"):
        _judge(ca, issued, now=start - SECOND)


def test_the_renewal_warnings_start_exactly_the_set_number_of_days_before_the_end() -> None:
    ca = TestCA(not_after=NOW + datetime.timedelta(days=400))
    issued = ca.issue(NAMES, not_after=NOW + datetime.timedelta(days=90))
    end = _cert(issued.cert).not_valid_after_utc
    before = datetime.timedelta(days=tls.RENEW_WARNING_DAYS)
    assert _judge(ca, issued, now=end - before)["warnings"] == []
    assert len(_judge(ca, issued, now=end - before + SECOND)["warnings"]) == 1
    ca_end = ca.cert.not_valid_after_utc
    leaf = ca.issue(NAMES, not_before=ca_end - datetime.timedelta(days=100), not_after=ca_end + datetime.timedelta(days=90))
    assert _judge(ca, leaf, now=ca_end - before)["warnings"] == []
    warned = _judge(ca, leaf, now=ca_end - before + SECOND)["warnings"]
    assert len(warned) == 1 and "the CA CN=sglang-deploy test CA expires on" in warned[0]  # type: ignore[index]
    assert _judge(ca, leaf, now=ca_end)["warnings"]  # the CA's last second: still trusted
    with pytest.raises(tls.TlsError, match="the CA CN=sglang-deploy test CA expired on"):
        _judge(ca, leaf, now=ca_end + SECOND)


def test_a_name_problem_is_not_followed_by_a_chain_problem_it_caused() -> None:
    """The chain is checked (for the names clients use) only once everything before it holds: one problem, one fix."""
    ca, other = TestCA(), TestCA("another CA")
    with pytest.raises(tls.TlsError) as err:
        _judge(ca, ca.issue(["gpu-01.lab"]), anchor=other.pem)
    assert str(err.value).count("Fix:") == 1 and "does not vouch" not in str(err.value), str(err.value)


def test_a_certificate_without_a_subject_alt_name_names_nothing() -> None:
    """Clients ignore the subject's CN: a certificate without a subjectAltName is refused for every name."""
    ca = TestCA()
    with pytest.raises(tls.TlsError, match=r"does not name 127\.0\.0\.1, gpu-01\.lab \(its names: none\)"):
        _judge(ca, ca.issue(["gpu-01.lab"], san=False))


def test_a_certificate_that_does_not_say_it_is_a_ca_is_not_taken_for_one() -> None:
    ca = TestCA()
    plain = ca.issue(NAMES, basic_constraints=False)
    assert not tls._is_ca(_cert(plain.cert)) and tls._is_ca(ca.cert)
    bundle = type(plain)(plain.cert + ca.pem, plain.key)
    assert _judge(ca, bundle)["subject"] == "CN=127.0.0.1"  # the CA-first rule does not fire: served


def test_a_file_of_exactly_the_limit_is_read(tmp_path: Path) -> None:
    edge = tmp_path / "edge.pem"
    edge.write_bytes(b"x" * tls.MAX_FILE_BYTES)
    assert len(tls.read_file(str(edge)).content) == tls.MAX_FILE_BYTES


def test_judge_resolved_checks_the_names_it_is_given(tmp_path: Path) -> None:
    ca = TestCA()
    issued = ca.issue(NAMES)
    paths = write(tmp_path, ca, issued)
    resolved = {"source": {kind: str(path) for kind, path in paths.items()}, "names": ["other.lab"]}
    with pytest.raises(tls.TlsError, match=r"does not name other\.lab"):
        tls.judge_resolved(resolved, tls.read_file, NOW)


def test_the_module_imports_without_cryptography() -> None:
    """The device's bundle and a bare control node import the CLI without cryptography: it is loaded when a
    certificate is judged, never at import."""
    code = "import sys; sys.modules['cryptography'] = None; import sglang_deploy.serving.tls as t; print(t.MAX_FILE_BYTES)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.strip() == str(tls.MAX_FILE_BYTES), done.stderr
