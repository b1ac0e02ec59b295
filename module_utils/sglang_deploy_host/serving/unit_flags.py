"""A server's launch flags as the control node and a host both read them: STDLIB ONLY, Python >= 3.9.

Where a server listens and how a client reaches it (sglang's ``--host``/``--port`` defaults, loopback and
wildcard addresses, the URL), which flag names hold secrets (seen through ``=``, dashes, underscores and
abbreviations), the exposure rule (a non-loopback bind needs an API key), the API key's characters, and what a
rendered unit says (its flags, URL, TLS and served model). The HTTP client that talks to the server is
endpoint.py, on top of this.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from .sglang_launcher import split_command_line
from .systemd import env_file_values, exec_start_argv


# sglang's ServerArgs defaults (server_args.py): where a server without --host/--port listens.
DEFAULT_BIND_HOST = "127.0.0.1"
DEFAULT_PORT = 30000
# Bind addresses that mean "every interface": a client on the host itself uses loopback.
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})
# The variable of the unit's environment file that holds the server's API key (--api-key {env: ...}).
API_KEY_ENV = "SGLANG_API_KEY"


# -- addresses and URLs ------------------------------------------------------------------------
def is_loopback(host: str) -> bool:
    """Whether a bind address is reachable only from the machine itself (``[::1]`` included)."""
    name = host.strip().strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False  # a host name or an interface address: reachable from the network


def url_host(address: str) -> str:
    """``address`` as the host part of a URL: an IPv6 address in brackets."""
    address = address.strip()
    if ":" in address and not address.startswith("["):
        return f"[{address}]"
    return address


def port_number(value: Any, what: str) -> int:
    """A TCP port (1-65535) from a flag or variable value; ValueError naming ``what``."""
    text = str(value)
    if isinstance(value, bool) or not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ValueError(f"{what} = {value!r} is not a port (1-65535)")
    return int(text)


def http_url(address: str, port: Any, scheme: str = "http") -> str:
    """``http://address:port`` (or ``scheme``, https), the address bracketed when it is IPv6."""
    if scheme not in ("http", "https"):
        raise ValueError(f"scheme {scheme!r} is not http or https")
    return f"{scheme}://{url_host(address)}:{port_number(port, 'port')}"


def check_url(url: str) -> str:
    """``url`` if it is an http:// or https:// base URL (host, optional port and path prefix), else
    ValueError naming it and the fix: nothing else (file:, ftp:, data:, a bare host) is opened."""
    try:
        parts = urllib.parse.urlsplit(url)
        ok = (
            isinstance(url, str)
            and not any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in url)  # "x\n" included
            and parts.scheme.lower() in ("http", "https")
            and bool(parts.hostname)
            and parts.port != 0
            and parts.username is None
            and not parts.query
            and not parts.fragment
        )
    except ValueError:  # a port that is not a number (urlsplit checks it lazily, in .port)
        ok = False
    if not ok:
        raise ValueError(
            f"{shown_url(url)!r} is not an http:// or https:// base URL without credentials, spaces or control characters: "
            "give the server's scheme, host and port, e.g. http://10.0.0.5:8000"
        )
    return url


def shown_url(url: object) -> str:
    """A URL as a message may show it: everything between ``://`` and the last ``@`` is credentials (a password may
    hold ``/`` or ``@`` itself), and goes; what is left is cut at 200 characters."""
    return re.sub(r"(?<=://).*@", "<credentials>@", str(url), flags=re.S)[:200]


def normalized_url(url: str) -> str:
    """One spelling of a base URL (check_url's): scheme and host in lower case, the port written as a number (the
    scheme's default when none is), no trailing ``/``. ``HTTP://Host:08000/`` and ``http://host:8000`` are one
    worker, as are ``https://h`` and ``https://h:443``."""
    parts = urllib.parse.urlsplit(check_url(url))
    scheme = parts.scheme.lower()
    port = parts.port if parts.port is not None else {"http": 80, "https": 443}[scheme]
    return urllib.parse.urlunsplit((scheme, f"{url_host(str(parts.hostname).lower())}:{port}", parts.path.rstrip("/"), "", ""))


# -- flag names and secrets --------------------------------------------------------------------
# Flags of sglang and the router (smg) whose value is a secret (or a URL or path that usually carries or
# names one): never a plain value in an argv or a unit file, only handed over in-process from the
# unit's 0600 env file (sglang_launcher.py --env-flag).
SECRET_FLAGS = frozenset({
    "api-key", "admin-api-key", "ssl-keyfile-password",  # sglang (server_args.py)
    "control-plane-api-keys", "oracle-password", "postgres-db-url", "redis-url", "client-key-path",  # smg
    "tenant-api-key", "mesh-tls-key",  # smg 1.13
})  # fmt: skip


# A flag's name as sglang's and smg's parsers take it after its "--": lower-case letters, digits and dashes.
FLAG_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")


# Real flags whose names begin a secret flag's name: argparse takes an exact name before an abbreviation.
NAMES_BEFORE_SECRETS = frozenset({"ssl-keyfile"})


def shown_flag_name(raw: object) -> str:
    """A flag name as a message may show it: up to an ``=`` (what follows could be a secret), printable."""
    text = str(raw)
    head, sep, _value = text.partition("=")
    shown = "".join(ch if ch.isprintable() else "?" for ch in head)[:80]
    return shown + ("=..." if sep else "")


def flag_name_problem(raw: object, variable: str) -> Optional[str]:
    """Why ``raw`` (a key of a flags mapping: ``tp-size``, ``--tp_size``) cannot be a flag's name, or None. A name
    holding ``=`` (``api-key=SECRET``: the value would land in the unit and the argv as it is), one that is not
    letters, digits and dashes, and an abbreviation of a secret flag (argparse takes ``--api-k`` for
    ``--api-key``) are refused; the message never shows what follows an ``=``."""
    shown = shown_flag_name(raw)
    name = str(raw).strip().lstrip("-").replace("_", "-")
    if "=" in name:
        return (
            f"{variable}: the flag name '{shown}' holds '=': a value never goes in the name (it would land in the unit "
            f"file and the process's argv as it is, a secret too). Fix: write it as the key's value: "
            f"{name.partition('=')[0]}: VALUE ({{env: NAME}} for a secret)"
        )
    if not FLAG_NAME.fullmatch(name):
        return f"{variable}: '{shown}' is not a flag name (lower-case letters, digits and dashes, e.g. tp-size)"
    secret = next((flag for flag in sorted(SECRET_FLAGS) if flag != name and flag.startswith(name)), None)
    if secret is not None and name not in NAMES_BEFORE_SECRETS:
        return (
            f"{variable}: '{shown}' abbreviates the secret flag --{secret} (the parser takes an abbreviation for the "
            "whole name): a secret is never a flag value. Fix: remove it; the API key comes from the role's key "
            "variable, other secrets as {env: NAME}"
        )
    return None


def false_value_problem(variable: str, name: str) -> str:
    """Why ``false`` is no flag value: Ansible's YAML 1.1 reads ``no``, ``off`` and ``false`` as false, and a flag
    that silently vanished for it would be a launch the inventory never asked for."""
    return (
        f"{variable}['{name}'] is false, which is neither a value nor a removal (YAML reads no, off and false as "
        "false). Fix: true for a bare switch, null to remove the flag, or quote the word ('no') if it is the value"
    )


def exposure_problem(
    what: str, bind: str, port: Any, *, has_key: bool, allowed: bool, key_var: str, bind_var: str, allow_var: str
) -> Optional[str]:
    """Why a service bound to ``bind`` would serve anyone who reaches it, or None: a non-loopback
    address without an API key is refused unless ``allow_var`` says it is on purpose."""
    if has_key or allowed or is_loopback(bind):
        return None
    return (
        f"{what} binds {bind}:{port} (not loopback) without an API key: anyone who reaches the port can use it. "
        f"Fix: set {key_var} from vault (docs/security.md), or bind {bind_var} to 127.0.0.1, "
        f"or set {allow_var}: true if that is on purpose"
    )


def client_host(bind_host: Optional[str]) -> str:
    """The address a client on the same machine uses for a server bound to ``bind_host``."""
    host = (bind_host if bind_host is not None else DEFAULT_BIND_HOST).strip()
    if host in WILDCARD_HOSTS:
        return "127.0.0.1"
    return url_host(host)


def base_url(flags: Mapping[str, Any], connect_host: Optional[str] = None) -> str:
    """``http(s)://host:port`` of a server launched with ``flags`` (the launch model's flag dict): https when
    it serves TLS (``--ssl-certfile``), as sglang's own ServerArgs.url() decides."""
    port = port_number(flags.get("port", DEFAULT_PORT), "launch flag port")
    host = client_host(connect_host) if connect_host else client_host(_str_or_none(flags.get("host")))
    return f"{'https' if serves_tls(flags) else 'http'}://{host}:{port}"


def serves_tls(flags: Mapping[str, Any]) -> bool:
    """Whether a server launched with ``flags`` speaks TLS (``--ssl-certfile`` names a file)."""
    return isinstance(flags.get("ssl-certfile"), str) and bool(flags["ssl-certfile"])


def host_cafile(flags: Mapping[str, Any]) -> str:
    """The CA file a client on the server's own host verifies it with: its ``--ssl-ca-certs`` ("" = none)."""
    value = flags.get("ssl-ca-certs")
    return value if isinstance(value, str) and serves_tls(flags) else ""


def served_model_name(flags: Mapping[str, Any]) -> str:
    """The name /v1/models lists: --served-model-name, else the model path (as sglang does)."""
    for name in ("served-model-name", "model-path", "model"):
        value = flags.get(name)
        if value not in (None, False, True, ""):
            return str(value)
    raise ValueError("the launch flags name no model (--model-path / --served-model-name)")


def _str_or_none(value: Any) -> Optional[str]:
    return None if value is None else str(value)


# -- what a rendered unit says ----------------------------------------------------------------
def flags_from_argv(argv: Sequence[str]) -> dict[str, Any]:
    """``--name value`` / ``--switch`` words into a flag dict (values of nargs flags joined)."""
    flags: dict[str, Any] = {}
    current: Optional[str] = None
    for word in argv:
        if word.startswith("--"):
            current = word[2:]
            flags[current] = True
        elif current is not None:
            previous = flags[current]
            flags[current] = word if previous is True else f"{previous} {word}"
    return flags


@dataclass(frozen=True)
class Target:
    """What a client needs: base URL, served model name, API key (may be empty)."""

    url: str
    model: str
    api_key: str = field(default="", repr=False)
    # Whether the server runs with --enable-metrics (GET /metrics); None: not known (a bare URL).
    metrics: Optional[bool] = None
    # The CA an https server is verified with ("" = the system store): on its host, its --ssl-ca-certs.
    cafile: str = ""


def target_from_render(unit_text: str, env_text: str, connect_host: Optional[str] = None) -> Target:
    """The endpoint a rendered unit serves: --host/--port/--served-model-name, and the API key the
    launcher hands to sglang (``--env-flag api-key=NAME``: NAME read from the rendered env file)."""
    flag_words, env_flags = split_command_line(exec_start_argv(unit_text))
    flags = flags_from_argv(flag_words)
    key = ""
    if "api-key" in env_flags:
        name = env_flags["api-key"]
        values = env_file_values(env_text)
        if name not in values:
            raise ValueError(f"--env-flag api-key={name}: the environment file does not set {name}")
        key = values[name]
    elif isinstance(flags.get("api-key"), str):
        key = str(flags["api-key"])
    return Target(
        base_url(flags, connect_host), served_model_name(flags), key, metrics=flags.get("enable-metrics") is True,
        cafile=host_cafile(flags),
    )  # fmt: skip


def metric_names(exposition: str) -> set[str]:
    """The metric names in a Prometheus text exposition (``# HELP``/``# TYPE`` lines and samples)."""
    names = set()
    for line in exposition.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            names.add(line.split("{", 1)[0].split(" ", 1)[0])
    return names


# -- the API key --------------------------------------------------------------------------------
# An API key sglang prints as it is in every form (repr, JSON, a URL): the launcher's mask then finds it
# in any log line. Hex, base64 and base64url keys (openssl rand -hex 32 / -base64 32) are all of these.
API_KEY_CHARS = re.compile(r"[A-Za-z0-9._~+/=-]+")


def api_key_problem(key: str, variable: str) -> Optional[str]:
    """Why ``key`` cannot be an API key (None when it can): a character sglang would print escaped
    (quote, backslash, space, tab, control, non-ASCII) would reach its log in a form a plain mask
    misses, and a newline would break the 0600 env file."""
    if not key:
        return None
    if not API_KEY_CHARS.fullmatch(key):
        # Named by kind and position, never by the character itself: no byte of a key is ever printed.
        bad = [(n, _char_kind(ch)) for n, ch in enumerate(key, 1) if not API_KEY_CHARS.fullmatch(ch)]
        kinds = ", ".join(f"{kind} at character {n}" for n, kind in bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        return (
            f"{variable} holds {kinds}: an API key is letters, digits and . _ ~ + / = - only (sglang "
            "prints other characters escaped, where log masking cannot be sure to find them). Fix: a new key, "
            "e.g. openssl rand -hex 32"
        )
    return None


def _char_kind(ch: str) -> str:
    if ch in "\r\n":
        return "a line break"
    if ch in " \t":
        return "a space or tab"
    if not ch.isprintable():
        return "a control character"
    if ord(ch) > 127:
        return "a non-ASCII character"
    if ch in "'\"\\":
        return "a quote or backslash"
    return "a punctuation character"
