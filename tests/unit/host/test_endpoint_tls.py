"""The endpoint client over TLS (module_utils/sglang_deploy_host/serving/endpoint.py): against a real TLS server on
127.0.0.1 with a certificate from a CA made here (tests/tls_certs.py), the chain and the name are always
verified; the readiness gate, bench and the watchdog hand the CA on; plain flags stay plain HTTP."""

from __future__ import annotations

import contextlib
import http.server
import ssl
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_deploy_host.serving import bench_steps, endpoint, unit_flags
from sglang_deploy_host.watch import model as watch_model
from sglang_deploy_host.watch import observe as watch_observe

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tls_certs import TestCA, write  # noqa: E402


class _Health(http.server.BaseHTTPRequestHandler):
    """/metrics: one sglang gauge (what the watchdog reads); anything else: 200 "ok"."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = b"sglang:num_running_reqs 3\n" if self.path == "/metrics" else b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def _serve(tmp_path: Path, names: list[str]) -> Iterator[tuple[str, Path]]:
    """``https://127.0.0.1:PORT`` serving a certificate for ``names`` from a CA made here, and that CA's file."""
    ca = TestCA()
    paths = write(tmp_path, ca, ca.issue(names))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(paths["certfile"], paths["keyfile"])
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", paths["cafile"]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture()
def https_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    with _serve(tmp_path, ["127.0.0.1", "localhost"]) as served:
        yield served


def test_the_ca_given_verifies_the_server(https_server: tuple[str, Path]) -> None:
    url, cafile = https_server
    assert endpoint.Endpoint(url, cafile=str(cafile)).get("/health").status == 200


def test_another_ca_or_the_system_store_is_refused_naming_the_fix(https_server: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = https_server
    with pytest.raises(endpoint.EndpointError, match="certificate is not trusted.*the system CA store.*sglang_server_tls_cafile"):
        endpoint.Endpoint(url).get("/health")
    other = tmp_path / "other-ca.crt"
    other.write_bytes(TestCA("another CA").pem)
    with pytest.raises(endpoint.EndpointError, match=f"not trusted.*CA file {other}"):
        endpoint.Endpoint(url, cafile=str(other)).get("/health")


def test_a_name_the_certificate_lacks_is_refused(tmp_path: Path) -> None:
    with _serve(tmp_path, ["localhost"]) as (url, cafile):
        with pytest.raises(endpoint.EndpointError, match="not trusted .*(mismatch|not valid for '127.0.0.1')"):
            endpoint.Endpoint(url, cafile=str(cafile)).get("/health")
        assert endpoint.Endpoint(url.replace("127.0.0.1", "localhost"), cafile=str(cafile)).get("/health").status == 200


def test_an_unreadable_or_empty_ca_file_is_a_clear_error_before_any_request(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="CA file .*missing.crt: cannot read it"):
        endpoint.Endpoint("https://127.0.0.1:1", cafile=str(tmp_path / "missing.crt"))
    empty = tmp_path / "empty.crt"
    empty.write_text("no certificate here\n")
    with pytest.raises(ValueError, match="no PEM certificate in it"):
        endpoint.Endpoint("https://127.0.0.1:1", cafile=str(empty))
    # A plain-HTTP endpoint reads no CA file at all.
    assert endpoint.Endpoint("http://127.0.0.1:1", cafile=str(tmp_path / "missing.crt")).cafile


def test_the_context_always_verifies_chain_and_name(tmp_path: Path) -> None:
    for context in (endpoint.tls_context(), endpoint.tls_context(str(write(tmp_path, TestCA(), TestCA().issue(["x"]))["cafile"]))):
        assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname


def test_the_readiness_gate_verifies_with_the_ca(https_server: tuple[str, Path]) -> None:
    url, cafile = https_server
    result, verdict = endpoint.readiness_gate(url, 10, path="/health", cafile=str(cafile), initial_delay=0.1, max_delay=0.1)
    assert result.ready, verdict
    result, verdict = endpoint.readiness_gate(url, 1, path="/health", initial_delay=0.2, max_delay=0.2)
    assert not result.ready and "not trusted" in verdict


def test_flags_with_ssl_certfile_mean_https_and_the_hosts_ca() -> None:
    flags = {"host": "0.0.0.0", "port": "8000", "ssl-certfile": "/etc/ssl/sglang/server.crt", "ssl-ca-certs": "/etc/ssl/sglang/ca.crt"}
    assert unit_flags.base_url(flags) == "https://127.0.0.1:8000"
    assert unit_flags.host_cafile(flags) == "/etc/ssl/sglang/ca.crt"
    assert unit_flags.base_url({"port": "8000"}) == "http://127.0.0.1:8000" and unit_flags.host_cafile({"ssl-ca-certs": "/x"}) == ""
    settings = bench_steps.settings_from_flags({**flags, "model-path": "/models/glm-5"}, backend="sglang", input_len=1,
                                         output_len=1, seed=1, timeout_s=10)  # fmt: skip
    assert (settings.base_url, settings.cafile) == ("https://127.0.0.1:8000", "/etc/ssl/sglang/ca.crt")


def test_bench_serving_trusts_the_servers_ca_through_its_environment() -> None:
    env = bench_steps.child_env({"PATH": "/usr/bin"}, "", "/etc/ssl/sglang/ca.crt")
    assert env["SSL_CERT_FILE"] == env["REQUESTS_CA_BUNDLE"] == "/etc/ssl/sglang/ca.crt"
    assert "SSL_CERT_FILE" not in bench_steps.child_env({"PATH": "/usr/bin"}, "")


def test_the_watchdog_reads_metrics_only_from_a_verified_server(https_server: tuple[str, Path], tmp_path: Path) -> None:
    """The watchdog's /metrics read (its own Endpoint) with the unit's --cafile: the gauge; without it the
    server is not trusted, so nothing is read (an empty Progress, as for a server without metrics)."""
    url, cafile = https_server

    def config(ca: str) -> watch_model.Config:
        return watch_model.Config(
            unit="sglang.service", url=url, env_file=None, api_key_env=None, expected_gpus=0,
            state_file=str(tmp_path / "state.json"), failures=1, backoff_initial_s=1, backoff_max_s=1, timeout_s=5,
            start_grace_s=0, stable_s=60, max_restarts_per_hour=1, service_user="root", cafile=ca,
        )  # fmt: skip

    assert watch_observe.progress(config(str(cafile))).running == 3
    assert watch_observe.progress(config("")) == watch_model.Progress()
