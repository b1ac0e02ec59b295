"""sglang_deploy_host.serving.endpoint against the sglang HTTP stand-in over real HTTP on 127.0.0.1.

The stand-in (tests/standin/sglang_server_standin.py) runs as its own process on an ephemeral port,
in the modes the suites must tell apart: ok, garble (NaN-like "!!!!" answers), never-ready (503).
Hostile servers (redirects, endless or trickled answers, silence) are small in-process servers on
127.0.0.1 whose handlers end on their own within seconds.
"""

from __future__ import annotations

import http.client
import json
import os
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT
from conftest import StandinProcess as Standin

from sglang_deploy_host.serving import endpoint as ep
from sglang_deploy_host.serving import gate, unit_flags
from sglang_deploy_host.serving.systemd import env_file_line

KEY = "unit-test-key"


OK_ARGS = ("--model-path", "org/Model-7B", "--served-model-name", "glm-5", "--api-key", KEY,
           "--reasoning-parser", "glm45", "--standin-load-delay", "0", "--tp-size", "8", "--trust-remote-code")  # fmt: skip


# -- pure logic --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("flags", "url"),
    [
        ({}, "http://127.0.0.1:30000"),
        ({"host": "0.0.0.0", "port": "8000"}, "http://127.0.0.1:8000"),
        ({"host": "::", "port": 8000}, "http://127.0.0.1:8000"),
        ({"host": "10.1.2.3", "port": 9000}, "http://10.1.2.3:9000"),
        ({"host": "fd00::5", "port": 9000}, "http://[fd00::5]:9000"),
    ],
)
def test_base_url_follows_the_launch_flags(flags: dict, url: str) -> None:
    assert unit_flags.base_url(flags) == url


def test_base_url_rejects_a_non_numeric_port() -> None:
    with pytest.raises(ValueError, match="launch flag port = 'http' is not a port"):
        unit_flags.base_url({"port": "http"})


@pytest.mark.parametrize(
    "url",
    ["file:///etc/passwd", "ftp://127.0.0.1/", "data:,hello", "gopher://127.0.0.1:70", "", "127.0.0.1:8000",
     "localhost", "http://", "http://127.0.0.1:port", "http://user:pw@127.0.0.1:8000", "http://127.0.0.1/?q=1",
     "http://127.0.0.1:8000\n", "http://127.0.0.1:8000 x", "http://127.0.0.1:8000\t"],
)  # fmt: skip
def test_only_http_and_https_base_urls_are_accepted(url: str) -> None:
    with pytest.raises(ValueError) as err:
        ep.Endpoint(url)
    message = str(err.value)
    shown = url.replace("user:pw@", "<credentials>@")  # the password never reaches a message
    assert repr(shown) in message and "http://" in message and "\n" not in message and "pw@" not in message


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:8000", "HTTPS://sglang.example", "https://sglang.example:8443/prefix/", "http://[fd00::5]:9000"],
)
def test_http_and_https_base_urls_are_accepted(url: str) -> None:
    assert ep.Endpoint(url).url == url


def test_served_model_name_falls_back_to_the_model_path() -> None:
    assert unit_flags.served_model_name({"served-model-name": "glm-5", "model": "a/b"}) == "glm-5"
    assert unit_flags.served_model_name({"model": "lukealonso/GLM-5-NVFP4"}) == "lukealonso/GLM-5-NVFP4"


def test_backoff_doubles_up_to_the_cap() -> None:
    delays = ep.backoff_delays(2, 2, 30)
    assert [next(delays) for _ in range(7)] == [2, 4, 8, 16, 30, 30, 30]
    with pytest.raises(ValueError):
        next(ep.backoff_delays(0, 2, 30))


@pytest.mark.parametrize(
    ("content", "answer"),
    [
        ("<think>hmm</think>\n\nParis", "Paris"),
        ("hmm, the template opened the tag</think>Paris", "Paris"),
        ("<think>still thinking when max_tokens ran out", ""),
        ("Paris", "Paris"),
    ],
)
def test_reasoning_is_stripped_without_a_parser(content: str, answer: str) -> None:
    assert gate.answer_text({"content": content}) == answer


def test_target_from_render_reads_flags_and_the_key_the_launcher_adds() -> None:
    """From the ExecStart= the launch model renders: the key is named (--env-flag api-key=NAME)
    in the unit and read from the rendered environment file."""
    from sglang_deploy.launch.config import LaunchConfig

    launch = LaunchConfig.from_vars(
        {"model": "lukealonso/GLM-5-NVFP4", "served-model-name": "glm-5",
         "api-key": {"env": "SGLANG_API_KEY"}, "host": "0.0.0.0", "port": 8000},
        python="/v/bin/python3", secret_env_names=["SGLANG_API_KEY"],
    )  # fmt: skip
    unit = f"[Service]\nExecStart={launch.exec_start()}\nRestart=on-failure\n"
    target = unit_flags.target_from_render(unit, "# x\nSGLANG_API_KEY='s3cr%t $x'\n")
    assert (target.url, target.model, target.api_key) == ("http://127.0.0.1:8000", "glm-5", "s3cr%t $x")
    assert "s3cr" not in repr(target)
    with pytest.raises(ValueError, match="does not set SGLANG_API_KEY"):
        unit_flags.target_from_render(unit, "OTHER='1'\n")
    open_unit = unit.replace("--env-flag api-key=SGLANG_API_KEY ", "")
    assert unit_flags.target_from_render(open_unit, "").api_key == ""


def test_the_shipped_probes_load(tmp_path: Path) -> None:
    probes = gate.load_probes()
    assert {"capital-of-france", "arithmetic", "python-function"} <= {p.name for p in probes}
    assert all(p.max_tokens >= 1024 for p in probes), "reasoning needs room before the answer"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{}", "want a non-empty list"),
        ("- {prompt: hi}\n", "'expect' must be a non-empty string"),
        ("- {prompt: hi, expect: '(unclosed'}\n", "not a valid regex"),
        ("- {prompt: hi, expect: x, max_tokens: 0}\n", "max_tokens must be a positive integer"),
        ("- {prompt: hi, expect: x, temperature: 1}\n", "unknown keys ['temperature']"),
        ("- {name: a, prompt: hi, expect: x}\n- {name: a, prompt: ho, expect: y}\n", "repeated: ['a']"),
    ],
)
def test_bad_probe_files_are_refused_with_file_and_entry(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "probes.yml"
    path.write_text(text)
    with pytest.raises(gate.ProbeFileError) as err:
        gate.load_probes(path)
    assert str(path) in str(err.value) and message in str(err.value)


# -- against the stand-in ----------------------------------------------------------------------
@pytest.mark.parametrize("standin", [OK_ARGS], indirect=True)
def test_ok_standin_passes_every_check(standin: Standin) -> None:
    server = ep.Endpoint(standin.url, api_key=KEY, timeout=10)
    assert server.get("/health").status == 200
    assert server.get("/health_generate").status == 200
    assert ep.model_ids(server) == ["glm-5"]
    message = ep.chat(server, "glm-5", "Say hello.", max_tokens=64)
    assert message["content"] and message["reasoning_content"], "reasoning parser splits the thinking off"
    results = gate.run_probes(server, "glm-5", gate.load_probes())
    assert [r.ok for r in results] == [True] * len(results), [r.describe() for r in results]


@pytest.mark.parametrize("standin", [(*OK_ARGS, "--standin-mode", "garble")], indirect=True)
def test_garbled_answers_fail_the_correctness_gate(standin: Standin) -> None:
    server = ep.Endpoint(standin.url, api_key=KEY, timeout=10)
    assert server.get("/health_generate").status == 200, "garbage still looks healthy"
    results = gate.run_probes(server, "glm-5", gate.load_probes())
    assert results and not any(r.ok for r in results)
    assert "FAILED capital-of-france" in results[0].describe() and "!!!!" in results[0].describe()


@pytest.mark.parametrize("standin", [OK_ARGS], indirect=True)
def test_wrong_or_missing_api_key_gets_401_but_health_stays_open(standin: Standin) -> None:
    for key in ("", "not-the-key"):
        server = ep.Endpoint(standin.url, api_key=key, timeout=10)
        answer = server.get("/v1/models")
        assert (answer.status, answer.json()) == (401, {"error": "Unauthorized"})
        assert server.get("/health_generate").status == 200
        with pytest.raises(ep.EndpointError) as err:
            ep.chat(server, "glm-5", "hi", max_tokens=8)
        assert err.value.status == 401
        result = gate.run_probe(server, "glm-5", gate.load_probes()[0])
        assert not result.ok and "HTTP 401" in result.reason


@pytest.mark.parametrize("standin", [("--standin-load-delay", "1.5")], indirect=True)
def test_wait_ready_waits_out_the_load(standin: Standin) -> None:
    server = ep.Endpoint(standin.url, timeout=5)
    assert server.get("/health_generate").status == 503, "sglang answers 503 while starting"
    result = ep.wait_ready(server, 20, delays=ep.backoff_delays(0.2, 2, 1))
    assert result.ready and result.attempts >= 2 and result.waited_s >= 1.0


class FakeClock:
    """wait_ready's clock and sleep: time moves only when it sleeps, so what it waits is exact, however
    busy the machine (its requests to the stand-in are real)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(round(seconds, 6))
        self.now += seconds


@pytest.mark.parametrize("standin", [("--standin-mode", "never-ready")], indirect=True)
def test_wait_ready_gives_up_at_the_budget(standin: Standin) -> None:
    server = ep.Endpoint(standin.url, timeout=5)
    fake = FakeClock()
    result = ep.wait_ready(server, 2.0, delays=ep.backoff_delays(0.2, 2, 1), clock=fake.clock, sleep=fake.sleep)
    assert not result.ready and "HTTP 503" in result.last
    # Polls at 0, 0.2, 0.6 and 1.4 s; the next pause (1 s) would end past the budget, so it sleeps out the
    # 0.6 s left and polls once more at 2.0 s: the whole budget, and not a moment more.
    assert fake.slept == [0.2, 0.4, 0.8, 0.6] and result.waited_s == pytest.approx(2.0) and result.attempts == 5


def test_wait_ready_stops_early_when_the_unit_failed() -> None:
    server = ep.Endpoint("http://127.0.0.1:9", timeout=1)  # discard port: nothing listens
    result = ep.wait_ready(server, 60, delays=ep.backoff_delays(0.1, 2, 1), unit_state=lambda: "unit x is failed")
    assert not result.ready and result.attempts == 1 and "unit x is failed" in result.last
    assert "no answer" in result.last


@pytest.mark.parametrize("standin", [("--standin-mode", "never-ready")], indirect=True)
def test_wait_ready_script_exits_1_with_the_reason(standin: Standin) -> None:
    port = standin.url.rsplit(":", 1)[1]
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_deploy_host.serving.endpoint", "wait-ready",
         "--bind-host", "0.0.0.0", "--port", port, "--timeout", "1.5", "--initial-delay", "0.2", "--max-delay", "0.5"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert proc.returncode == 1
    assert f"NOT READY: http://127.0.0.1:{port}/health_generate" in proc.stdout and "HTTP 503" in proc.stdout


# -- hostile servers ---------------------------------------------------------------------------
# A handler ends on its own after HANDLER_LIFE_S at most, or when its test's server stops.
HANDLER_LIFE_S = 10.0
# How long the deadline tests' silent and trickling servers would go on: far past any deadline, so that a
# client that ended early proves its deadline, however loaded the machine (the stop event ends them).
SLOW_SERVER_LIFE_S = 120.0


class Server(socketserver.ThreadingTCPServer):
    """A server on 127.0.0.1 (ephemeral port); ``seen`` holds the headers of the requests it got."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, handler: type[socketserver.BaseRequestHandler], **config: Any) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.config = config
        self.seen: list[dict[str, str]] = []
        self.sent = 0
        self.stopped = threading.Event()
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()

    def stop(self) -> None:
        self.stopped.set()
        self.shutdown()
        self.server_close()


@pytest.fixture()
def serve() -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def start(handler: type[socketserver.BaseRequestHandler], **config: Any) -> Server:
        servers.append(Server(handler, **config))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


class Http(BaseHTTPRequestHandler):
    """Records the request, then ``answer()``."""

    server: Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.server.seen.append(dict(self.headers))
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.answer()

    do_POST = do_GET  # noqa: N815

    def answer(self) -> None:
        body = b'{"object": "list", "data": [{"id": "glm-5"}]}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class Redirect(Http):
    """Answers ``status`` with ``Location: location``."""

    def answer(self) -> None:
        self.send_response(self.server.config["status"])
        self.send_header("Location", self.server.config["location"])
        self.send_header("Content-Length", "0")
        self.end_headers()


class Big(Http):
    """A body of ``size`` bytes framed by Content-Length (length) or the close (close); chunked: endless."""

    protocol_version = "HTTP/1.1"
    ENDLESS = 256 * 1024 * 1024  # what "endless" stops at, should a client read it all

    def answer(self) -> None:
        framing, size = self.server.config["framing"], self.server.config["size"]
        self.send_response(200)
        if framing == "length":
            self.send_header("Content-Length", str(size))
        elif framing == "chunked":
            self.send_header("Transfer-Encoding", "chunked")
            size = self.ENDLESS
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        block = b"x" * 65536
        ends = time.monotonic() + HANDLER_LIFE_S
        try:
            while self.server.sent < size and time.monotonic() < ends and not self.server.stopped.is_set():
                data = block[: size - self.server.sent]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if framing == "chunked" else data)
                self.server.sent += len(data)
        except OSError:
            pass  # the client hung up, as it should


class Silent(socketserver.BaseRequestHandler):
    """Accepts the connection and never sends a byte (for ``life`` s, default HANDLER_LIFE_S)."""

    server: Server

    def handle(self) -> None:
        self.server.stopped.wait(self.server.config.get("life", HANDLER_LIFE_S))


class Trickle(socketserver.BaseRequestHandler):
    """One byte every 0.5 s: of a status line whose headers never end (head), or of a body (body)."""

    server: Server

    def handle(self) -> None:
        self.request.recv(65536)
        if self.server.config["where"] == "body":
            self.request.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
            trickle = b"x" * 1000
        else:
            trickle = b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 1000
        ends = time.monotonic() + self.server.config.get("life", HANDLER_LIFE_S)
        try:
            for byte in trickle:
                if self.server.stopped.wait(0.5) or time.monotonic() > ends:
                    break
                self.request.sendall(bytes([byte]))
        except OSError:
            pass


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_refused_and_the_key_never_leaves_the_origin(serve: Callable[..., Server], status: int) -> None:
    other = serve(Http)  # another port: another origin
    first = serve(Redirect, status=status, location=f"{other.url}/v1/models")
    server = ep.Endpoint(first.url, api_key=KEY, timeout=5)
    for call in (lambda: ep.model_ids(server), lambda: ep.chat(server, "glm-5", "hi", max_tokens=8)):
        with pytest.raises(ep.EndpointError) as err:
            call()
        assert f"HTTP {status} redirect to '{other.url}/v1/models' refused" in str(err.value)
        assert err.value.status == status
    assert [h.get("Authorization") for h in first.seen] == [f"Bearer {KEY}"] * 2, "the origin itself gets the key"
    assert not any("Authorization" in headers for headers in other.seen), "the key went to another origin"


@pytest.mark.parametrize("framing", ["length", "close", "chunked"])
def test_an_oversized_answer_is_refused_without_reading_it_all(serve: Callable[..., Server], framing: str) -> None:
    big = serve(Big, framing=framing, size=ep.MAX_ANSWER_BYTES + 1)
    start = time.monotonic()
    with pytest.raises(ep.EndpointError, match=f"answer larger than {ep.MAX_ANSWER_BYTES} bytes refused"):
        ep.Endpoint(big.url, timeout=10).get("/v1/models")
    assert time.monotonic() - start < 5
    assert big.sent < Big.ENDLESS


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_a_silent_server_fails_at_the_deadline(serve: Callable[..., Server], method: str) -> None:
    silent = serve(Silent, life=SLOW_SERVER_LIFE_S)
    start = time.monotonic()
    with pytest.raises(ep.EndpointError, match=r"no complete answer within 1\.5 s"):
        ep.Endpoint(silent.url, timeout=1.5).request(method, "/v1/chat/completions", {} if method == "POST" else None)
    elapsed = time.monotonic() - start
    # Not before the deadline (load only delays, so this bound cannot flake); and well before the server's own
    # silence (SLOW_SERVER_LIFE_S): the deadline ended it, whatever else the machine was doing.
    assert elapsed >= 1.45 and elapsed < SLOW_SERVER_LIFE_S / 2, f"deadline 1.5 s, took {elapsed:.1f} s"


@pytest.mark.parametrize("where", ["head", "body"])
def test_a_trickling_server_fails_at_the_deadline(serve: Callable[..., Server], where: str) -> None:
    trickle = serve(Trickle, where=where, life=SLOW_SERVER_LIFE_S)
    start = time.monotonic()
    with pytest.raises(ep.EndpointError, match=r"no complete answer within 1\.5 s"):
        ep.Endpoint(trickle.url, timeout=1.5).get("/health")
    elapsed = time.monotonic() - start
    # A byte every 0.5 s resets a socket timeout forever; the total deadline ends it (the message names 1.5 s).
    assert elapsed >= 1.45 and elapsed < SLOW_SERVER_LIFE_S / 2, f"deadline 1.5 s, took {elapsed:.1f} s"


def test_get_requests_have_the_short_deadline(serve: Callable[..., Server], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ep, "SHORT_DEADLINE_S", 1.0)
    trickle = serve(Trickle, where="body")
    start = time.monotonic()
    with pytest.raises(ep.EndpointError, match=r"no complete answer within 1 s"):
        ep.Endpoint(trickle.url, timeout=60).get("/health")
    assert time.monotonic() - start < 30  # the GET's 1 s, not the endpoint's 60 s (the message names which)


# -- the served context ------------------------------------------------------------------------
# sglang's refusal, verbatim from tokenizer_manager.py (0.5.10.post1 to 0.5.23).
REFUSAL = (
    "Requested token count exceeds the model's maximum context length of {context} tokens. You requested "
    "a total of {total} tokens: {input} tokens from the input messages and {new} tokens for the completion. "
    "Please reduce the number of tokens in the input messages or the completion to fit within the limit."
)


class ContextServer(BaseHTTPRequestHandler):
    """sglang's context checks for a model of ``context`` tokens (the real server showed them with a
    2,048-token model): /v1/models reports ``max_model_len`` unless ``report`` is false, and a chat
    whose input (``template`` tokens + one per 3 prompt bytes) plus ``max_tokens`` exceeds the
    context is refused with HTTP 400 and sglang's message. Answers follow the default probes.
    ``server.seen`` records each chat's (input tokens, max_tokens, status)."""

    server: Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
        pass

    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path.startswith("/health"):
            self._send(200, {})
            return
        if self.path == "/metrics" and self.server.config.get("metrics"):
            data = self.server.config["metrics"].encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        if self.path != "/v1/models":
            # sglang without --enable-metrics (or any unknown route): FastAPI's 404.
            self._send(404, {"detail": "Not Found"})
            return
        card: dict[str, Any] = {"id": "glm-5", "object": "model", "owned_by": "sglang", "root": "glm-5"}
        if self.server.config.get("report", True):
            card["max_model_len"] = self.server.config["context"]
        self._send(200, {"object": "list", "data": [card]})

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        prompt = request["messages"][-1]["content"]
        context, new = self.server.config["context"], request["max_tokens"]
        used = self.server.config["template"] + len(prompt.encode()) // 3
        if used + new > context:
            self.server.seen.append({"input": used, "max_tokens": new, "status": 400})
            message = REFUSAL.format(context=context, total=used + new, input=used, new=new)
            self._send(400, {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400})
            return
        self.server.seen.append({"input": used, "max_tokens": new, "status": 200})
        answers = {"north vault": "4817", "Start with 7": "50", "France": "Paris", "17 + 25": "42", "13 * 7": "91",
                   "Python": "def add(a, b):\n    return a + b"}  # fmt: skip
        content = next((a for key, a in answers.items() if key in prompt), "Hello!")
        choice = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        self._send(200, {"object": "chat.completion", "choices": [choice]})


def test_probes_fit_a_2048_token_context(serve: Callable[..., Server]) -> None:
    """The real sglang 0.5.17 with a 2,048-token model refused every probe's max_tokens 2048."""
    fake = serve(ContextServer, context=2048, template=20)
    server = ep.Endpoint(fake.url, timeout=10)
    assert ep.context_length(server, "glm-5") == 2048
    results = gate.run_probes(server, "glm-5", gate.load_probes())
    assert [r.ok for r in results] == [True] * len(results), [r.describe() for r in results]
    assert [seen["status"] for seen in fake.seen] == [200] * len(results), "a probe was refused"
    for probe, seen in zip(gate.load_probes(), fake.seen):
        assert seen["max_tokens"] == 2048 - ep.prompt_token_bound(gate.build_prompt(probe, 2048))


def test_a_chat_template_longer_than_the_allowance_is_fitted_by_sglangs_count(serve: Callable[..., Server]) -> None:
    fake = serve(ContextServer, context=2048, template=ep.CHAT_TEMPLATE_ALLOWANCE_TOKENS + 300)
    server = ep.Endpoint(fake.url, timeout=10)
    message = ep.complete_in_context(server, "glm-5", ep.CHAT_SMOKE_PROMPT, 2048, ep.context_length(server, "glm-5")).message
    assert message["content"] == "Hello!"
    refused, answered = fake.seen
    assert refused["status"] == 400 and answered["status"] == 200
    assert answered["max_tokens"] == 2048 - answered["input"], "the retry takes exactly the room sglang counted"


def test_without_max_model_len_sglangs_refusal_still_fits_the_chat(serve: Callable[..., Server]) -> None:
    fake = serve(ContextServer, context=2048, template=20, report=False)
    server = ep.Endpoint(fake.url, timeout=10)
    assert ep.context_length(server, "glm-5") is None
    results = gate.run_probes(server, "glm-5", gate.load_probes())
    assert all(r.ok for r in results), [r.describe() for r in results]
    assert [seen["max_tokens"] for seen in fake.seen[::2]] == [2048] * len(results), "asked as the probes say first"


def test_a_large_context_leaves_max_tokens_as_the_probe_asks(serve: Callable[..., Server]) -> None:
    fake = serve(ContextServer, context=202752, template=20)
    server = ep.Endpoint(fake.url, timeout=10)
    assert all(r.ok for r in gate.run_probes(server, "glm-5", gate.load_probes()))
    assert {seen["max_tokens"] for seen in fake.seen} == {2048}


def test_a_prompt_that_fills_the_context_fails_saying_so(serve: Callable[..., Server]) -> None:
    fake = serve(ContextServer, context=100, template=200)
    server = ep.Endpoint(fake.url, timeout=10)
    result = gate.run_probe(server, "glm-5", gate.load_probes()[0], ep.context_length(server, "glm-5"))
    assert not result.ok and "the prompt alone fills the model's context" in result.reason
    assert [seen["max_tokens"] for seen in fake.seen] == [100], "no room by the bound: sglang counts"


@pytest.mark.parametrize(
    ("wanted", "context", "fitted"),
    [(2048, None, 2048), (2048, 202752, 2048), (2048, 2048, 2048 - 257 - 10), (64, 2048, 64), (2048, 200, 200)],
)
def test_fit_max_tokens(wanted: int, context: int | None, fitted: int) -> None:
    assert ep.fit_max_tokens(wanted, "0123456789", context) == fitted


def test_room_from_refusal_reads_sglangs_count() -> None:
    text = json.dumps({"object": "error", "message": REFUSAL.format(context=2048, total=2078, input=30, new=2048)})
    assert ep.room_from_refusal(text) == 2018
    assert ep.room_from_refusal('{"object": "error", "message": "messages: Field required"}') is None


@pytest.mark.parametrize("context", [2048, None])
def test_verify_endpoint_passes_a_2048_token_server(serve: Callable[..., Server], context: int | None) -> None:
    fake = serve(ContextServer, context=2048, template=20, report=context is not None)
    proc = _verify(fake.url)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "8 passed" in proc.stdout, proc.stdout
    assert all(seen["input"] + seen["max_tokens"] <= 2048 for seen in fake.seen if seen["status"] == 200)


def test_verify_endpoint_fails_a_metrics_route_without_sglangs_metrics(serve: Callable[..., Server]) -> None:
    # Something answers /metrics, but not sglang's Prometheus text (a proxy page, another exporter).
    fake = serve(ContextServer, context=2048, template=20, metrics="<html>hello</html>\n")
    proc = _verify(fake.url)
    assert proc.returncode == 1 and "1 failed, 7 passed" in proc.stdout, proc.stdout
    assert "test_metrics_are_served_as_configured" in proc.stdout and "sglang:num_running_reqs" in proc.stdout


# -- wait-ready --------------------------------------------------------------------------------
# The widest key a header can carry and sglang's log masking can find (endpoint.api_key_problem): every
# character class it allows, in an env file written the way the role writes it (env_file_line).
WIDE_KEY = "Kk09._~+/=-" + "a" * 21
# A key systemd's env-file parser only reads right when quoted right; it is one the client will not send.
TRICKY_KEY = "k'e\"y $HOME `id` \\ %n"


def _wait_ready(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sglang_deploy_host.serving.endpoint", "wait-ready", *args],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip


def _env_file(tmp_path: Path, name: str, key: str) -> Path:
    env_file = tmp_path / "sglang.env"
    others = {"SGLANG_API_KEY": "not-the-key", "OTHER_KEY": "not-the-key-either"}
    others[name] = key
    env_file.write_text("# Ansible managed\n" + "".join(env_file_line(n, v) + "\n" for n, v in others.items()))
    return env_file


@pytest.mark.parametrize("standin", [("--api-key", WIDE_KEY, "--standin-load-delay", "0")], indirect=True)
@pytest.mark.parametrize("name", ["SGLANG_API_KEY", "OTHER_KEY"])
def test_wait_ready_reads_the_key_from_the_env_file(standin: Standin, tmp_path: Path, name: str) -> None:
    env_file = _env_file(tmp_path, name, WIDE_KEY)
    # With --env-file the process environment is not read.
    env = {**os.environ, unit_flags.API_KEY_ENV: "not-the-key"}
    args = ("--url", standin.url, "--path", "/v1/models", "--initial-delay", "0.2")
    proc = _wait_ready(*args, "--timeout", "5", "--env-file", str(env_file), "--api-key-env", name, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert WIDE_KEY not in proc.stdout + proc.stderr
    # Without the key /v1/models answers 401: the 200 above came from the key in the file.
    without = _wait_ready(*args, "--timeout", "0.5", env={**os.environ, unit_flags.API_KEY_ENV: ""})
    assert without.returncode == 1 and "HTTP 401" in without.stdout


def test_an_env_file_key_is_read_whole_however_quoted(tmp_path: Path) -> None:
    assert ep.api_key_from_env_file(str(_env_file(tmp_path, "OTHER_KEY", TRICKY_KEY)), "OTHER_KEY") == TRICKY_KEY


def test_wait_ready_will_not_send_a_key_no_header_can_carry(tmp_path: Path) -> None:
    env_file = _env_file(tmp_path, "SGLANG_API_KEY", TRICKY_KEY)
    proc = _wait_ready("--url", "http://127.0.0.1:9", "--timeout", "1", "--env-file", str(env_file))
    assert proc.returncode == 2 and "a quote or backslash at character 2" in proc.stderr, proc.stderr
    assert "$HOME" not in proc.stderr and "Traceback" not in proc.stderr


def test_wait_ready_names_a_missing_env_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.env"
    proc = _wait_ready("--url", "http://127.0.0.1:9", "--timeout", "1", "--env-file", str(missing))
    assert proc.returncode == 2
    assert f"env file {missing}: cannot read it (No such file or directory)" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_wait_ready_refuses_a_url_that_is_not_http() -> None:
    proc = _wait_ready("--url", "file:///etc/passwd", "--timeout", "1")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "'file:///etc/passwd'" in lines[0] and "http://" in lines[0], proc.stderr


# -- sglang-deploy verify --endpoint -----------------------------------------------------------
def _verify(url: str, *extra: str, key: str | None = None) -> subprocess.CompletedProcess[str]:
    """The command with the key in its environment, as a user gives it (--api-key is refused)."""
    env = {k: v for k, v in os.environ.items() if k != unit_flags.API_KEY_ENV}
    if key is not None:
        env[unit_flags.API_KEY_ENV] = key
    return subprocess.run(
        [sys.executable, "-m", "sglang_deploy.cli", "verify", "--endpoint", url, "--model", "glm-5", *extra],
        capture_output=True, text=True, timeout=300, check=False, cwd=ROOT, env=env,
    )  # fmt: skip


@pytest.mark.parametrize("standin", [OK_ARGS, (*OK_ARGS, "--enable-metrics")], indirect=True)
def test_verify_endpoint_passes_a_good_server_and_fails_a_wrong_key(standin: Standin) -> None:
    good = _verify(standin.url, key=KEY)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "8 passed" in good.stdout, good.stdout
    bad = _verify(standin.url, key="wrong")
    assert bad.returncode == 1 and "401" in bad.stdout


@pytest.mark.parametrize("standin", [(*OK_ARGS, "--standin-mode", "garble")], indirect=True)
def test_verify_endpoint_fails_garbled_output_only_on_the_gate(standin: Standin, tmp_path: Path) -> None:
    proc = _verify(standin.url, key=KEY)
    assert proc.returncode == 1
    assert "FAILED" in proc.stdout and "test_correctness_gate" in proc.stdout and "1 failed, 7 passed" in proc.stdout, proc.stdout
    # --probes replaces the set: a probe the garbage matches passes.
    probes = tmp_path / "bangs.yml"
    probes.write_text("- {name: bangs, prompt: anything, expect: '^!+$', max_tokens: 64}\n")
    assert _verify(standin.url, "--probes", str(probes), key=KEY).returncode == 0


def test_verify_endpoint_speaks_tls_with_the_ca_given_and_never_without_it(tmp_path: Path) -> None:
    """The stand-in serving TLS as uvicorn does (its warmup verifying its own certificate against
    --ssl-ca-certs, as sglang's): `verify --endpoint https://... --cafile CA` passes every test (plain HTTP
    to its port refused among them); without the CA the server is not trusted and nothing passes."""
    sys.path.insert(0, str(ROOT / "tests"))
    from tls_certs import TestCA, write

    ca = TestCA()
    paths = write(tmp_path / "tls", ca, ca.issue(["127.0.0.1"]))
    server = Standin(
        tmp_path / "standin.log", *OK_ARGS, "--ssl-certfile", str(paths["certfile"]), "--ssl-keyfile",
        str(paths["keyfile"]), "--ssl-ca-certs", str(paths["cafile"]),
    )  # fmt: skip
    try:
        assert server.url.startswith("https://127.0.0.1:")
        good = _verify(server.url, "--cafile", str(paths["cafile"]), key=KEY)
        assert good.returncode == 0 and "8 passed" in good.stdout and "test_tls_is_served_as_configured[local] PASSED" in good.stdout, good.stdout
        untrusted = _verify(server.url, key=KEY)
        assert untrusted.returncode == 1 and "the server's certificate is not trusted" in untrusted.stdout, untrusted.stdout
        assert _verify(server.url, "--cafile", str(tmp_path / "none.crt"), key=KEY).returncode == 2
        # The stand-in's own warmup verified its certificate under the name it binds (sglang's ServerArgs.url()).
        assert "fired up" in (tmp_path / "standin.log").read_text()
    finally:
        server.stop()


def test_verify_refuses_a_bad_probes_file_before_contacting_anything(tmp_path: Path) -> None:
    probes = tmp_path / "p.yml"
    probes.write_text("- {prompt: x}\n")
    proc = _verify("http://127.0.0.1:9", "--probes", str(probes))
    assert proc.returncode == 2 and "'expect' must be a non-empty string" in proc.stderr


@pytest.mark.parametrize("url", ["file:///etc/passwd", "10.0.0.5:8000"])
def test_verify_refuses_a_url_that_is_not_http(url: str) -> None:
    proc = _verify(url)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and repr(url) in lines[0] and "http://" in lines[0], proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


def test_verify_endpoint_fails_fast_when_the_server_never_answers(serve: Callable[..., Server]) -> None:
    """Each test would wait out its own deadline; the suite's first /health check fails them all at once."""
    silent = serve(Silent, life=300)
    start = time.monotonic()
    proc = _verify(silent.url, key=KEY)
    elapsed = time.monotonic() - start
    assert proc.returncode == 1
    assert "8 errors" in proc.stdout and proc.stdout.count("did not answer GET /health") >= 8, proc.stdout
    # One /health deadline, not a deadline per test (8 x GENERATE_DEADLINE_S).
    assert elapsed < ep.GENERATE_DEADLINE_S, f"took {elapsed:.0f} s"


@pytest.mark.parametrize(
    ("key", "kind"),
    [("good-key\r0123456789", "a line break at character 9"), ("kéy-0123456789abcdef", "a non-ASCII character at character 2"),
     ("key-0123456789-абв", "a non-ASCII character at character 16"), ("tab\tkey-0123456789", "a space or tab at character 4")],
)  # fmt: skip
@pytest.mark.parametrize("via", ["env", "file"])
def test_a_key_no_header_can_carry_is_refused_in_one_line_without_a_byte_of_it(tmp_path: Path, key: str, kind: str, via: str) -> None:
    """verify and bench take the key from $SGLANG_API_KEY or --api-key-file and check it with the role's own
    rule (endpoint.api_key_problem) before any request: exit 2, one line naming where it came from and what
    kind of character is wrong, and neither the key nor its odd character anywhere in the output."""
    extra: list[str] = []
    env_key: str | None = key
    if via == "file":
        path = tmp_path / "key"
        path.write_bytes(key.encode("utf-8"))
        path.chmod(0o600)
        extra, env_key = ["--api-key-file", str(path)], None
    for command in (["verify", "--endpoint", "http://127.0.0.1:9", "--model", "m"],
                    ["bench", "--endpoint", "http://127.0.0.1:9", "--model", "m", "--tokenizer", str(tmp_path)]):  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k != unit_flags.API_KEY_ENV}
        if env_key is not None:
            env[unit_flags.API_KEY_ENV] = env_key
        done = subprocess.run([sys.executable, "-m", "sglang_deploy.cli", *command, *extra], capture_output=True, text=True,
                              timeout=120, check=False, cwd=ROOT, env=env)  # fmt: skip
        out = done.stdout + done.stderr
        assert done.returncode == 2, out
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in out, out
        assert kind in out and ("$SGLANG_API_KEY" if via == "env" else "--api-key-file") in out, out
        assert key.strip() not in out and not any(ch in out for ch in key if ord(ch) > 127 or ch in "\r\t"), out


def test_the_client_refuses_a_key_it_could_not_send_before_any_request() -> None:
    with pytest.raises(ValueError, match="the API key holds a line break at character 4") as err:
        ep.Endpoint("http://127.0.0.1:9", api_key="abc\r\ndef")
    assert "abc" not in str(err.value)


@pytest.mark.parametrize("standin", [OK_ARGS], indirect=True)
def test_the_standin_reads_a_chunked_request_body_as_uvicorn_does(standin: Standin) -> None:
    """smg (round_robin) streams request bodies chunked; a stand-in that read Content-Length only answered 400
    and took the next chunk for a request line."""
    body = json.dumps({"model": "glm-5", "messages": [{"role": "user", "content": "What is 2+2?"}], "max_tokens": 8}).encode()
    connection = http.client.HTTPConnection("127.0.0.1", standin.port, timeout=10)
    try:
        connection.putrequest("POST", "/v1/chat/completions")
        for name, value in (("Authorization", f"Bearer {KEY}"), ("Content-Type", "application/json"),
                            ("Transfer-Encoding", "chunked")):  # fmt: skip
            connection.putheader(name, value)
        connection.endheaders()
        for part in (body[:20], body[20:]):
            connection.send(b"%x\r\n%s\r\n" % (len(part), part))
        connection.send(b"0\r\n\r\n")
        answer = connection.getresponse()
        assert answer.status == 200, answer.read()
        assert json.loads(answer.read())["choices"][0]["message"]
        # The same connection serves the next request: nothing of the body was left over.
        connection.request("GET", "/health")
        assert connection.getresponse().status == 200
    finally:
        connection.close()
