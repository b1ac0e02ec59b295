"""`sglang-deploy quality record|check --endpoint` end to end, as a user runs it (a subprocess, the key in the
environment), against the stand-in's logprob API: exit 0 for a recording and a PASS, 1 for a FAIL, 2 with one line
for every input it refuses before asking the server and for a server it cannot judge; `bench --compare` shows the
quality verdicts kept in two runs and fails a B that failed its check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from conftest import StandinProcess as Standin

from sglang_deploy.bench import runs as bench_runs
from sglang_deploy.bench import quality as bench_quality

KEY = "quality-cli-key-0123456789"


def _cli(*args: str, key: str | None = KEY) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_API_KEY"}
    if key is not None:
        env["SGLANG_API_KEY"] = key
    return subprocess.run([sys.executable, "-m", "sglang_deploy.cli", *args], capture_output=True, text=True,
                          timeout=600, check=False, cwd=ROOT, env=env)  # fmt: skip


def _server(tmp_path: Path, mode: str) -> Standin:
    return Standin(tmp_path / f"{mode}.log", "--api-key", KEY, "--served-model-name", "glm-5", "--standin-load-delay", "0",
                   "--standin-mode", mode)  # fmt: skip


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("recorded")
    server = _server(directory, "ok")
    try:
        done = _cli("quality", "record", "--endpoint", server.url, "--model", "glm-5", "--out", str(directory / "ref.json"))
    finally:
        server.stop()
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(f"recorded {directory / 'ref.json'}: 6 prompts of sglang-deploy-default v1"), done.stdout
    return directory / "ref.json"


def test_a_recording_is_a_reference_readable_by_others_and_holds_no_key(recorded: Path) -> None:
    assert oct(recorded.stat().st_mode & 0o777) == "0o644"
    text = recorded.read_text()
    assert KEY not in text and json.loads(text)["format"] == "sglang-deploy quality reference"


@pytest.mark.parametrize(("mode", "status", "word"), [("ok", 0, "PASS"), ("drift", 1, "FAIL")])
def test_check_exits_0_on_pass_and_1_on_fail_with_the_figures(tmp_path: Path, recorded: Path, mode: str, status: int, word: str) -> None:
    server = _server(tmp_path, mode)
    try:
        done = _cli("quality", "check", "--endpoint", server.url, "--reference", str(recorded))
        as_json = _cli("quality", "check", "--endpoint", server.url, "--reference", str(recorded), "--json")
    finally:
        server.stop()
    assert done.returncode == status, done.stdout + done.stderr
    assert done.stdout.startswith(f"sglang-deploy quality check: {word}"), done.stdout
    assert "per-token KL (nats) over" in done.stdout and "batch at concurrency 8 against concurrency 1" in done.stdout
    data = json.loads(as_json.stdout)
    assert as_json.returncode == status and data["verdict"] == word and set(data["kl"]) >= {"mean", "p99", "max"}


def test_a_threshold_option_replaces_the_references(tmp_path: Path, recorded: Path) -> None:
    server = _server(tmp_path, "drift")
    try:
        done = _cli("quality", "check", "--endpoint", server.url, "--reference", str(recorded), "--max-kl-mean", "5",
                    "--max-kl-p99", "50", "--min-top1", "0", "--tie-margin", "100")  # fmt: skip
    finally:
        server.stop()
    assert done.returncode == 0 and done.stdout.startswith("sglang-deploy quality check: PASS [KL mean"), done.stdout + done.stderr
    assert "(max 5)" in done.stdout


@pytest.mark.parametrize(("mode", "message"), [
    ("no-logprobs", "this server does not return logprobs"),
    ("retokenized", "the reference was recorded with another tokenizer"),
])  # fmt: skip
def test_a_server_it_cannot_judge_exits_2_with_one_line(tmp_path: Path, recorded: Path, mode: str, message: str) -> None:
    server = _server(tmp_path, mode)
    try:
        done = _cli("quality", "check", "--endpoint", server.url, "--reference", str(recorded))
    finally:
        server.stop()
    assert done.returncode == 2 and done.stdout == "", done.stdout + done.stderr
    assert done.stderr.startswith("sglang-deploy quality check: no verdict: ") and message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_bad_input_is_refused_before_any_request(tmp_path: Path, recorded: Path) -> None:
    """None of these reach a server: the URL answers nothing (port 9 of loopback, discard)."""
    url = "http://127.0.0.1:9"
    malformed = tmp_path / "malformed.json"
    malformed.write_text(json.dumps({**json.loads(recorded.read_text()), "format_version": 7}))
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "elsewhere.json")
    cases = {
        ("quality", "check", "--endpoint", url, "--reference", str(tmp_path / "none.json")): "none.json: cannot read it",
        ("quality", "check", "--endpoint", url, "--reference", str(malformed)): "format_version 7; this sglang-deploy reads 1",
        ("quality", "check", "--reference", str(recorded)): "give --endpoint URL or -i INVENTORY (one of them)",
        ("quality", "check", "--endpoint", url, "-i", "inventory/proxmox", "--reference", str(recorded)): "one of them",
        ("quality", "check", "--endpoint", url, "--reference", str(recorded), "--min-top1", "95"): "top1_agreement is a share",
        ("quality", "check", "--endpoint", url, "--reference", str(recorded), "--api-key", "x"): "--api-key is not taken",
        ("quality", "check", "--endpoint", "ftp://h", "--reference", str(recorded)): "ftp://h",
        ("quality", "record", "--endpoint", url, "--model", "m", "--out", str(link)): "is a symbolic link",
        ("quality", "record", "--endpoint", url, "--model", "m", "--out", str(tmp_path / "no" / "ref.json")): "no directory",
        ("quality", "record", "--endpoint", url, "--out", str(tmp_path / "r.json")): "--endpoint needs --model NAME",
    }
    for argv, message in cases.items():
        done = _cli(*argv)
        assert done.returncode == 2 and message in done.stderr, (argv, done.stdout + done.stderr)
    assert not (tmp_path / "elsewhere.json").exists() and not (tmp_path / "r.json").exists()


def test_an_unreachable_server_exits_2(recorded: Path) -> None:
    done = _cli("quality", "check", "--endpoint", "http://127.0.0.1:9", "--reference", str(recorded))
    assert done.returncode == 2 and "no verdict: GET http://127.0.0.1:9/v1/models: no answer" in done.stderr, done.stderr


# -- bench --compare with the verdicts a run keeps ------------------------------------------------------------
def _run(tmp_path: Path, name: str, verdict: dict | None) -> Path:
    record = {"max_concurrency": 1, "output_throughput": 100.0, "total_throughput": 200.0, "completed": 5,
              "median_ttft_ms": 10.0, "p99_ttft_ms": 20.0, "median_itl_ms": 2.0, "p99_itl_ms": 4.0}
    meta = {"host": name, "started": "20261206T000000Z", "settings": {"input_len": 256, "output_len": 256}}
    if verdict is not None:
        meta["quality"] = bench_quality.summary(verdict)
    run = bench_runs.Run(meta=meta, steps=[{"concurrency": 1, "ok": True, "record": record, "num_prompts": 5, "wall_s": 1.0}])
    bench_runs.write_run(tmp_path / name, run)
    return tmp_path / name


def _verdict(word: str) -> dict:
    return {"verdict": word, "reasons": [] if word == "PASS" else ["mean per-token KL 0.3 nats is over 0.02"],
            "kl": {"mean": 0.001 if word == "PASS" else 0.3, "p99": 0.01}, "top1_agreement": 0.99,
            "reference": {"served_model": "glm-5"}, "thresholds": {}}  # fmt: skip


def test_compare_shows_both_verdicts_and_fails_a_b_that_failed_its_check(tmp_path: Path) -> None:
    a = _run(tmp_path, "a", _verdict("PASS"))
    b_fail = _run(tmp_path, "b-fail", _verdict("FAIL"))
    b_unchecked = _run(tmp_path, "b-unchecked", None)
    failed = _cli("bench", "--compare", str(a), str(b_fail), "--out", str(tmp_path / "out"))
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "quality A: PASS (KL mean 0.001, top-1 99.0%), B: FAIL (KL mean 0.3, top-1 99.0%)" in failed.stderr
    report = Path(failed.stdout.strip()).read_text()
    assert "Quality of B: sglang-deploy quality check: FAIL: mean per-token KL 0.3 nats is over 0.02" in report
    same = _cli("bench", "--compare", str(a), str(b_unchecked), "--out", str(tmp_path / "out"))
    assert same.returncode == 0 and "quality A: PASS (KL mean 0.001, top-1 99.0%), B: not checked" in same.stderr
    # A run that failed its check is not ok on its own either.
    assert bench_runs.overall(bench_runs.load_run(b_fail)).startswith("QUALITY FAIL: sglang-deploy quality check: FAIL")
