"""sglang-deploy bench without a server: the sweep plan, bench_serving's arguments and environment,
what is redacted, the bounded child process, baselines and the verdict, the report files, and bad
input (one line, exit 2). tests/unit/bench/test_bench_serving.py runs the real bench_serving against the
stand-in; tests/unit/bench/test_bench_standin.py checks the stand-in's streams and pacing."""

from __future__ import annotations

import json
import os
import struct
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from sglang_deploy import cli
from sglang_deploy.bench import comparison as bench_comparison
from sglang_deploy.bench import runs as bench_runs
from sglang_deploy_host.serving import bench_steps as host_bench

KEY = "bench-unit-test-key-7f3a"
# The sweep as the sglang_deploy_bench role's defaults give it (the module has no defaults of its own).
ROLE_SWEEP = {"backend": "sglang", "input_len": 1024, "output_len": 512, "seed": 1, "timeout_s": 3600.0}


# --- the plan ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("max_running", "concurrencies"),
    [(None, [1, 8, 16, 32, 64]), (64, [1, 8, 16, 32, 64]), (48, [1, 8, 16, 32, 48]), (128, [1, 8, 16, 32, 64, 128]),
     (4, [1, 4]), (1, [1])],
)  # fmt: skip
def test_the_default_sweep_is_capped_and_topped_by_max_running_requests(max_running: int | None, concurrencies: list[int]) -> None:
    steps = host_bench.plan(None, max_running)
    assert [s.concurrency for s in steps] == concurrencies
    assert all(s.num_prompts == 5 * s.concurrency for s in steps)


def test_given_concurrencies_run_as_given_in_increasing_order() -> None:
    steps = host_bench.plan([16, 2, 2, 128], 64, prompts_per_concurrency=8)
    assert [(s.concurrency, s.num_prompts) for s in steps] == [(2, 16), (16, 128), (128, 1024)]


@pytest.mark.parametrize(("concurrencies", "per", "message"), [([0, 4], 5, "concurrency 0"), (None, 4, "below 5")])
def test_a_sweep_that_measures_nothing_useful_is_refused(concurrencies: list[int] | None, per: int, message: str) -> None:
    with pytest.raises(host_bench.BenchError, match=message):
        host_bench.plan(concurrencies, None, per)


def test_settings_from_the_launch_flags_reach_the_server_on_its_own_host() -> None:
    flags = {"host": "0.0.0.0", "port": "8000", "model": "/var/lib/sglang/models/m/rev", "served-model-name": "glm-5",
             "max-running-requests": "64", "api-key": {"env": "SGLANG_API_KEY"}}  # fmt: skip
    settings = host_bench.settings_from_flags(flags, **ROLE_SWEEP)
    assert (settings.base_url, settings.model, settings.tokenizer) == ("http://127.0.0.1:8000", "glm-5", flags["model"])
    assert host_bench.settings_from_flags({**flags, "tokenizer-path": "/t"}, **ROLE_SWEEP).tokenizer == "/t"
    assert host_bench.max_running_requests(flags) == 64
    assert host_bench.max_running_requests({}) is None
    with pytest.raises(host_bench.BenchError, match="max-running-requests='lots'"):
        host_bench.max_running_requests({"max-running-requests": "lots"})


# --- bench_serving's arguments and environment --------------------------------------------------------
def _settings(**changes: Any) -> host_bench.Settings:
    base = {"base_url": "http://127.0.0.1:8000/", "model": "glm-5", "tokenizer": "/models/glm-5", **ROLE_SWEEP}
    return host_bench.Settings(**{**base, **changes})


def _option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_each_step_asks_bench_serving_for_fixed_lengths_offline_with_a_seed() -> None:
    argv = host_bench.bench_argv(_settings(), host_bench.Step(8, 40), "/tmp/x/result.jsonl", progress_bar=False)
    assert _option(argv, "--dataset-name") == "random-ids"  # "random" would download ShareGPT from the hub
    assert _option(argv, "--random-range-ratio") == "1.0"  # 0.0 (its default) draws lengths from 1..N
    assert (_option(argv, "--random-input-len"), _option(argv, "--random-output-len")) == ("1024", "512")
    assert (_option(argv, "--num-prompts"), _option(argv, "--max-concurrency")) == ("40", "8")
    assert (_option(argv, "--warmup-requests"), _option(argv, "--seed")) == ("8", "1")
    assert (_option(argv, "--backend"), _option(argv, "--base-url")) == ("sglang", "http://127.0.0.1:8000")
    assert "--tokenize-prompt" in argv and "--disable-tqdm" in argv and "--output-details" in argv


def test_the_openai_backends_get_text_prompts_and_a_terminal_gets_the_progress_bar() -> None:
    argv = host_bench.bench_argv(_settings(backend="sglang-oai-chat", warmup_requests=2), host_bench.Step(4, 20), "r", progress_bar=True)
    assert "--tokenize-prompt" not in argv and "--disable-tqdm" not in argv
    assert _option(argv, "--warmup-requests") == "2"


def test_the_key_goes_only_into_the_variable_bench_serving_reads() -> None:
    user = {"PATH": "/usr/bin", "OPENAI_API_KEY": "the-users-openai-key", "API_KEY": "another-key"}
    env = host_bench.child_env(user, KEY)
    assert env["OPENAI_API_KEY"] == KEY and "API_KEY" not in env
    assert (env["HF_HUB_OFFLINE"], env["TRANSFORMERS_OFFLINE"], env["PATH"]) == ("1", "1", "/usr/bin")
    # Without a key nothing else is sent to the benchmarked server either.
    assert not {"OPENAI_API_KEY", "API_KEY"} & set(host_bench.child_env(user, ""))
    argv = host_bench.bench_argv(_settings(), host_bench.Step(1, 5), "r", progress_bar=False)
    assert not any(KEY in word for word in argv)


def test_server_info_secrets_and_copies_of_the_key_are_redacted() -> None:
    record = {
        "server_info": {"api_key": KEY, "admin_api_key": "admin", "ssl_keyfile_password": None, "tp_size": 8},
        "errors": ["", f"Unauthorized: bad key {KEY}!"],
        "output_throughput": 225.0,
    }
    clean = host_bench.redact(record, [KEY])
    assert clean["server_info"] == {"api_key": "********", "admin_api_key": "********", "ssl_keyfile_password": None, "tp_size": 8}
    assert clean["errors"] == ["", "Unauthorized: bad key ********!"]
    assert clean["output_throughput"] == 225.0
    assert KEY not in json.dumps(clean)


def test_request_errors_are_sampled_one_line_each() -> None:
    traceback = "Traceback (most recent call last):\n  File \"x\", line 1\naiohttp.ClientConnectorError: refused"
    errors = ["", traceback, "Internal Server Error: boom", traceback, "a\nb", "fourth", "fifth"]
    assert host_bench.error_samples(errors) == ["aiohttp.ClientConnectorError: refused", "Internal Server Error: boom", "a b"]


# --- the bounded child ---------------------------------------------------------------------------------
def test_a_program_past_its_deadline_is_killed_with_its_children(tmp_path: Path) -> None:
    marker = tmp_path / "child.pid"
    script = (
        "import subprocess, sys, time\n"
        f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(marker)!r}, 'w').write(str(child.pid))\n"
        "print('started', flush=True)\n"
        "time.sleep(120)\n"
    )
    seen: list[bytes] = []
    started = time.monotonic()
    rc, tail = host_bench.run_bounded([sys.executable, "-c", script], dict(os.environ), 3.0, echo=seen.append)
    assert rc is None and time.monotonic() - started < 15
    assert b"started" in tail and b"started" in b"".join(seen)
    child = int(marker.read_text())
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and Path(f"/proc/{child}/stat").read_text().split()[2] != "Z":
        assert time.monotonic() < deadline, "the grandchild survived the kill"
        time.sleep(0.1)


def test_a_program_that_ends_in_time_returns_its_status_and_output() -> None:
    rc, tail = host_bench.run_bounded([sys.executable, "-c", "print('x' * 10); raise SystemExit(3)"], dict(os.environ), 30)
    assert (rc, tail.strip()) == (3, b"x" * 10)


def test_a_step_against_a_dead_server_fails_at_once_without_starting_bench_serving(tmp_path: Path) -> None:
    never = tmp_path / "started"
    command = [sys.executable, "-c", f"open({str(never)!r}, 'w')"]
    result = host_bench.run_step(command, _settings(base_url="http://127.0.0.1:9"), host_bench.Step(4, 20), KEY)
    assert not result.ok and result.failed_requests == 20 and result.record is None
    assert "not healthy" in (result.problem or "") and not never.exists()


# --- baselines and the verdict -------------------------------------------------------------------------
def _record(concurrency: int, output: float, total: float, **extra: Any) -> dict[str, Any]:
    return {"max_concurrency": concurrency, "output_throughput": output, "total_throughput": total,
            "request_throughput": output / 512, "median_ttft_ms": 100.0, "p99_ttft_ms": 200.0,
            "median_itl_ms": 20.0, "p99_itl_ms": 40.0, "completed": 5 * concurrency, "random_input_len": 1024,
            "random_output_len": 512, "server_info": {"version": "0.5.10.post1", "tp_size": 8, "api_key": "********"},
            **extra}  # fmt: skip


def _run(points: dict[int, tuple[float, float]], failed: tuple[int, ...] = ()) -> bench_runs.Run:
    steps = [
        {"concurrency": c, "num_prompts": 5 * c, "ok": c not in failed, "failed_requests": 3 if c in failed else 0,
         "problem": "3 of 40 requests failed" if c in failed else None, "error_samples": ["Internal Server Error: x"] if c in failed else [],
         "record": _record(c, out, total), "wall_s": 10.0, "argv": ["--max-concurrency", str(c)], "output_tail": ""}
        for c, (out, total) in points.items()
    ]  # fmt: skip
    meta = {"host": "glm5-01", "model": "glm-5", "started": "20261201T000000Z", "lane": "cu128", "git_revision": "abc",
            "settings": {"backend": "sglang", "input_len": 1024, "output_len": 512, "seed": 1, "warmup_requests": None,
                         "prompts_per_concurrency": 5, "step_timeout": 3600.0},
            "flags": {"tp-size": "8", "api-key": {"env": "SGLANG_API_KEY"}, "trust-remote-code": True}}  # fmt: skip
    return bench_runs.Run(meta=meta, steps=steps)


def test_the_shipped_seed_figures_load_and_say_their_lengths_are_unknown() -> None:
    seed = bench_runs.load_baseline("seed-004")
    assert seed.points == {16: {"output_throughput": 50.0}, 32: {"output_throughput": 144.0, "total_throughput": 304.0},
                           64: {"output_throughput": 225.0, "total_throughput": 516.0}}  # fmt: skip
    assert (seed.input_len, seed.output_len) == (None, None)
    assert "direction" in (bench_runs.check_lengths(seed, 1024, 512) or "")
    assert "seed-004" in bench_runs.shipped_baselines()


def test_the_verdict_is_new_over_baseline_per_shared_concurrency() -> None:
    seed = bench_runs.load_baseline("seed-004")
    verdict = bench_runs.compare(_run({1: (30.0, 90.0), 16: (44.0, 120.0), 64: (900.0, 2700.0)}), seed, 0.10)
    assert [(c.concurrency, c.metric, round(c.ratio, 2)) for c in verdict.comparisons] == [
        (16, "output_throughput", 0.88), (64, "output_throughput", 4.0), (64, "total_throughput", 5.23)]  # fmt: skip
    assert [(c.concurrency, c.metric) for c in verdict.regressions] == [(16, "output_throughput")]
    assert bench_runs.compare(_run({16: (45.0, 120.0)}), seed, 0.10).regressions == []  # 0.90 is the threshold itself


def test_a_failed_step_is_not_compared_and_fails_the_run() -> None:
    run = _run({16: (10.0, 30.0), 64: (900.0, 2700.0)}, failed=(16,))
    verdict = bench_runs.compare(run, bench_runs.load_baseline("seed-004"), 0.10)
    assert {c.concurrency for c in verdict.comparisons} == {64}
    run.verdict = verdict
    assert bench_runs.overall(run).startswith("FAILED (concurrency 16: 3 of 40 requests failed")


def test_nothing_in_common_with_the_baseline_is_refused_or_no_verdict() -> None:
    run = _run({1: (1.0, 2.0), 2: (2.0, 4.0)})
    with pytest.raises(bench_runs.BenchInputError, match=r"concurrencies \[16, 32, 64\].*measured \[1, 2\]") as err:
        bench_runs.compare(run, bench_runs.load_baseline("seed-004"), 0.1)
    run.verdict_problem = str(err.value)
    assert bench_runs.overall(run).startswith("NO VERDICT (baseline seed-004 has concurrencies")


def test_a_previous_run_is_a_baseline_and_other_lengths_are_refused(tmp_path: Path) -> None:
    bench_runs.write_run(tmp_path / "old", _run({8: (400.0, 1200.0), 64: (1000.0, 3000.0)}))
    for spec in (tmp_path / "old", tmp_path / "old" / "sweep.json", tmp_path / "old" / "results.jsonl"):
        old = bench_runs.load_baseline(str(spec))
        assert old.points[64] == {"output_throughput": 1000.0, "total_throughput": 3000.0}
        assert (old.input_len, old.output_len) == (1024, 512)
        assert bench_runs.check_lengths(old, 1024, 512) is None
    with pytest.raises(bench_runs.BenchInputError, match="1024 input / 512 output.*--input-len 1024 --output-len 512"):
        bench_runs.check_lengths(old, 128, 64)
    regressed = _run({8: (400.0, 1200.0), 64: (850.0, 2550.0)})
    regressed.verdict = bench_runs.compare(regressed, old, 0.10)
    assert bench_runs.overall(regressed).startswith("REGRESSION against")
    assert "0.85x" in bench_runs.overall(regressed)


# --- the report files ------------------------------------------------------------------------------------
def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_a_run_is_written_as_jsonl_table_and_plot_and_reads_back(tmp_path: Path) -> None:
    run = _run({1: (40.0, 120.0), 8: (300.0, 900.0), 64: (1100.0, 3300.0)}, failed=(8,))
    run.verdict = bench_runs.compare(run, bench_runs.load_baseline("seed-004"), 0.10)
    paths = bench_runs.write_run(tmp_path / "run", run)
    records = [json.loads(line) for line in paths["results.jsonl"].read_text().splitlines()]
    assert [r["max_concurrency"] for r in records] == [1, 8, 64] and records[0]["output_throughput"] == 40.0
    sweep = json.loads(paths["sweep.json"].read_text())
    assert [s["concurrency"] for s in sweep["steps"]] == [1, 8, 64] and "record" not in sweep["steps"][0]
    assert sweep["verdict"]["baseline"] == "seed-004" and sweep["git_revision"] == "abc"
    report = paths["report.md"].read_text()
    assert "| 64 | 320 | 0 | 1,100.0 | 3,300.0 |" in report
    assert "**concurrency 8 FAILED**: 3 of 40 requests failed" in report and "`Internal Server Error: x`" in report
    assert "launch flags: --tp-size 8 --api-key ${SGLANG_API_KEY} --trust-remote-code" in report
    assert "![throughput, TTFT and ITL against concurrency](bench.png)" in report
    assert report.rstrip().endswith("Verdict: **FAILED (concurrency 8: 3 of 40 requests failed)**")
    width, height = _png_size(paths["bench.png"])
    assert width >= 1000 and height >= 400
    assert {oct(p.stat().st_mode & 0o777) for p in paths.values()} == {"0o600"}
    again = bench_runs.load_run(tmp_path / "run")
    assert [s["record"]["output_throughput"] for s in again.steps] == [40.0, 300.0, 1100.0]


def test_a_run_where_nothing_succeeded_still_gets_a_plot_saying_so(tmp_path: Path) -> None:
    run = _run({4: (1.0, 2.0)}, failed=(4,))
    paths = bench_runs.write_run(tmp_path / "run", run)
    assert _png_size(paths["bench.png"])[0] > 0
    assert "FAILED" in paths["report.md"].read_text()


# --- bad input: one line, exit 2, before anything runs -----------------------------------------------------
def _bench(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        rc = cli.main(["bench", *argv])
    except SystemExit as done:
        rc = int(done.code or 0)
    captured = capsys.readouterr()
    return rc, captured.out + captured.err


@pytest.fixture()
def tokenizer(tmp_path: Path) -> str:
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer_config.json").write_text("{}")
    return str(tmp_path / "tok")


ENDPOINT = ["--endpoint", "http://127.0.0.1:9", "--model", "m"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--threshold", "nan"], "--threshold nan must be between 0 and 1"),
        (["--threshold", "1.5"], "--threshold 1.5"),
        (["--step-timeout", "inf"], "step timeout inf"),
        (["--step-timeout", "-1"], "step timeout -1.0"),
        (["--input-len", "0"], "input length 0"),
        (["--warmup-requests", "-2"], "warm-up requests -2"),
        (["--prompts-per-concurrency", "2"], "prompts per concurrency 2 is below 5"),
        (["--concurrency", "1,x"], "not a comma-separated list"),
        (["--concurrency", "0,4"], "concurrencies are integers >= 1"),
        (["--model", "m"], "--model/--api-key-file/--cafile go with --endpoint"),
        (["--cafile", "/etc/ssl/ca.crt"], "--model/--api-key-file/--cafile go with --endpoint"),
        ([*ENDPOINT, "-i", "inventory/proxmox"], "does not take -i/-l"),
        (["--endpoint", "http://127.0.0.1:9", "--model", "m"], "--tokenizer PATH"),
        (["--endpoint", "file:///etc/passwd", "--model", "m", "--tokenizer", "TOK"], "file:///etc/passwd"),
        ([*ENDPOINT, "--tokenizer", "/nonexistent"], "no tokenizer there"),
        ([*ENDPOINT, "--tokenizer", "TOK", "--api-key-file", "/nonexistent/key"], "cannot read it"),
        ([*ENDPOINT, "--tokenizer", "TOK", "--lane", "cu999"], "unknown lane 'cu999'"),
        (["--baseline", "seed-004x"], "--baseline seed-004x: cannot open it"),
        (["--baseline", "BIN"], "not UTF-8 text"),
        # Before: /dev/zero never ended, /dev/urandom gave a traceback; a FIFO would block.
        (["--baseline", "/dev/zero"], "--baseline /dev/zero: not a regular file"),
        (["--baseline", "/dev/urandom"], "--baseline /dev/urandom: not a regular file"),
        (["--baseline", "FIFO"], "not a regular file"),
        (["--baseline", "HUGE"], "more than the"),
        (["--baseline", "NUL"], "a binary file (NUL bytes)"),
        (["--compare", "/dev/zero", "seed-004"], "--baseline /dev/zero: not a regular file"),
        (["--compare", "BIN", "seed-004"], "not UTF-8 text"),
        (["--baseline", "OBJ"], "no 'records' list"),
        (["--baseline", "OLD", "--input-len", "128"], "not comparable"),
        ([*ENDPOINT, "--tokenizer", "TOK", "--concurrency", "1,2", "--baseline", "seed-004"], "nothing to compare"),
        ([*ENDPOINT, "--tokenizer", "TOK", "--api-key", KEY], "--api-key is not taken"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(argv: list[str], message: str, tokenizer: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    (tmp_path / "bin.json").write_bytes(bytes(range(128, 256)))
    (tmp_path / "nul.json").write_bytes(b'{"records": []}\0')
    (tmp_path / "obj.json").write_text("{}")
    (tmp_path / "old.jsonl").write_text(json.dumps(_record(64, 1.0, 2.0)) + "\n")
    os.mkfifo(tmp_path / "fifo.json")
    with open(tmp_path / "huge.json", "wb") as huge:  # sparse: 64 GiB of nothing on disk
        huge.truncate(64 << 30)
    files = {"TOK": tokenizer, "BIN": str(tmp_path / "bin.json"), "OBJ": str(tmp_path / "obj.json"), "OLD": str(tmp_path / "old.jsonl"),
             "FIFO": str(tmp_path / "fifo.json"), "HUGE": str(tmp_path / "huge.json"), "NUL": str(tmp_path / "nul.json")}  # fmt: skip
    rc, output = _bench([files.get(word, word) for word in argv], capsys)
    assert rc == 2, output
    assert "Traceback" not in output and message in output and KEY not in output, output
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 or (lines[0].startswith("usage:") and ": error: " in lines[-1]), output


# --- --compare: two runs side by side ----------------------------------------------------------------------
def _latency_run(points: dict[int, tuple[float, float]], failed: tuple[int, ...] = ()) -> bench_runs.Run:
    """_run with latencies: ITL grows with the batch, TTFT with the queue."""
    run = _run(points, failed)
    for step in run.steps:
        record = step["record"]
        record.update(median_ttft_ms=100.0 * step["concurrency"], p99_ttft_ms=150.0 * step["concurrency"],
                      median_itl_ms=1000.0 * step["concurrency"] / record["output_throughput"],
                      p99_itl_ms=1500.0 * step["concurrency"] / record["output_throughput"])  # fmt: skip
    return run


def test_compare_shows_b_over_a_per_concurrency_and_judges_output_throughput(tmp_path: Path) -> None:
    bench_runs.write_run(tmp_path / "a", _latency_run({1: (30.0, 90.0), 16: (300.0, 900.0), 64: (800.0, 2400.0)}))
    bench_runs.write_run(tmp_path / "b", _latency_run({1: (33.0, 99.0), 16: (450.0, 1350.0), 64: (1600.0, 4800.0)}))
    comparison = bench_comparison.compare_sides(bench_comparison.load_side(str(tmp_path / "a")), bench_comparison.load_side(str(tmp_path / "b")), 0.10)
    assert [(c, round(r, 2)) for c, r in comparison.judged()] == [(1, 1.1), (16, 1.5), (64, 2.0)]
    assert comparison.faster == [16, 64] and comparison.slower == [] and comparison.ok
    assert comparison.verdict().startswith("B is FASTER at 16, 64 (output throughput B/A: 1.10x at 1, 1.50x at 16, 2.00x at 64")
    row64 = comparison.rows[-1]
    assert row64.ratio("median_itl_ms") == pytest.approx(0.5) and row64.ratio("total_throughput") == pytest.approx(2.0)
    paths = bench_comparison.write_comparison(tmp_path / "cmp", comparison)
    report = paths["compare.md"].read_text()
    assert "| 64 | 800.0 / 1,600.0 (2.00x) | 2,400.0 / 4,800.0 (2.00x) |" in report
    assert json.loads(paths["compare.json"].read_text())["rows"][2]["output_throughput_ratio"] == pytest.approx(2.0)
    assert _png_size(paths["compare.png"]) == (1500, 460)
    assert oct(paths["compare.md"].stat().st_mode & 0o777) == "0o600"


def test_compare_calls_b_slower_mixed_or_failed_and_the_exit_status_follows() -> None:
    a = bench_comparison.side_of_run(Path("a"), _latency_run({1: (30.0, 90.0), 64: (800.0, 2400.0)}))
    slower = bench_comparison.compare_sides(a, bench_comparison.side_of_run(Path("b"), _latency_run({1: (30.0, 90.0), 64: (600.0, 1800.0)})))
    assert slower.slower == [64] and not slower.ok and slower.verdict().startswith("B is SLOWER at 64")
    mixed = bench_comparison.compare_sides(a, bench_comparison.side_of_run(Path("b"), _latency_run({1: (40.0, 120.0), 64: (600.0, 1800.0)})))
    assert mixed.verdict().startswith("MIXED: B is faster at 1 and slower at 64")
    failed = bench_comparison.compare_sides(a, bench_comparison.side_of_run(Path("b"), _latency_run({1: (30.0, 90.0), 64: (10.0, 30.0)}, failed=(64,))))
    assert failed.b_failed == [64] and not failed.ok and "B FAILED at concurrency 64" in failed.verdict()
    assert bench_comparison.compare_sides(a, a).verdict().startswith("SAME within +-10%")


def test_compare_takes_the_seed_figures_with_a_note_and_refuses_other_lengths(tmp_path: Path) -> None:
    seed = bench_comparison.load_side("seed-004")
    run = bench_comparison.side_of_run(tmp_path, _latency_run({16: (60.0, 180.0), 64: (900.0, 2700.0)}))
    comparison = bench_comparison.compare_sides(seed, run)
    assert [(c, round(r, 1)) for c, r in comparison.judged()] == [(16, 1.2), (64, 4.0)]
    assert comparison.rows[1].ratio("median_itl_ms") is None  # the seed gave no latencies
    assert "seed-004 does not record its input/output lengths" in comparison.notes[0]
    other = bench_comparison.Side("other", "x", {64: {"output_throughput": 1.0}}, {}, 128, 64)
    with pytest.raises(bench_runs.BenchInputError, match="not the same workload"):
        bench_comparison.compare_sides(run, other)


def test_the_compare_command_writes_the_comparison_and_exits_on_the_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench_runs.write_run(tmp_path / "a", _latency_run({16: (300.0, 900.0), 64: (800.0, 2400.0)}))
    bench_runs.write_run(tmp_path / "b", _latency_run({16: (250.0, 750.0), 64: (700.0, 2100.0)}))
    assert cli.main(["bench", "--compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "out")]) == 1
    captured = capsys.readouterr()
    assert "B is SLOWER everywhere" in captured.err
    [written] = (tmp_path / "out" / "compare").iterdir()
    assert captured.out.strip() == str(written / "compare.md")
    assert cli.main(["bench", "--compare", str(tmp_path / "b"), str(tmp_path / "a"), "--out", str(tmp_path / "out")]) == 0
    # A wrong count or a sweep option with two runs: one line, exit 2.
    assert cli.main(["bench", "--compare", "a", "b", "c"]) == 2
    assert cli.main(["bench", "--compare", str(tmp_path / "a"), str(tmp_path / "b"), "--endpoint", "http://127.0.0.1:1"]) == 2
    assert cli.main(["bench", "--compare", str(tmp_path / "nothing"), "seed-004"]) == 2
    assert "cannot open it" in capsys.readouterr().err


# --- speculative decoding that drafts for nothing (recorded on the H200, GLM-5's architecture, random weights) ---
REAL_GLM5 = Path(__file__).resolve().parents[2] / "fixtures" / "real-sglang" / "h200-glm5-arch-0.5.17"


def test_a_speculative_run_that_accepts_about_one_token_is_inert() -> None:
    """glm5-dsa-mtp ran EAGLE with a draft of random weights: sglang reported an acceptance of 1.0 and said
    nothing else; the run's verdict and a comparison with the same launch without MTP both call it INERT."""
    mtp = bench_runs.load_run(REAL_GLM5 / "glm5-dsa-mtp" / "bench")
    assert [step["record"]["accept_length"] for step in mtp.steps] == [1.0]
    assert bench_runs.table_rows(mtp)[0][-1] == "1.00"
    verdict = bench_runs.overall(mtp)
    assert verdict.startswith("INERT: speculative decoding accepts 1.00 at 1 tokens per step (under 1.1)")
    assert "sglang-deploy checkpoint DIR" in verdict
    plain = bench_runs.load_run(REAL_GLM5 / "glm5-dsa-bf16" / "bench")
    assert bench_runs.overall(plain) == "ok" and bench_runs.table_rows(plain)[0][-1] == "-"
    comparison = bench_comparison.compare_sides(bench_comparison.load_side(str(REAL_GLM5 / "glm5-dsa-bf16" / "bench")),
                                     bench_comparison.load_side(str(REAL_GLM5 / "glm5-dsa-mtp" / "bench")))  # fmt: skip
    assert "B is INERT: speculative decoding accepts 1.00 at 1" in comparison.verdict()
    assert comparison.ok is False
    assert comparison.rows[0].cell("accept_length").endswith("/ 1.0")


@pytest.mark.parametrize(("accept", "inert"), [(1.0, True), (1.09, True), (1.1, False), (2.3, False), (None, False)])
def test_inert_is_an_acceptance_under_1_1_and_only_with_a_figure(accept: float | None, inert: bool) -> None:
    points = {8: {"output_throughput": 100.0, "accept_length": accept}}
    assert bool(bench_runs.inert_points(points)) is inert


def test_the_cli_takes_the_sweeps_defaults_from_the_role_only() -> None:
    """roles/sglang_deploy_bench/defaults/main.yml is the one place: the CLI's options read it, the module has none."""
    import yaml
    from conftest import ROOT

    role = yaml.safe_load((ROOT / "roles" / "sglang_deploy_bench" / "defaults" / "main.yml").read_text())
    parser = cli.build_parser()
    args = parser.parse_args(["bench", *ENDPOINT, "--tokenizer", "/t"])
    for option in ("prompts_per_concurrency", "input_len", "output_len", "backend", "seed", "warmup_requests"):
        assert getattr(args, option) == role[f"sglang_deploy_bench_{option}"], option
    assert args.step_timeout == float(role["sglang_deploy_bench_step_timeout"])
    module = (ROOT / "library" / "sglang_bench.py").read_text()
    assert '"default": bench.' not in module and not hasattr(host_bench, "DEFAULT_INPUT_LEN")

