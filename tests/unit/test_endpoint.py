"""sglang_deploy.endpoint against the sglang HTTP stand-in over real HTTP on 127.0.0.1.

The stand-in (tests/standin/sglang_server_standin.py) runs as its own process on an ephemeral port,
in the modes the suites must tell apart: ok, garble (NaN-like "!!!!" answers), never-ready (503).
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT

from sglang_deploy import endpoint as ep

STANDIN = ROOT / "tests" / "standin" / "sglang_server_standin.py"
KEY = "unit-test-key"


class Standin:
    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(STANDIN), "--host", "127.0.0.1", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 15)
        assert ready, "stand-in did not print its address within 15 s"
        first = self.proc.stdout.readline()
        match = re.search(r"on (http://127\.0\.0\.1:\d+)", first)
        assert match, f"unexpected first line: {first!r}"
        self.url = match.group(1)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture()
def standin(request: pytest.FixtureRequest) -> Iterator[Standin]:
    args = getattr(request, "param", ())
    server = Standin(*args)
    try:
        yield server
    finally:
        server.stop()


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
    assert ep.base_url(flags) == url


def test_base_url_rejects_a_non_numeric_port() -> None:
    with pytest.raises(ValueError, match="port='http'"):
        ep.base_url({"port": "http"})


def test_served_model_name_falls_back_to_the_model_path() -> None:
    assert ep.served_model_name({"served-model-name": "glm-5", "model": "a/b"}) == "glm-5"
    assert ep.served_model_name({"model": "lukealonso/GLM-5-NVFP4"}) == "lukealonso/GLM-5-NVFP4"


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
    assert ep.answer_text({"content": content}) == answer


def test_target_from_render_reads_flags_and_the_key_reference() -> None:
    unit = (
        "[Service]\n"
        'ExecStart=/v/bin/python3 -m sglang.launch_server \\\n'
        "    --model lukealonso/GLM-5-NVFP4 \\\n"
        "    --served-model-name glm-5 \\\n"
        "    --api-key ${SGLANG_API_KEY} \\\n"
        "    --host 0.0.0.0 \\\n"
        "    --port 8000\n"
        "Restart=on-failure\n"
    )
    target = ep.target_from_render(unit, "# x\nSGLANG_API_KEY='s3cr%t $x'\n")
    assert (target.url, target.model, target.api_key) == ("http://127.0.0.1:8000", "glm-5", "s3cr%t $x")
    assert "s3cr" not in repr(target)
    with pytest.raises(ValueError, match=r"\$\{SGLANG_API_KEY\}"):
        ep.target_from_render(unit, "OTHER='1'\n")


def test_the_shipped_probes_load(tmp_path: Path) -> None:
    probes = ep.load_probes()
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
    with pytest.raises(ep.ProbeFileError) as err:
        ep.load_probes(path)
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
    results = ep.run_probes(server, "glm-5", ep.load_probes())
    assert [r.ok for r in results] == [True] * len(results), [r.describe() for r in results]


@pytest.mark.parametrize("standin", [(*OK_ARGS, "--standin-mode", "garble")], indirect=True)
def test_garbled_answers_fail_the_correctness_gate(standin: Standin) -> None:
    server = ep.Endpoint(standin.url, api_key=KEY, timeout=10)
    assert server.get("/health_generate").status == 200, "garbage still looks healthy"
    results = ep.run_probes(server, "glm-5", ep.load_probes())
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
        result = ep.run_probe(server, "glm-5", ep.load_probes()[0])
        assert not result.ok and "HTTP 401" in result.reason


@pytest.mark.parametrize("standin", [("--standin-load-delay", "1.5")], indirect=True)
def test_wait_ready_waits_out_the_load(standin: Standin) -> None:
    server = ep.Endpoint(standin.url, timeout=5)
    assert server.get("/health_generate").status == 503, "sglang answers 503 while starting"
    result = ep.wait_ready(server, 20, delays=ep.backoff_delays(0.2, 2, 1))
    assert result.ready and result.attempts >= 2 and result.waited_s >= 1.0


@pytest.mark.parametrize("standin", [("--standin-mode", "never-ready")], indirect=True)
def test_wait_ready_gives_up_at_the_budget(standin: Standin) -> None:
    server = ep.Endpoint(standin.url, timeout=5)
    start = time.monotonic()
    result = ep.wait_ready(server, 2.0, delays=ep.backoff_delays(0.2, 2, 1))
    elapsed = time.monotonic() - start
    assert not result.ready and "HTTP 503" in result.last
    assert 1.9 <= elapsed < 6, f"budget 2 s, waited {elapsed:.1f} s"


def test_wait_ready_stops_early_when_the_unit_failed() -> None:
    server = ep.Endpoint("http://127.0.0.1:9", timeout=1)  # discard port: nothing listens
    result = ep.wait_ready(server, 60, delays=ep.backoff_delays(0.1, 2, 1), unit_state=lambda: "unit x is failed")
    assert not result.ready and result.attempts == 1 and "unit x is failed" in result.last
    assert "no answer" in result.last


@pytest.mark.parametrize("standin", [("--standin-mode", "never-ready")], indirect=True)
def test_wait_ready_script_exits_1_with_the_reason(standin: Standin) -> None:
    port = standin.url.rsplit(":", 1)[1]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "src" / "sglang_deploy" / "endpoint.py"), "wait-ready",
         "--bind-host", "0.0.0.0", "--port", port, "--timeout", "1.5", "--initial-delay", "0.2", "--max-delay", "0.5"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert proc.returncode == 1
    assert f"NOT READY: http://127.0.0.1:{port}/health_generate" in proc.stdout and "HTTP 503" in proc.stdout


# -- sglang-deploy verify --endpoint -----------------------------------------------------------
def _verify(url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != ep.API_KEY_ENV}
    return subprocess.run(
        [sys.executable, "-m", "sglang_deploy.cli", "verify", "--endpoint", url, "--model", "glm-5", *extra],
        capture_output=True, text=True, timeout=300, check=False, cwd=ROOT, env=env,
    )  # fmt: skip


@pytest.mark.parametrize("standin", [OK_ARGS], indirect=True)
def test_verify_endpoint_passes_a_good_server_and_fails_a_wrong_key(standin: Standin) -> None:
    good = _verify(standin.url, "--api-key", KEY)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "6 passed" in good.stdout, good.stdout
    bad = _verify(standin.url, "--api-key", "wrong")
    assert bad.returncode == 1 and "401" in bad.stdout


@pytest.mark.parametrize("standin", [(*OK_ARGS, "--standin-mode", "garble")], indirect=True)
def test_verify_endpoint_fails_garbled_output_only_on_the_gate(standin: Standin, tmp_path: Path) -> None:
    proc = _verify(standin.url, "--api-key", KEY)
    assert proc.returncode == 1
    assert "FAILED" in proc.stdout and "test_correctness_gate" in proc.stdout and "1 failed, 5 passed" in proc.stdout, proc.stdout
    # --probes replaces the set: a probe the garbage matches passes.
    probes = tmp_path / "bangs.yml"
    probes.write_text("- {name: bangs, prompt: anything, expect: '^!+$', max_tokens: 64}\n")
    assert _verify(standin.url, "--api-key", KEY, "--probes", str(probes)).returncode == 0


def test_verify_refuses_a_bad_probes_file_before_contacting_anything(tmp_path: Path) -> None:
    probes = tmp_path / "p.yml"
    probes.write_text("- {prompt: x}\n")
    proc = _verify("http://127.0.0.1:9", "--probes", str(probes))
    assert proc.returncode == 2 and "'expect' must be a non-empty string" in proc.stderr
