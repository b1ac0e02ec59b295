"""sglang_launcher.py: the API key reaches sglang's sys.argv, never the process argv, the workers'
environment or the log. Runs the real launcher file on a stand-in module that behaves like sglang
where it matters: logs its ServerArgs (key included) from the main process and a spawned worker."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest

from sglang_deploy_host.serving import sglang_launcher
from sglang_deploy_host.serving.sglang_launcher import MASK, Masker

LAUNCHER = Path(sglang_launcher.__file__)
KEY = "sk-launch-7d2e91c4"

STANDIN = '''
import json, multiprocessing, os, signal, sys, time, urllib.parse

def worker(argv):
    print(f"Global server args updated! server_args=ServerArgs(api_key={argv[-1]!r})", file=sys.stderr, flush=True)
    with open(f"/proc/{os.getpid()}/cmdline", "rb") as f:
        cmdline = f.read()
    with open(os.environ["REPORT"] + ".worker", "w") as out:
        json.dump({"cmdline": cmdline.decode(errors="replace"), "env": sorted(os.environ)}, out)

if __name__ == "__main__":
    with open(f"/proc/{os.getpid()}/cmdline", "rb") as f:
        cmdline = f.read()
    with open(os.environ["REPORT"], "w") as out:
        json.dump({"argv": sys.argv[1:], "cmdline": cmdline.decode(errors="replace"), "env": sorted(os.environ)}, out)
    print(f"server_args=ServerArgs(api_key={sys.argv[-1]!r}, port=8000)", file=sys.stderr, flush=True)
    mode = os.environ.get("MODE", "")
    if mode == "forms":  # every other way a library prints a string
        print(json.dumps({"api_key": sys.argv[-1]}), json.dumps({"k": sys.argv[-1]}, ensure_ascii=False), flush=True)
        print("GET /x?key=" + urllib.parse.quote(sys.argv[-1], safe="") + "&q=" + urllib.parse.quote_plus(sys.argv[-1]), flush=True)
        print(repr([sys.argv[-1]]), '"' + sys.argv[-1].replace(chr(92), chr(92) * 2).replace('"', chr(92) + '"') + '"', flush=True)
    if mode == "raise":
        raise RuntimeError(f"boom with {sys.argv[-1]}")
    if mode == "sigterm":
        def on_term(*_):
            print(f"draining, key {sys.argv[-1]}", flush=True)
            sys.exit(0)
        signal.signal(signal.SIGTERM, on_term)
        print("ready", flush=True)
        time.sleep(60)
    process = multiprocessing.get_context("spawn").Process(target=worker, args=(sys.argv,))
    process.start()
    process.join()
    sys.exit(int(os.environ.get("EXIT", "0")))
'''


@pytest.fixture()
def standin(tmp_path: Path) -> Path:
    package = tmp_path / "standin_sglang"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "launch_server.py").write_text(STANDIN)
    return tmp_path


def _launch(standin: Path, *extra: str, env: dict[str, str] | None = None, **kwargs):  # type: ignore[no-untyped-def]
    environment = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(standin),
        "REPORT": str(standin / "report.json"),
        "SGLANG_API_KEY": KEY,
        **(env or {}),
    }
    argv = [sys.executable, str(LAUNCHER), "--module", "standin_sglang.launch_server",
            "--env-flag", "api-key=SGLANG_API_KEY", *extra,
            "--", "--model-path", "/models/x", "--port", "8000"]  # fmt: skip
    return argv, environment


def test_the_key_reaches_sglang_but_not_argv_environment_or_log(standin: Path) -> None:
    argv, env = _launch(standin)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads((standin / "report.json").read_text())
    assert report["argv"] == ["--model-path", "/models/x", "--port", "8000", "--api-key", KEY]
    assert KEY not in report["cmdline"]  # /proc/PID/cmdline is readable by every local user
    assert "SGLANG_API_KEY" not in report["env"]
    worker = json.loads((standin / "report.json.worker").read_text())
    assert KEY not in worker["cmdline"] and "SGLANG_API_KEY" not in worker["env"]
    log = done.stdout + done.stderr
    assert KEY not in log
    assert f"api_key='{MASK.decode()}'" in log  # the main process's ServerArgs line, masked
    assert "Global server args updated!" in log  # the worker's line went through the mask too


def test_exit_status_and_tracebacks_pass_through_masked(standin: Path) -> None:
    argv, env = _launch(standin, env={"EXIT": "3"})
    assert subprocess.run(argv, env=env, capture_output=True, timeout=120, check=False).returncode == 3
    argv, env = _launch(standin, env={"MODE": "raise"})
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1
    assert "RuntimeError: boom with ********" in done.stderr and KEY not in done.stderr


def test_a_missing_secret_fails_in_one_line(standin: Path) -> None:
    argv, env = _launch(standin)
    del env["SGLANG_API_KEY"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "SGLANG_API_KEY is not set" in done.stderr
    assert not (standin / "report.json").exists()


def test_sigterm_to_the_unit_lets_sglang_drain_and_log_masked(standin: Path) -> None:
    """systemd (KillMode=control-group) signals every process of the unit: the launcher ignores
    it, sglang drains, and the lines it writes while draining are still masked."""
    argv, env = _launch(standin, env={"MODE": "sigterm"})
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"
    time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert b"draining, key ********" in out and KEY.encode() not in out + err


def test_without_secrets_the_module_runs_in_process(standin: Path) -> None:
    report = standin / "report.json"
    argv = [sys.executable, str(LAUNCHER), "--module", "standin_sglang.launch_server", "--", "--port", "1"]
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(standin), "REPORT": str(report)}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(report.read_text())["argv"] == ["--port", "1"]


@pytest.mark.parametrize("spec", ["api-key", "=X", "api-key=", "--api-key=X"])
def test_bad_env_flag_specs_are_refused(spec: str) -> None:
    with pytest.raises(sglang_launcher.LaunchError, match="want FLAG=ENV_NAME"):
        sglang_launcher.parse_env_flags([spec], {"X": "v"})


def _masked(chunks: list[bytes], secrets: list[bytes]) -> bytes:
    masker = Masker(secrets)
    return b"".join(masker.feed(chunk) for chunk in chunks) + masker.flush()


def test_masker_finds_a_secret_cut_at_every_chunk_boundary() -> None:
    text = b"start api_key='" + KEY.encode() + b"' end\nnext line " + KEY.encode() + b"\n"
    for cut in range(1, len(text)):
        for second in range(cut, len(text)):
            out = _masked([text[:cut], text[cut:second], text[second:]], [KEY.encode()])
            assert KEY.encode() not in out, (cut, second)
            assert out == text.replace(KEY.encode(), MASK)


def test_masker_bounds_lines_without_newlines_and_keeps_other_text() -> None:
    secret = b"s3cr3t-value"
    blob = (b"x" * 100_000 + secret) * 3
    masker = Masker([secret, b"s3cr3t"])
    first = masker.feed(blob[:150_000])
    assert first and len(first) <= 150_000  # written out before any newline came
    out = first + masker.feed(blob[150_000:]) + masker.flush()
    assert secret not in out and out == blob.replace(secret, MASK)


def test_masker_carries_a_secret_split_by_a_chunk_in_a_line_longer_than_its_bound() -> None:
    """A line past 64 KiB is written out before its newline; the bytes that may start a secret stay behind,
    so a secret cut in two by the chunk that crossed the bound is still masked, wherever the cut falls."""
    secret = KEY.encode()
    head = b"y" * (70 * 1024)  # past the 64 KiB bound, no newline
    for cut in range(1, len(secret)):
        masker = Masker([secret])
        first = masker.feed(head + secret[:cut])
        assert first, "a line past the bound is written out before its newline"
        rest = masker.feed(secret[cut:] + b" tail\n") + masker.flush()
        assert secret[:cut] not in first[-len(secret):], cut  # the secret's start was held back, not written
        assert first + rest == head + MASK + b" tail\n", cut


def test_masker_carries_enough_for_the_longest_of_several_secrets() -> None:
    """The launcher hands the masker every form of every secret at once (the API key, the admin key, their repr,
    JSON and URL forms): different lengths. What a chunk leaves behind is the longest one's length less a byte,
    so the long secret cut at any byte is masked in a line past the bound, and the short one beside it too."""
    short, long_ = b"k3y-0", b"admin-" + b"L" * 40
    head = b"z" * (70 * 1024)
    for cut in range(1, len(long_)):
        masker = Masker([short, long_])
        out = masker.feed(head + short + b" " + long_[:cut])
        out += masker.feed(long_[cut:] + b" " + short + b"\n") + masker.flush()
        assert out == head + MASK + b" " + MASK + b" " + MASK + b"\n", cut


def test_masker_masks_the_longer_of_two_secrets_that_share_a_start() -> None:
    """A secret that begins another (a key and the key with a suffix): the longer is masked whole, not the
    shorter with the rest left showing."""
    out = _masked([b"token=abcdef-ghij\n"], [b"abcdef", b"abcdef-ghij"])
    assert out == b"token=" + MASK + b"\n"
    out = _masked([b"token=abcdef-ghij\n"], [b"abcdef-ghij", b"abcdef"])
    assert out == b"token=" + MASK + b"\n"


def test_masker_ignores_an_empty_secret_and_passes_text_without_secrets_unchanged() -> None:
    assert _masked([b"plain line\n", b"no newline"], [b"", KEY.encode()]) == b"plain line\nno newline"
    assert _masked([b"a\n"], []) == b"a\n"
    masker = Masker([KEY.encode()])
    assert masker.feed(b"partial") == b"" and masker.flush() == b"partial"  # held until its line ends


def test_every_form_of_two_keys_is_masked_in_one_stream() -> None:
    api, admin = "api-key-0123456789", "admin'key\\0123"
    secrets = sglang_launcher.secret_forms(api) + sglang_launcher.secret_forms(admin)
    assert len({len(form) for form in secrets}) > 2
    line = f"ServerArgs(api_key={api!r}, admin_api_key={admin!r}) {json.dumps(admin)} {urllib.parse.quote(admin, safe='')}\n"
    data = line.encode()
    for size in (1, 3, 7, len(data)):
        out = _masked([data[i : i + size] for i in range(0, len(data), size)], secrets)
        assert api.encode() not in out and b"admin" not in out.replace(b"admin_api_key", b""), (size, out)


@pytest.mark.parametrize("key", ["back\\slash-key-0123", "quo'te\"key-0123", "tab\tkey-0123", "ünïcode-key-0123", "sp ace%key-0123"])
def test_a_key_that_sglang_prints_escaped_is_masked_in_every_form(standin: Path, key: str) -> None:
    """sglang logs ServerArgs as a repr (backslash, quotes, tab escaped); libraries print JSON or URLs.
    Before: only the raw bytes were masked, so the repr of a key with a backslash went out in clear."""
    argv, env = _launch(standin, env={"SGLANG_API_KEY": key, "MODE": "forms"})
    done = subprocess.run(argv, env=env, capture_output=True, timeout=120, check=False)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log
    assert log.count(MASK) >= 8, log  # the ServerArgs lines, JSON twice, two URL forms, the repr, the "..." form
    for form in sglang_launcher.secret_forms(key):
        assert form not in log, (form, log)
    # What is left around the masks is the program's own text, not a piece of the key.
    assert b"key-0123" not in log


def test_strip_ansi_keeps_the_journal_plain_and_still_masks(standin: Path) -> None:
    """The router colours its log whatever NO_COLOR says; --strip-ansi (the router unit's) removes the
    codes, also between a secret's characters, before the mask looks for it."""
    masker = Masker([KEY.encode()], strip_ansi=True)
    coloured = b"\x1b[2m2026-12-01\x1b[0m \x1b[32m INFO\x1b[0m key " + KEY[:4].encode() + b"\x1b[1m" + KEY[4:].encode() + b"\n"
    assert masker.feed(coloured) + masker.flush() == b"2026-12-01  INFO key " + MASK + b"\n"
    # through the real launcher: a module without secrets but with colours is relayed, plain
    module = standin / "colour_mod.py"
    module.write_text("import sys\nprint('\\x1b[33mWARN\\x1b[0m plain', flush=True)\nprint('\\x1b[1;31merr\\x1b[0m', file=sys.stderr)\n")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(standin)}
    argv = [sys.executable, str(LAUNCHER), "--module", "colour_mod", "--strip-ansi", "--"]
    done = subprocess.run(argv, env=env, capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"WARN plain\n" and done.stderr == b"err\n"
    plain = subprocess.run(argv[:-2] + ["--"], env=env, capture_output=True, timeout=60, check=False)
    assert b"\x1b[33m" in plain.stdout  # without the switch the module's output is untouched


@pytest.mark.parametrize(
    ("key", "forms"),
    [
        # repr picks "..." for a key holding ' and no ": the '...' form escapes the quote.
        ("it's-key", {"it's-key", "it\\'s-key", "it%27s-key"}),
        # and '...' for one holding ": JSON and the "..." form escape it.
        ('say"hi', {'say"hi', 'say\\"hi', "say%22hi"}),
        # JSON ASCII-escaped and not; a control character the repr writes as \x01, JSON as \u0001.
        ("ü\x01", {"ü\x01", "ü\\x01", "\\u00fc\\u0001", "ü\\u0001", "%C3%BC%01"}),
        ("a b", {"a b", "a%20b", "a+b"}),
    ],
)
def test_secret_forms_are_exactly_the_ways_it_is_printed_longest_first(key: str, forms: set[str]) -> None:
    found = sglang_launcher.secret_forms(key)
    assert set(found) == {form.encode() for form in forms}
    assert [len(form) for form in found] == sorted((len(form) for form in found), reverse=True)


def test_a_line_without_a_newline_is_written_once_past_the_limit_keeping_a_secrets_length_back() -> None:
    """A line is held until it ends, up to 64 KiB; past that it is written but for the last len(secret) - 1 bytes,
    which may be the start of a secret the next chunk ends."""
    limit = sglang_launcher._MAX_LINE
    secret = b"0123456789"
    masker = Masker([secret, b"abc"])
    assert masker.feed(b"x" * limit) == b""  # at the limit: still held
    masker = Masker([secret, b"abc"])
    assert masker.feed(b"x" * (limit + 1)) == b"x" * (limit + 1 - (len(secret) - 1))
    assert masker.feed(b"01234") == b"" and masker.feed(b"56789\n") == b"x" * (len(secret) - 1) + MASK + b"\n"


def test_the_masker_keeps_colour_codes_unless_told_to_strip_them() -> None:
    coloured = b"\x1b[31mred " + KEY.encode() + b"\x1b[0m\n"
    assert _masked([coloured], [KEY.encode()]) == b"\x1b[31mred " + MASK + b"\x1b[0m\n"
    stripped = Masker([KEY.encode()], strip_ansi=True)
    assert stripped.feed(coloured) == b"red " + MASK + b"\n"


def test_relay_drains_what_a_lingering_worker_writes_for_the_drain_time_then_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """sglang's spawned workers can outlive its main process holding the log pipes: after the child exits, what
    they write is relayed (masked, a last line without its newline too) for the drain time, and then relay
    returns the child's status instead of waiting for the pipes to close."""
    monkeypatch.setattr(sglang_launcher, "_DRAIN_AFTER_EXIT_S", 1.5)
    saved = {signum: signal.getsignal(signum) for signum in sglang_launcher._FORWARDED_SIGNALS}
    read_end, write_end = os.pipe()
    out_read, out_write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        for fd in (read_end, out_read, out_write):
            os.close(fd)
        if os.fork() == 0:  # the lingering worker: writes after the child exits, then holds the pipe
            for line in (b"late " + KEY.encode() + b"\n", b"later\n", b"partial"):  # each read on its own
                time.sleep(0.3)
                os.write(write_end, line)
            time.sleep(6)
            os._exit(0)
        os.write(write_end, b"\x1b[1mfirst " + KEY.encode() + b"\n")  # kept: strip_ansi is off unless asked
        os._exit(3)
    os.close(write_end)
    try:
        start = time.monotonic()
        status = sglang_launcher.relay({read_end: out_write}, [KEY.encode()], child)
        elapsed = time.monotonic() - start
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
        os.close(out_write)
        with contextlib.suppress(OSError):  # left open by relay when the worker still held it
            os.close(read_end)
    with os.fdopen(out_read, "rb") as relayed:
        out = relayed.read(1 << 20)
    assert status == 3
    assert out == b"\x1b[1mfirst " + MASK + b"\nlate " + MASK + b"\nlater\npartial"
    assert 1.4 <= elapsed < 5, elapsed
