"""Real X.509 test certificates, made with cryptography (what Ansible's Python has): a CA, a server
certificate it signs for the names given, and the variants the TLS checks must refuse. Used by the unit
tests of serving/tls.py, the endpoint client and `sglang-deploy validate` (files written 0600/0644)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

NOW = datetime.datetime.now(datetime.timezone.utc)


@dataclass(frozen=True)
class Issued:
    cert: bytes
    key: bytes


def _name(text: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


def _san(names: Sequence[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for name in names:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(entries)


def _pem_key(key: Any, password: bytes | None = None) -> bytes:
    encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)


class TestCA:
    """A CA (P-256) that issues server certificates."""

    __test__ = False  # not a pytest class

    def __init__(self, name: str = "sglang-deploy test CA", *, not_after: datetime.datetime | None = None,
                 issuer: "TestCA | None" = None, path_length: int = 0) -> None:  # fmt: skip
        """A root CA, or with ``issuer`` an intermediate it signs; ``path_length``: how many intermediates may
        follow (a root that issues an intermediate needs 1)."""
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = _name(name)
        signer = issuer if issuer is not None else self
        builder = (
            x509.CertificateBuilder()
            .subject_name(self.name).issuer_name(signer.name).public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(NOW - datetime.timedelta(days=1)).not_valid_after(not_after or NOW + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=path_length), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False)
        )  # fmt: skip
        if issuer is not None:
            builder = builder.add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer.key.public_key()), critical=False)
        self.cert = builder.sign(signer.key, hashes.SHA256())

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(
        self,
        names: Sequence[str],
        *,
        not_before: datetime.datetime | None = None,
        not_after: datetime.datetime | None = None,
        password: bytes | None = None,
        key: Any = None,
        san: bool = True,
        basic_constraints: bool = True,
    ) -> Issued:
        """A server certificate for ``names``, on a new P-256 key or on ``key`` (any private key cryptography makes);
        without ``san`` only the subject's CN names it, without ``basic_constraints`` it does not say it is no CA."""
        key = key if key is not None else ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(names[0])).issuer_name(self.name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before or NOW - datetime.timedelta(days=1))
            .not_valid_after(not_after or NOW + datetime.timedelta(days=365))
            .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False)
        )  # fmt: skip
        if san:
            builder = builder.add_extension(_san(names), critical=False)
        if basic_constraints:
            builder = builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        cert = builder.sign(self.key, hashes.SHA256())
        return Issued(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key, password))


def write(directory: Path, ca: TestCA, issued: Issued, stem: str = "server") -> dict[str, Path]:
    """``{certfile, keyfile, cafile}`` written in ``directory`` (the key 0600)."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {"certfile": directory / f"{stem}.crt", "keyfile": directory / f"{stem}.key", "cafile": directory / "ca.crt"}
    paths["certfile"].write_bytes(issued.cert)
    paths["keyfile"].write_bytes(issued.key)
    paths["keyfile"].chmod(0o600)
    paths["cafile"].write_bytes(ca.pem)
    return paths
