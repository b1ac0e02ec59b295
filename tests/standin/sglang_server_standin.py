#!/usr/bin/env python3
"""STAND-IN for a serving sglang (``python -m sglang.launch_server``): no GPU, no model, stdlib only.

It speaks the part of sglang's HTTP API that the readiness gate and the endpoint suite use, with
routes, status codes and shapes taken from sglang 0.5.10.post1 ``srt/entrypoints/http_server.py``,
``srt/utils/auth.py`` and ``srt/entrypoints/openai/protocol.py``:

  GET  /health, /health_generate  503 (empty) while "loading", then 200 (empty); never need the key
  GET  /v1/models                 {"object": "list", "data": [{"id": <served name>, "object": "model", ...}]}
  POST /v1/chat/completions       OpenAI chat.completion; ``reasoning_content`` split off when
                                  --reasoning-parser is set (sglang's default separate_reasoning)
  anything but /health*           401 {"error": "Unauthorized"} without ``Authorization: Bearer <--api-key>``

It accepts sglang's launch argv (--model-path/--model, --served-model-name, --host, --port,
--api-key, --reasoning-parser; every other flag is ignored), so a test venv can install it as the
module ``sglang.launch_server`` and the real systemd unit starts it. Answers come from a small rule
table (capital of France, two-number arithmetic, a Python ``add`` function); they are right, so
the correctness gate passes, except in the modes below. Stand-in behaviour is chosen by options
or, under systemd, by environment variables (the unit's argv stays the inventory's):

  --standin-mode / SGLANG_STANDIN_MODE    ok (default) | garble (every answer is NaN-like
                                          "!!!!!!", as the seeds saw from a bad backend) |
                                          never-ready (/health* answer 503 forever)
  --standin-load-delay / SGLANG_STANDIN_LOAD_DELAY   seconds of "loading" (503) after start (default 2)

``--port 0`` picks a free port; the first line on stdout always says where it listens.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional

MODES = ("ok", "garble", "never-ready")
GARBLE = "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
CONTEXT_LEN = 202752


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sglang.launch_server (stand-in)")
    parser.add_argument("--model-path", "--model", dest="model_path", default="standin/model")
    parser.add_argument("--served-model-name")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--api-key")
    parser.add_argument("--reasoning-parser")
    parser.add_argument("--standin-mode", choices=MODES, default=os.environ.get("SGLANG_STANDIN_MODE", "ok"))
    parser.add_argument(
        "--standin-load-delay", type=float, default=float(os.environ.get("SGLANG_STANDIN_LOAD_DELAY", "2"))
    )
    # Every other sglang flag (--tp-size 8, --trust-remote-code, ...) is accepted and ignored.
    args, _ignored = parser.parse_known_args(argv)
    if args.standin_mode not in MODES:
        parser.error(f"--standin-mode {args.standin_mode!r}: choose from {MODES}")
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


def rule_answer(prompt: str) -> str:
    """The stand-in's 'model': right answers for the default probes, a greeting otherwise."""
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


class StandinState:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.served_name = args.served_model_name or args.model_path
        self.started = time.monotonic()

    @property
    def loading(self) -> bool:
        if self.args.standin_mode == "never-ready":
            return True
        return time.monotonic() - self.started < self.args.standin_load_delay

    def complete(self, request: dict[str, Any]) -> dict[str, Any]:
        messages = request.get("messages") or []
        prompt = ""
        for message in reversed(messages):
            if isinstance(message, dict) and message.get("role") == "user":
                content = message.get("content")
                prompt = content if isinstance(content, str) else json.dumps(content)
                break
        answer = GARBLE if self.args.standin_mode == "garble" else rule_answer(prompt)
        thinking = "The user asks a short question; answer it directly."
        max_tokens = request.get("max_tokens") or request.get("max_completion_tokens") or 128
        # Thinking spends tokens first, as in a reasoning model; a small max_tokens cuts the answer.
        budget = max(0, int(max_tokens) - len(_tokens(thinking)))
        words = _tokens(answer)
        finish = "stop" if budget >= len(words) else "length"
        kept = answer if finish == "stop" else " ".join(words[:budget])
        separate = request.get("separate_reasoning", True)
        if self.args.reasoning_parser and separate:
            message = {"role": "assistant", "content": kept, "reasoning_content": thinking, "tool_calls": None}
        else:
            message = {
                "role": "assistant",
                "content": f"<think>{thinking}</think>{kept}",
                "reasoning_content": None,
                "tool_calls": None,
            }
        completion_tokens = len(_tokens(thinking)) + len(_tokens(kept))
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
            "usage": {
                "prompt_tokens": prompt_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                "completion_tokens": completion_tokens,
                "prompt_tokens_details": None,
                "reasoning_tokens": len(_tokens(thinking)),
            },
            "metadata": {"weight_version": "default"},
        }


def make_handler(state: StandinState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "uvicorn"
        sys_version = ""
        protocol_version = "HTTP/1.1"

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
            else:
                self._send(404, {"detail": "Not Found"})

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if not self._authorized():
                self._send(401, {"error": "Unauthorized"})
                return
            if self.path != "/v1/chat/completions":
                self._send(404, {"detail": "Not Found"})
                return
            try:
                request = json.loads(raw or b"null")
            except ValueError:
                request = None
            if not isinstance(request, dict) or not isinstance(request.get("messages"), list):
                self._send(
                    400,
                    {"object": "error", "message": "messages: Field required", "type": "BadRequestError",
                     "param": None, "code": 400},
                )
                return
            self._send(200, state.complete(request))

    return Handler


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    state = StandinState(args)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(state))
    server.daemon_threads = True
    host, port = server.server_address[:2]
    print(
        f"sglang stand-in: serving {state.served_name!r} on http://{host}:{port} "
        f"mode={args.standin_mode} load_delay={args.standin_load_delay}s "
        f"reasoning_parser={args.reasoning_parser or 'none'} api_key={'set' if args.api_key else 'none'}",
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
        threading.Timer(
            args.standin_load_delay, lambda: print("sglang stand-in: The server is fired up and ready to roll!", flush=True)
        ).start()
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
