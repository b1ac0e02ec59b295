"""sglang_deploy_host.model.inspection: what a checkpoint holds, from its headers, on synthetic checkpoints whose
headers are GLM-5-NVFP4's (tests/fixtures/glm5_checkpoint.py: real names, dtypes and shapes, the data a
hole), then the ``sglang-deploy checkpoint`` command and the ``sglang_checkpoint`` module run by Ansible."""

from __future__ import annotations

import json
import os
import resource
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

from sglang_deploy.memory import architectures
from sglang_deploy_host.model import inspection

sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
from glm5_checkpoint import make_variants, sparse_copy  # noqa: E402

CLI = [sys.executable, "-m", "sglang_deploy.cli", "checkpoint"]
GLM5 = architectures.config("glm-5")


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One of each: no draft (lukealonso/GLM-5-NVFP4 as published), a BF16 draft (festr2's), an NVFP4 draft,
    a BF16 shared expert beside NVFP4 routed experts (the GLM-5.1 NVFP4 case)."""
    return make_variants(tmp_path_factory.mktemp("checkpoints"))


def copy_of(made: dict[str, Path], name: str, tmp_path: Path) -> Path:
    """A private copy to break (sparse shards stay sparse: copy by header, not by data)."""
    return sparse_copy(made[name], tmp_path / name)


# -- the verdicts -----------------------------------------------------------------------------------
def test_a_draft_less_checkpoint_is_missing_every_tensor_of_layer_78(made: dict[str, Path]) -> None:
    found = inspection.inspect(made["missing"])
    assert (found.architecture, found.num_layers, found.draft_layers_declared) == ("GlmMoeDsaForCausalLM", 78, 1)
    assert found.speculative == "missing" and found.draft_tensors_present == [] and found.draft_bytes == 0
    expected = sorted(architectures.draft_layer_tensors(GLM5))
    # Layer 77's names renumbered, its NVFP4 scales left out, plus the four MTP tensors: the 791 of the BF16 layer.
    assert found.draft_tensors_missing == expected and len(expected) == 791
    assert not any(name.endswith(inspection.SCALE_SUFFIXES) for name in found.draft_tensors_missing)
    assert "model.layers.78.eh_proj.weight" in found.draft_tensors_missing
    assert found.quantization == "NVFP4" and found.shared_experts_fusion == "same-dtype"


def test_a_bf16_draft_is_usable_with_its_exact_bytes_and_dtypes(made: dict[str, Path]) -> None:
    found = inspection.inspect(made["bf16"])
    draft = architectures.draft_layer_tensors(GLM5)
    assert found.speculative == "usable" and found.draft_tensors_missing == []
    assert found.draft_tensors_present == sorted(draft)
    assert found.draft_dtypes == {"BF16": 790, "F32": 1}  # the router's score bias is F32, as the graft card says
    # The exact sum of the data spans: 19,905,841,664 B, to the byte the index delta of the same graft on GLM-5.2.
    assert found.draft_bytes == 19_905_841_664
    assert found.draft_loaded_replicated_bytes + found.draft_loaded_split_bytes == found.draft_bytes
    # Per GPU at TP 8: replicated (MLA down-projections, indexer, router, eh_proj, norms) + the rest / 8.
    replicated = sum(
        2 * (s[0] * (s[1] if len(s) > 1 else 1)) * (2 if dtype == "F32" else 1)
        for name, (dtype, s) in draft.items()
        if any(part in name for part in ("norm", "q_a_proj", "kv_a_proj_with_mqa", "indexer", "mlp.gate.", "eh_proj"))
    )
    assert found.draft_loaded_replicated_bytes == replicated == 205_195_776
    assert found.draft_bytes_per_gpu(8) == replicated + -(-(found.draft_bytes - replicated) // 8)
    assert 2.3 < found.draft_bytes_per_gpu(8) / 2**30 < 2.6  # the 2.3-2.6 GiB at TP 8
    assert found.draft_embedding_and_head_bytes == 2 * 2 * 154_880 * 6144


def test_a_quantized_draft_is_the_wrong_dtype(made: dict[str, Path]) -> None:
    found = inspection.inspect(made["nvfp4"])
    assert found.speculative == "wrong-dtype" and found.draft_tensors_missing == []
    assert found.draft_dtypes["U8"] == (256 + 1) * 3 == found.draft_dtypes["F8_E4M3"]  # routed + shared experts
    assert "model.layers.78.mlp.experts.0.gate_proj.weight" in found.draft_tensors_wrong_dtype
    assert "wrong-dtype" not in found.speculative_reason and "BF16" in found.speculative_reason


def test_a_bf16_shared_expert_beside_nvfp4_experts_needs_fusion_off(made: dict[str, Path]) -> None:
    found = inspection.inspect(made["shared-bf16"])
    assert found.routed_expert_dtypes == {"U8": 2 * 256 * 3} and found.shared_expert_dtypes == {"BF16": 2 * 3}
    assert found.shared_experts_fusion == "dtypes-differ"
    assert "--disable-shared-experts-fusion" in found.summary()


def test_the_text_says_plainly_that_layer_78_is_missing(made: dict[str, Path]) -> None:
    done = subprocess.run([*CLI, str(made["missing"])], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "GlmMoeDsaForCausalLM" in text and "MISSING" in text and "draft layer 78 is missing" in text
    assert "uninitialised weights" in text and "without speculative flags" in text
    done = subprocess.run([*CLI, str(made["bf16"]), "--json"], capture_output=True, text=True, timeout=60, check=False)
    data = json.loads(done.stdout)
    for key in ("architecture", "num_layers", "draft_layers_declared", "draft_tensors_present", "draft_tensors_missing",
                "draft_dtypes", "draft_bytes", "speculative"):  # fmt: skip
        assert key in data
    assert data["speculative"] == "usable" and data["num_layers"] == 78


# -- what cannot be read: exit 2, one line, within seconds ----------------------------------------------
def _run(path: Path) -> subprocess.CompletedProcess[str]:
    start = time.monotonic()
    done = subprocess.run([*CLI, str(path)], capture_output=True, text=True, timeout=60, check=False)
    assert time.monotonic() - start < 30
    return done


def _refused(path: Path, needle: str) -> None:
    done = _run(path)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert needle in lines[0], lines[0]


def test_a_missing_directory(tmp_path: Path) -> None:
    _refused(tmp_path / "nope", "does not exist")


def test_a_truncated_index(made: dict[str, Path], tmp_path: Path) -> None:
    ckpt = copy_of(made, "missing", tmp_path)
    index = ckpt / inspection.INDEX_NAME
    index.write_bytes(index.read_bytes()[:5000])
    _refused(ckpt, "the index")


def test_a_header_length_larger_than_the_file(made: dict[str, Path], tmp_path: Path) -> None:
    ckpt = copy_of(made, "missing", tmp_path)
    shard = ckpt / "model-00002-of-00004.safetensors"
    os.truncate(shard, 1 << 20)
    with shard.open("r+b") as handle:
        handle.write(struct.pack("<Q", 10 << 20))  # plausible for a header, but past the file's end
    _refused(ckpt, "model-00002-of-00004.safetensors: file ends inside its 10485760-byte header (1048576 bytes in all)")


def test_a_hostile_header_length_is_refused_before_anything_is_read(made: dict[str, Path], tmp_path: Path) -> None:
    ckpt = copy_of(made, "missing", tmp_path)
    shard = ckpt / "model-00001-of-00004.safetensors"
    with shard.open("r+b") as handle:
        handle.write(struct.pack("<Q", 2**63 - 1))
    _refused(ckpt, "is not plausible")


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        ("shard-gone", "named by model.safetensors.index.json is missing"),
        ("shard-short", "shorter than the"),
        ("shard-long", "longer than the"),
        ("index-names-more", "whose header does not hold it"),
        ("not-json-header", "header is not JSON"),
        ("bad-span", "needs 12288 bytes but its data_offsets span 10"),
        ("fifo", "not a regular file"),
        ("config-gone", "config.json"),
    ],
)
def test_a_malformed_checkpoint_names_what_is_wrong(made: dict[str, Path], tmp_path: Path, damage: str, needle: str) -> None:
    ckpt = copy_of(made, "missing", tmp_path)
    shard = ckpt / "model-00002-of-00004.safetensors"
    if damage == "shard-gone":
        shard.unlink()
    elif damage == "shard-short":
        os.truncate(shard, shard.stat().st_size - 1)
    elif damage == "shard-long":
        os.truncate(shard, shard.stat().st_size + 1)
    elif damage == "index-names-more":
        index = json.loads((ckpt / inspection.INDEX_NAME).read_text())
        index["weight_map"]["model.layers.0.extra.weight"] = shard.name
        (ckpt / inspection.INDEX_NAME).write_text(json.dumps(index))
    elif damage == "not-json-header":
        with shard.open("r+b") as handle:
            handle.seek(8)
            handle.write(b"\xff\xfe")
    elif damage == "bad-span":  # a BF16 [6144] tensor whose span is 10 bytes
        header = json.dumps({"model.layers.0.input_layernorm.weight": {"dtype": "BF16", "shape": [6144], "data_offsets": [0, 10]}})
        raw = header.encode() + b" " * (-len(header) % 8)
        shard.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 10)
        index = json.loads((ckpt / inspection.INDEX_NAME).read_text())
        index["weight_map"] = {k: v for k, v in index["weight_map"].items() if v != shard.name}
        index["weight_map"]["model.layers.0.input_layernorm.weight"] = shard.name
        (ckpt / inspection.INDEX_NAME).write_text(json.dumps(index))
    elif damage == "fifo":
        shard.unlink()
        os.mkfifo(shard)
    elif damage == "config-gone":
        (ckpt / "config.json").unlink()
    _refused(ckpt, needle)


def test_it_reads_headers_only_under_a_small_memory_limit(made: dict[str, Path]) -> None:
    """The BF16-draft checkpoint claims 36 GB; the inspection runs in an address space of 512 MiB (Python itself
    takes most of it): only the headers are read, never mapped or read data."""
    apparent = sum(p.stat().st_size for p in made["bf16"].iterdir())
    on_disk = sum(p.stat().st_blocks * 512 for p in made["bf16"].iterdir())
    assert apparent > 30e9 and on_disk < 50e6

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (512 << 20, 512 << 20))

    script = "import sys; from sglang_deploy_host.model import inspection; sys.exit(inspection.main(sys.argv[1:]))"
    done = subprocess.run(
        [sys.executable, "-c", script, str(made["bf16"]), "--json"],
        capture_output=True, text=True, timeout=60, check=False, preexec_fn=limit,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["draft_bytes"] == 19_905_841_664


# -- the verdict kept beside the weights --------------------------------------------------------------
def test_a_kept_verdict_is_read_back_only_for_the_same_files(made: dict[str, Path], tmp_path: Path) -> None:
    ckpt = copy_of(made, "bf16", tmp_path)
    verdict = Path(inspection.verdict_path(ckpt))
    assert verdict == tmp_path / "bf16.checkpoint.json"
    found = inspection.inspect(ckpt)
    assert inspection.read_kept(ckpt, verdict) is None  # nothing kept yet
    assert inspection.keep(ckpt, verdict, found) is None
    assert verdict.stat().st_mode & 0o777 == 0o644
    assert inspection.read_kept(ckpt, verdict) == found
    # A shard changed since (a re-fetch, a graft): the verdict is for other files.
    shard = ckpt / "model-00005-of-00005.safetensors"
    os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 1))
    assert inspection.read_kept(ckpt, verdict) is None


def test_a_planted_or_loosened_verdict_is_not_believed(made: dict[str, Path], tmp_path: Path) -> None:
    ckpt = copy_of(made, "missing", tmp_path)
    verdict = Path(inspection.verdict_path(ckpt))
    found = inspection.inspect(ckpt)
    assert inspection.keep(ckpt, verdict, found) is None
    # Someone rewrites the verdict to "usable": the content is read, but the file is now writable by others.
    data = json.loads(verdict.read_text())
    data["inspection"]["speculative"] = "usable"
    verdict.write_text(json.dumps(data))
    assert inspection.read_kept(ckpt, verdict).speculative == "usable"  # same owner, 0644: believed
    verdict.chmod(0o666)
    assert inspection.read_kept(ckpt, verdict) is None
    verdict.chmod(0o644)
    # A verdict for another directory, or of another schema, or not JSON at all.
    for change in ({"path": "/elsewhere"}, {"schema": 0}):
        verdict.write_text(json.dumps({**data, **change}))
        assert inspection.read_kept(ckpt, verdict) is None
    verdict.write_text("{not json")
    assert inspection.read_kept(ckpt, verdict) is None
    # A verdict behind a link is not followed.
    verdict.unlink()
    (tmp_path / "elsewhere.json").write_text(json.dumps(data))
    verdict.symlink_to(tmp_path / "elsewhere.json")
    assert inspection.read_kept(ckpt, verdict) is None
    # A directory others may write: neither kept there nor read from there.
    verdict.unlink()
    tmp_path.chmod(0o777)
    try:
        assert "writable by others" in (inspection.keep(ckpt, verdict, found) or "")
        assert not verdict.exists()
    finally:
        tmp_path.chmod(0o755)


# -- the module, run by Ansible --------------------------------------------------------------------------
def _module(tmp_path: Path, path: Path, *extra: str) -> dict[str, Any]:
    env = {
        **os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
        "ANSIBLE_STDOUT_CALLBACK": "json", "ANSIBLE_LOCAL_TEMP": str(tmp_path / "local"),
        "ANSIBLE_REMOTE_TEMP": str(tmp_path / "remote"), "ANSIBLE_NOCOLOR": "1",
    }  # fmt: skip
    args = json.dumps({"path": str(path), "inventory_hostname": "glm5-01"})
    done = subprocess.run(
        [str(Path(sys.executable).with_name("ansible")), "localhost", "-c", "local", "-m", "sglang_checkpoint",
         "-a", args, "-e", f"ansible_python_interpreter={sys.executable}", *extra],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=180, check=False,
    )  # fmt: skip
    assert done.stdout.startswith("{"), done.stdout + done.stderr
    plays = json.loads(done.stdout)["plays"]
    return plays[0]["tasks"][0]["hosts"]["localhost"]


def test_the_module_inspects_keeps_and_reads_back(made: dict[str, Path], tmp_path: Path) -> None:
    ckpt = copy_of(made, "missing", tmp_path)
    dry = _module(tmp_path, ckpt, "--check")
    assert dry["state"] == "inspected" and dry["inspection"]["speculative"] == "missing"
    assert dry["changed"] is False and not Path(inspection.verdict_path(ckpt)).exists()  # check mode keeps nothing
    first = _module(tmp_path, ckpt)
    assert first["changed"] is True and first["kept"] is False
    again = _module(tmp_path, ckpt)
    assert again["changed"] is False and again["kept"] is True and again["inspection"] == first["inspection"]


def test_the_module_waits_for_weights_that_are_not_there_yet(made: dict[str, Path], tmp_path: Path) -> None:
    absent = _module(tmp_path, tmp_path / "not-fetched")
    assert absent["state"] == "absent" and absent["inspection"] is None and not absent.get("failed")
    ckpt = copy_of(made, "missing", tmp_path)
    shard = ckpt / "model-00003-of-00004.safetensors"
    os.truncate(shard, shard.stat().st_size // 2)  # a resumable copy half-way
    incomplete = _module(tmp_path, ckpt)
    assert incomplete["state"] == "incomplete" and "shorter than" in incomplete["reason"]
    with (ckpt / "model-00001-of-00004.safetensors").open("r+b") as handle:
        handle.seek(8)
        handle.write(b"\xff")
    broken = _module(tmp_path, ckpt)
    assert broken["failed"] and broken["msg"].startswith("host glm5-01: the checkpoint the server loads")
    assert "Fix:" in broken["msg"]
