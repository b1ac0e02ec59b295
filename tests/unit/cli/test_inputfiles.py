"""inputfiles: what a command reads is a regular file, under a cap, and text (or JSON) where that is expected;
everything else is an InputFileError (a ValueError) naming the option, the path and the reason."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from sglang_deploy import inputfiles
from sglang_deploy.inputfiles import InputFileError


def test_a_regular_file_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"\0\x01\xffbinary is fine as bytes")
    assert inputfiles.read_bytes(path, "--x") == b"\0\x01\xffbinary is fine as bytes"
    assert inputfiles.read_bytes(str(path), "--x") == path.read_bytes()


def test_the_cap_is_inclusive(tmp_path: Path) -> None:
    path = tmp_path / "f.txt"
    path.write_bytes(b"x" * 10)
    assert inputfiles.read_bytes(path, "--x", max_bytes=10) == b"x" * 10
    with pytest.raises(InputFileError, match=r"--x .*f\.txt: 10 bytes, more than the 9 this reads"):
        inputfiles.read_bytes(path, "--x", max_bytes=9)


def test_a_sparse_file_over_the_cap_is_refused_before_reading(tmp_path: Path) -> None:
    path = tmp_path / "huge.log"
    with path.open("wb") as handle:
        handle.truncate(inputfiles.DEFAULT_MAX_BYTES + 1)
    with pytest.raises(InputFileError, match="more than the 67,108,864 this reads"):
        inputfiles.read_text(path, "log")


def test_a_file_that_grows_past_the_cap_while_read_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The size is checked on the open file and again by the read itself (at most cap + 1 bytes)."""
    path = tmp_path / "growing.log"
    path.write_bytes(b"y" * 100)
    real_fstat = os.fstat

    class Smaller:
        def __init__(self, info: os.stat_result) -> None:
            self.st_mode, self.st_size = info.st_mode, 1

    monkeypatch.setattr(inputfiles.os, "fstat", lambda fd: Smaller(real_fstat(fd)))
    with pytest.raises(InputFileError, match="more than the 10 bytes"):
        inputfiles.read_bytes(path, "log", max_bytes=10)


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom", "/dev/null"])
def test_a_device_is_refused(device: str) -> None:
    with pytest.raises(InputFileError, match=f"--x {device}: not a regular file"):
        inputfiles.read_bytes(device, "--x")


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(InputFileError, match="not a regular file"):
        inputfiles.read_text(fifo, "--x")


def test_a_link_is_judged_by_what_it_points_to(tmp_path: Path) -> None:
    (tmp_path / "real.json").write_text('{"a": 1}')
    (tmp_path / "good.json").symlink_to(tmp_path / "real.json")
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    assert inputfiles.read_json(tmp_path / "good.json", "--x") == {"a": 1}
    with pytest.raises(InputFileError, match="not a regular file"):
        inputfiles.read_json(tmp_path / "zero.json", "--x")


def test_a_directory_and_a_missing_file_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="a directory; give a file"):
        inputfiles.read_text(tmp_path, "--x")
    with pytest.raises(InputFileError, match=r"cannot open it \(No such file or directory\)"):
        inputfiles.read_text(tmp_path / "missing", "--x")


@pytest.mark.parametrize(
    ("content", "why"),
    [(b"text\0with a NUL", r"a binary file \(NUL bytes\)"), (b"caf\xe9", r"not UTF-8 text \(byte 3\)"),
     (b"\xff\xfe", r"not UTF-8 text \(byte 0\)")],
)  # fmt: skip
def test_text_is_utf8_without_nul_bytes(content: bytes, why: str, tmp_path: Path) -> None:
    path = tmp_path / "f.txt"
    path.write_bytes(content)
    with pytest.raises(InputFileError, match=why):
        inputfiles.read_text(path, "--x")
    assert inputfiles.read_bytes(path, "--x") == content  # as bytes it is fine


def test_text_and_json_read_back(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    path.write_text('{"name": "café", "n": [1, 2]}\n', encoding="utf-8")
    assert inputfiles.read_text(path, "--x") == '{"name": "café", "n": [1, 2]}\n'
    assert inputfiles.read_json(path, "--x") == {"name": "café", "n": [1, 2]}


@pytest.mark.parametrize("content", [b"", b"{", b"[1,", b"nan?", b"{'single': 1}"])
def test_json_that_does_not_parse_is_refused(content: bytes, tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    path.write_bytes(content)
    with pytest.raises(InputFileError, match=r"--x .*f\.json: not JSON"):
        inputfiles.read_json(path, "--x")


def test_json_has_its_own_smaller_default_cap(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    with path.open("wb") as handle:
        handle.truncate(inputfiles.JSON_MAX_BYTES + 1)
    with pytest.raises(InputFileError, match="more than the 16,777,216 this reads"):
        inputfiles.read_json(path, "--x")


def test_the_error_is_a_value_error_of_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as caught:
        inputfiles.read_text(tmp_path, "--x")
    assert "\n" not in str(caught.value)


def test_exists_sees_links_even_dangling_ones(tmp_path: Path) -> None:
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    assert inputfiles.exists(tmp_path / "dangling")
    assert inputfiles.exists(tmp_path)
    assert not inputfiles.exists(tmp_path / "nowhere")


# --- streams (stdin): read at most the cap, refuse more ------------------------------------------------------


def test_a_stream_is_read_up_to_the_cap() -> None:
    assert inputfiles.read_stream_text(io.BytesIO(b"x" * 10), "stdin", max_bytes=10) == "x" * 10
    with pytest.raises(InputFileError, match="stdin: more than the 9 bytes this reads"):
        inputfiles.read_stream_text(io.BytesIO(b"x" * 10), "stdin", max_bytes=9)


def test_an_endless_stream_is_cut_at_the_cap() -> None:
    class Endless(io.RawIOBase):
        def __init__(self) -> None:
            self.given = 0

        def readable(self) -> bool:
            return True

        def readinto(self, buffer: bytearray) -> int:  # type: ignore[override]
            buffer[:] = b"\0" * len(buffer)
            self.given += len(buffer)
            return len(buffer)

    endless = Endless()
    with pytest.raises(InputFileError, match="more than the 1,000 bytes"):
        inputfiles.read_stream_text(endless, "stdin", max_bytes=1000)
    assert endless.given <= 1001


@pytest.mark.parametrize(("content", "why"), [(b"a\0b", "binary"), (b"\xe9t\xe9", "not UTF-8")])
def test_a_stream_must_be_text(content: bytes, why: str) -> None:
    with pytest.raises(InputFileError, match=f"stdin: .*{why}"):
        inputfiles.read_stream_text(io.BytesIO(content), "stdin")


def test_stdin_from_dev_zero_is_refused_at_the_cap() -> None:
    with open("/dev/zero", "rb") as zero, pytest.raises(InputFileError, match="more than the 4,096 bytes"):
        inputfiles.read_stream_text(zero, "stdin", max_bytes=4096)
