"""TLS on the endpoint: the inventory's certificate, key and CA, judged on the control node before any host changes.

``sglang_server_tls_certfile`` / ``_keyfile`` / ``_cafile`` are control-node files (plain or ansible-vault);
the role copies them to the host (tasks/tls.yml) and the unit gives sglang ``--ssl-certfile``,
``--ssl-keyfile`` and ``--ssl-ca-certs`` (the CA too: sglang's own warmup request then verifies the
certificate instead of switching the check off, server_args.ssl_verify). Every client the project runs
verifies the chain and the name against that CA.

:func:`judge` refuses what would fail at 2 a.m. instead of at deploy time, each problem naming the
variable and the file: a certificate that has expired or is not valid yet, one that does not name every
name its clients use (the host's own checks reach it on the bound or loopback address, the routers and
Prometheus on the worker URL's host), a key that is not the certificate's, an encrypted key (sglang would
need its password on a command line), a plain key file others can read, a CA that does not vouch for the
certificate. The chain is verified the way the strictest client does it (cryptography's verifier follows
the web PKI rules of rustls-webpki, which the router, smg, uses), so what passes here passes there.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.x509 import verification

# The variables, by the role of their file (also the keys of the resolved ``tls`` and of its ``source``).
VARIABLES = {
    "certfile": "sglang_server_tls_certfile",
    "keyfile": "sglang_server_tls_keyfile",
    "cafile": "sglang_server_tls_cafile",
}
# The largest file read: a certificate chain or a CA bundle is kilobytes, a distribution's whole bundle ~200 KiB.
MAX_FILE_BYTES = 4 * 1024 * 1024
# A certificate that ends within this many days is served, with a warning to renew it.
RENEW_WARNING_DAYS = 21
# What an ansible-vault file starts with: its mode protects ciphertext only, so it is not judged.
VAULT_HEADER = b"$ANSIBLE_VAULT;"


def _crypto() -> tuple[ModuleType, ModuleType, ModuleType]:
    """cryptography's x509, serialization and verification, imported when a certificate is judged: the CLI
    imports this module for its names alone (server.py), and a machine without cryptography (the device's
    image) still runs every command that judges no certificate."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.x509 import verification

    return x509, serialization, verification


class TlsError(ValueError):
    """TLS files that cannot be served; the message lists every problem, each naming its variable and file."""


@dataclass(frozen=True)
class TlsFile:
    """One control-node file as read (vault-decrypted): its path as the inventory gives it, its content,
    its mode, and whether it is an ansible-vault file on disk."""

    path: str
    content: bytes
    mode: int
    vaulted: bool


def names_of(certificate: x509.Certificate) -> list[str]:
    """The names a certificate vouches for: its subjectAltName's DNS names and IP addresses (clients ignore
    the subject's CN when a SAN is present, and the web PKI rules require one)."""
    x509, _, _ = _crypto()
    try:
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [*san.get_values_for_type(x509.DNSName), *(str(ip) for ip in san.get_values_for_type(x509.IPAddress))]


def client_name(name: str) -> str:
    """A URL's host as a certificate names it: no IPv6 brackets, host names in lower case."""
    name = name.strip().strip("[]")
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return name.lower().rstrip(".")


def _subject(name: str) -> verification.DNSName | verification.IPAddress:
    _, _, verification = _crypto()
    try:
        return verification.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return verification.DNSName(name)


def _certificates(file: TlsFile, variable: str, problems: list[str]) -> list[x509.Certificate]:
    x509, _, _ = _crypto()
    try:
        found = x509.load_pem_x509_certificates(file.content)
    except ValueError:
        found = []
    if not found:
        problems.append(f"{variable}={file.path}: no PEM certificate in it")
    return found


def _fingerprint(certificate: x509.Certificate) -> str:
    _, serialization, _ = _crypto()
    return hashlib.sha256(certificate.public_bytes(serialization.Encoding.DER)).hexdigest()


def judge(
    cert: TlsFile, key: TlsFile, ca: TlsFile, *, names: Sequence[str], now: datetime.datetime
) -> dict[str, object]:
    """What the certificate is (subject, names, not_after, sha256, warnings), or TlsError with every problem.
    ``names`` are the host names and addresses clients use; ``now`` is timezone-aware."""
    problems: list[str] = []
    chain = _certificates(cert, VARIABLES["certfile"], problems)
    anchors = _certificates(ca, VARIABLES["cafile"], problems)
    leaf = chain[0] if chain else None
    if len(chain) > 1 and _is_ca(chain[0]):
        # A bundle written CA-first: the server would present the CA as its own certificate. (One CA certificate
        # alone is a self-signed server certificate: the chain's check below says what to do instead.)
        problems.append(
            f"{VARIABLES['certfile']}={cert.path}: its first certificate ({chain[0].subject.rfc4514_string()}) is a CA's, "
            "not the server's. Fix: put the server's certificate first, then any intermediate"
        )
        raise TlsError("; ".join(problems))
    _judge_key(key, leaf, cert.path, problems)
    warnings: list[str] = []
    if leaf is not None:
        where = f"{VARIABLES['certfile']}={cert.path}"
        start, end = leaf.not_valid_before_utc, leaf.not_valid_after_utc
        if now > end:
            problems.append(f"{where}: the certificate expired on {end:%Y-%m-%d %H:%M} UTC. Fix: renew it")
        elif now < start:
            problems.append(f"{where}: the certificate is not valid before {start:%Y-%m-%d %H:%M} UTC (check both clocks)")
        elif end - now < datetime.timedelta(days=RENEW_WARNING_DAYS):
            warnings.append(f"{where}: the certificate expires on {end:%Y-%m-%d} UTC; renew it before then")
        vouched = names_of(leaf)
        wanted = [client_name(name) for name in dict.fromkeys(names)]
        missing = [name for name in wanted if not _covered(vouched, name)]
        if missing:
            problems.append(
                f"{where}: the certificate does not name {', '.join(missing)} (its names: {', '.join(vouched) or 'none'}); "
                f"its clients reach the server as {', '.join(wanted)}. Fix: issue it with every one of them in its "
                "subjectAltName (docs/security.md, TLS), or point sglang_server_advertise_url at a name it has"
            )
        if anchors and not problems:
            _judge_chain(leaf, chain[1:], anchors, wanted, now, cert.path, ca.path, problems)
    for anchor in anchors:
        ends = anchor.not_valid_after_utc
        what = f"{VARIABLES['cafile']}={ca.path}: the CA {anchor.subject.rfc4514_string()}"
        if now > ends:
            problems.append(f"{what} expired on {ends:%Y-%m-%d %H:%M} UTC: no client trusts what it signed. Fix: renew it")
        elif ends - now < datetime.timedelta(days=RENEW_WARNING_DAYS):
            warnings.append(f"{what} expires on {ends:%Y-%m-%d} UTC: every certificate it signed stops being trusted then")
    if problems:
        raise TlsError("; ".join(problems))
    assert leaf is not None
    return {
        "subject": leaf.subject.rfc4514_string(),
        "names": names_of(leaf),
        "not_after": f"{leaf.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}",
        "sha256": _fingerprint(leaf),
        "warnings": warnings,
    }


def _is_ca(certificate: x509.Certificate) -> bool:
    crypto_x509, _, _ = _crypto()
    try:
        return bool(certificate.extensions.get_extension_for_class(crypto_x509.BasicConstraints).value.ca)
    except crypto_x509.ExtensionNotFound:
        return False


def _covered(listed: Sequence[str], name: str) -> bool:
    """Whether ``name`` matches one of a certificate's names (a wildcard as clients match it)."""
    _, _, verification = _crypto()
    listed = [client_name(entry) for entry in listed]  # DNS names compare without case (RFC 4343)
    name = client_name(name)
    if name in listed:
        return True
    subject = _subject(name)
    if isinstance(subject, verification.IPAddress):
        return False  # an address matches only itself
    for pattern in listed:
        # RFC 6125: a wildcard stands for exactly one whole leftmost label.
        if pattern.startswith("*.") and "." in name and name.split(".", 1)[1] == pattern[2:].lower():
            return True
    return False


# What the server (Python's ssl under OpenSSL 3, security level 2) and its clients (OpenSSL, rustls in smg) all
# accept: RSA of 2,048 bits or more, ECDSA on P-256/P-384/P-521, Ed25519. Python's ssl refuses a smaller RSA key
# when it loads it ("ee key too small"); no TLS 1.3 client speaks DSA; rustls has no Ed448 and no other curve.
MIN_RSA_BITS = 2048
EC_CURVES = frozenset({"secp256r1", "secp384r1", "secp521r1"})


def _key_problem(public_key: object) -> str | None:
    """Why a server with this key could not serve its clients, or None."""
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    if isinstance(public_key, rsa.RSAPublicKey):
        if public_key.key_size < MIN_RSA_BITS:
            return (f"an RSA key of {public_key.key_size} bits: Python's ssl (what sglang serves with) refuses to load one "
                    f"under {MIN_RSA_BITS} bits")
        return None
    if isinstance(public_key, ec.EllipticCurvePublicKey):
        if public_key.curve.name not in EC_CURVES:
            return f"an EC key on {public_key.curve.name}, a curve TLS clients (rustls in the router, browsers) do not take"
        return None
    if isinstance(public_key, ed25519.Ed25519PublicKey):
        return None
    return f"a {type(public_key).__name__.removeprefix('_').replace('PublicKey', '')} key, which no TLS 1.3 client takes"


def _judge_key(key: TlsFile, leaf: x509.Certificate | None, cert_path: str, problems: list[str]) -> None:
    _, serialization, _ = _crypto()
    where = f"{VARIABLES['keyfile']}={key.path}"
    if not key.vaulted and stat.S_IMODE(key.mode) & 0o044:
        whom = "every user" if stat.S_IMODE(key.mode) & 0o004 else "the file's group"
        problems.append(
            f"{where}: the private key is readable by {whom} of the control node (mode "
            f"{stat.S_IMODE(key.mode):04o}). Fix: chmod 600 {key.path}, or keep it in ansible-vault"
        )
    try:
        private = serialization.load_pem_private_key(key.content, password=None)
    except TypeError:
        problems.append(
            f"{where}: the private key is encrypted; sglang would need its password on its command line. "
            "Fix: decrypt it (openssl pkey -in KEY -out PLAIN) and keep the plain key in ansible-vault instead"
        )
        return
    except (ValueError, UnicodeError):
        problems.append(f"{where}: no PEM private key in it")
        return
    unusable = _key_problem(private.public_key())
    if unusable:
        problems.append(
            f"{where}: {unusable}. Fix: issue the certificate for an RSA key of at least {MIN_RSA_BITS} bits or an "
            "ECDSA P-256 key (openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256)"
        )
        return
    if leaf is None:
        return
    mine = private.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    theirs = leaf.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if mine != theirs:
        problems.append(
            f"{where}: this key is not the certificate's ({VARIABLES['certfile']}={cert_path}): TLS handshakes "
            "would fail. Fix: give the key the certificate was issued for"
        )


def _judge_chain(
    leaf: x509.Certificate,
    intermediates: list[x509.Certificate],
    anchors: list[x509.Certificate],
    names: Sequence[str],
    now: datetime.datetime,
    cert_path: str,
    ca_path: str,
    problems: list[str],
) -> None:
    _, _, verification = _crypto()
    store = verification.Store(anchors)
    for name in names:
        verifier = verification.PolicyBuilder().store(store).time(now).build_server_verifier(_subject(name))
        try:
            verifier.verify(leaf, intermediates)
        except verification.VerificationError as err:
            problems.append(
                f"{VARIABLES['cafile']}={ca_path} does not vouch for {VARIABLES['certfile']}={cert_path} as {name} "
                f"({err}). Fix: give the CA that issued it (and put any intermediate after the certificate in "
                "its file); a self-signed server certificate is not a CA: make a small CA of your own "
                "(docs/security.md, TLS)"
            )
            return


def read_file(path: str, real_path: str | None = None) -> TlsFile:
    """``path`` as :func:`judge` takes it: ``real_path`` is where its plain content is (Ansible's
    decrypted copy of a vault file), else ``path`` itself. Bounded; OSError/ValueError naming the file."""
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"{path} is not a regular file")
    with open(path, "rb") as raw:
        vaulted = raw.read(len(VAULT_HEADER)) == VAULT_HEADER
    with open(real_path or path, "rb") as handle:
        content = handle.read(MAX_FILE_BYTES + 1)
    if len(content) > MAX_FILE_BYTES:
        raise ValueError(f"{path} is larger than {MAX_FILE_BYTES} bytes: not a PEM certificate or key")
    return TlsFile(path, content, info.st_mode, vaulted)


def judge_resolved(
    resolved_tls: Mapping[str, object], read: Callable[[str], TlsFile], now: datetime.datetime
) -> dict[str, object]:
    """One host's resolved ``tls`` (serving/server.py: ``source`` paths, ``names``) judged; ``read`` gives a
    control-node file as :func:`judge` takes it (the action plugin decrypts vault files). TlsError, each
    problem naming variable and file; a CA in ansible-vault is refused (clients on the control node,
    ``verify`` and Prometheus, read it as it is, and it is no secret)."""
    source = {kind: str(path) for kind, path in dict(resolved_tls.get("source") or {}).items()}  # type: ignore[call-overload]
    files: dict[str, TlsFile] = {}
    problems: list[str] = []
    for kind, variable in VARIABLES.items():
        try:
            files[kind] = read(source[kind])
        except (OSError, ValueError) as err:
            problems.append(f"{variable}={source.get(kind, '')}: cannot read it ({getattr(err, 'strerror', None) or err})")
    if "cafile" in files and files["cafile"].vaulted:
        problems.append(
            f"{VARIABLES['cafile']}={source['cafile']}: a CA certificate is public, and the control node's clients "
            "(verify, Prometheus) read it as it is. Fix: keep it unencrypted (only the key belongs in vault)"
        )
    if problems:
        raise TlsError("; ".join(problems))
    names = [str(name) for name in resolved_tls.get("names") or []]  # type: ignore[attr-defined]
    return judge(files["certfile"], files["keyfile"], files["cafile"], names=names, now=now)
