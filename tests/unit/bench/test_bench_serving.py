"""sglang's own bench_serving (the lane's pinned 0.5.10.post1, from the validator venv) against the
stand-in, whose streams are paced so the right numbers are known beforehand (slow: ~6 minutes).

The stand-in sends each streamed request's first token TTFT after it arrived, then one token every
1/min(R, C/n) s for n requests in flight (tests/standin/sglang_server_standin.py). With c requests
kept in flight, each L tokens long, bench_serving must measure:
    ITL               = 1 / r,  r = min(R, C/c)
    output throughput = c * L / (TTFT + (L - 1) / r)     (every request takes TTFT + (L-1)/r)
    total throughput  = output throughput * (input_len + L) / L
TOLERANCE below is 10%: bench_serving and the stand-in share this machine's cores with everything
else, and a late token shows up as one long and one short gap (the stand-in keeps its schedule, so
the rate holds); on the 2-core CI machine the measured figures came within 2%, also at a load
average of 6. A mix-up of units or of per-request and aggregate rates is off by a factor of 2 or
more, far outside it. TTFT is one event, not a schedule, so it is held only to bounds: never before
the stand-in sends the token, and not as late as later tokens.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT
from conftest import StandinProcess as Standin

from sglang_deploy import cli
from sglang_deploy.bench import runs as bench_runs
from sglang_deploy.launch import validator_venv
from sglang_deploy.lanes.catalog import DEFAULT_LANE, load_lane
from sglang_deploy_host.serving import bench_steps as host_bench

sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
import bench_tokenizer  # noqa: E402

pytestmark = pytest.mark.slow
TOLERANCE = 0.10
KEY = "bench-serving-test-key-5c1e"
INPUT_LEN = 128
OUTPUT_LEN = 48


@pytest.fixture(scope="module")
def command() -> list[str]:
    return bench_runs.bench_command(load_lane(DEFAULT_LANE))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(bench_tokenizer.write(tmp_path_factory.mktemp("bench-tokenizer")))


@pytest.fixture()
def serve(tmp_path: Path) -> Iterator[Any]:
    started: list[Standin] = []

    def start(*args: str) -> Standin:
        started.append(Standin(tmp_path / f"standin-{len(started)}.log", "--standin-load-delay", "0", "--api-key", KEY, "--served-model-name", "tiny", *args))
        return started[-1]

    yield start
    for server in started:
        server.stop()


def settings(server: Standin, tokenizer: str, **changes: Any) -> host_bench.Settings:
    return host_bench.Settings(**{"base_url": server.url, "model": "tiny", "tokenizer": tokenizer, "backend": "sglang", "seed": 1, "input_len": INPUT_LEN,
                                  "output_len": OUTPUT_LEN, "timeout_s": 300.0, **changes})  # fmt: skip


def near(measured: float, expected: float) -> bool:
    return abs(measured - expected) <= TOLERANCE * expected


def expected_output_throughput(concurrency: int, rate: float, ttft_s: float, length: int = OUTPUT_LEN) -> float:
    return concurrency * length / (ttft_s + (length - 1) / rate)


def test_measured_throughput_and_itl_match_the_configured_rates(serve: Any, command: list[str], tokenizer: str) -> None:
    """R = 50 tok/s per request, C = 400 tok/s in all, TTFT 40 ms: at concurrency 1 and 4 each
    request streams at 50 tok/s (ITL 20 ms); at 16 the cap leaves 25 tok/s each (ITL 40 ms)."""
    server = serve("--standin-tokens-per-s", "50", "--standin-max-tokens-per-s", "400", "--standin-ttft-ms", "40")
    steps = host_bench.plan([1, 4, 16])
    results = bench_runs.run_sweep(command, settings(server, tokenizer), steps, KEY)
    for step, result, rate in zip(steps, results, (50.0, 50.0, 25.0)):
        record = result["record"]
        assert result["ok"] and result["failed_requests"] == 0, result
        assert record["completed"] == step.num_prompts and record["max_concurrency"] == step.concurrency
        # --tokenize-prompt and fixed lengths: exactly these many tokens each way.
        assert record["total_input_tokens"] == step.num_prompts * INPUT_LEN
        assert record["total_output_tokens"] == step.num_prompts * OUTPUT_LEN
        want = expected_output_throughput(step.concurrency, rate, 0.040)
        # Shown with `pytest -s`: what was measured against what the stand-in was set to.
        print(f"\nconcurrency {step.concurrency}: output {record['output_throughput']:.1f} tok/s (expected {want:.1f}), "
              f"median ITL {record['median_itl_ms']:.2f} ms / mean {record['mean_itl_ms']:.2f} ms (expected {1000 / rate:.1f}), "
              f"median TTFT {record['median_ttft_ms']:.1f} ms (stand-in 40), tolerance {TOLERANCE:.0%}")  # fmt: skip
        assert near(record["output_throughput"], want), (step, record["output_throughput"], want)
        assert near(record["total_throughput"], want * (INPUT_LEN + OUTPUT_LEN) / OUTPUT_LEN), (step, record["total_throughput"])
        assert near(record["median_itl_ms"], 1000 / rate), (step, record["median_itl_ms"])
        assert near(record["mean_itl_ms"], 1000 / rate), (step, record["mean_itl_ms"])
        # TTFT is one event, not a schedule: the client's own delays on a loaded machine add to it.
        # Never below the stand-in's 40 ms, and never as late as a later token.
        assert 40 <= record["median_ttft_ms"] < 40 + 5 * 1000 / rate, (step, record["median_ttft_ms"])


def test_the_openai_chat_route_measures_the_same_rate_but_a_reasoning_parser_hides_thinking_in_ttft(
    serve: Any, command: list[str], tokenizer: str
) -> None:
    """With --reasoning-parser the thinking (9 words here) streams as reasoning_content, which the
    chat backend does not count: its TTFT becomes TTFT + 9 intervals (220 ms). The sglang backend
    sees the first token (why it is the default). A token is never measured before the stand-in
    sends it, so the lower bounds are exact; the upper ones leave room for a loaded machine."""
    server = serve("--standin-tokens-per-s", "50", "--standin-ttft-ms", "40", "--reasoning-parser", "glm45")
    step = host_bench.Step(2, 10)
    chat = host_bench.run_step(command, settings(server, tokenizer, backend="sglang-oai-chat"), step, KEY)
    native = host_bench.run_step(command, settings(server, tokenizer), step, KEY)
    assert chat.ok and native.ok, (chat.problem, native.problem)
    assert chat.record is not None and native.record is not None
    assert near(chat.record["median_itl_ms"], 20.0) and near(native.record["median_itl_ms"], 20.0)
    assert 40 <= native.record["median_ttft_ms"] < 40 + 5 * 20, native.record["median_ttft_ms"]
    assert 40 + 9 * 20 <= chat.record["median_ttft_ms"] < 40 + 14 * 20, chat.record["median_ttft_ms"]


def test_server_errors_are_counted_sampled_and_fail_the_step(serve: Any, command: list[str], tokenizer: str) -> None:
    """Every 4th generation request answers 500: the 2 warm-up requests are numbers 1-2, the 10
    measured ones 3-12, so 4, 8 and 12 fail."""
    server = serve("--standin-fail-every", "4")
    result = host_bench.run_step(command, settings(server, tokenizer), host_bench.Step(2, 10), KEY)
    assert not result.ok and result.failed_requests == 3 and result.problem == "3 of 10 requests failed"
    assert result.record is not None and result.record["completed"] == 7
    assert any("fails on purpose" in sample for sample in result.error_samples), result.error_samples
    assert "errors" not in result.record and "itls" not in result.record


def test_a_server_that_answers_without_tokens_fails_the_step(serve: Any, command: list[str], tokenizer: str) -> None:
    """/generate answers 200 and streams nothing: bench_serving may count such requests as completed; a
    step without a single output token is a failure, not a throughput of 0. (Before: ok.)"""
    server = serve("--standin-mode", "empty")
    result = host_bench.run_step(command, settings(server, tokenizer), host_bench.Step(2, 10), KEY)
    assert not result.ok and result.failed_requests == 10, (result.problem, result.record)
    assert result.problem == "no output tokens: the server answered 10 of 10 requests with nothing"
    # bench_serving itself counted the requested length as if it had been generated.
    assert result.record is not None and result.record["total_output_tokens"] == 10 * OUTPUT_LEN


def test_a_redirect_to_another_server_fails_the_step_and_reaches_nothing(serve: Any, command: list[str], tokenizer: str,
                                                                         tmp_path: Path) -> None:  # fmt: skip
    """The server answers its generation requests with 307 to another (healthy) server: bench_serving's
    aiohttp follows redirects, which would measure the other server under this one's name. With
    redirects off every request fails (HTTP 307) and the other server sees no generation request.
    (Before: the step was ok, with the other server's numbers.)"""
    other = serve()
    server = serve("--standin-mode", "redirect", "--standin-redirect-to", other.url)
    result = host_bench.run_step(command, settings(server, tokenizer), host_bench.Step(1, 5), KEY)
    assert not result.ok and result.failed_requests == 5, (result.problem, result.record)
    assert result.problem is not None and "Temporary Redirect" in result.problem  # bench_serving's warm-up already fails
    assert "POST /generate" not in (tmp_path / "standin-0.log").read_text()


def test_a_hung_server_is_cut_off_at_the_step_timeout(serve: Any, command: list[str], tokenizer: str) -> None:
    server = serve("--standin-mode", "stall")
    started = time.monotonic()
    result = host_bench.run_step(command, settings(server, tokenizer, timeout_s=30.0), host_bench.Step(2, 10), KEY)
    assert time.monotonic() - started < 30 + 15
    assert not result.ok and result.record is None and result.failed_requests == 10
    assert result.problem == "timed out after 30 s (bench_serving killed; nothing measured)"


class ArgvWatch:
    """Scans every process's argv while a run goes on; collects any that holds the secret (but the
    server's: the test gives the stand-in its key on its command line)."""

    def __init__(self, secret: str, server_pid: int) -> None:
        self.secret = secret.encode()
        self.server = Path(f"/proc/{server_pid}/cmdline")
        self.found: set[str] = set()
        self.scans = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ArgvWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
                if cmdline == self.server:
                    continue
                try:
                    if self.secret in cmdline.read_bytes():
                        self.found.add(cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
                except OSError:
                    continue
            self.scans += 1


def _no_secret_under(root: Path) -> None:
    leaks = [str(path) for path in root.rglob("*") if path.is_file() and KEY.encode() in path.read_bytes()]
    assert not leaks, f"the API key is in {leaks}"


def test_endpoint_command_end_to_end(serve: Any, tokenizer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """`sglang-deploy bench --endpoint`: the key from the environment reaches the server (which
    answers 401 without it) and no argv; the run directory holds the records, the table, the plot and
    the verdict; a baseline it falls short of makes the exit status 1."""
    server = serve("--standin-tokens-per-s", "40", "--max-running-requests", "2")
    baseline = tmp_path / "faster.json"
    baseline.write_text(json.dumps({"name": "faster-box", "source": "a made-up faster server",
                                    "random_input_len": 64, "random_output_len": 24,
                                    "records": [{"max_concurrency": 2, "output_throughput": 500.0}]}))  # fmt: skip
    monkeypatch.setenv("SGLANG_API_KEY", KEY)
    out = tmp_path / "out"
    with ArgvWatch(KEY, server.proc.pid) as watch:
        rc = cli.main(["bench", "--endpoint", server.url, "--model", "tiny", "--tokenizer", tokenizer,
                       "--input-len", "64", "--output-len", "24", "--out", str(out), "--baseline", str(baseline)])  # fmt: skip
    captured = capsys.readouterr()
    assert watch.scans > 10 and not watch.found, watch.found
    assert rc == 1, captured.err
    assert "REGRESSION against faster-box: output_throughput at concurrency 2" in captured.err
    # No --concurrency: the default sweep capped and topped by the server's max_running_requests (2).
    [run_dir] = list((out / f"127.0.0.1-{server.port}").iterdir())
    assert captured.out.strip() == str(run_dir / "report.md")
    records = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert [r["max_concurrency"] for r in records] == [1, 2]
    assert all(r["completed"] == 5 * r["max_concurrency"] and r["random_range_ratio"] == 1.0 for r in records)
    assert records[0]["server_info"]["api_key"] == "********" and records[0]["dataset_name"] == "random-ids"
    assert near(records[0]["median_itl_ms"], 25.0)
    sweep = json.loads((run_dir / "sweep.json").read_text())
    assert sweep["lane"] == DEFAULT_LANE and sweep["mode"] == "endpoint" and sweep["git_revision"]
    assert sweep["settings"]["input_len"] == 64 and sweep["verdict"]["regression"] is True
    assert all(step["ok"] for step in sweep["steps"])
    report = (run_dir / "report.md").read_text()
    assert "| 2 | 10 | 0 |" in report and "## Against faster-box" in report and "STAND-IN" in report
    assert (run_dir / "bench.png").read_bytes()[:4] == b"\x89PNG"
    assert " 401 " not in (tmp_path / "standin-0.log").read_text()
    _no_secret_under(out)


def test_compare_puts_two_real_sweeps_side_by_side(serve: Any, tokenizer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """`bench --compare`: a sweep against a stand-in streaming 40 tok/s per request, then (--compare A with
    --endpoint) one against a stand-in twice as fast beside it, then the two stored runs with --compare A B:
    B/A of the output throughput is the rates' ratio (2x, within the tolerance) at both concurrencies, the
    ITL's is its inverse, and the verdict and exit status say which is faster."""
    monkeypatch.setenv("SGLANG_API_KEY", KEY)
    slow, fast = serve("--standin-tokens-per-s", "40"), serve("--standin-tokens-per-s", "80")
    common = ["--model", "tiny", "--tokenizer", tokenizer, "--input-len", "64", "--output-len", "24", "--concurrency", "1,2"]
    assert cli.main(["bench", "--endpoint", slow.url, *common, "--out", str(tmp_path / "a")]) == 0
    [run_a] = list((tmp_path / "a").glob("*/*"))
    capsys.readouterr()
    assert cli.main(["bench", "--endpoint", fast.url, *common, "--out", str(tmp_path / "b"), "--compare", str(run_a)]) == 0
    [run_b] = list((tmp_path / "b").glob("*/*"))
    assert "B is FASTER everywhere" in capsys.readouterr().err
    beside = json.loads((run_b / "compare.json").read_text())
    for row in beside["rows"]:
        assert near(row["output_throughput_ratio"], 2.0), row
        assert near(row["median_itl_ms_ratio"], 0.5), row
    assert (run_b / "compare.png").read_bytes()[:4] == b"\x89PNG"
    # The two stored runs, the other way round: B (the slow one) is slower, exit 1.
    assert cli.main(["bench", "--compare", str(run_b), str(run_a), "--out", str(tmp_path / "c")]) == 1
    assert "B is SLOWER everywhere" in capsys.readouterr().err
    for out in ("a", "b", "c"):
        _no_secret_under(tmp_path / out)


def test_inventory_command_end_to_end(serve: Any, tokenizer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """`sglang-deploy bench -i`: playbooks/bench.yml on a local-connection host whose "ml-env" is the
    validator venv (sglang's imports of datasets/torchvision answered by the validator's stand-ins
    through sitecustomize, as the real ml-env has them installed), the key read from the unit's 0600
    env file, the GPU facts from the nvidia-smi stand-in on PATH (one H200). The server fails its
    17th generation request: step 1 sends 1 warm-up and 5 measured requests (1-6), step 2 sends 2
    warm-up (7-8) and 10 measured ones (9-18), so step 2 has one failure, and the host fails after
    both steps' results are written."""
    server = serve("--standin-tokens-per-s", "40", "--standin-fail-every", "17")
    env_dir = tmp_path / "etc"
    env_dir.mkdir()
    (env_dir / "sglang.env").write_text(f"SGLANG_API_KEY={KEY}\n")
    (env_dir / "sglang.env").chmod(0o600)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('_validator_probe', {str(validator_venv._PROBE)!r})\n"
        "probe = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(probe)\n"
        f"probe._install_stand_ins({[*load_lane(DEFAULT_LANE).validator.stand_ins, *bench_runs.BENCH_STAND_INS]!r})\n"
    )
    python = validator_venv._venv_python(validator_venv.ensure_validator_env(load_lane(DEFAULT_LANE)))
    inventory = tmp_path / "inventory"
    (inventory / "host_vars").mkdir(parents=True)
    (inventory / "hosts.yml").write_text(
        "sglang_servers:\n  hosts:\n    benchhost:\n      ansible_connection: local\n      ansible_become: false\n"
        f"      ansible_python_interpreter: {sys.executable}\n"
    )
    (inventory / "host_vars" / "benchhost.yml").write_text(json.dumps({
        "sglang_server_python": str(python), "sglang_server_config_dir": str(env_dir),
        # The key as the vault would give it: the role's launch model then reads it from the env file.
        "sglang_server_api_key": KEY,
        "sglang_server_flags": {"model-path": tokenizer, "served-model-name": "tiny", "host": "127.0.0.1",
                                "port": server.port, "max-running-requests": 2},
    }))  # fmt: skip
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.setenv("PATH", f"{ROOT / 'tests' / 'standin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("NVIDIA_SMI_FIXTURE_DIR", str(ROOT / "tests" / "fixtures" / "nvidia-smi" / "h200-1gpu"))
    out = tmp_path / "out"
    rc = cli.main(["bench", "-i", str(inventory), "--input-len", "64", "--output-len", "24", "--out", str(out),
                   "--baseline", "seed-004"])  # fmt: skip
    captured = capsys.readouterr()
    assert rc == 1, captured.err
    # Live: a line per step as it ends, the failure with its count and a sample of the server's error.
    assert "benchhost concurrency 1, 5 prompts: ok" in captured.err
    assert "benchhost concurrency 2, 10 prompts: FAILED (1 of 10 requests failed)" in captured.err
    assert "error: Internal Server Error:" in captured.err and "generation request 17 fails on purpose" in captured.err
    assert "benchhost: concurrency 2: 1 of 10 requests failed" in captured.err  # the playbook's verdict on the host
    [run_dir] = list((out / "benchhost").iterdir())
    sweep = json.loads((run_dir / "sweep.json").read_text())
    assert sweep["mode"] == "inventory" and sweep["lane"] == "cu128"
    assert sweep["flags"]["api-key"] == {"env": "SGLANG_API_KEY"}
    assert [gpu["name"] for gpu in sweep["gpu_facts"]["gpus"]] == ["NVIDIA H200"]
    assert [(s["concurrency"], s["ok"], s["failed_requests"]) for s in sweep["steps"]] == [(1, True, 0), (2, False, 1)]
    records = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert [r["completed"] for r in records] == [5, 9]
    assert near(records[0]["median_itl_ms"], 25.0) and records[0]["server_info"]["api_key"] == "********"
    report = (run_dir / "report.md").read_text()
    assert "GPUs: 1x NVIDIA H200" in report and "launch flags: --model-path" in report
    assert "Verdict: **FAILED (concurrency 2: 1 of 10 requests failed)**" in report
    assert " 401 " not in (tmp_path / "standin-0.log").read_text()
    _no_secret_under(out)
