"""Bad input to any command is a one-line error and exit 2, never a traceback: the whole class
(NaN, infinities, zero and negative numbers, binary, empty, wrong-shape and missing files, a
directory where a file belongs, a device, a FIFO, a file over the cap, bytes that are not UTF-8), not
one example per command. The CLI runs in-process, except where the input is a stream or a huge file:
there it runs in a process of its own, memory-capped and with a deadline (see _run_isolated)."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_deploy import cli
from sglang_deploy_host.gpu import nccl_check

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


# --- files that are not files: devices, FIFOs, directories, binary, not UTF-8, too large -------------------
# Every file a command reads is a regular file under a size cap, and text where text is expected; anything
# else is one line and exit 2, never a hang, an OOM kill or a traceback. The stream-like inputs run the CLI
# in a process of its own, with its address space capped and a deadline, so that reading one without a
# bound fails the test (MemoryError, a timeout) instead of taking the test run down with it.

ISOLATED_TIMEOUT_S = 30
ISOLATED_ADDRESS_SPACE = 3 << 30
# A sparse file larger than every cap a command applies (the largest: kernels' shared objects).
OVER_EVERY_CAP = (8 << 30) + 1
STREAMS = ["dev-zero", "dev-urandom", "fifo", "over-cap"]  # run isolated
REGULAR = ["directory", "nul-bytes", "invalid-utf8"]  # safe to run in-process
WHY = {
    "dev-zero": "not a regular file",
    "dev-urandom": "not a regular file",
    "fifo": "not a regular file",
    "over-cap": "more than",
    "directory": "directory",
    "nul-bytes": "binary",
    "invalid-utf8": "UTF-8",
}


def hostile_path(root: Path, kind: str, name: str = "input") -> str:
    """A path of ``kind`` under ``root`` (or a device), named ``name`` where it is a file of its own."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / name
    if kind == "dev-zero":
        return "/dev/zero"
    if kind == "dev-urandom":
        return "/dev/urandom"
    if kind == "fifo":
        os.mkfifo(path)  # nobody ever writes to it: an open without O_NONBLOCK waits forever
    elif kind == "over-cap":
        with path.open("wb") as handle:
            handle.truncate(OVER_EVERY_CAP)  # sparse: no disk, no memory
    elif kind == "directory":
        path.mkdir()
    elif kind == "nul-bytes":
        path.write_bytes(b'{"gpus": []}\nINFO start\n\0\0\0\x01\x02 binary\n')
    elif kind == "invalid-utf8":
        path.write_bytes(b'{"name": "caf\xe9"}\nINFO \xff\xfe not utf-8\n')
    else:
        raise AssertionError(kind)
    return str(path)


def _run_isolated(argv: list[str], *, stdin: str | None = None, prelude: str = "") -> tuple[int, str]:
    """The CLI in a process of its own: address space capped, killed (with anything it started)
    after ISOLATED_TIMEOUT_S. ``prelude``: Python run before it (monkeypatching)."""

    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (ISOLATED_ADDRESS_SPACE, ISOLATED_ADDRESS_SPACE))

    code = f"import sys\n{prelude}\nfrom sglang_deploy import cli\nsys.exit(cli.main(sys.argv[1:]))\n"
    with open(stdin or os.devnull, "rb") as source:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, *argv], stdin=source, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, preexec_fn=limits, start_new_session=True,
        )  # fmt: skip
        try:
            out, err = proc.communicate(timeout=ISOLATED_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            pytest.fail(f"{argv} did not finish in {ISOLATED_TIMEOUT_S} s: it waits on or reads its input unbounded")
    return proc.returncode, (out + err).decode(errors="replace")


def _run_kind(kind: str, argv: list[str], capsys: pytest.CaptureFixture[str], **isolated: str) -> tuple[int, str]:
    if kind in STREAMS or isolated:
        return _run_isolated(argv, **isolated)
    return _run(argv, capsys)


def _assert_refused(kind: str, rc: int, output: str) -> None:
    _assert_one_line_error(rc, output)
    assert WHY[kind] in output, output


@pytest.mark.parametrize("json_output", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("kind", STREAMS + REGULAR)
def test_doctor_refuses_a_log_that_is_not_a_text_file(kind: str, json_output: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = hostile_path(tmp_path, kind, "server.log")
    argv = ["doctor", log, *(["--json"] if json_output else [])]
    _assert_refused(kind, *_run_kind(kind, argv, capsys))


@pytest.mark.parametrize("kind", ["dev-zero", "dev-urandom", "over-cap", "nul-bytes", "invalid-utf8"])
def test_doctor_refuses_a_stdin_that_is_not_bounded_text(kind: str, tmp_path: Path) -> None:
    """``doctor -``: at most the cap is read from stdin; more, or bytes that are not text, is refused."""
    source = hostile_path(tmp_path, kind, "stdin.log")
    rc, output = _run_isolated(["doctor", "-"], stdin=source)
    _assert_one_line_error(rc, output)
    assert {"dev-zero": "more than", "dev-urandom": "more than"}.get(kind, WHY[kind]) in output, output


@pytest.mark.parametrize("kind", STREAMS + ["nul-bytes", "invalid-utf8"])
def test_doctor_refuses_a_plan_file_that_is_not_a_text_file(kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "server.log"
    log.write_text("INFO nothing to see\n")
    plan = hostile_path(tmp_path, kind, "plan.json")
    _assert_refused(kind, *_run_kind(kind, ["doctor", "--plan", plan, str(log)], capsys))


@pytest.mark.parametrize("lines", ["0", "-5", "100000000"])
def test_doctor_refuses_a_journal_length_it_cannot_bound(lines: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("sglang_servers:\n  hosts:\n    here:\n      ansible_connection: local\n")
    rc, output = _run(["doctor", "-i", str(inventory), "--lines", lines], capsys)
    _assert_one_line_error(rc, output)
    assert "--lines" in output


PLAN_FILE_OPTIONS = ["--gpu-facts", "--model-config", "--safetensors-index", "--hf-quant-config"]


def _plan_argv(option: str, path: str, tmp_path: Path) -> list[str]:
    if option == "--hf-quant-config":  # read along with a model config
        config = tmp_path / "config.json"
        config.write_text("{}")
        return ["plan", *SEED_BOX, "--model-config", str(config), option, path]
    return ["plan", *SEED_BOX, option, path]


@pytest.mark.parametrize("kind", STREAMS + REGULAR)
@pytest.mark.parametrize("option", PLAN_FILE_OPTIONS)
def test_plan_refuses_a_json_file_that_is_not_a_text_file(option: str, kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = hostile_path(tmp_path, kind, "input.json")
    _assert_refused(kind, *_run_kind(kind, _plan_argv(option, path, tmp_path), capsys))


@pytest.mark.parametrize("kind", ["binary", "empty", "list", "truncated", "scalar", "missing", "directory"])
def test_plan_refuses_an_unusable_hf_quant_config(kind: str, files: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Named on the command line, it is read (and refused) like the others, never skipped quietly."""
    _assert_one_line_error(*_run(_plan_argv("--hf-quant-config", files[kind], tmp_path), capsys))


def test_plan_refuses_a_quant_config_beside_the_model_config_that_is_not_a_file(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    os.mkfifo(tmp_path / "hf_quant_config.json")
    rc, output = _run_isolated(["plan", *SEED_BOX, "--model-config", str(tmp_path / "config.json")])
    _assert_refused("fifo", rc, output)


@pytest.mark.parametrize("json_output", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("kind", STREAMS + ["nul-bytes"])
def test_kernels_refuses_a_path_that_is_not_a_bounded_regular_file(kind: str, json_output: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = hostile_path(tmp_path, kind, "ops.so")
    argv = ["kernels", *(["--json"] if json_output else []), path]
    rc, output = _run_kind(kind, argv, capsys)
    _assert_one_line_error(rc, output)
    assert {"nul-bytes": "not an ELF"}.get(kind, WHY[kind]) in output, output


def test_kernels_walk_skips_devices_fifos_and_links_out(tmp_path: Path) -> None:
    """A directory walk reads regular files only: a FIFO or a link to /dev/zero named like a shared
    object, or a link to /dev, is not opened (and does not hang the walk)."""
    tree = tmp_path / "site-packages"
    (tree / "pkg").mkdir(parents=True)
    os.mkfifo(tree / "pkg" / "fifo.so")
    (tree / "pkg" / "zero.so").symlink_to("/dev/zero")
    (tree / "dev").symlink_to("/dev", target_is_directory=True)
    rc, output = _run_isolated(["kernels", "--require", "sm_120", str(tree)])
    assert rc == 3, output  # nothing with device code found, nothing refused
    assert "Traceback" not in output


def test_kernels_refuses_a_missing_path_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, output = _run(["kernels", str(tmp_path / "missing.so")], capsys)
    _assert_one_line_error(rc, output)
    assert output.count(str(tmp_path / "missing.so")) == 1, output


@pytest.mark.parametrize("kind", STREAMS + REGULAR)
def test_nccl_check_command_refuses_an_environment_file_that_is_not_a_text_file(kind: str, tmp_path: Path) -> None:
    """Checked before the check's interpreter is started (it would read the file unbounded)."""
    path = hostile_path(tmp_path, kind, "sglang.env")
    rc, output = _run_isolated(["nccl-check", "--python", sys.executable, "--", "--env-from-file", path])
    _assert_refused(kind, rc, output)


@pytest.mark.parametrize("spelling", ["--env-from-file={}", "--env-from-fi {}"])
def test_nccl_check_command_finds_the_environment_file_however_it_is_spelled(spelling: str, tmp_path: Path) -> None:
    path = hostile_path(tmp_path, "fifo", "sglang.env")
    rc, output = _run_isolated(["nccl-check", "--python", sys.executable, "--", *spelling.format(path).split()])
    _assert_refused("fifo", rc, output)


LOCK_PRELUDE = """
from pathlib import Path
from sglang_deploy.lanes import lock
lock.lock_dir = lambda: Path({root!r})
lock.resolve = lambda target, uv=None: "# resolved\\n"
"""


@pytest.mark.parametrize("check", [True, False], ids=["check", "write"])
@pytest.mark.parametrize("kind", STREAMS + REGULAR)
def test_lock_refuses_a_lock_file_that_is_not_a_text_file(kind: str, check: bool, tmp_path: Path) -> None:
    from sglang_deploy.lanes import catalog, lock

    lane = next(name for name in catalog.lane_names() if catalog.load_lane(name).lock is not None)
    first = lock.targets(catalog.load_lane(lane))[0]
    root = tmp_path / "locks"
    source = hostile_path(root, kind, first.file_name)
    if source.startswith("/dev/"):
        (root / first.file_name).symlink_to(source)
    argv = ["lock", "--lane", lane, *(["--check"] if check else [])]
    rc, output = _run_isolated(argv, prelude=LOCK_PRELUDE.format(root=str(root)))
    _assert_refused(kind, rc, output)
