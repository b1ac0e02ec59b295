"""Hostile checkpoints (issue 43, class 3): `sglang-deploy checkpoint` on each one exits 2 with one line, in seconds,
under a 2 GiB address-space limit, never reads a file out of the checkpoint through a link, never writes an escape
sequence from a name to the terminal, and does not call usable a shard whose tensor spans overlap or leave holes
(the safetensors loader refuses those). The checkpoints are GLM-5-NVFP4-shaped (tests/fixtures/glm5_checkpoint.py)."""

from __future__ import annotations

import json
import os
import resource
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT

from sglang_deploy_host.model import inspection, safetensors

sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
from glm5_checkpoint import make_glm5_checkpoint, sparse_copy  # noqa: E402

LIMIT = 2 << 30
SHARD = "model-00002-of-00004.safetensors"


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile")
    make_glm5_checkpoint(root / "missing", draft="missing")
    return root / "missing"


@pytest.fixture()
def ckpt(source: Path, tmp_path: Path) -> Path:
    """A private copy (sparse shards stay sparse: their headers copied, their length kept)."""
    return sparse_copy(source, tmp_path / "ckpt")


def inspect_limited(path: Path) -> subprocess.CompletedProcess[str]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))

    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "sglang_deploy.cli", "checkpoint", str(path)], capture_output=True,
                          text=True, timeout=60, check=False, preexec_fn=limit, cwd=ROOT)  # fmt: skip
    assert time.monotonic() - start < 20, "more than seconds"
    return done


def refused(path: Path, needle: str) -> str:
    done = inspect_limited(path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert needle in lines[0], lines[0]
    assert "\x1b" not in done.stderr + done.stdout
    return lines[0]


def rewrite_header(shard: Path, change) -> None:  # noqa: ANN001 - a callable on the header's dict
    raw = shard.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    size = shard.stat().st_size - 8 - length
    change(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    shard.write_bytes(struct.pack("<Q", len(text)) + text)
    os.truncate(shard, 8 + len(text) + size)


def test_a_config_that_declares_a_billion_draft_layers(ckpt: Path) -> None:
    config = json.loads((ckpt / "config.json").read_text())
    config["num_nextn_predict_layers"] = 1_000_000_000
    (ckpt / "config.json").write_text(json.dumps(config))
    refused(ckpt, "num_nextn_predict_layers = 1000000000 is more than any real model has (at most 16)")


@pytest.mark.parametrize("key", ["num_hidden_layers", "vocab_size", "hidden_size"])
def test_a_config_with_impossible_counts(ckpt: Path, key: str) -> None:
    config = json.loads((ckpt / "config.json").read_text())
    config[key] = 10**15
    (ckpt / "config.json").write_text(json.dumps(config))
    refused(ckpt, f"{key} = {10**15} is more than any real model has")


def test_a_tensor_of_a_million_and_a_half_dimensions(ckpt: Path) -> None:
    def huge(header: dict) -> None:
        name = next(n for n in header if n != "__metadata__")
        header[name]["shape"] = [1] * 1_500_000

    rewrite_header(ckpt / SHARD, huge)
    refused(ckpt, "dimensions, not a list of at most 16 sizes")


@pytest.mark.parametrize("where", ["header", "config", "index"])
def test_json_nested_too_deeply(ckpt: Path, where: str) -> None:
    deep = "[" * 200_000 + "]" * 200_000
    if where == "header":
        raw = ('{"x": ' + deep + "}").encode()
        raw += b" " * (-len(raw) % 8)
        (ckpt / SHARD).write_bytes(struct.pack("<Q", len(raw)) + raw)
        refused(ckpt, "nested too deeply")
    elif where == "config":
        (ckpt / "config.json").write_text(deep)
        refused(ckpt, "config.json")
    else:
        (ckpt / inspection.INDEX_NAME).write_text(deep)
        refused(ckpt, "the index")


def test_a_header_larger_than_any_real_one_is_not_read(ckpt: Path) -> None:
    shard = ckpt / SHARD
    with shard.open("r+b") as handle:
        handle.write(struct.pack("<Q", 20 << 20))
    os.truncate(shard, max(shard.stat().st_size, (20 << 20) + 16))
    refused(ckpt, "header length 20971520 is not plausible (at most 16777216 bytes)")


def test_a_shard_through_a_link_out_of_the_checkpoint_is_not_read(ckpt: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.safetensors"
    (ckpt / SHARD).rename(outside)
    (ckpt / SHARD).symlink_to(outside)
    line = refused(ckpt, "is a link out of the checkpoint")
    assert "not read" in line


def test_a_config_through_a_link_out_of_the_checkpoint_is_not_read(ckpt: Path, tmp_path: Path) -> None:
    (ckpt / "config.json").rename(tmp_path / "config.json")
    (ckpt / "config.json").symlink_to(tmp_path / "config.json")
    refused(ckpt, "config.json")


def test_a_hugging_face_snapshot_links_into_its_blobs(source: Path, tmp_path: Path) -> None:
    """The cache layout (snapshots/<rev>/<file> -> ../../blobs/<hash>) is a checkpoint's own, and is read."""
    repo = tmp_path / "models--lukealonso--GLM-5-NVFP4"
    snapshot = repo / "snapshots" / ("0" * 40)
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for number, path in enumerate(sorted(source.iterdir())):
        blob = repo / "blobs" / f"blob{number}"
        if path.suffix == ".safetensors":
            with path.open("rb") as src, blob.open("wb") as dst:
                length = src.read(8)
                dst.write(length + src.read(struct.unpack("<Q", length)[0]))
                dst.truncate(path.stat().st_size)
        else:
            shutil.copy(path, blob)
        (snapshot / path.name).symlink_to(os.path.relpath(blob, snapshot))
    done = inspect_limited(snapshot)
    assert done.returncode == 0, done.stderr
    assert "MTP draft layer for speculative decoding: MISSING" in done.stdout


def test_an_escape_sequence_in_a_tensor_name_never_reaches_the_terminal(ckpt: Path) -> None:
    def named(header: dict) -> None:
        name = next(n for n in header if n != "__metadata__")
        header["\x1b]0;owned\x07\x1b[31m" + name] = header.pop(name)

    rewrite_header(ckpt / SHARD, named)
    line = refused(ckpt, "is not printable")
    assert "\\x1b" in line


def test_an_escape_sequence_in_the_index_never_reaches_the_terminal(ckpt: Path) -> None:
    index = json.loads((ckpt / inspection.INDEX_NAME).read_text())
    index["weight_map"]["model.layers.0.x.weight"] = "\x1b[2Jshard.safetensors"
    (ckpt / inspection.INDEX_NAME).write_text(json.dumps(index))
    refused(ckpt, "maps to an invalid file")


@pytest.mark.parametrize(("change", "needle"), [("overlap", "overlaps the one before it"), ("hole", "leaves a hole of 16 bytes")])
def test_spans_that_overlap_or_leave_holes_are_not_usable(ckpt: Path, change: str, needle: str) -> None:
    def spans(header: dict) -> None:
        tensors = sorted((n for n in header if n != "__metadata__"), key=lambda n: header[n]["data_offsets"][0])
        first, second = header[tensors[0]], header[tensors[1]]
        shift = -16 if change == "overlap" else 16
        second["data_offsets"] = [second["data_offsets"][0] + shift, second["data_offsets"][1] + shift]
        if change == "overlap":  # the one after must still fit
            first["data_offsets"] = list(first["data_offsets"])

    rewrite_header(ckpt / SHARD, spans)
    line = refused(ckpt, needle)
    assert "the safetensors loader refuses this file" in line


def test_the_shown_name_escapes_and_bounds() -> None:
    assert safetensors.shown("a\x1b[31mb") == "a\\x1b[31mb"
    assert len(safetensors.shown("x" * 500)) == 120
