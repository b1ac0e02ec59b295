"""TLS in the resolver (serving/server.py ``_tls``): the inventory's three files become sglang's --ssl-* flags with
the host's paths, https URLs for every client, the names the certificate must carry, the watchdog's CA; what
cannot be served is refused naming the variable (the files' content is judged by the validate play: test_tls.py)."""

from __future__ import annotations

from typing import Any

import pytest
from server_inputs import resolve

from sglang_deploy.lanes.catalog import load_lane
from sglang_deploy.serving import server

TLS = {"certfile": "/inv/tls/server.crt", "keyfile": "/inv/tls/server.key", "cafile": "/inv/tls/ca.crt", "dir": "/etc/ssl/sglang"}


def _resolve(**overrides: Any) -> dict[str, Any]:
    return resolve(**{"tls": dict(TLS), **overrides})


def test_tls_adds_the_flags_with_the_hosts_paths_and_https_for_every_client() -> None:
    result = _resolve()
    assert {flag: result["flags"][flag] for flag in ("ssl-certfile", "ssl-keyfile", "ssl-ca-certs")} == {
        "ssl-certfile": "/etc/ssl/sglang/server.crt", "ssl-keyfile": "/etc/ssl/sglang/server.key",
        "ssl-ca-certs": "/etc/ssl/sglang/ca.crt",
    }  # fmt: skip
    # The files' paths are no secret: plain argv words (the key's content never leaves the 0640 file).
    assert "--ssl-keyfile" in result["launch"]["argv"]
    endpoint = result["endpoint"]
    assert (endpoint["local_url"], endpoint["worker_url"], endpoint["cafile"]) == (
        "https://127.0.0.1:8000", "https://10.0.0.21:8000", "/etc/ssl/sglang/ca.crt")  # fmt: skip
    assert result["tls"]["names"] == ["127.0.0.1", "10.0.0.21"]
    assert result["tls"]["source"] == {k: TLS[k] for k in ("certfile", "keyfile", "cafile")}
    watchdog = result["watchdog"]["exec_start"]
    assert "--url https://127.0.0.1:8000" in watchdog and "--cafile /etc/ssl/sglang/ca.crt" in watchdog


def test_without_files_nothing_changes() -> None:
    result = resolve(tls={"certfile": "", "keyfile": "", "cafile": "", "dir": "/etc/ssl/sglang"})
    assert result["tls"] == {} and result["endpoint"]["local_url"].startswith("http://")
    assert not any(flag.startswith("ssl-") for flag in result["flags"]) and "--cafile" not in result["watchdog"]["exec_start"]


def test_the_names_are_the_bind_address_and_the_advertised_host() -> None:
    result = _resolve(flags_override={"host": "10.0.0.21"}, advertise_url="https://gpu-01.lab:8000")
    assert result["tls"]["names"] == ["10.0.0.21", "gpu-01.lab"]
    # Bound to "::", the host's clients use 127.0.0.1 and sglang's own warmup ::1 (ServerArgs.url()): both.
    assert _resolve(flags_override={"host": "::"})["tls"]["names"] == ["127.0.0.1", "::1", "10.0.0.21"]


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ({"tls": {**TLS, "cafile": ""}}, "TLS needs all three files, and sglang_server_tls_cafile is not set"),
        ({"tls": {**TLS, "certfile": "", "keyfile": ""}}, "sglang_server_tls_certfile, sglang_server_tls_keyfile are not set"),
        ({"tls": {**TLS, "keyfile": "tls/server.key"}}, "sglang_server_tls_keyfile=tls/server.key: give the control node's file as an absolute path"),
        ({"tls": {**TLS, "dir": "etc/ssl"}}, "sglang_server_tls_dir"),
        ({"advertise_url": "http://10.0.0.21:8000"}, "sglang_server_advertise_url=http://10.0.0.21:8000 is http://, but the server speaks TLS"),
        ({"flags_override": {"ssl-certfile": "/x.crt"}}, "sets --ssl-certfile: the role serves TLS itself"),
        ({"flags_override": {"ssl_keyfile_password": "x"}}, "sets --ssl-keyfile-password"),
    ],
)
def test_what_cannot_be_served_is_refused_naming_the_variable(overrides: dict[str, Any], expected: str) -> None:
    with pytest.raises(server.ResolveError, match="host glm5-01: .*" + expected.replace("(", r"\(").replace("+", r"\+")):
        _resolve(**overrides)


def test_a_lane_whose_sglang_cannot_serve_tls_is_refused_naming_the_lane(monkeypatch: pytest.MonkeyPatch) -> None:
    lane = load_lane("cu128")
    monkeypatch.setattr(server, "_lane", lambda name: type(lane)(**{**lane.__dict__, "tls_flags": ("ssl-certfile",)}))
    with pytest.raises(server.ResolveError, match=r"sglang_common_lane=cu128: its sglang 0.5.10.post1 has no --ssl-keyfile, --ssl-ca-certs"):
        _resolve()


def test_an_https_proxy_in_front_of_a_plain_server_is_its_own_business() -> None:
    assert resolve(advertise_url="https://proxy.lab:443")["endpoint"]["worker_url"] == "https://proxy.lab:443"
