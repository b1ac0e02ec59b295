"""sglang_deploy_host.model.weights: the completeness check, plan and copy behind the hf_model role's modules,
on real safetensors files (tests/unit/host/test_weights_module.py runs the modules themselves)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from sglang_deploy_host.model import weights

sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
from tiny_checkpoint import make_checkpoint, write_shard  # noqa: E402

SHARD1 = "model-00001-of-00003.safetensors"
SHARD2 = "model-00002-of-00003.safetensors"
MODULE_UTILS = ROOT / "module_utils"


@pytest.fixture()
def ckpt(tmp_path: Path) -> Path:
    make_checkpoint(tmp_path / "ckpt")
    return tmp_path / "ckpt"


def _names(files: list[weights.PendingFile]) -> list[str]:
    return [f.name for f in files]


def _truncate(path: Path, drop: int) -> None:
    os.truncate(path, path.stat().st_size - drop)


def test_header_parse_gives_the_tensors_and_the_exact_file_size(tmp_path: Path):
    data = b"\x01" * 24
    write_shard(tmp_path / "a.safetensors", {"w": ([2, 3], data), "b": ([3], data[:12])})
    header = weights.safetensors_header(tmp_path / "a.safetensors")
    assert header["w"] == {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}
    assert header["b"]["data_offsets"] == [24, 36]
    assert weights.safetensors_expected_size(tmp_path / "a.safetensors") == (tmp_path / "a.safetensors").stat().st_size


def test_header_parse_rejects_a_file_that_ends_inside_the_header(tmp_path: Path):
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", 400) + b'{"w": {')
    with pytest.raises(weights.WeightsError, match="ends inside its 400-byte header"):
        weights.safetensors_header(path)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"", "shorter than the 8-byte header length"),
        (struct.pack("<Q", 2**40) + b"{}", "not plausible"),
        (struct.pack("<Q", 4) + b"nope", "not JSON"),
        (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
    ],
)
def test_header_parse_rejects_garbage(tmp_path: Path, payload: bytes, message: str):
    path = tmp_path / "x.safetensors"
    path.write_bytes(payload)
    with pytest.raises(weights.WeightsError, match=message):
        weights.safetensors_header(path)


def test_tensor_without_offsets_is_rejected(tmp_path: Path):
    raw = json.dumps({"w": {"dtype": "F32", "shape": [1]}}).encode()
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 4)
    with pytest.raises(weights.WeightsError, match="no valid data_offsets"):
        weights.safetensors_expected_size(path)


def test_complete_checkpoint_passes(ckpt: Path):
    report = weights.check(ckpt)
    assert report.complete, report.summary()
    assert [f.name for f in report.files] == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert report.present_bytes == report.expected_bytes == sum(
        (ckpt / f.name).stat().st_size for f in report.files
    )


def test_complete_with_the_source_manifest_checks_every_file(ckpt: Path):
    manifest = weights.list_files(ckpt)
    assert set(manifest) == {"config.json", "tokenizer_config.json", weights.INDEX_NAME, SHARD1, SHARD2,
                             "model-00003-of-00003.safetensors"}
    assert weights.check(ckpt, manifest).complete


def test_missing_shard_is_reported(ckpt: Path):
    (ckpt / SHARD2).unlink()
    report = weights.check(ckpt)
    assert not report.complete
    assert [(f.name, f.state) for f in report.problems()] == [(SHARD2, "missing")]
    assert report.brief() == f"{SHARD2} missing"
    assert "INCOMPLETE" in report.summary() and SHARD2 in report.summary()


def test_truncated_shard_is_found_from_its_own_header(ckpt: Path):
    full = (ckpt / SHARD1).stat().st_size
    _truncate(ckpt / SHARD1, 100)
    report = weights.check(ckpt)  # no manifest: the header alone knows the size
    [problem] = report.problems()
    assert (problem.name, problem.state, problem.expected_bytes, problem.present_bytes) == (
        SHARD1, "truncated", full, full - 100)


def test_shard_cut_inside_its_header_is_reported_not_raised(ckpt: Path):
    os.truncate(ckpt / SHARD1, 20)
    [problem] = weights.check(ckpt).problems()
    assert problem.state == "bad-header" and "header" in problem.detail
    assert weights.check(ckpt).brief() == f"{SHARD1} bad-header ({problem.detail})"


def test_oversized_shard_is_not_complete(ckpt: Path):
    with (ckpt / SHARD1).open("ab") as handle:
        handle.write(b"junk")
    assert [f.state for f in weights.check(ckpt).problems()] == ["oversized"]


def test_shard_consistent_but_different_from_the_source_is_not_complete(ckpt: Path, tmp_path: Path):
    manifest = weights.list_files(ckpt)
    manifest[SHARD1] += 8
    [problem] = weights.check(ckpt, manifest).problems()
    assert problem.state == "truncated" and "differs from the source" in problem.detail


def test_non_shard_file_missing_from_the_target_is_reported(ckpt: Path):
    manifest = weights.list_files(ckpt)
    (ckpt / "tokenizer_config.json").unlink()
    assert [(f.name, f.state) for f in weights.check(ckpt, manifest).problems()] == [
        ("tokenizer_config.json", "missing")]


@pytest.mark.parametrize(
    ("index_text", "message"),
    [
        ("{not json", "not readable JSON"),
        ('{"metadata": {}}', "no weight_map"),
        ('{"weight_map": {"w": "../../etc/passwd"}}', "invalid file"),
    ],
)
def test_bad_index_makes_the_checkpoint_incomplete(ckpt: Path, index_text: str, message: str):
    (ckpt / weights.INDEX_NAME).write_text(index_text)
    report = weights.check(ckpt)
    assert not report.complete
    assert any(message in e for e in report.errors), report.errors


def test_no_index_and_no_single_file_is_incomplete(tmp_path: Path):
    (tmp_path / "config.json").write_text("{}")
    report = weights.check(tmp_path)
    assert not report.complete and "neither" in report.errors[0]


def test_single_file_checkpoint_without_index(tmp_path: Path):
    write_shard(tmp_path / "model.safetensors", {"w": ([4], b"\0" * 16)})
    assert weights.check(tmp_path).complete


def test_missing_directory_is_incomplete(tmp_path: Path):
    assert not weights.check(tmp_path / "nope").complete


def test_copy_resumes_a_truncated_file_and_skips_good_ones(ckpt: Path, tmp_path: Path):
    manifest = weights.list_files(ckpt)
    target = tmp_path / "target"
    assert _names(weights.copy_resumable(ckpt, target, manifest)) == sorted(manifest)
    assert weights.check(target, manifest).complete
    _truncate(target / SHARD2, 1000)
    before = (target / SHARD1).stat().st_mtime_ns
    assert _names(weights.copy_resumable(ckpt, target, manifest)) == [SHARD2]
    assert (target / SHARD2).read_bytes() == (ckpt / SHARD2).read_bytes()
    assert (target / SHARD1).stat().st_mtime_ns == before
    assert weights.copy_resumable(ckpt, target, manifest) == []
    assert oct((target / SHARD2).stat().st_mode & 0o777) == "0o644"
    assert oct(target.stat().st_mode & 0o777) == "0o755"


def test_copy_rewrites_a_longer_target_file(ckpt: Path, tmp_path: Path):
    manifest = weights.list_files(ckpt)
    target = tmp_path / "target"
    weights.copy_resumable(ckpt, target, manifest)
    (target / "config.json").write_text((ckpt / "config.json").read_text() + "extra")
    assert _names(weights.copy_resumable(ckpt, target, manifest)) == ["config.json"]
    assert (target / "config.json").read_bytes() == (ckpt / "config.json").read_bytes()


def test_copy_refuses_a_source_that_changed_under_the_manifest(ckpt: Path, tmp_path: Path):
    manifest = weights.list_files(ckpt)
    _truncate(ckpt / SHARD1, 10)
    with pytest.raises(weights.WeightsError, match="the manifest says"):
        weights.copy_resumable(ckpt, tmp_path / "t", manifest)


def test_copy_plan_says_what_a_copy_would_write_and_writes_nothing(ckpt: Path, tmp_path: Path):
    manifest = weights.list_files(ckpt)
    target = tmp_path / "target"
    fresh = weights.copy_plan(ckpt, target, manifest)
    assert not target.exists()
    assert [(f.name, f.present_bytes, f.offset, f.bytes_to_write) for f in fresh] == [
        (name, None, 0, size) for name, size in sorted(manifest.items())]
    weights.copy_resumable(ckpt, target, manifest)
    _truncate(target / SHARD1, 300)
    (target / "config.json").write_text((ckpt / "config.json").read_text() + "extra")
    before = {name: (target / name).read_bytes() for name in manifest}
    pending = {f.name: f for f in weights.copy_plan(ckpt, target, manifest)}
    assert sorted(pending) == ["config.json", SHARD1]
    # The short shard resumes at its end; the longer file is written again in full.
    assert (pending[SHARD1].offset, pending[SHARD1].bytes_to_write) == (manifest[SHARD1] - 300, 300)
    assert (pending["config.json"].offset, pending["config.json"].bytes_to_write) == (0, manifest["config.json"])
    assert {name: (target / name).read_bytes() for name in manifest} == before


def test_copy_refuses_a_missing_source_file_before_writing(ckpt: Path, tmp_path: Path):
    manifest = weights.list_files(ckpt)
    (ckpt / SHARD2).unlink()
    with pytest.raises(weights.WeightsError, match=f"source {ckpt / SHARD2}: No such file"):
        weights.copy_resumable(ckpt, tmp_path / "t", manifest)
    assert not (tmp_path / "t").exists()


def test_progress_counts_every_byte_against_the_expected_total(ckpt: Path, tmp_path: Path):
    total = sum(weights.list_files(ckpt).values())
    assert weights.progress(ckpt, total) == {"bytes": total, "expected_bytes": total, "percent": 100.0}
    assert weights.progress(tmp_path / "absent", total) == {"bytes": 0, "expected_bytes": total, "percent": 0.0}


def test_source_manifest_refuses_a_missing_or_empty_source(tmp_path: Path):
    with pytest.raises(weights.WeightsError, match="is not a directory"):
        weights.source_manifest(tmp_path / "absent")
    (tmp_path / "empty" / ".cache").mkdir(parents=True)
    with pytest.raises(weights.WeightsError, match="holds no files"):
        weights.source_manifest(tmp_path / "empty")


def test_plan_counts_only_what_is_left(ckpt: Path, tmp_path: Path):
    manifest = weights.list_files(ckpt)
    target = tmp_path / "models" / "org--name" / "rev"
    fresh = weights.plan(target, manifest, margin_bytes=1000)
    total = sum(manifest.values())
    assert (fresh["complete"], fresh["missing_bytes"], fresh["needed_bytes"]) == (False, total, total + 1000)
    assert fresh["free_path"] == str(tmp_path)  # nearest existing ancestor
    assert fresh["enough_space"] is True
    weights.copy_resumable(ckpt, target, manifest)
    _truncate(target / SHARD1, 300)
    partial = weights.plan(target, manifest, margin_bytes=0)
    assert partial["missing_bytes"] == 300 and not partial["complete"]
    weights.copy_resumable(ckpt, target, manifest)
    done = weights.plan(target, manifest, margin_bytes=10**18)
    assert (done["complete"], done["needed_bytes"], done["enough_space"]) == (True, 0, True)


def test_plan_checks_a_local_source_itself(ckpt: Path, tmp_path: Path):
    manifest = weights.list_files(ckpt)
    assert weights.plan(tmp_path / "t", manifest, 0, source_dir=ckpt)["source_complete"] is True
    _truncate(ckpt / SHARD2, 64)
    broken = weights.plan(tmp_path / "t", weights.list_files(ckpt), 0, source_dir=ckpt)
    assert broken["source_complete"] is False
    assert [(p["name"], p["state"]) for p in broken["source_problems"]] == [(SHARD2, "truncated")]
    size = (ckpt / SHARD2).stat().st_size
    assert broken["source_problems_brief"] == f"{SHARD2} truncated (expected {size + 64} bytes, found {size})"
    assert weights.plan(tmp_path / "t", manifest, 0)["source_complete"] is None


def test_plan_says_when_the_disk_is_too_small(ckpt: Path, tmp_path: Path):
    manifest = weights.list_files(ckpt)
    result = weights.plan(tmp_path / "t", manifest, margin_bytes=10**18)
    assert result["enough_space"] is False and result["needed_bytes"] > result["free_bytes"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[]", "no 'files'"),
        ("{x", "not JSON"),
        ('{"files": {"a": -1}}', "bad entry"),
        ('{"files": {"a": true}}', "bad entry"),
        ('{"files": {"/etc/x": 1}}', "bad entry"),
        ('{"files": {"a/../../x": 1}}', "bad entry"),
        ('{"files": {}}', "no 'files'"),
    ],
)
def test_bad_manifest_is_rejected(tmp_path: Path, text: str, message: str):
    (tmp_path / "m.json").write_text(text)
    with pytest.raises(weights.WeightsError, match=message):
        weights.load_manifest(tmp_path / "m.json")


def test_manifest_skips_download_tool_bookkeeping(ckpt: Path):
    (ckpt / ".cache" / "huggingface").mkdir(parents=True)
    (ckpt / ".cache" / "huggingface" / "x.incomplete").write_bytes(b"12345")
    assert not any(name.startswith(".cache") for name in weights.list_files(ckpt))
    assert weights.bytes_on_disk(ckpt) == sum(weights.list_files(ckpt).values()) + 5


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    """The command line as an operator runs it: plain python3 -m, the package from module_utils only."""
    return subprocess.run([sys.executable, "-m", "sglang_deploy_host.model.weights", *args], capture_output=True,
                          text=True, timeout=60, check=False, env={**os.environ, "PYTHONPATH": str(MODULE_UTILS)},
                          cwd="/")


def test_cli_check_exit_codes_and_json(ckpt: Path, tmp_path: Path):
    manifest_out = _run("manifest", str(ckpt), "--json")
    assert manifest_out.returncode == 0, manifest_out.stderr
    (tmp_path / "m.json").write_text(manifest_out.stdout)
    good = _run("check", str(ckpt), "--manifest", str(tmp_path / "m.json"), "--json")
    assert good.returncode == 0 and json.loads(good.stdout)["complete"] is True
    _truncate(ckpt / SHARD2, 1)
    bad = _run("check", str(ckpt))
    assert bad.returncode == 1 and f"{SHARD2}: truncated" in bad.stdout


def test_cli_copy_then_progress(ckpt: Path, tmp_path: Path):
    (tmp_path / "m.json").write_text(_run("manifest", str(ckpt), "--json").stdout)
    copied = _run("copy", str(ckpt), str(tmp_path / "t"), "--manifest", str(tmp_path / "m.json"))
    assert copied.returncode == 0, copied.stderr
    total = json.loads((tmp_path / "m.json").read_text())["total_bytes"]
    progress = json.loads(_run("progress", str(tmp_path / "t"), "--expected-bytes", str(total)).stdout)
    assert progress == {"bytes": total, "expected_bytes": total, "percent": 100.0}


def test_cli_plan_from_hub_sizes_given_as_json(ckpt: Path, tmp_path: Path):
    sizes = json.dumps({"files": weights.list_files(ckpt)})
    result = _run("plan", str(tmp_path / "t"), "--manifest-json", sizes, "--margin-bytes", "7")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    total = sum(weights.list_files(ckpt).values())
    assert (data["complete"], data["needed_bytes"], data["files"]) == (False, total + 7, weights.list_files(ckpt))


def test_cli_reports_a_bad_source_with_exit_2(tmp_path: Path):
    result = _run("plan", str(tmp_path / "t"), "--source-dir", str(tmp_path / "absent"))
    assert result.returncode == 2 and "is not a directory" in result.stderr
