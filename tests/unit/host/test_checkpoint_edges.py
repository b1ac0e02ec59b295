"""The checkpoint inspection at its edges (issue 44): a draft layer that is partly there - a graft that lost
``eh_proj``, a fetch that skipped one of the draft's shards, one expert quantized - and every size cap just at
and just past its bound (config.json, the index, a header, a tensor's dimensions and sizes, a name, the config's
counts). The all-or-nothing drafts and the far-past-the-cap files are test_checkpoint.py's and
test_checkpoint_hostile.py's."""

from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

from sglang_deploy.memory import architectures
from sglang_deploy_host.model import inspection, safetensors

sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
from glm5_checkpoint import make_glm5_checkpoint, make_variants  # noqa: E402

GLM5 = architectures.config("glm-5")
DRAFT = architectures.draft_layer_tensors(GLM5)
EH_PROJ = "model.layers.78.eh_proj.weight"


# -- a draft layer that is partly there ------------------------------------------------------------------------
def test_a_graft_that_lost_eh_proj_is_missing_exactly_that_tensor(tmp_path: Path) -> None:
    make_glm5_checkpoint(tmp_path / "graft", draft="bf16", draft_without=(EH_PROJ,))
    found = inspection.inspect(tmp_path / "graft")
    assert found.speculative == "missing" and found.draft_tensors_missing == [EH_PROJ]
    assert len(found.draft_tensors_present) == len(DRAFT) - 1
    assert "draft layer 78 is missing (1 of its tensors absent" in found.speculative_reason
    assert "the config declares 1 draft layer(s)" in found.speculative_reason


@pytest.mark.parametrize("name", ["model.layers.78.enorm.weight", "model.layers.78.shared_head.norm.weight",
                                  "model.layers.78.mlp.experts.255.down_proj.weight",
                                  "model.layers.78.self_attn.indexer.wk.weight"])  # fmt: skip
def test_any_one_draft_tensor_lost_is_missing(tmp_path: Path, name: str) -> None:
    assert name in DRAFT
    make_glm5_checkpoint(tmp_path / "graft", draft="bf16", draft_without=(name,))
    found = inspection.inspect(tmp_path / "graft")
    assert (found.speculative, found.draft_tensors_missing) == ("missing", [name])


def test_a_fetch_that_skipped_one_of_the_drafts_shards_is_missing_its_tensors(tmp_path: Path) -> None:
    """The draft over two shards; the second was never fetched (an allow-pattern that missed it) and the index
    was rewritten without it: half the draft is there, which is no draft."""
    made = make_glm5_checkpoint(tmp_path / "half", draft="bf16", draft_shards=2)
    index = made["index"]
    shards = sorted(set(index["weight_map"].values()))
    skipped = shards[-1]
    lost = sorted(name for name, shard in index["weight_map"].items() if shard == skipped)
    assert lost and all(name.startswith("model.layers.78.") for name in lost)
    (tmp_path / "half" / skipped).unlink()
    index["weight_map"] = {name: shard for name, shard in index["weight_map"].items() if shard != skipped}
    (tmp_path / "half" / inspection.INDEX_NAME).write_text(json.dumps(index))
    found = inspection.inspect(tmp_path / "half")
    assert found.speculative == "missing" and found.draft_tensors_missing == lost
    assert found.draft_bytes == sum(architectures_bytes(DRAFT[n]) for n in found.draft_tensors_present)


def architectures_bytes(spec: tuple[str, tuple[int, ...]]) -> int:
    dtype, shape = spec
    count = 1
    for dim in shape:
        count *= dim
    return -(-count * safetensors.DTYPE_BITS[dtype] // 8)


def test_one_quantized_expert_in_the_draft_is_the_wrong_dtype(tmp_path: Path) -> None:
    name = "model.layers.78.mlp.experts.7.up_proj.weight"
    make_glm5_checkpoint(tmp_path / "one", draft="bf16", draft_dtypes={name: "F8_E4M3"})
    found = inspection.inspect(tmp_path / "one")
    assert (found.speculative, found.draft_tensors_wrong_dtype) == ("wrong-dtype", [name])
    assert "1 of its tensors are quantized (e.g. model.layers.78.mlp.experts.7.up_proj.weight)" in found.speculative_reason


def test_a_draft_of_every_unquantized_dtype_is_usable(tmp_path: Path) -> None:
    overrides = {"model.layers.78.enorm.weight": "F32", "model.layers.78.hnorm.weight": "F16"}
    make_glm5_checkpoint(tmp_path / "mixed", draft="bf16", draft_dtypes=overrides)
    found = inspection.inspect(tmp_path / "mixed")
    expected: dict[str, int] = {}
    for name, (dtype, _shape) in DRAFT.items():
        dtype = overrides.get(name, dtype)
        expected[dtype] = expected.get(dtype, 0) + 1
    assert found.speculative == "usable" and found.draft_dtypes == expected and expected["F16"] == 1


def test_two_declared_draft_layers_need_both(tmp_path: Path) -> None:
    made = make_glm5_checkpoint(tmp_path / "two", draft="bf16")
    config = made["config"]
    config["num_nextn_predict_layers"] = 2
    (tmp_path / "two" / "config.json").write_text(json.dumps(config))
    found = inspection.inspect(tmp_path / "two")
    assert found.speculative == "missing" and found.draft_tensors_missing
    assert all(name.startswith("model.layers.79.") for name in found.draft_tensors_missing)
    assert "declares 2 draft layer(s)" in found.speculative_reason


# -- each cap at its bound and one past it ---------------------------------------------------------------------
@pytest.fixture()
def small(tmp_path: Path) -> Path:
    """A one-shard checkpoint (config.json and model.safetensors), to pad and grow."""
    root = tmp_path / "small"
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1}))
    write_shard(root / "model.safetensors", {"model.layers.0.w": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}}, 8)
    return root


def write_shard(path: Path, header: dict, data: int, pad_to: int | None = None) -> None:
    raw = json.dumps(header).encode()
    if pad_to is not None:
        raw += b" " * (pad_to - len(raw))
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * data)


def pad_json(path: Path, value: object, size: int) -> None:
    raw = json.dumps(value).encode()
    path.write_bytes(raw + b" " * (size - len(raw)))


def test_config_json_at_its_cap_is_read_and_one_byte_more_is_not(small: Path) -> None:
    config = json.loads((small / "config.json").read_text())
    pad_json(small / "config.json", config, inspection.JSON_MAX_BYTES)
    assert inspection.inspect(small).num_layers == 1
    pad_json(small / "config.json", config, inspection.JSON_MAX_BYTES + 1)
    with pytest.raises(inspection.CheckpointError, match=f"more than the {inspection.JSON_MAX_BYTES:,} this reads"):
        inspection.inspect(small)


def test_the_quantization_config_has_the_same_cap(small: Path) -> None:
    quant = {"quantization": {"quant_algo": "NVFP4"}}
    pad_json(small / inspection.QUANT_CONFIG_NAME, quant, inspection.JSON_MAX_BYTES)
    assert inspection.inspect(small).quantization == "NVFP4"
    pad_json(small / inspection.QUANT_CONFIG_NAME, quant, inspection.JSON_MAX_BYTES + 1)
    with pytest.raises(inspection.CheckpointError, match="hf_quant_config.json"):
        inspection.inspect(small)


def test_the_index_at_its_cap_is_read_and_one_byte_more_is_not(small: Path) -> None:
    (small / "model.safetensors").rename(small / "model-00001-of-00001.safetensors")
    index = {"weight_map": {"model.layers.0.w": "model-00001-of-00001.safetensors"}}
    pad_json(small / inspection.INDEX_NAME, index, inspection.INDEX_MAX_BYTES)
    assert inspection.inspect(small).tensors == 1
    pad_json(small / inspection.INDEX_NAME, index, inspection.INDEX_MAX_BYTES + 1)
    with pytest.raises(inspection.CheckpointError, match=f"the index .*more than the {inspection.INDEX_MAX_BYTES:,}"):
        inspection.inspect(small)


def test_a_header_at_its_cap_is_read_and_eight_bytes_more_is_not(small: Path) -> None:
    header = {"model.layers.0.w": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}}
    write_shard(small / "model.safetensors", header, 8, pad_to=safetensors.MAX_HEADER_BYTES)
    assert inspection.inspect(small).tensors == 1
    write_shard(small / "model.safetensors", header, 8, pad_to=safetensors.MAX_HEADER_BYTES + 8)
    with pytest.raises(inspection.CheckpointError, match=f"header length {safetensors.MAX_HEADER_BYTES + 8} is not plausible"):
        inspection.inspect(small)


def test_a_header_length_of_zero_is_not_plausible(small: Path) -> None:
    (small / "model.safetensors").write_bytes(struct.pack("<Q", 0))
    with pytest.raises(inspection.CheckpointError, match="header length 0 is not plausible"):
        inspection.inspect(small)


@pytest.mark.parametrize("dims", [safetensors.MAX_DIMS, safetensors.MAX_DIMS + 1])
def test_a_shape_of_max_dims_is_read_and_one_more_is_not(small: Path, dims: int) -> None:
    header = {"model.layers.0.w": {"dtype": "BF16", "shape": [1] * (dims - 1) + [4], "data_offsets": [0, 8]}}
    write_shard(small / "model.safetensors", header, 8)
    if dims <= safetensors.MAX_DIMS:
        assert inspection.inspect(small).tensors == 1
    else:
        with pytest.raises(inspection.CheckpointError, match=f"not a list of at most {safetensors.MAX_DIMS} sizes"):
            inspection.inspect(small)


def test_a_dimension_at_its_cap_is_a_size_and_one_more_is_not() -> None:
    """A 2**48-element tensor would need a 512 TiB file: the bound is checked on the header's entry alone."""
    top = safetensors.MAX_DIM_SIZE
    tensor = safetensors._tensor("w", {"dtype": "U8", "shape": [top], "data_offsets": [0, top]}, strict=True)
    assert tensor.nbytes == top
    with pytest.raises(safetensors.HeaderError, match="not a list of sizes"):
        safetensors._tensor("w", {"dtype": "U8", "shape": [top + 1], "data_offsets": [0, top + 1]}, strict=True)
    for bad in (-1, True, 2.0, "4"):
        with pytest.raises(safetensors.HeaderError, match="not a list of sizes"):
            safetensors._tensor("w", {"dtype": "U8", "shape": [bad], "data_offsets": [0, 4]}, strict=True)
    assert safetensors._tensor("w", {"dtype": "U8", "shape": [0], "data_offsets": [4, 4]}, strict=True).nbytes == 0


def test_a_name_at_its_cap_is_read_and_one_character_more_is_not() -> None:
    entry = {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}
    assert safetensors._tensor("n" * safetensors.MAX_NAME_CHARS, entry, strict=True).nbytes == 1
    with pytest.raises(safetensors.HeaderError, match="not printable or longer than 1024 characters"):
        safetensors._tensor("n" * (safetensors.MAX_NAME_CHARS + 1), entry, strict=True)


@pytest.mark.parametrize(
    "offsets",
    [[4, 0], [0], [0, 1, 2], [-1, 0], [0, True], [0.0, 1], "0,1", None],
)
def test_offsets_that_are_not_a_span_are_refused(offsets: object) -> None:
    with pytest.raises(safetensors.HeaderError, match="has no valid data_offsets"):
        safetensors._tensor("w", {"dtype": "U8", "shape": [1], "data_offsets": offsets}, strict=True)


def test_without_strict_only_the_span_is_checked() -> None:
    loose = safetensors._tensor("w", {"dtype": "nonsense", "shape": "x", "data_offsets": [0, 3]}, strict=False)
    assert (loose.dtype, loose.shape, loose.nbytes) == ("nonsense", (), 3)


@pytest.mark.parametrize(("key", "top"), sorted(inspection.MAX_COUNTS.items()))
def test_each_count_at_its_cap_is_a_count_and_one_more_is_not(key: str, top: int) -> None:
    assert inspection._int({key: top}, key) == top
    with pytest.raises(inspection.CheckpointError, match=f"{key} = {top + 1} is more than any real model has"):
        inspection._int({key: top + 1}, key)
    for bad in (-1, True, 1.5, "3"):
        with pytest.raises(inspection.CheckpointError, match="is not a count"):
            inspection._int({key: bad}, key)
    assert inspection._int({}, key, 0) == 0
    with pytest.raises(inspection.CheckpointError, match=f"config.json has no {key}"):
        inspection._int({}, key)


def test_a_shown_name_is_whole_up_to_120_characters_and_cut_with_dots_past_it() -> None:
    assert safetensors.shown("n" * 120) == "n" * 120
    assert safetensors.shown("n" * 121) == "n" * 117 + "..."
    assert safetensors.shown("a\x1bb") == "a\\x1bb" and safetensors.shown("tab\there") == "tab\\there"


# -- a header's entries: each refusal alone, each message exact ------------------------------------------------
@pytest.mark.parametrize("dtype", ["XX", "bf16", ["BF16"], 5, None])
def test_a_dtype_that_is_not_a_safetensors_dtype_is_refused(dtype: object) -> None:
    with pytest.raises(safetensors.HeaderError, match=r"has dtype .*, not a safetensors dtype"):
        safetensors._tensor("w", {"dtype": dtype, "shape": [1], "data_offsets": [0, 2]}, strict=True)


def test_the_refusals_of_a_shape_and_a_span_say_what_they_found() -> None:
    with pytest.raises(safetensors.HeaderError) as err:
        safetensors._tensor("w", {"dtype": "U8", "shape": "4", "data_offsets": [0, 4]}, strict=True)
    assert str(err.value).startswith("tensor 'w' has a shape of str dimensions, not a list of at most")
    with pytest.raises(safetensors.HeaderError) as err:
        safetensors._tensor("w", {"dtype": "U8", "shape": [1] * 17, "data_offsets": [0, 1]}, strict=True)
    assert str(err.value).startswith("tensor 'w' has a shape of 17 dimensions, not a list of at most")
    with pytest.raises(safetensors.HeaderError) as err:
        safetensors._tensor("w", {"dtype": "BF16", "shape": [4], "data_offsets": [10, 16]}, strict=True)
    assert str(err.value) == "tensor 'w' (BF16 [4]) needs 8 bytes but its data_offsets span 6"


def test_a_file_cut_inside_its_header_says_so_with_its_size(tmp_path: Path) -> None:
    """A header length that runs past the file's end is a cut file (a download not finished), named as such before
    any read; at exactly the file's end it is whole."""
    header = json.dumps({"w": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}}).encode()
    whole = tmp_path / "whole.safetensors"
    whole.write_bytes(struct.pack("<Q", len(header)) + header)
    assert safetensors.read_header(whole).header_len == len(header)
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(struct.pack("<Q", len(header) + 4) + header)
    with pytest.raises(safetensors.ShortFileError) as err:
        safetensors.read_header(cut)
    assert str(err.value) == f"file ends inside its {len(header) + 4}-byte header ({len(header) + 8} bytes in all)"


def test_a_headers_metadata_is_kept_when_it_is_a_mapping(tmp_path: Path) -> None:
    for metadata, kept in (({"format": "pt"}, {"format": "pt"}), ("pt", {}), (None, {})):
        entries: dict[str, object] = {"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}
        if metadata is not None:
            entries["__metadata__"] = metadata
        write_shard(tmp_path / "m.safetensors", entries, 1)
        header = safetensors.read_header(tmp_path / "m.safetensors")
        assert header.metadata == kept and list(header.tensors) == ["w"]


# -- what `sglang-deploy checkpoint` prints ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def variants(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_variants(tmp_path_factory.mktemp("variants"))


SUMMARIES = {
    "missing": [
        "GlmMoeDsaForCausalLM (glm_moe_dsa), 78 layers, 6,220 tensors in 4 shard(s), 16.2 GB, quantization NVFP4",
        "MTP draft layer for speculative decoding: MISSING",
        "  The config declares 1 draft layer(s) (num_nextn_predict_layers) but draft layer 78 is missing (791 of its",
        "  791 expected tensors absent, e.g. model.layers.78.eh_proj.weight",
        "Shared and routed experts are both U8: fusion is safe",
    ],
    "bf16": [
        "GlmMoeDsaForCausalLM (glm_moe_dsa), 78 layers, 7,011 tensors in 5 shard(s), 36.1 GB, quantization NVFP4",
        "MTP draft layer for speculative decoding: USABLE",
        "  Draft layer 78 is complete and unquantized: speculative decoding (EAGLE/NEXTN) can use it.",
        "  draft layer 78: 791 tensors present (BF16 790, F32 1), 19.91 GB",
        "Shared and routed experts are both U8: fusion is safe",
    ],
    "shared-bf16": [
        "GlmMoeDsaForCausalLM (glm_moe_dsa), 78 layers, 6,993 tensors in 5 shard(s), 36.2 GB, quantization NVFP4",
        "MTP draft layer for speculative decoding: USABLE",
        "  Draft layer 78 is complete and unquantized: speculative decoding (EAGLE/NEXTN) can use it.",
        "  draft layer 78: 791 tensors present (BF16 790, F32 1), 19.91 GB",
        "Shared experts BF16 beside routed experts U8: sglang fuses them without checking; launch with "
        "--disable-shared-experts-fusion",
    ],
}


@pytest.mark.parametrize("name", sorted(SUMMARIES))
def test_the_summary_says_what_the_checkpoint_is_and_what_it_means(variants: dict[str, Path], name: str) -> None:
    """The text `sglang-deploy checkpoint` prints, line by line: sizes in GB (not bytes), the verdict in capitals,
    the reason with its first letter raised, the draft's tensors, the fusion rule."""
    lines = inspection.inspect(variants[name]).summary().splitlines()
    expected = SUMMARIES[name]
    assert len(lines) == len(expected)
    assert lines[0] == f"{variants[name]}: {expected[0]}"
    for line, want in zip(lines[1:], expected[1:]):
        assert line.startswith(want), (line, want)


def test_a_checkpoint_without_a_quantization_or_a_draft_says_neither(small: Path) -> None:
    summary = inspection.inspect(small).summary().splitlines()
    assert summary[0] == f"{small}: LlamaForCausalLM (unknown), 1 layers, 1 tensors in 1 shard(s), 0.0 GB"
    assert summary[1:] != [] and not any(line.startswith(("  draft layer 1:", "Shared")) for line in summary[1:])
    assert summary[-1] == "  5 expected tensors absent, e.g. model.layers.1.eh_proj.weight"


def test_the_drafts_bytes_per_gpu_need_a_tensor_parallel_size(variants: dict[str, Path]) -> None:
    found = inspection.inspect(variants["bf16"])
    one = found.draft_bytes_per_gpu(1)
    assert one == found.draft_loaded_replicated_bytes + found.draft_loaded_split_bytes
    assert found.draft_bytes_per_gpu(8) == found.draft_loaded_replicated_bytes + -(-found.draft_loaded_split_bytes // 8)
    with pytest.raises(ValueError, match="tp_size 0 is not a size"):
        found.draft_bytes_per_gpu(0)


@pytest.mark.parametrize(
    ("weight_map", "needle"),
    [
        ([], "has no weight_map"),
        ({}, "has no weight_map"),
        ({"w": 5}, "maps to an invalid file '5'"),
        ({"w": ""}, "maps to an invalid file ''"),
        ({"w": "/etc/passwd"}, "maps to an invalid file '/etc/passwd'"),
        ({"w": "../other/model.safetensors"}, "maps to an invalid file '../other/model.safetensors'"),
        ({"w": "sub/../../model.safetensors"}, "maps to an invalid file 'sub/../../model.safetensors'"),
        ({"w": "model\x1b[31m.safetensors"}, "maps to an invalid file 'model\\\\x1b[31m.safetensors'"),
        ({"ok": "model.safetensors", "w": "/abs"}, "tensor 'w' maps to an invalid file '/abs'"),
    ],
)
def test_each_bad_entry_of_the_weight_map_is_refused_alone(small: Path, weight_map: object, needle: str) -> None:
    (small / inspection.INDEX_NAME).write_text(json.dumps({"metadata": {"total_size": 8}, "weight_map": weight_map}))
    with pytest.raises(inspection.CheckpointError) as err:
        inspection.inspect(small)
    assert needle in str(err.value), str(err.value)


@pytest.mark.parametrize("architectures", [[], "LlamaForCausalLM", None, {"0": "x"}])
def test_an_architecture_list_that_is_empty_or_not_a_list_is_unknown(small: Path, architectures: object) -> None:
    (small / "config.json").write_text(json.dumps({"architectures": architectures, "num_hidden_layers": 1, "model_type": "llama"}))
    found = inspection.inspect(small)
    assert (found.architecture, found.model_type) == ("unknown", "llama")


def test_the_index_names_the_tensor_a_shards_header_lacks(tmp_path: Path) -> None:
    root = tmp_path / "two"
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1}))
    entry = {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}
    write_shard(root / "a.safetensors", {"a.w": entry}, 8)
    write_shard(root / "b.safetensors", {"b.w": entry}, 8)
    index = {"metadata": {"total_size": 24}, "weight_map": {"a.w": "a.safetensors", "b.w": "b.safetensors", "b.x": "b.safetensors"}}
    (root / inspection.INDEX_NAME).write_text(json.dumps(index))
    with pytest.raises(inspection.CheckpointError) as err:
        inspection.inspect(root)
    assert str(err.value) == f"{inspection.INDEX_NAME} puts b.x in b.safetensors, whose header does not hold it"


def test_a_shard_the_disk_cannot_read_is_one_error_naming_it(small: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read error of the disk (stood in for by read_header raising EIO) names the shard and the error."""

    def failing(path: object, **_: object) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(safetensors, "read_header", failing)
    with pytest.raises(inspection.CheckpointError, match=r"^shard model\.safetensors: Input/output error$"):
        inspection.inspect(small)


def test_fusion_is_judged_per_pair_of_routed_and_shared_experts() -> None:
    u8, bf16 = {"U8": 4}, {"BF16": 1}
    assert inspection._fusion({}, {}, {}, {}) == "no-shared-experts"
    assert inspection._fusion(u8, {}, u8, {}) == "no-shared-experts"
    assert inspection._fusion(u8, u8, u8, u8) == "same-dtype"
    assert inspection._fusion(u8, bf16, u8, u8) == "dtypes-differ"
    assert inspection._fusion(u8, {}, u8, bf16) == "dtypes-differ"  # only the draft layer has a shared expert
    assert inspection._fusion(u8, u8, {}, bf16) == "same-dtype"  # a shared expert without routed ones beside it


def test_a_verdict_is_kept_and_read_for_a_checkpoint_without_a_quantization_config(small: Path, tmp_path: Path) -> None:
    assert not (small / inspection.QUANT_CONFIG_NAME).exists() and inspection._identity(small / "none") is None
    found = inspection.inspect(small)
    kept_at = tmp_path / "verdict.json"
    assert inspection.keep(small, kept_at, found) is None
    assert inspection.read_kept(small, kept_at) == found


def test_a_verdict_is_kept_only_where_nobody_else_can_write_and_read_only_if_nobody_else_could_have(small: Path, tmp_path: Path) -> None:
    found = inspection.inspect(small)
    assert inspection.keep(small, tmp_path / "no-dir" / "v.json", found) == f"{tmp_path / 'no-dir'}: No such file or directory"
    kept_at = tmp_path / "verdict.json"
    assert inspection.keep(small, kept_at, found) is None and inspection.read_kept(small, kept_at) == found
    kept_at.chmod(0o664)  # another user could have written it since
    assert inspection.read_kept(small, kept_at) is None
    kept_at.chmod(0o644)
    if os.geteuid() == 0:
        os.chown(kept_at, 65534, 65534)
        assert inspection.read_kept(small, kept_at) is None
        os.chown(kept_at, 0, 0)
    assert inspection.read_kept(small, kept_at) == found
    kept_at.unlink()
    kept_at.mkdir()
    assert inspection.read_kept(small, kept_at) is None


@pytest.mark.parametrize(
    "tamper",
    [
        lambda kept: kept.update(shards=[1]),
        lambda kept: kept.update(shards="model.safetensors"),
        lambda kept: kept.pop("inspection"),
        lambda kept: kept["inspection"].update(no_such_field=1),
        lambda kept: kept.update(inspection=["not", "a", "mapping"]),
    ],
    ids=["shards-not-names", "shards-a-string", "no-inspection", "unknown-field", "inspection-a-list"],
)
def test_a_kept_verdict_that_is_not_one_is_not_read(small: Path, tmp_path: Path, tamper: Any) -> None:
    found = inspection.inspect(small)
    kept_at = tmp_path / "verdict.json"
    assert inspection.keep(small, kept_at, found) is None
    kept = json.loads(kept_at.read_text())
    tamper(kept)
    kept_at.write_text(json.dumps(kept))
    assert inspection.read_kept(small, kept_at) is None


def test_a_verdict_that_cannot_be_written_leaves_no_temporary_file(small: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    found = inspection.inspect(small)
    where = tmp_path / "kept"
    where.mkdir(mode=0o755)

    def full_disk(*_: object, **__: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(inspection.json, "dump", full_disk)
    with pytest.raises(OSError, match="No space left on device"):
        inspection.keep(small, where / "verdict.json", found)
    assert list(where.iterdir()) == []
