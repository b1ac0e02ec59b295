"""The serving endpoint: health, model list, a chat answer, and the correctness gate.

Target: ``--sglang-endpoint``/``--sglang-model`` (``sglang-deploy verify --endpoint``), else the
host's render of the inventory (its --host/--port/--served-model-name/--api-key). The correctness
gate (sglang_deploy_host/serving/gate.py) runs the probes (``--sglang-probes FILE`` or
sglang_deploy_host/serving/probes/default.yml, a long-context probe among them) at temperature 0 and judges each
whole answer: a natural stop, a match, a length that fits the probe, no loop. This is what catches garbled
or degenerate output from a bad KV dtype or attention backend. Every chat's prompt and max_tokens fit the
context the server reports in /v1/models (``max_model_len``).

Every test's first request is preceded, once per server and session, by GET /health with a short
deadline: a server that accepts connections and never answers fails them all at once with that
reason, instead of each test waiting out its own deadline (up to minutes for a chat).
"""

from __future__ import annotations

import dataclasses
import os
import ssl
import urllib.parse
from pathlib import Path

import pytest

from sglang_deploy_host.serving import endpoint as ep
from sglang_deploy_host.serving import gate, sglang_launcher, systemd, unit_flags

# /health answers at once from a serving sglang (it generates nothing).
ANSWERS_DEADLINE_S = 10.0


def _connect_host(request: pytest.FixtureRequest, host, bind_host: str | None) -> str | None:  # type: ignore[no-untyped-def]
    """Where the control node reaches a host's server: the bind address, unless it is a wildcard;
    then the host's ansible_host over SSH (a local or container connection shares loopback)."""
    given = request.config.getoption("--sglang-connect-host")
    if given:
        return str(given)
    if bind_host is None or bind_host.strip() not in unit_flags.WILDCARD_HOSTS:
        return None
    variables = host.ansible.get_variables()
    if variables.get("ansible_connection", "ssh") in ("ssh", "paramiko", "smart") and variables.get("ansible_host"):
        return str(variables["ansible_host"])
    return None


@pytest.fixture()
def target(request: pytest.FixtureRequest, host) -> unit_flags.Target:  # type: ignore[no-untyped-def]
    # ``host`` is taken statically: testinfra parametrizes only tests that name it (with
    # --sglang-endpoint and no --hosts it is the harmless local host).
    url = request.config.getoption("--sglang-endpoint")
    if url:
        model = request.config.getoption("--sglang-model")
        if not model:
            pytest.fail("--sglang-endpoint needs --sglang-model (the served model name)")
        key = os.environ.get(request.config.getoption("--sglang-api-key-env"), "")
        return unit_flags.Target(str(url), str(model), key, cafile=str(request.config.getoption("--sglang-cafile")))
    rendered: Path = request.getfixturevalue("rendered_dir")
    unit_name: str = request.getfixturevalue("unit_name")
    unit_text = (rendered / f"{unit_name}.service").read_text()
    flag_words, _ = sglang_launcher.split_command_line(systemd.exec_start_argv(unit_text))
    bind_host = unit_flags.flags_from_argv(flag_words).get("host")
    target = unit_flags.target_from_render(
        unit_text,
        (rendered / f"{unit_name}.env").read_text(),
        connect_host=_connect_host(request, host, bind_host if isinstance(bind_host, str) else None),
    )
    # The render names the CA's path on the host; this machine verifies with its own copy.
    return dataclasses.replace(target, cafile=str(request.config.getoption("--sglang-cafile")))


@pytest.fixture(scope="session")
def unanswered() -> dict[str, str]:
    """Base URL -> why it did not answer GET /health ("" when it did): checked once per session."""
    return {}


@pytest.fixture()
def server(target: unit_flags.Target, unanswered: dict[str, str]) -> ep.Endpoint:
    endpoint = ep.Endpoint(target.url, api_key=target.api_key, timeout=ep.GENERATE_DEADLINE_S, cafile=target.cafile)
    if target.url not in unanswered:
        try:
            endpoint.get("/health", timeout=ANSWERS_DEADLINE_S)
            unanswered[target.url] = ""
        except ep.EndpointError as err:
            unanswered[target.url] = str(err)
    why = unanswered[target.url]
    if why:
        pytest.fail(f"the server did not answer GET /health, so no test can pass: {why}", pytrace=False)
    return endpoint


@pytest.mark.parametrize("path", ["/health", "/health_generate"])
def test_health_routes_answer_200(server: ep.Endpoint, path: str) -> None:
    answer = server.get(path)
    assert answer.status == 200, f"GET {server.url}{path}: HTTP {answer.status} {answer.text[:200]!r}"


def test_models_lists_the_served_model_name(server: ep.Endpoint, target: unit_flags.Target) -> None:
    assert target.model in ep.model_ids(server)


def test_api_key_is_enforced_as_configured(server: ep.Endpoint, target: unit_flags.Target) -> None:
    anonymous = ep.Endpoint(server.url, cafile=server.cafile)
    if target.api_key:
        assert anonymous.get("/v1/models").status == 401, "the API key is set but not enforced"
        assert ep.Endpoint(server.url, api_key=target.api_key + "-wrong", cafile=server.cafile).get("/v1/models").status == 401
    else:
        assert anonymous.get("/v1/models").status == 200, "no API key configured, yet the server refuses"


def test_metrics_are_served_as_configured(server: ep.Endpoint, target: unit_flags.Target) -> None:
    # sglang serves /metrics (Prometheus text) with --enable-metrics, outside its API key check like
    # /health; without the flag the route does not exist. A bare --sglang-endpoint: either, well formed.
    answer = ep.Endpoint(server.url, cafile=server.cafile).get("/metrics")
    if target.metrics is False:
        assert answer.status == 404, f"--enable-metrics is not set, yet GET /metrics answers HTTP {answer.status}"
        return
    if target.metrics is None and answer.status == 404:
        return
    assert answer.status == 200, f"GET {server.url}/metrics: HTTP {answer.status} {answer.text[:200]!r}"
    names = unit_flags.metric_names(answer.text)
    assert "sglang:num_running_reqs" in names, f"no sglang:num_running_reqs in /metrics: {sorted(names)[:20]}"


def test_tls_is_served_as_configured(server: ep.Endpoint) -> None:
    """An https server: its certificate verifies against the CA given, under the name in the URL (the server
    fixture's first request did, with the check on), and plain HTTP to its port gets no answer (the key never
    crosses in clear). A CA given for a plain-HTTP server is a TLS the inventory asks for and nobody serves."""
    parts = urllib.parse.urlsplit(server.url)
    if parts.scheme != "https":
        assert not server.cafile, f"a CA file is given, yet {server.url} is plain HTTP: the inventory's TLS is not served"
        return
    with pytest.raises(ep.EndpointError, match="no answer|no complete answer"):
        ep.Endpoint(parts._replace(scheme="http").geturl()).get("/health")
    context = ep.tls_context(server.cafile)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname


def test_chat_completion_returns_content(server: ep.Endpoint, target: unit_flags.Target) -> None:
    # max_tokens fitted to the context /v1/models reports (a 2,048-token model refuses 2,048 new tokens).
    context_len = ep.context_length(server, target.model)
    message = ep.complete_in_context(server, target.model, ep.CHAT_SMOKE_PROMPT, ep.CHAT_SMOKE_MAX_TOKENS, context_len).message
    assert gate.answer_text(message), f"empty answer: {message!r}"


def _probes(config: pytest.Config) -> list[gate.Probe]:
    path = config.getoption("--sglang-probes")
    return gate.load_probes(path)


def test_correctness_gate(request: pytest.FixtureRequest, server: ep.Endpoint, target: unit_flags.Target) -> None:
    """Every probe's whole answer passes (gate.judge); the report names each failed probe, why, and its answer."""
    results = gate.run_probes(server, target.model, _probes(request.config))
    failed = [r for r in results if not r.ok]
    assert not failed, "correctness gate failed:\n" + gate.report(results)
