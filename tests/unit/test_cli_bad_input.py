"""Bad input to any command is a one-line error and exit 2, never a traceback: the whole class
(NaN, infinities, zero and negative numbers, binary, empty, wrong-shape and missing files, a
directory where a file belongs), not one example per command. The CLI runs in-process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_deploy import cli
from sglang_deploy_host import nccl_check

SEED_BOX = ["--gpu-memory-mib", "97887", "--tp-size", "8", "--max-running-requests", "64"]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("bad-input")
    made = {
        "binary": bytes(range(256)) * 8,
        "empty": b"",
        "list": b"[1, 2]",
        "object": b"{}",
        "truncated": b'{"gpus": [',
        "scalar": b"42",
    }
    paths = {}
    for name, content in made.items():
        path = root / f"{name}.json"
        path.write_bytes(content)
        paths[name] = str(path)
    paths["missing"] = str(root / "missing.json")
    paths["directory"] = str(root)
    return paths


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        rc = cli.main(argv)
    except SystemExit as done:  # argparse's own usage errors
        rc = int(done.code or 0)
    captured = capsys.readouterr()
    return rc, captured.out + captured.err


def _assert_one_line_error(rc: int, output: str) -> None:
    """Exit 2 and one line saying what is wrong: our own message, or argparse's usage followed by
    its one ``error:`` line (``-inf`` is read as an option there)."""
    assert rc == 2, output
    assert "Traceback" not in output
    lines = [line for line in output.splitlines() if line.strip()]
    assert lines, "no error message"
    if lines[0].startswith("usage:"):
        assert ": error: " in lines[-1], output
    else:
        assert len(lines) == 1, output


NUMBERS = ["nan", "inf", "-inf", "0", "-1", "1e400"]
# Options where 0 is meaningful (no memory in use, no margin, ...): every other number is refused.
ZERO_OK = {"--weights-gib-per-gpu", "--gpu-memory-used-mib", "--runtime-overhead-mib", "--graph-mib-per-bs", "--margin-mib"}
PLAN_NUMBER_CASES = [
    (option, value)
    for option in ["--gpu-memory-mib", "--mem-fraction-static", *sorted(ZERO_OK)]
    for value in NUMBERS
    if not (value == "0" and option in ZERO_OK)
]


@pytest.mark.parametrize("option, value", PLAN_NUMBER_CASES)
def test_plan_refuses_impossible_numbers(option: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    if option == "--gpu-memory-mib":
        argv = ["plan", "--tp-size", "8", option, value]
    else:
        argv = ["plan", *SEED_BOX, option, value]
    _assert_one_line_error(*_run(argv, capsys))


@pytest.mark.parametrize(
    "extra",
    [["--tp-size", "0"], ["--tp-size", "-8"], ["--page-size", "0"], ["--kv-bytes-per-token", "0"],
     ["--max-running-requests", "0"], ["--cuda-graph-max-bs", "-1"], ["--cuda-graph-bs", "1", "0"],
     ["--chunked-prefill-size", "0"], ["--chunked-prefill-size", "-2"], ["--max-total-tokens", "0"],
     ["--tp-size", "x"], ["--mem-fraction-static", "0.9x"]],
)  # fmt: skip
def test_plan_refuses_impossible_counts(extra: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    _assert_one_line_error(*_run(["plan", "--gpu-memory-mib", "97887", *extra], capsys))


@pytest.mark.parametrize("kind", ["binary", "empty", "list", "object", "truncated", "scalar", "missing", "directory"])
@pytest.mark.parametrize("option", ["--gpu-facts", "--model-config", "--safetensors-index"])
def test_plan_refuses_unusable_files(option: str, kind: str, files: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    _assert_one_line_error(*_run(["plan", *SEED_BOX, option, files[kind]], capsys))


@pytest.mark.parametrize("kind", ["binary", "empty", "list", "object", "truncated", "scalar", "missing", "directory"])
def test_doctor_refuses_an_unusable_plan_file(kind: str, files: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "server.log"
    log.write_text("INFO nothing to see\n")
    _assert_one_line_error(*_run(["doctor", "--plan", files[kind], str(log)], capsys))


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_doctor_refuses_an_unreadable_log(kind: str, files: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    _assert_one_line_error(*_run(["doctor", files[kind]], capsys))


def test_doctor_with_nothing_to_read_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    rc, output = _run(["doctor"], capsys)
    _assert_one_line_error(rc, output)
    assert "nothing to read" in output


@pytest.mark.parametrize("kind", ["binary", "empty", "list", "object", "truncated", "scalar", "missing", "directory"])
def test_verify_refuses_an_unusable_probes_file(kind: str, files: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["verify", "--endpoint", "http://127.0.0.1:9", "--model", "m", "--probes", files[kind]]
    _assert_one_line_error(*_run(argv, capsys))


@pytest.mark.parametrize("kind", ["binary", "empty", "missing", "directory", "list"])
def test_nccl_check_refuses_an_unusable_environment_source(kind: str, files: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    rc = nccl_check.main(["--env-from-file", files[kind]])
    _assert_one_line_error(rc, capsys.readouterr().err)


@pytest.mark.parametrize(
    "argv",
    [["--sizes-mib", "nan"], ["--sizes-mib", "inf"], ["--sizes-mib", "0"], ["--sizes-mib", "-4"],
     ["--sizes-mib", "1e12"], ["--gpus", "-1"], ["--iters", "0"], ["--timeout", "0"], ["--env", "NOVALUE"],
     ["--env", "1BAD=x"]],
)  # fmt: skip
def test_nccl_check_refuses_impossible_numbers(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    rc = nccl_check.main(argv)
    _assert_one_line_error(rc, capsys.readouterr().err)


def test_nccl_check_command_without_its_interpreter(capsys: pytest.CaptureFixture[str]) -> None:
    _assert_one_line_error(*_run(["nccl-check", "--python", "/nonexistent/python3"], capsys))


def test_plan_json_of_a_valid_plan_still_works(capsys: pytest.CaptureFixture[str]) -> None:
    """The guard rails do not refuse the seed box itself."""
    rc, output = _run(["plan", *SEED_BOX, "--mem-fraction-static", "0.92", "--json"], capsys)
    assert rc == 0
    assert json.loads(output)["safe"] is True
