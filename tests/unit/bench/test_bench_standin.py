"""The sglang stand-in's streams, which the benchmark tests measure: shapes of sglang 0.5.10.post1's
/generate and OpenAI streams, exact token counts, the pacing model (first token after the TTFT, then
1/min(R, C/n) apart), injected failures and the stall. Plain HTTP on 127.0.0.1, no bench_serving
(tests/unit/bench/test_bench_serving.py runs that)."""

from __future__ import annotations

import http.client
import json
import select
import threading
import time
from typing import Any

import pytest
from conftest import StandinProcess as Standin

KEY = "standin-stream-key"


# Every stand-in here: ready at once, and clients send the key.
STANDIN_ARGS = ("--standin-load-delay", "0", "--api-key", KEY)


def post(server: Standin, path: str, body: dict[str, Any], key: str = KEY, timeout: float = 30) -> tuple[int, list[Any], list[float]]:
    """Status, the parsed events (or the one JSON body) and each event's arrival time (monotonic)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    conn.request("POST", path, json.dumps(body), {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    response = conn.getresponse()
    if not response.getheader("Content-Type", "").startswith("text/event-stream"):
        data = json.loads(response.read())
        conn.close()
        return response.status, [data], [time.monotonic()]
    events, times = [], []
    for line in response:  # http.client undoes the chunked framing
        if line.startswith(b"data: "):
            payload = line[len(b"data: "):].strip()
            events.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
            times.append(time.monotonic())
    conn.close()
    return response.status, events, times


def generate(max_new: int, **extra: Any) -> dict[str, Any]:
    return {"input_ids": list(range(100)), "stream": True,
            "sampling_params": {"max_new_tokens": max_new, "ignore_eos": True, "temperature": 0.0}, **extra}  # fmt: skip


def test_generate_streams_all_text_so_far_and_the_token_count(standin: Standin) -> None:
    status, events, _ = post(standin, "/generate", generate(20))
    assert status == 200 and events[-1] == "[DONE]"
    chunks = events[:-1]
    assert [c["meta_info"]["completion_tokens"] for c in chunks] == list(range(1, 21))
    assert all(len(c["text"].split()) == c["meta_info"]["completion_tokens"] for c in chunks)
    assert all(c["meta_info"]["prompt_tokens"] == 100 for c in chunks)
    assert [c["meta_info"]["finish_reason"] for c in chunks][-2:] == [None, {"type": "length", "length": 20}]
    # Without ignore_eos the answer ends where it ends.
    _, short, _ = post(standin, "/generate", {"text": "What is 2+3?", "stream": True, "sampling_params": {"max_new_tokens": 20}})
    assert short[-2]["text"] == "5" and short[-2]["meta_info"]["finish_reason"] == {"type": "stop", "matched": None}


@pytest.mark.parametrize("standin", [("--reasoning-parser", "glm45")], indirect=True)
def test_chat_streams_thinking_as_reasoning_content_then_the_answer(standin: Standin) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "What is the capital of France?"}], "stream": True,
            "max_completion_tokens": 30, "ignore_eos": True, "stream_options": {"include_usage": True}}  # fmt: skip
    status, events, _ = post(standin, "/v1/chat/completions", body)
    assert status == 200 and events[-1] == "[DONE]"
    deltas = [e["choices"][0]["delta"] for e in events[:-1] if e["choices"]]
    assert len(deltas) == 30 and deltas[0]["role"] == "assistant"
    fields = ["reasoning_content" if "reasoning_content" in d else "content" for d in deltas]
    assert fields == ["reasoning_content"] * 9 + ["content"] * 21  # the 9 words of thinking come first
    assert "".join(d["content"] for d in deltas if "content" in d).split()[0] == "Paris"
    assert events[-2]["usage"]["completion_tokens"] == 30 and events[-3]["choices"][0]["finish_reason"] == "length"


def test_chat_without_a_reasoning_parser_keeps_thinking_in_content(standin: Standin) -> None:
    body = {"messages": [{"role": "user", "content": "What is 6*7?"}], "stream": True, "max_tokens": 100}
    _, events, _ = post(standin, "/v1/chat/completions", body)
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1])
    assert text.startswith("<think>The user") and text.endswith("</think> 42")


def test_completions_stream_text_pieces(standin: Standin) -> None:
    body = {"model": "m", "prompt": "What is 2+3?", "max_tokens": 8, "stream": True, "ignore_eos": True}
    _, events, _ = post(standin, "/v1/completions", body)
    pieces = [e["choices"][0]["text"] for e in events[:-1]]
    assert len(pieces) == 8 and pieces[0] == "5" and events[-2]["choices"][0]["finish_reason"] == "length"


def test_generation_needs_the_key_and_server_info_has_it_in_clear_like_sglang(standin: Standin) -> None:
    status, _, _ = post(standin, "/generate", generate(2), key="wrong")
    assert status == 401
    conn = http.client.HTTPConnection("127.0.0.1", standin.port, timeout=10)
    conn.request("GET", "/server_info", headers={"Authorization": f"Bearer {KEY}"})
    info = json.loads(conn.getresponse().read())
    assert info["api_key"] == KEY and info["version"] == "0.5.10.post1" and info["internal_states"] == [{}]


@pytest.mark.parametrize("standin", [("--standin-fail-every", "3")], indirect=True)
def test_every_nth_generation_request_fails(standin: Standin) -> None:
    statuses = [post(standin, "/generate", generate(2))[0] for _ in range(7)]
    assert statuses == [200, 200, 500, 200, 200, 500, 200]
    status, [body], _ = post(standin, "/v1/chat/completions", {"messages": []})
    assert status == 200  # the 8th request; the 9th fails
    status, [body], _ = post(standin, "/v1/completions", {"prompt": "x", "max_tokens": 2})
    assert status == 500 and "fails on purpose" in body["message"]


# -- pacing ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("standin", [("--standin-tokens-per-s", "100", "--standin-ttft-ms", "150")], indirect=True)
def test_a_stream_gets_its_first_token_after_the_ttft_then_one_each_1_over_r(standin: Standin) -> None:
    started = time.monotonic()
    _, events, times = post(standin, "/generate", generate(21))
    first, last = times[0] - started, times[-2] - started
    assert 0.15 <= first < 0.15 + 0.25
    # 20 intervals of 10 ms after the first token; kept on schedule, so not longer by much.
    assert 0.20 * 0.95 <= last - first < 0.20 + 0.25


@pytest.mark.parametrize("standin", [("--standin-tokens-per-s", "100", "--standin-max-tokens-per-s", "100")], indirect=True)
def test_the_aggregate_cap_shares_the_rate_among_requests_in_flight(standin: Standin) -> None:
    spans: list[float] = []

    def one() -> None:
        _, _, times = post(standin, "/generate", generate(31))
        spans.append(times[-2] - times[0])

    threads = [threading.Thread(target=one) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    # Alone: 30 intervals of 10 ms; two at once share 100 tok/s: 30 intervals of 20 ms.
    assert len(spans) == 2 and all(0.60 * 0.9 <= span < 0.60 + 0.3 for span in spans), spans


@pytest.mark.parametrize("standin", [("--standin-mode", "stall")], indirect=True)
def test_a_stalled_server_answers_health_but_never_sends_a_token(standin: Standin) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", standin.port, timeout=10)
    conn.request("GET", "/health_generate")
    assert conn.getresponse().status == 200
    conn = http.client.HTTPConnection("127.0.0.1", standin.port, timeout=10)
    conn.request("POST", "/generate", json.dumps(generate(5)), {"Authorization": f"Bearer {KEY}"})
    response = conn.getresponse()
    assert response.status == 200
    assert select.select([conn.sock], [], [], 2.0)[0] == [], "a stalled stream sent something"
    conn.close()
