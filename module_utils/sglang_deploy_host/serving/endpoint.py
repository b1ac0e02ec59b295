"""Talk to a serving sglang endpoint: readiness wait, health checks, chat completions.

STDLIB ONLY, Python >= 3.9: the module sglang_wait_ready runs the readiness gate with it on the host
after every (re)start; on the control node ``sglang-deploy verify`` and tests/infra/test_endpoint.py
import it. The correctness gate (probes and the judge of an answer) is gate.py, on top of this; where a
server listens, its URL and what its flags say are unit_flags.py, below it.

Routes and shapes follow sglang's ``srt/entrypoints/http_server.py`` (0.5.10.post1):
``/health`` and ``/health_generate`` answer 503 while the server is starting and never need the
API key; everything else needs ``Authorization: Bearer <key>`` when ``--api-key`` is set (401,
``{"error": "Unauthorized"}``).

Requests go to the base URL's own host and port only (http:// or https://, no proxy), follow no
redirect (the Bearer token never reaches another origin), read at most MAX_ANSWER_BYTES and end
at a total deadline, so a hostile or broken server cannot hold or flood the caller.

Chats fit the served context: ``/v1/models`` lists each model's ``max_model_len`` (sglang's
``model_config.context_len``) and sglang refuses (HTTP 400) a request whose input plus ``max_tokens``
exceeds it, so :func:`complete_in_context` caps ``max_tokens`` with an upper bound of the prompt's tokens
and, should sglang still refuse, retries once with the room sglang's own count leaves.

The readiness gate (:func:`readiness_gate`; the module sglang_wait_ready runs it on the host, and
``python -m sglang_deploy_host.serving.endpoint wait-ready --url URL --timeout S [--env-file PATH]`` too)
polls with back-off until URL+path answers 200. The API key, if any, is NAME (default
SGLANG_API_KEY) in the unit's environment file, read on the host, so it never is on a command line.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

from ..fs.files import UnreadableFileError, read_regular_file
from .systemd import env_file_values
from .unit_flags import API_KEY_ENV, DEFAULT_PORT, api_key_problem, base_url, check_url

READY_PATH = "/health_generate"
# The endpoint suite's plain chat: any non-empty answer passes.
CHAT_SMOKE_PROMPT = "Say hello in one short sentence."
# Its max_tokens: room for a reasoning model's thinking (fitted to the context, complete_in_context).
CHAT_SMOKE_MAX_TOKENS = 2048
# chat()'s temperature: deterministic.
CHAT_TEMPERATURE = 0.0
# What a chat template adds around one user message (role headers, a default system prompt), in
# tokens, when a prompt's tokens are bounded without the model's tokenizer (prompt_token_bound).
CHAT_TEMPLATE_ALLOWANCE_TOKENS = 256
# Total deadline of one request (connect, TLS, headers and body). GETs (health, model list) answer
# at once, except /health_generate, which gives up on its one token after 20 s itself.
SHORT_DEADLINE_S = 30.0
# A chat completion: up to a probe's max_tokens (gate.DEFAULT_PROBE_MAX_TOKENS) of generation.
GENERATE_DEADLINE_S = 120.0
# The largest answer read: chat answers and the model list are kilobytes. Read in pieces, so an
# endless body costs this much memory, not all of it.
MAX_ANSWER_BYTES = 4 * 1024 * 1024
# The unit's environment file: a few lines of secrets; anything larger is not that file.
ENV_FILE_MAX_BYTES = 64 * 1024
# A CA bundle a client trusts (one CA, or a distribution's whole bundle of ~150): bounded like every file read.
CA_FILE_MAX_BYTES = 4 * 1024 * 1024
_READ_PIECE = 64 * 1024


class EndpointError(RuntimeError):
    """A request that did not get the expected answer; ``status`` is 0 when nothing answered."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


# -- HTTP --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Response:
    status: int
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            raise EndpointError(f"answer is not JSON: {self.text[:200]!r}", self.status) from None


class _Deadline:
    """The watchdog of one request: at ``seconds`` it shuts the watched connection down, which ends
    a read or write blocked on it (a per-operation socket timeout never fires on a trickle)."""

    def __init__(self, seconds: float) -> None:
        self.expired = False
        self._end = time.monotonic() + seconds
        self._lock = threading.Lock()
        self._done = False
        self._sock: Optional[socket.socket] = None
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> "_Deadline":
        self._timer.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._timer.cancel()
        with self._lock:
            self._done = True
            if self._sock is not None:
                self._sock.close()

    def remaining(self) -> float:
        return max(0.01, self._end - time.monotonic())

    @property
    def passed(self) -> bool:
        # Also true when a socket timeout (the time left at connect) fired just before the watchdog.
        return self.expired or time.monotonic() >= self._end

    def watch(self, sock: socket.socket) -> None:
        # A descriptor of its own (dup): however the request's socket gets closed, the watchdog
        # never shuts down a descriptor number the process has since reused.
        with self._lock:
            self._sock = socket.fromfd(sock.fileno(), sock.family, sock.type)
            if self.expired:
                self._shutdown()

    def _expire(self) -> None:
        with self._lock:
            if not self._done:
                self.expired = True
                self._shutdown()

    def _shutdown(self) -> None:
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # the connection is gone already


def _too_big(what: str, status: int) -> EndpointError:
    return EndpointError(
        f"{what}: answer larger than {MAX_ANSWER_BYTES} bytes refused (sglang's are kilobytes)", status
    )


def _read_body(answer: http.client.HTTPResponse, what: str) -> bytes:
    """The body in pieces, refused past MAX_ANSWER_BYTES (a declared longer one unread)."""
    if answer.length is not None and answer.length > MAX_ANSWER_BYTES:
        raise _too_big(what, answer.status)
    pieces: list[bytes] = []
    size = 0
    while True:
        piece = answer.read(_READ_PIECE)
        if not piece:
            break
        size += len(piece)
        if size > MAX_ANSWER_BYTES:
            raise _too_big(what, answer.status)
        pieces.append(piece)
    if answer.length:  # http.client returns a body cut short by the close as if complete
        raise http.client.IncompleteRead(b"".join(pieces), answer.length)
    return b"".join(pieces)


def read_text(path: str, limit: int, what: str, encoding: str, kind: str) -> str:
    """A small file a client reads (the env file, a CA file): a regular file, at most ``limit`` bytes,
    decoded; ValueError naming ``what`` and the path otherwise."""
    try:
        return read_regular_file(path, limit).decode(encoding)
    except OSError as err:
        raise ValueError(f"{what} {path}: cannot read it ({err.strerror})") from None
    except UnreadableFileError as err:
        raise ValueError(f"{what} {path}: {err}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{what} {path}: not {kind}") from None


def tls_context(cafile: str = "") -> ssl.SSLContext:
    """The client side of every https request: the certificate chain and the host name are always
    verified (ssl.create_default_context: CERT_REQUIRED, check_hostname), against ``cafile`` (PEM,
    read bounded) when given, else the system's CA store. No caller can switch the check off."""
    if not cafile:
        return ssl.create_default_context()
    pem = read_text(cafile, CA_FILE_MAX_BYTES, "CA file", "ascii", "PEM text")
    try:
        return ssl.create_default_context(cadata=pem)
    except ssl.SSLError as err:
        raise ValueError(f"CA file {cafile}: no PEM certificate in it ({err.reason or err})") from None


def _exchange(
    parts: urllib.parse.SplitResult,
    method: str,
    path: str,
    body: Optional[bytes],
    headers: Mapping[str, str],
    deadline: _Deadline,
    what: str,
    context: Optional[ssl.SSLContext],
) -> Response:
    """One request on a new connection to the URL's own host and port (never a proxy)."""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    sock = socket.create_connection((parts.hostname, port), timeout=deadline.remaining())
    deadline.watch(sock)
    answer: Optional[http.client.HTTPResponse] = None
    try:
        if parts.scheme == "https":
            sock = (context or ssl.create_default_context()).wrap_socket(sock, server_hostname=parts.hostname)
        # http.client only speaks HTTP on the socket connected (and TLS-wrapped) under the watchdog.
        conn = http.client.HTTPConnection(str(parts.hostname), port)
        conn.sock = sock
        conn.request(method, (parts.path.rstrip("/") + path) or "/", body=body, headers=dict(headers))
        answer = conn.getresponse()
        if 300 <= answer.status < 400:
            location = answer.getheader("Location", "")
            raise EndpointError(
                f"{what}: HTTP {answer.status} redirect to {location[:200]!r} refused "
                "(sglang never redirects: give the server's own URL)",
                answer.status,
            )
        return Response(answer.status, _read_body(answer, what))
    finally:
        if answer is not None:
            answer.close()
        sock.close()


@dataclass(frozen=True)
class Endpoint:
    """An sglang HTTP server at an http(s):// base URL; ``api_key`` is sent as a Bearer token when
    set, to that origin only. ``timeout`` is a request's total deadline; GETs get at most
    SHORT_DEADLINE_S of it. An https server's certificate is verified against ``cafile`` (PEM; "" = the
    system's CA store), its name against the URL's host (:func:`tls_context`)."""

    url: str
    api_key: str = field(default="", repr=False)
    timeout: float = GENERATE_DEADLINE_S
    cafile: str = ""
    # The https client context, made from cafile once (None for http://).
    _context: Optional[ssl.SSLContext] = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_url(self.url)
        # A key no HTTP header can carry would fail deep in http.client, with the key in the traceback.
        problem = api_key_problem(self.api_key, "the API key")
        if problem:
            raise ValueError(problem)
        # Read once, here: a CA file that cannot be read is a clear error before any request.
        if urllib.parse.urlsplit(self.url).scheme == "https":
            object.__setattr__(self, "_context", tls_context(self.cafile))

    def request(self, method: str, path: str, payload: Any = None, timeout: Optional[float] = None) -> Response:
        """One request within ``timeout`` s in all (default ``self.timeout``); HTTP error statuses are
        returned, not raised. No answer in time, a redirect or an answer over MAX_ANSWER_BYTES ->
        EndpointError (status 0 when nothing answered)."""
        seconds = self.timeout if timeout is None else timeout
        parts = urllib.parse.urlsplit(self.url)
        what = f"{method} {self.url.rstrip('/')}{path}"
        headers = {"Host": parts.netloc, "Connection": "close"}
        body = None
        if payload is not None:
            body = json.dumps(payload).encode("utf-8")
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        with _Deadline(seconds) as deadline:
            try:
                response = _exchange(parts, method, path, body, headers, deadline, what, self._context)
            except EndpointError:
                raise
            except ssl.SSLCertVerificationError as err:
                raise EndpointError(
                    f"{what}: the server's certificate is not trusted ({err.verify_message}): "
                    f"{'CA file ' + self.cafile if self.cafile else 'the system CA store'} does not vouch for it "
                    "under this host name. Fix: give the CA that signed it (--cafile; in an inventory "
                    "sglang_server_tls_cafile), or a URL whose host the certificate names"
                ) from None
            except (OSError, http.client.HTTPException) as err:
                if deadline.passed:
                    raise EndpointError(f"{what}: no complete answer within {seconds:g} s") from None
                raise EndpointError(f"{what}: no answer ({err})") from None
            # A close-delimited answer the watchdog cut short reads as complete.
            if deadline.passed:
                raise EndpointError(f"{what}: no complete answer within {seconds:g} s")
        return response

    def get(self, path: str, timeout: Optional[float] = None) -> Response:
        return self.request("GET", path, timeout=min(self.timeout, SHORT_DEADLINE_S) if timeout is None else timeout)


def expect_ok(response: Response, what: str) -> Response:
    if response.status != 200:
        raise EndpointError(f"{what}: HTTP {response.status} {response.text[:300]!r}", response.status)
    return response


def model_cards(endpoint: Endpoint) -> list[dict[str, Any]]:
    """Every card /v1/models lists (``id``, ``max_model_len``, ...)."""
    data = expect_ok(endpoint.get("/v1/models"), "GET /v1/models").json()
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise EndpointError(f"GET /v1/models: not a model list: {data!r}")
    return [card for card in data["data"] if isinstance(card, dict)]


def model_ids(endpoint: Endpoint) -> list[str]:
    """The ``id`` of every card /v1/models lists."""
    return [str(card.get("id")) for card in model_cards(endpoint)]


def context_length(endpoint: Endpoint, model: str) -> Optional[int]:
    """``max_model_len`` of ``model``'s card in /v1/models (sglang's context length: prompt plus
    generated tokens); None when the card does not say (a LoRA adapter's, another server's)."""
    for card in model_cards(endpoint):
        if str(card.get("id")) == model:
            value = card.get("max_model_len")
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
            return None
    return None


def prompt_token_bound(prompt: str) -> int:
    """At least as many tokens as a one-message chat of ``prompt`` takes, without the model's
    tokenizer: byte-level BPE (Llama 3, GLM, Qwen) and SentencePiece with byte fallback spend at most
    one token per UTF-8 byte (+1 for a leading-space marker), and the chat template's own tokens get
    CHAT_TEMPLATE_ALLOWANCE_TOKENS."""
    return len(prompt.encode("utf-8")) + 1 + CHAT_TEMPLATE_ALLOWANCE_TOKENS


def fit_max_tokens(wanted: int, prompt: str, context_len: Optional[int]) -> int:
    """``max_tokens`` for a chat of ``prompt`` that the context holds: ``wanted``, capped at what
    the context leaves after :func:`prompt_token_bound`. When the bound leaves no room (a context of
    a few hundred tokens), ``wanted`` capped at the context: sglang's refusal then names the real
    count (see :func:`complete_in_context`)."""
    if context_len is None:
        return wanted
    room = context_len - prompt_token_bound(prompt)
    return min(wanted, room if room >= 1 else context_len)


# sglang's refusal (tokenizer_manager.py, the same text 0.5.10.post1 to 0.5.23): "Requested token
# count exceeds the model's maximum context length of C tokens. You requested a total of T tokens:
# I tokens from the input messages and M tokens for the completion. ..."
_CONTEXT_REFUSAL = re.compile(
    r"maximum context length of (\d+) tokens\. You requested a total of \d+ tokens: (\d+) tokens from the input"
)


def context_from_refusal(text: str) -> Optional[int]:
    """The model's context length by sglang's own refusal (None when ``text`` is not one)."""
    match = _CONTEXT_REFUSAL.search(text)
    return int(match.group(1)) if match else None


def room_from_refusal(text: str) -> Optional[int]:
    """Tokens left for the completion by sglang's own count in its context-length refusal; None
    when ``text`` is not one."""
    match = _CONTEXT_REFUSAL.search(text)
    if not match:
        return None
    return int(match.group(1)) - int(match.group(2))


def _chat_request(endpoint: Endpoint, model: str, prompt: str, max_tokens: int, temperature: float) -> Response:
    payload = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": temperature,
        "max_tokens": max_tokens,
        "stream": False,
    }
    return endpoint.request("POST", "/v1/chat/completions", payload)


@dataclass(frozen=True)
class Completion:
    """A chat completion's first choice: its ``message``, why it ended (``finish_reason``: ``stop`` for a
    natural end, ``length`` at ``max_tokens``) and the ``max_tokens`` it was asked for."""

    message: dict
    finish_reason: Optional[str]
    max_tokens: int


def _completion(response: Response, max_tokens: int) -> Completion:
    data = expect_ok(response, "POST /v1/chat/completions").json()
    try:
        choice = data["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError):
        raise EndpointError(f"POST /v1/chat/completions: no choices[0].message in {data!r}") from None
    if not isinstance(message, dict):
        raise EndpointError(f"POST /v1/chat/completions: message is not an object: {message!r}")
    finish = choice.get("finish_reason")
    return Completion(message, finish if isinstance(finish, str) else None, max_tokens)


def chat(endpoint: Endpoint, model: str, prompt: str, max_tokens: int, temperature: float = CHAT_TEMPERATURE) -> dict[str, Any]:
    """One OpenAI chat completion; returns the first choice's ``message``."""
    return _completion(_chat_request(endpoint, model, prompt, max_tokens, temperature), max_tokens).message


def complete_in_context(
    endpoint: Endpoint,
    model: str,
    prompt: str,
    max_tokens: int,
    context_len: Optional[int],
    temperature: float = CHAT_TEMPERATURE,
) -> Completion:
    """One chat completion with ``max_tokens`` fitted to the served context (:func:`fit_max_tokens`); if
    sglang still refuses the request for the context (HTTP 400, its own token count in the message:
    a chat template longer than the allowance, or no ``max_model_len`` known), once more with the
    room that count leaves. A prompt that alone fills the context is an EndpointError saying so."""
    fitted = fit_max_tokens(max_tokens, prompt, context_len)
    response = _chat_request(endpoint, model, prompt, fitted, temperature)
    room = room_from_refusal(response.text) if response.status == 400 else None
    if room is not None and room < fitted:
        if room < 1:
            raise EndpointError(
                f"POST /v1/chat/completions: the prompt alone fills the model's context ({response.text[:300]!r})",
                response.status,
            )
        fitted = room
        response = _chat_request(endpoint, model, prompt, room, temperature)
    return _completion(response, fitted)


# -- readiness ---------------------------------------------------------------------------------
def backoff_delays(initial: float = 2.0, factor: float = 2.0, maximum: float = 30.0) -> Iterator[float]:
    """Pauses between polls: initial, initial*factor, ... capped at ``maximum`` (endless)."""
    if initial <= 0 or factor < 1 or maximum < initial:
        raise ValueError("need 0 < initial <= maximum and factor >= 1")
    delay = initial
    while True:
        yield delay
        delay = min(delay * factor, maximum)


@dataclass(frozen=True)
class ReadyResult:
    ready: bool
    attempts: int
    waited_s: float
    last: str


def wait_ready(
    endpoint: Endpoint,
    timeout_s: float,
    path: str = READY_PATH,
    delays: Optional[Iterator[float]] = None,
    unit_state: Optional[Callable[[], Optional[str]]] = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    progress: Optional[Callable[[str], None]] = None,
) -> ReadyResult:
    """Poll ``path`` until it answers 200 or ``timeout_s`` is spent (each request bounded too).

    ``unit_state`` (optional) returns why waiting is pointless (e.g. the unit failed), else None.
    """
    delays = delays if delays is not None else backoff_delays()
    start = clock()
    deadline = start + timeout_s
    attempts = 0
    last = "not polled yet"
    while True:
        attempts += 1
        remaining = deadline - clock()
        try:
            # /health_generate waits up to 20 s for a token itself; leave it room, within the budget.
            answer = endpoint.get(path, timeout=max(1.0, min(SHORT_DEADLINE_S, remaining)))
            if answer.status == 200:
                return ReadyResult(True, attempts, clock() - start, f"GET {path}: 200")
            last = f"GET {path}: HTTP {answer.status}"
        except EndpointError as err:
            last = str(err)
        if unit_state is not None:
            why = unit_state()
            if why:
                return ReadyResult(False, attempts, clock() - start, f"{why}; last poll: {last}")
        if progress is not None:
            progress(f"attempt {attempts} after {clock() - start:.0f}s: {last}")
        pause = next(delays)
        if clock() + pause >= deadline:
            remaining = deadline - clock()
            if remaining > 0:
                sleep(remaining)
            # One last poll at the deadline, so the whole budget counts.
            try:
                answer = endpoint.get(path, timeout=5.0)
                attempts += 1
                if answer.status == 200:
                    return ReadyResult(True, attempts, clock() - start, f"GET {path}: 200")
                last = f"GET {path}: HTTP {answer.status}"
            except EndpointError as err:
                last = str(err)
            return ReadyResult(False, attempts, clock() - start, last)
        sleep(pause)


def systemd_unit_failed(unit: str) -> Callable[[], Optional[str]]:
    """A ``unit_state`` for :func:`wait_ready`: reports a unit systemd has given up on."""

    def check() -> Optional[str]:
        try:
            state = subprocess.run(
                ["systemctl", "is-active", unit], capture_output=True, text=True, timeout=10, check=False
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return None
        if state in ("failed", "inactive"):
            return f"unit {unit} is {state} (it exited; systemd does not restart it now)"
        return None

    return check


# -- the readiness gate (module sglang_wait_ready, and this file as a script) ----------------------
# The options of every module that talks to the endpoint: the key read with api_key_from_env_file, the CA an
# https server is verified against (documented once: the doc fragment sglang_endpoint_client). The variable's
# name is no secret.
CLIENT_OPTIONS: dict[str, dict[str, Any]] = {
    "env_file": {"type": "path"},
    "api_key_env": {"type": "str", "default": API_KEY_ENV, "no_log": False},
    "cafile": {"type": "path", "default": ""},
}


def api_key_from_env_file(env_file: Optional[str], name: str) -> str:
    """``name`` from the unit's environment file, read here (the key never is on a command line
    or in a task's environment), else from this process's environment; "" when it is not set."""
    if env_file is None:
        return os.environ.get(name, "")
    text = read_text(env_file, ENV_FILE_MAX_BYTES, "env file", "utf-8", "UTF-8 text")
    return env_file_values(text).get(name, "")


def readiness_gate(
    url: str,
    timeout: float,
    *,
    path: str = READY_PATH,
    unit: Optional[str] = None,
    env_file: Optional[str] = None,
    api_key_env: str = API_KEY_ENV,
    initial_delay: float = 2.0,
    max_delay: float = 30.0,
    progress: Optional[Callable[[str], None]] = None,
    cafile: str = "",
) -> "tuple[ReadyResult, str]":
    """Poll ``url + path`` until it answers 200 or ``timeout`` is spent; the result and its verdict
    line. ValueError for a URL that is not http(s), an unreadable ``env_file`` or ``cafile``."""
    endpoint = Endpoint(url, api_key=api_key_from_env_file(env_file, api_key_env), cafile=cafile)
    result = wait_ready(
        endpoint,
        timeout,
        path=path,
        delays=backoff_delays(initial_delay, 2.0, max_delay),
        unit_state=systemd_unit_failed(unit) if unit else None,
        progress=progress,
    )
    if result.ready:
        return result, f"ready: {url}{path} answered 200 after {result.waited_s:.0f}s ({result.attempts} polls)"
    return result, (
        f"NOT READY: {url}{path} did not answer 200 within {timeout:.0f}s "
        f"({result.attempts} polls, {result.waited_s:.0f}s): {result.last}"
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="endpoint.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ready = sub.add_parser("wait-ready", help="poll until the server answers 200 (bounded)")
    ready.add_argument("--url", help="base URL, e.g. http://127.0.0.1:8000 (default: from --bind-host/--port)")
    ready.add_argument("--bind-host", help="the server's --host flag (a wildcard means loopback here)")
    ready.add_argument("--port", help=f"the server's --port flag (default {DEFAULT_PORT})")
    ready.add_argument("--timeout", type=float, required=True, help="total budget in seconds")
    ready.add_argument("--path", default=READY_PATH, help=f"route to poll (default {READY_PATH})")
    ready.add_argument("--unit", help="stop early when this systemd unit has failed")
    ready.add_argument("--initial-delay", type=float, default=2.0, help="first pause between polls (s)")
    ready.add_argument("--max-delay", type=float, default=30.0, help="longest pause between polls (s)")
    ready.add_argument("--env-file", help="the unit's EnvironmentFile= holding the API key (read as root)")
    ready.add_argument(
        "--api-key-env",
        default=API_KEY_ENV,
        help=f"the key's variable in --env-file, else in this environment (default {API_KEY_ENV})",
    )
    ready.add_argument("--cafile", default="", help="PEM CA file an https server's certificate is verified against")
    args = parser.parse_args(argv)
    url = args.url or base_url({k: v for k, v in (("host", args.bind_host), ("port", args.port)) if v})
    try:
        result, verdict = readiness_gate(
            url, args.timeout, path=args.path, unit=args.unit, env_file=args.env_file,
            api_key_env=args.api_key_env, initial_delay=args.initial_delay, max_delay=args.max_delay,
            progress=lambda line: print(line, flush=True), cafile=args.cafile,
        )  # fmt: skip
    except ValueError as err:
        print(f"endpoint.py wait-ready: {err}", file=sys.stderr, flush=True)
        return 2
    print(verdict, flush=True)
    return 0 if result.ready else 1


if __name__ == "__main__":
    sys.exit(main())
