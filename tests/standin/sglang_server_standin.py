#!/usr/bin/env python3
"""STAND-IN for a serving sglang (``python -m sglang.launch_server``): no GPU, no model, stdlib only.

It speaks the part of sglang's HTTP API that the readiness gate, the endpoint suite and sglang's own
``bench_serving`` use, with routes, status codes and shapes taken from sglang 0.5.10.post1
``srt/entrypoints/http_server.py``, ``srt/utils/auth.py``, ``srt/managers/tokenizer_manager.py`` and
``srt/entrypoints/openai/protocol.py``:

  GET  /health, /health_generate  503 (empty) while "loading", then 200 (empty); never need the key
  GET  /v1/models                 {"object": "list", "data": [{"id": <served name>, "object": "model", ...}]}
  GET  /server_info               the launch arguments as sglang returns them (``dataclasses.asdict``
                                  of ServerArgs: the API key included, in clear, as sglang does)
  POST /v1/chat/completions       OpenAI chat.completion; ``reasoning_content`` split off when
                                  --reasoning-parser is set (sglang's default separate_reasoning);
                                  ``"stream": true``: chat.completion.chunk events (SSE)
  POST /v1/completions            OpenAI text_completion, streamed or not
  POST /generate                  sglang's native route; streamed: ``data: {"text": <all text so
                                  far>, "meta_info": {"completion_tokens": k, ...}}`` events, then
                                  ``data: [DONE]``
  anything but /health*           401 {"error": "Unauthorized"} without ``Authorization: Bearer <--api-key>``

It accepts sglang's launch argv (--model-path/--model, --served-model-name, --host, --port,
--api-key, --reasoning-parser, --tp-size, --max-running-requests, --ssl-certfile/--ssl-keyfile/--ssl-ca-certs
for TLS as uvicorn serves it, with sglang's own warmup request verifying the certificate against
--ssl-ca-certs at ServerArgs.url() and the server exiting when that fails; every other flag is ignored), so a
test venv can install it as the module ``sglang.launch_server`` and the real systemd unit starts it.
Answers come from a small rule table (capital of France, two-number arithmetic, a Python ``add``
function); they are right, so the correctness gate passes, except in the modes below. A "token" is
a whitespace-separated word. Stand-in behaviour is chosen by options or, under systemd, by
environment variables (the unit's argv stays the inventory's):

  --standin-mode / SGLANG_STANDIN_MODE    ok (default) | garble (every answer is NaN-like
                                          "!!!!!!", as the seeds saw from a bad backend) |
                                          never-ready (/health* answer 503 forever) |
                                          stall (generation requests get no answer, or a stream
                                          that never sends a token: a hung server) |
                                          busy (generation requests get no answer as in stall, but
                                          /metrics' sglang:realtime_tokens_total keeps growing: a
                                          server deep in a long prefill, slow but making progress) |
                                          empty (generation requests answer 200 with no token: a
                                          server that "succeeds" at nothing) |
                                          redirect (generation requests answer 307 to
                                          --standin-redirect-to / SGLANG_STANDIN_REDIRECT_TO + path) |
                                          repeat (the right answer repeated until max_tokens) |
                                          runon (the right answer, then words of junk until
                                          max_tokens): the degenerate output of a broken numeric
                                          path, which "the right word is in there" would pass |
                                          constant (one string, CONSTANT_ANSWER, for every chat, and
                                          a next-token distribution that ignores the input: a server
                                          that no longer computes the model) |
                                          drift (the logprob model's logits moved by noise: fluent,
                                          not quite the model) |
                                          batch-race (right alone, wrong tokens while another
                                          generation runs: the FP4 GEMM race under concurrency) |
                                          no-logprobs (/generate answers without its logprob fields) |
                                          retokenized (another tokenizer: other ids for the same text)
  --standin-load-delay / SGLANG_STANDIN_LOAD_DELAY   seconds of "loading" (503) after start (default 2)
  --standin-mode-file / SGLANG_STANDIN_MODE_FILE     a file holding one of the modes above, read at
                                          every request: a server started before the file was last
                                          written switches to that mode while it runs (molecule flips
                                          the running unit into ``stall``: /health* keep answering
                                          200); a server started after it ignores it, as a restart
                                          clears a hung scheduler

Streamed answers (bench_serving's way to measure) are paced so that what a client measures can be
computed beforehand. With R = --standin-tokens-per-s, C = --standin-max-tokens-per-s and n
generation requests in progress, every streamed request gets its first token --standin-ttft-ms
after it arrived and then one token each 1/min(R, C/n) seconds (a bound that is 0 is no bound;
both 0: as fast as the stand-in can write). So with n requests kept in flight, the inter-token
latency is 1/min(R, C/n) and the output throughput n * min(R, C/n): C models a GPU whose decode
step slows down as the batch grows. Token times are kept on a schedule (a late token does not
delay the next ones), so the average rate holds on a busy machine. With ``ignore_eos`` a stream
has exactly the requested number of tokens (the answer, then filler words).

  --standin-tokens-per-s / SGLANG_STANDIN_TOKENS_PER_S          R (default 0: no bound)
  --standin-max-tokens-per-s / SGLANG_STANDIN_MAX_TOKENS_PER_S  C (default 0: no bound)
  --standin-ttft-ms / SGLANG_STANDIN_TTFT_MS                    time to the first token (default 0)
  --standin-fail-every / SGLANG_STANDIN_FAIL_EVERY              N: every N-th generation request
                                                                (counted from 1 over all generation
                                                                routes) answers 500 (default 0: none)

Non-streamed answers are not paced. ``--port 0`` picks a free port; the first line on stdout
always says where it listens.

The logprob API (what ``sglang-deploy quality`` speaks, shapes from sglang 0.5.17's tokenizer_manager.py and
logprob_result_processor.py): ``POST /tokenize`` ({"tokens", "count", "max_model_len"}), and a non-streamed
``POST /generate`` with ``return_logprob`` answered by a small language model instead of the rule table. Its
tokens are digits, words and punctuation marks (LM_TOKEN), each an id by its CRC-32; its next-token
distribution is a fixed function of the last two ids (Gaussian logits seeded by them, one favoured token), so
greedy decoding and teacher-forced scoring are deterministic and a top-k has real spread. ``input_top_logprobs``
starts with null at ``logprob_start_len`` and each entry is ``[logprob, token_id, null]``, as sglang's.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import itertools
import functools
import json
import math
import os
import random
import re
import secrets
import socket
import ssl
import sys
import threading
import time
import urllib.parse
import uuid
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator, Optional

MODES = ("ok", "garble", "never-ready", "stall", "busy", "empty", "redirect", "repeat", "runon",
         "constant", "drift", "batch-race", "no-logprobs", "retokenized")
# What a constant server answers to every chat: the right answer to each default probe at once.
CONSTANT_ANSWER = "Paris 42 91 50 4817 def add(a, b): return a + b"
# The logprob model (module docstring): its vocabulary, special ids and tokenizer.
LM_VOCAB = 2048
LM_BOS, LM_EOS = 0, 1
LM_TOKEN = re.compile(r"\d|\w+|[^\w\s]")
# The favoured next token's lift over the Gaussian logits (nats): a top-1 of about 0.5, the rest spread.
LM_FAVOURED = 8.0
LM_SPREAD = 1.5
# drift: noise added to every logit; batch-race: the noise while another generation runs.
LM_DRIFT = 0.7
LM_RACE = 4.0
# Prefill tokens a busy stand-in reports computing per second (sglang:realtime_tokens_total{mode="prefill_compute"}).
BUSY_TOKENS_PER_S = 2048
GARBLE = "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
CONTEXT_LEN = 202752
SGLANG_VERSION = "0.5.10.post1"
THINKING = "The user asks a short question; answer it directly."
# Words appended to a stream that must reach max_new_tokens (ignore_eos, as bench_serving asks).
FILLER = "and the model keeps on generating tokens until the length limit".split()
# How long a stalled request is held before its thread gives up (the client's deadline ends it first).
STALL_S = 600.0
GENERATION_ROUTES = ("/generate", "/v1/chat/completions", "/v1/completions")
# A chunked request body larger than this is refused (a bound on what the stand-in reads).
MAX_CHUNKED_BODY = 16 << 20


def _env_number(name: str, default: str) -> float:
    return float(os.environ.get(name, default))


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sglang.launch_server (stand-in)")
    parser.add_argument("--model-path", "--model", dest="model_path", default="standin/model")
    parser.add_argument("--served-model-name")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--api-key")
    parser.add_argument("--reasoning-parser")
    parser.add_argument("--tp-size", "--tp", dest="tp_size", type=int, default=1)
    parser.add_argument("--max-running-requests", type=int)
    parser.add_argument("--enable-metrics", action="store_true")
    parser.add_argument("--ssl-certfile")
    parser.add_argument("--ssl-keyfile")
    parser.add_argument("--ssl-ca-certs")
    parser.add_argument("--standin-mode", choices=MODES, default=os.environ.get("SGLANG_STANDIN_MODE", "ok"))
    parser.add_argument("--standin-mode-file", default=os.environ.get("SGLANG_STANDIN_MODE_FILE", ""))
    parser.add_argument("--standin-load-delay", type=float, default=_env_number("SGLANG_STANDIN_LOAD_DELAY", "2"))
    parser.add_argument("--standin-tokens-per-s", type=float, default=_env_number("SGLANG_STANDIN_TOKENS_PER_S", "0"))
    parser.add_argument(
        "--standin-max-tokens-per-s", type=float, default=_env_number("SGLANG_STANDIN_MAX_TOKENS_PER_S", "0")
    )
    parser.add_argument("--standin-ttft-ms", type=float, default=_env_number("SGLANG_STANDIN_TTFT_MS", "0"))
    parser.add_argument("--standin-fail-every", type=int, default=int(_env_number("SGLANG_STANDIN_FAIL_EVERY", "0")))
    parser.add_argument("--standin-redirect-to", default=os.environ.get("SGLANG_STANDIN_REDIRECT_TO", ""))
    # Every other sglang flag (--trust-remote-code, --mem-fraction-static 0.9, ...) is accepted and ignored.
    args, _ignored = parser.parse_known_args(argv)
    if args.standin_mode not in MODES:
        parser.error(f"--standin-mode {args.standin_mode!r}: choose from {MODES}")
    for name in ("standin_tokens_per_s", "standin_max_tokens_per_s", "standin_ttft_ms", "standin_fail_every"):
        value = getattr(args, name)
        if not math.isfinite(value) or value < 0:
            parser.error(f"--{name.replace('_', '-')} {value!r}: must be a finite number >= 0")
    return args


def _arithmetic(prompt: str) -> Optional[str]:
    match = re.search(r"(-?\d+)\s*([+\-*x×/])\s*(-?\d+)", prompt)
    if not match:
        return None
    a, op, b = int(match.group(1)), match.group(2), int(match.group(3))
    if op == "+":
        return str(a + b)
    if op == "-":
        return str(a - b)
    if op in ("*", "x", "×"):
        return str(a * b)
    return str(a // b) if b and a % b == 0 else (f"{a / b:g}" if b else "undefined")


_STEPS = (
    (re.compile(r"^double it$", re.I), lambda value, start, k: value * 2),
    (re.compile(r"^add (-?\d+)", re.I), lambda value, start, k: value + k),
    (re.compile(r"^multiply (?:that|it|the result) by (-?\d+)", re.I), lambda value, start, k: value * k),
    (re.compile(r"^(?:then )?subtract the number you started with", re.I), lambda value, start, k: value - start),
    (re.compile(r"^(?:then )?subtract (-?\d+)", re.I), lambda value, start, k: value - k),
)


def _steps(prompt: str) -> Optional[str]:
    """'Start with N. Double it. Add K ...' worked through, step by step (the multi-step probe)."""
    match = re.search(r"Start with (-?\d+)\.(.*?)What is the final number", prompt, re.I | re.S)
    if not match:
        return None
    start = value = int(match.group(1))
    for sentence in filter(None, (part.strip() for part in match.group(2).split("."))):
        for pattern, step in _STEPS:
            found = pattern.search(sentence)
            if found:
                value = step(value, start, int(found.group(1)) if found.groups() else 0)
                break
        else:
            return None  # a step this 'model' cannot do: no answer rather than a wrong one
    return str(value)


def _recall(prompt: str) -> Optional[str]:
    """The answer to a question about a fact in the prompt's notes (the long-context probe): the notes'
    sentence whose subject is the question's."""
    question = re.search(r"Question: What is (the [^?]+)\?", prompt)
    if not question:
        return None
    fact = re.search(re.escape(question.group(1)) + r" is (\S+?)\.(?:\s|$)", prompt, re.I)
    return fact.group(1) if fact else None


def rule_answer(prompt: str) -> str:
    """The stand-in's 'model': right answers for the default probes, a greeting otherwise."""
    recalled = _recall(prompt)
    if recalled is not None:
        return recalled
    worked = _steps(prompt)
    if worked is not None:
        return worked
    if re.search(r"capital of france", prompt, re.I):
        return "Paris"
    function = re.search(r"python function named (\w+)", prompt, re.I)
    if function:
        return f"```python\ndef {function.group(1)}(a, b):\n    return a + b\n```"
    number = _arithmetic(prompt)
    if number is not None:
        return number
    return "Hello! This is the sglang stand-in answering."


def _tokens(text: str) -> list[str]:
    return text.split()


def _stream_words(answer: str, max_tokens: int, ignore_eos: bool) -> list[str]:
    """The words a stream sends: the answer (cut at max_tokens), then filler up to max_tokens when
    the client asked to ignore the end of the answer (bench_serving's ignore_eos)."""
    words = _tokens(answer)
    if ignore_eos:
        words += list(itertools.islice(itertools.cycle(FILLER), max(0, max_tokens - len(words))))
    return words[:max_tokens]


def _user_prompt(messages: list[Any]) -> str:
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else json.dumps(content)
    return ""


def _max_tokens(request: dict[str, Any], *keys: str, default: int = 128) -> int:
    for key in keys:
        value = request.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return default


def lm_tokenize(text: str, special: bool, salt: str = "") -> list[int]:
    """The logprob model's token ids for ``text`` (a leading BOS with ``special``)."""
    ids = [LM_BOS] if special else []
    ids += [2 + zlib.crc32((salt + piece).encode("utf-8")) % (LM_VOCAB - 2) for piece in LM_TOKEN.findall(text)]
    return ids


@functools.lru_cache(maxsize=1 << 16)
def lm_logprobs(before: int, last: int, noise_seed: int = 0, noise: float = 0.0) -> tuple[float, ...]:
    """log P(next | ..., before, last): Gaussian logits seeded by the two ids, one favoured token, EOS unlikely;
    ``noise`` (seeded by ``noise_seed``) moves every logit, as a launch that computes the model differently."""
    rng = random.Random(before * 1_000_003 + last * 7_919 + 17)
    logits = [rng.gauss(0.0, LM_SPREAD) for _ in range(LM_VOCAB)]
    logits[2 + (before * 31 + last * 17 + 5) % (LM_VOCAB - 2)] += LM_FAVOURED
    logits[LM_EOS] = -8.0
    logits[LM_BOS] = -30.0
    if noise:
        jitter = random.Random(noise_seed * 7_777 + before * 31 + last)
        logits = [value + jitter.gauss(0.0, noise) for value in logits]
    top = max(logits)
    norm = top + math.log(sum(math.exp(value - top) for value in logits))
    return tuple(value - norm for value in logits)


def lm_top(logprobs: tuple[float, ...], k: int) -> list[list[Any]]:
    best = sorted(range(len(logprobs)), key=lambda token: -logprobs[token])[:k]
    return [[logprobs[token], token, None] for token in best]


class Pacer:
    """When each token of a streamed answer is due (see the module docstring for the model)."""

    def __init__(self, per_request: float, total: float, ttft_s: float) -> None:
        self.per_request = per_request
        self.total = total
        self.ttft_s = ttft_s
        self._lock = threading.Lock()
        self._active = 0

    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        """Counts a generation request as in progress (n of the model) while the block runs."""
        with self._lock:
            self._active += 1
        try:
            yield
        finally:
            with self._lock:
                self._active -= 1

    @property
    def active(self) -> int:
        """Generation requests in progress now."""
        with self._lock:
            return self._active

    def interval(self) -> float:
        """Seconds from one token to the next at the current number of requests in progress."""
        with self._lock:
            active = max(1, self._active)
        rates = [rate for rate in (self.per_request, self.total / active if self.total else 0.0) if rate > 0]
        return 1.0 / min(rates) if rates else 0.0

    def schedule(self, count: int) -> Iterator[int]:
        """Yields 1..count, each when that token is due: the first after ttft, then one interval
        apart on a fixed schedule (a late wake-up does not push the later tokens back)."""
        due = time.monotonic() + self.ttft_s
        for number in range(1, count + 1):
            if number > 1:
                due += self.interval()
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            yield number


class StandinState:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.served_name = args.served_model_name or args.model_path
        self.started = time.monotonic()
        self.started_wall = time.time()
        self.pacer = Pacer(args.standin_tokens_per_s, args.standin_max_tokens_per_s, args.standin_ttft_ms / 1000.0)
        self._requests = itertools.count(1)
        self._count_lock = threading.Lock()
        self.generations = 0
        self.decoded = 0  # tokens generated (/generate), sglang:realtime_tokens_total{mode="decode"}
        self.busy_since: Optional[float] = None  # when /metrics first saw the busy mode

    @property
    def mode(self) -> str:
        """--standin-mode, or the mode file's when it was written after this server started."""
        path = self.args.standin_mode_file
        if path:
            try:
                if os.stat(path).st_mtime >= self.started_wall:
                    with open(path, encoding="utf-8") as handle:
                        wanted = handle.read(64).strip()
                    if wanted in MODES:
                        return wanted
            except OSError:
                pass  # no file: the launch mode
        return str(self.args.standin_mode)

    @property
    def loading(self) -> bool:
        if self.mode == "never-ready":
            return True
        return time.monotonic() - self.started < self.args.standin_load_delay

    def next_generation_number(self) -> int:
        with self._count_lock:
            self.generations += 1
            return next(self._requests)

    def count_tokens(self, tokens: int) -> None:
        with self._count_lock:
            self.decoded += tokens

    def metrics_text(self) -> str:
        """Some of sglang's own metrics (srt/observability/metrics_collector.py names), labelled as it does:
        the scheduler's token counters move with what it computes (a busy stand-in's prefill keeps growing;
        a stalled one's stands still)."""
        with self._count_lock:
            served, decoded = self.generations, self.decoded
        if self.mode == "busy":
            self.busy_since = self.busy_since or time.monotonic()
            prefill = int((time.monotonic() - self.busy_since) * BUSY_TOKENS_PER_S)
        else:
            prefill = 0
        label = f'{{model_name="{self.served_name}"}}'
        rank = f'model_name="{self.served_name}",tp_rank="0"'
        return (
            "# HELP sglang:num_requests_total Number of requests processed.\n"
            "# TYPE sglang:num_requests_total counter\n"
            f"sglang:num_requests_total{label} {served}.0\n"
            "# HELP sglang:num_running_reqs The number of running requests.\n"
            "# TYPE sglang:num_running_reqs gauge\n"
            f"sglang:num_running_reqs{label} {1.0 if self.mode == 'busy' else 0.0}\n"
            "# HELP sglang:realtime_tokens_total Total number of tokens processed (updated on each log interval).\n"
            "# TYPE sglang:realtime_tokens_total counter\n"
            f'sglang:realtime_tokens_total{{mode="prefill_compute",{rank}}} {float(prefill)}\n'
            f'sglang:realtime_tokens_total{{mode="decode",{rank}}} {float(decoded)}\n'
        )

    def answer_for(self, prompt: str) -> str:
        if self.mode == "constant":
            return CONSTANT_ANSWER
        return GARBLE if self.mode == "garble" else rule_answer(prompt)

    def distribution(self, ids: list[int], position: int, racing: bool = False) -> tuple[float, ...]:
        """The logprob model's distribution for the token at ``position`` of ``ids`` (given those before it)."""
        before = ids[position - 2] if position >= 2 else LM_BOS
        last = ids[position - 1] if position >= 1 else LM_BOS
        if self.mode == "constant":
            return lm_logprobs(LM_BOS, LM_BOS)
        if self.mode == "drift":
            return lm_logprobs(before, last, 1, LM_DRIFT)
        if racing:
            return lm_logprobs(before, last, 2, LM_RACE)
        return lm_logprobs(before, last)

    def logprob_generate(self, request: dict[str, Any], racing: bool) -> dict[str, Any]:
        """A non-streamed /generate with return_logprob, answered by the logprob model (module docstring)."""
        params = request.get("sampling_params") or {}
        max_new = params.get("max_new_tokens", 128)
        ids = request.get("input_ids")
        if not isinstance(ids, list):
            ids = lm_tokenize(str(request.get("text") or ""), True, "x" if self.mode == "retokenized" else "")
        ids = list(ids)
        prompt_len = len(ids)
        start = request.get("logprob_start_len", -1)
        start = prompt_len if not isinstance(start, int) or start < 0 else start
        k = request.get("top_logprobs_num") or 0
        input_lp: list[Any] = []
        input_top: list[Any] = []
        for position in range(start, prompt_len):
            if position == start:
                input_lp.append([None, ids[position], None])
                input_top.append(None)
                continue
            dist = self.distribution(ids, position)
            input_lp.append([dist[ids[position]], ids[position], None])
            input_top.append(lm_top(dist, k) if k else None)
        output_lp: list[Any] = []
        output_top: list[Any] = []
        finish: dict[str, Any] = {"type": "length", "length": max_new}
        for _ in range(max_new):
            dist = self.distribution(ids, len(ids), racing and len(ids) > prompt_len + 2)
            token = max(range(LM_VOCAB), key=lambda t: dist[t])
            ids.append(token)
            output_lp.append([dist[token], token, None])
            output_top.append(lm_top(dist, k) if k else None)
            if token == LM_EOS:
                finish = {"type": "stop", "matched": LM_EOS}
                break
        self.count_tokens(len(output_lp))
        meta: dict[str, Any] = {
            "id": uuid.uuid4().hex, "finish_reason": finish, "prompt_tokens": prompt_len,
            "completion_tokens": len(output_lp), "cached_tokens": 0, "weight_version": "default",
        }
        if self.mode != "no-logprobs":
            meta.update({"input_token_logprobs": input_lp, "output_token_logprobs": output_lp})
            if k:
                meta.update({"input_top_logprobs": input_top, "output_top_logprobs": output_top})
        return {"text": " ".join(f"w{token}" for token in ids[prompt_len:]), "output_ids": ids[prompt_len:], "meta_info": meta}

    def server_info(self) -> dict[str, Any]:
        """A trimmed ``/server_info``: sglang returns every ServerArgs field, api_key in clear."""
        args = self.args
        return {
            "model_path": args.model_path,
            "tokenizer_path": args.model_path,
            "served_model_name": self.served_name,
            "host": args.host,
            "port": args.port,
            "api_key": args.api_key,
            "admin_api_key": None,
            "ssl_keyfile_password": None,
            "tp_size": args.tp_size,
            "max_running_requests": args.max_running_requests,
            "reasoning_parser": args.reasoning_parser,
            "standin": {
                "mode": args.standin_mode,
                "tokens_per_s": args.standin_tokens_per_s,
                "max_tokens_per_s": args.standin_max_tokens_per_s,
                "ttft_ms": args.standin_ttft_ms,
                "fail_every": args.standin_fail_every,
            },
            "internal_states": [{}],
            "version": SGLANG_VERSION,
        }

    def complete(self, request: dict[str, Any]) -> dict[str, Any]:
        prompt = _user_prompt(request.get("messages") or [])
        answer = self.answer_for(prompt)
        max_tokens = _max_tokens(request, "max_tokens", "max_completion_tokens")
        # Thinking spends tokens first, as in a reasoning model; a small max_tokens cuts the answer.
        budget = max(0, max_tokens - len(_tokens(THINKING)))
        words = _tokens(answer)
        if self.mode in ("repeat", "runon"):  # never stops by itself: every token up to max_tokens
            tail = itertools.cycle(words) if self.mode == "repeat" else (f"{w}{n}" for n in itertools.count() for w in FILLER)
            words = list(itertools.islice(itertools.chain(words, tail), budget + 1))
        finish = "stop" if budget >= len(words) else "length"
        kept = " ".join(words) if finish == "stop" else " ".join(words[:budget])
        if self.separates_reasoning(request):
            message = {"role": "assistant", "content": kept, "reasoning_content": THINKING, "tool_calls": None}
        else:
            message = {
                "role": "assistant",
                "content": f"<think>{THINKING}</think>{kept}",
                "reasoning_content": None,
                "tool_calls": None,
            }
        completion_tokens = len(_tokens(THINKING)) + len(_tokens(kept))
        prompt_tokens = len(_tokens(prompt))
        return {
            "id": uuid.uuid4().hex,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.get("model") or self.served_name,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": finish,
                    "matched_stop": 151336 if finish == "stop" else None,
                }
            ],
            "usage": _usage(prompt_tokens, completion_tokens, reasoning=len(_tokens(THINKING))),
            "metadata": {"weight_version": "default"},
        }

    def separates_reasoning(self, request: dict[str, Any]) -> bool:
        return bool(self.args.reasoning_parser) and bool(request.get("separate_reasoning", True))


def _usage(prompt_tokens: int, completion_tokens: int, reasoning: int = 0) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
        "reasoning_tokens": reasoning,
    }


def _sse(body: Any) -> bytes:
    return b"data: " + (body if isinstance(body, bytes) else json.dumps(body).encode("utf-8")) + b"\n\n"


class StandinServer(ThreadingHTTPServer):
    daemon_threads = True
    # A benchmark connects up to its concurrency at once; the default backlog (5) would drop SYNs
    # and add a second's retransmit to their time to first token.
    request_queue_size = 1024
    # TLS (--ssl-certfile): each accepted connection is wrapped; its handshake runs in the request's own
    # thread (on its first read), so a client that never completes one holds no other.
    tls: Optional[ssl.SSLContext] = None

    def get_request(self) -> Any:
        conn, address = super().get_request()
        if self.tls is not None:
            conn = self.tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
        return conn, address


def tls_context(args: argparse.Namespace) -> Optional[ssl.SSLContext]:
    """uvicorn's server context from sglang's flags (sglang's own checks first: both files, each present);
    --ssl-ca-certs is loaded as uvicorn does, without asking clients for a certificate."""
    if not args.ssl_certfile and not args.ssl_keyfile:
        return None
    if not (args.ssl_certfile and args.ssl_keyfile):
        raise SystemExit("--ssl-certfile and --ssl-keyfile go together")
    for path in filter(None, (args.ssl_certfile, args.ssl_keyfile, args.ssl_ca_certs)):
        if not os.path.isfile(path):
            raise SystemExit(f"SSL file not found: {path!r}")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(args.ssl_certfile, args.ssl_keyfile)
    if args.ssl_ca_certs:
        context.load_verify_locations(args.ssl_ca_certs)
    return context


def warmup_url(args: argparse.Namespace, port: int) -> str:
    """sglang's ServerArgs.url(): its own requests go to the bound address (loopback for a wildcard)."""
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(args.host, args.host)
    host = f"[{host}]" if ":" in host else host
    return f"{'https' if args.ssl_certfile else 'http'}://{host}:{port}"


def warmup(args: argparse.Namespace, port: int) -> bool:
    """sglang's warmup request over TLS: GET /health at :func:`warmup_url`, the certificate verified against
    --ssl-ca-certs (sglang's ssl_verify(); without it sglang turns the check off, and so does this)."""
    if not args.ssl_certfile:
        return True
    context = ssl.create_default_context(cafile=args.ssl_ca_certs) if args.ssl_ca_certs else ssl._create_unverified_context()
    url = warmup_url(args, port)
    parts = urllib.parse.urlsplit(url)
    try:
        conn = http.client.HTTPSConnection(str(parts.hostname), parts.port, timeout=10, context=context)
        conn.request("GET", "/health")
        conn.getresponse().read()
        conn.close()
    except (OSError, http.client.HTTPException) as err:
        print(f"Initialization failed. warmup error: GET {url}/health: {err}", file=sys.stderr, flush=True)
        return False
    return True


def make_handler(state: StandinState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "uvicorn"
        sys_version = ""
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            # Each token leaves at once: Nagle's algorithm would hold small writes back for an ACK.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - base class name
            # uvicorn-like access log line on stdout (the unit's journal).
            print(f'INFO:     {self.client_address[0]} - "{self.requestline}" {args[1] if len(args) > 1 else ""}', flush=True)

        def _send(self, status: int, body: Optional[Any] = None) -> None:
            data = b"" if body is None else json.dumps(body).encode("utf-8")
            self.send_response(status)
            if body is not None:
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            # srt/utils/auth.py: /health* and /metrics are always open; else Bearer <api_key>.
            if self.path.startswith("/health") or self.path.startswith("/metrics") or not state.args.api_key:
                return True
            parts = (self.headers.get("Authorization") or "").split(" ", 1)
            return len(parts) == 2 and parts[0].lower() == "bearer" and secrets.compare_digest(
                parts[1], state.args.api_key
            )

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if not self._authorized():
                self._send(401, {"error": "Unauthorized"})
            elif self.path in ("/health", "/health_generate"):
                self._send(503 if state.loading else 200)
            elif self.path == "/v1/models":
                card = {
                    "id": state.served_name,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "sglang",
                    "root": state.served_name,
                    "parent": None,
                    "max_model_len": CONTEXT_LEN,
                }
                self._send(200, {"object": "list", "data": [card]})
            elif self.path in ("/server_info", "/get_server_info"):
                self._send(200, state.server_info())
            elif self.path == "/metrics" and state.args.enable_metrics:
                data = state.metrics_text().encode("utf-8")
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            else:
                self._send(404, {"detail": "Not Found"})

        def _body(self) -> Optional[bytes]:
            """The request body: Content-Length, or chunked (as uvicorn reads it; smg streams bodies so with some
            policies). None for a malformed or oversized chunked body (the connection is closed)."""
            if "chunked" not in (self.headers.get("Transfer-Encoding") or "").lower():
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""
            body = b""
            while True:
                line = self.rfile.readline(64).split(b";", 1)[0].strip()
                try:
                    size = int(line, 16)
                except ValueError:
                    size = -1
                if size < 0 or len(body) + size > MAX_CHUNKED_BODY:
                    self.close_connection = True
                    return None
                if size == 0:
                    while self.rfile.readline(1024).strip():  # trailers, up to the blank line
                        pass
                    return body
                body += self.rfile.read(size)
                self.rfile.readline(8)  # the CRLF after each chunk

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            raw = self._body()
            if raw is None:
                self._send(400, {"detail": "malformed chunked body"})
                return
            if not self._authorized():
                self._send(401, {"error": "Unauthorized"})
                return
            if self.path in ("/tokenize", "/v1/tokenize"):
                self._tokenize(raw)
                return
            if self.path not in GENERATION_ROUTES:
                self._send(404, {"detail": "Not Found"})
                return
            try:
                request = json.loads(raw or b"null")
            except ValueError:
                request = None
            problem = self._request_problem(request)
            if problem:
                self._send(400, {"object": "error", "message": problem, "type": "BadRequestError", "param": None, "code": 400})
                return
            assert isinstance(request, dict)
            number = state.next_generation_number()
            every = state.args.standin_fail_every
            if every and number % every == 0:
                message = f"stand-in: generation request {number} fails on purpose (--standin-fail-every {every})"
                self._send(500, {"object": "error", "message": message, "type": "InternalServerError", "param": None, "code": 500})
                return
            if state.mode == "redirect":
                self.send_response(307)
                self.send_header("Location", state.args.standin_redirect_to.rstrip("/") + self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            with state.pacer.request():
                if state.mode in ("stall", "busy"):
                    self._stall(bool(request.get("stream")))
                elif self.path == "/generate" and request.get("return_logprob") and not request.get("stream"):
                    if state.mode == "batch-race":
                        time.sleep(0.05)  # hold the request, so that a batch's requests run together
                    racing = state.mode == "batch-race" and state.pacer.active > 1
                    self._send(200, state.logprob_generate(request, racing))
                elif self.path == "/generate":
                    self._generate(request)
                elif self.path == "/v1/completions":
                    self._completions(request)
                elif request.get("stream"):
                    self._chat_stream(request)
                else:
                    self._send(200, state.complete(request))

        def _tokenize(self, raw: bytes) -> None:
            """sglang's /tokenize (openai/serving_tokenize.py): one prompt, or a list of them."""
            try:
                request = json.loads(raw or b"null")
            except ValueError:
                request = None
            prompt = request.get("prompt") if isinstance(request, dict) else None
            if not isinstance(prompt, (str, list)):
                self._send(400, {"object": "error", "message": "prompt: Field required", "type": "BadRequestError", "code": 400})
                return
            special = bool(request.get("add_special_tokens", True))
            salt = "x" if state.mode == "retokenized" else ""
            if isinstance(prompt, str):
                tokens: Any = lm_tokenize(prompt, special, salt)
                count: Any = len(tokens)
            else:
                tokens = [lm_tokenize(str(p), special, salt) for p in prompt]
                count = [len(t) for t in tokens]
            self._send(200, {"tokens": tokens, "count": count, "max_model_len": CONTEXT_LEN})

        def _request_problem(self, request: Any) -> Optional[str]:
            if not isinstance(request, dict):
                return "the body must be a JSON object"
            if self.path == "/v1/chat/completions" and not isinstance(request.get("messages"), list):
                return "messages: Field required"
            if self.path == "/v1/completions" and "prompt" not in request:
                return "prompt: Field required"
            if self.path == "/generate" and "text" not in request and "input_ids" not in request:
                return "Either text or input_ids should be provided."
            return None

        # -- streaming ------------------------------------------------------------------------
        def _stream(self, events: Iterator[bytes]) -> None:
            """Server-sent events in HTTP/1.1 chunks (as uvicorn sends sglang's StreamingResponse)."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for event in itertools.chain(events, [_sse(b"[DONE]")]):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client went away; nothing left to tell it

        def _paced(self, words: list[str], event: Callable[[int, str], bytes]) -> Iterator[bytes]:
            for number in state.pacer.schedule(len(words)):
                yield event(number, words[number - 1])

        def _stall(self, stream: bool) -> None:
            if stream:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream; charset=utf-8")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
            time.sleep(STALL_S)
            self.close_connection = True

        def _generate(self, request: dict[str, Any]) -> None:
            """sglang's /generate: every event carries all text so far and the token count."""
            params = request.get("sampling_params") or {}
            max_new = _max_tokens(params, "max_new_tokens")
            input_ids = request.get("input_ids")
            prompt = request.get("text") if isinstance(request.get("text"), str) else ""
            prompt_tokens = len(input_ids) if isinstance(input_ids, list) else len(_tokens(prompt))
            words = _stream_words(state.answer_for(prompt), max_new, bool(params.get("ignore_eos")))
            if state.mode == "empty":
                words = []
            rid = uuid.uuid4().hex
            started = time.monotonic()

            def body(count: int) -> dict[str, Any]:
                done = count == len(words)
                reason = None
                if done:
                    reason = {"type": "length", "length": count} if count == max_new else {"type": "stop", "matched": None}
                return {
                    "text": " ".join(words[:count]),
                    "meta_info": {
                        "id": rid,
                        "finish_reason": reason,
                        "prompt_tokens": prompt_tokens,
                        "weight_version": "default",
                        "total_retractions": 0,
                        "reasoning_tokens": 0,
                        "completion_tokens": count,
                        "cached_tokens": 0,
                        "e2e_latency": time.monotonic() - started,
                    },
                }

            state.count_tokens(len(words))
            if request.get("stream"):
                self._stream(self._paced(words, lambda count, _word: _sse(body(count))))
            else:
                self._send(200, body(len(words)))

        def _completions(self, request: dict[str, Any]) -> None:
            prompt = request.get("prompt") if isinstance(request.get("prompt"), str) else ""
            max_tokens = _max_tokens(request, "max_tokens")
            words = _stream_words(state.answer_for(prompt), max_tokens, bool(request.get("ignore_eos")))
            finish = "length" if len(words) == max_tokens else "stop"
            base = {"id": uuid.uuid4().hex, "object": "text_completion", "created": int(time.time()),
                    "model": request.get("model") or state.served_name}  # fmt: skip
            if not request.get("stream"):
                choice = {"index": 0, "text": " ".join(words), "logprobs": None, "finish_reason": finish, "matched_stop": None}
                self._send(200, {**base, "choices": [choice], "usage": _usage(len(_tokens(prompt)), len(words))})
                return

            def event(number: int, word: str) -> bytes:
                last = number == len(words)
                choice = {"index": 0, "text": (" " if number > 1 else "") + word, "logprobs": None,
                          "finish_reason": finish if last else None, "matched_stop": None}  # fmt: skip
                usage = _usage(len(_tokens(prompt)), number) if last else None
                return _sse({**base, "choices": [choice], "usage": usage})

            self._stream(self._paced(words, event))

        def _chat_stream(self, request: dict[str, Any]) -> None:
            """chat.completion.chunk events: thinking as reasoning_content deltas (with a reasoning
            parser; else inside <think> in content), then the answer as content deltas."""
            prompt = _user_prompt(request["messages"])
            max_tokens = _max_tokens(request, "max_tokens", "max_completion_tokens")
            ignore_eos = bool(request.get("ignore_eos"))
            separate = state.separates_reasoning(request)
            thinking = _tokens(THINKING) if separate else _tokens(f"<think>{THINKING}</think>")
            words = _stream_words(" ".join(thinking + [state.answer_for(prompt)]), max_tokens, ignore_eos)
            finish = "length" if len(words) == max_tokens else "stop"
            base = {"id": uuid.uuid4().hex, "object": "chat.completion.chunk", "created": int(time.time()),
                    "model": request.get("model") or state.served_name}  # fmt: skip
            include_usage = bool((request.get("stream_options") or {}).get("include_usage"))

            def event(number: int, word: str) -> bytes:
                text = (" " if number > 1 else "") + word
                field = "reasoning_content" if separate and number <= len(thinking) else "content"
                delta = {"role": "assistant", field: text} if number == 1 else {field: text}
                last = number == len(words)
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish if last else None,
                          "matched_stop": None}  # fmt: skip
                chunk = _sse({**base, "choices": [choice], "usage": None})
                if last and include_usage:
                    chunk += _sse({**base, "choices": [], "usage": _usage(len(_tokens(prompt)), number)})
                return chunk

            self._stream(self._paced(words, event))

    return Handler


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    state = StandinState(args)
    server = StandinServer((args.host, args.port), make_handler(state))
    server.tls = tls_context(args)
    host, port = server.server_address[:2]
    print(
        f"sglang stand-in: serving {state.served_name!r} on {'https' if server.tls else 'http'}://{host}:{port} "
        f"mode={args.standin_mode} load_delay={args.standin_load_delay}s "
        f"reasoning_parser={args.reasoning_parser or 'none'} api_key={'set' if args.api_key else 'none'} "
        f"tokens_per_s={args.standin_tokens_per_s:g} max_tokens_per_s={args.standin_max_tokens_per_s:g} "
        f"ttft_ms={args.standin_ttft_ms:g} fail_every={args.standin_fail_every}",
        flush=True,
    )
    # Real sglang logs its whole ServerArgs, the API key in clear, in the main process
    # (entrypoints/engine.py) and again in each scheduler: the launcher must mask it.
    print(
        f"server_args=ServerArgs(model_path={args.model_path!r}, host={args.host!r}, port={args.port}, "
        f"api_key={args.api_key!r}, served_model_name={state.served_name!r})",
        file=sys.stderr,
        flush=True,
    )
    if args.standin_mode == "never-ready":
        print("sglang stand-in: never-ready mode: /health_generate answers 503 forever", flush=True)
    else:
        def fired_up() -> None:
            if not warmup(args, port):
                os._exit(1)  # sglang kills its own process tree when its warmup fails
            print("sglang stand-in: The server is fired up and ready to roll!", flush=True)

        threading.Timer(args.standin_load_delay, fired_up).start()
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
