"""The checkpoint inspection at its edges (issue 44): a draft layer that is partly there - a graft that lost
``eh_proj``, a fetch that skipped one of the draft's shards, one expert quantized - and every size cap just at
and just past its bound (config.json, the index, a header, a tensor's dimensions and sizes, a name, the config's
counts). The all-or-nothing drafts and the far-past-the-cap files are test_checkpoint.py's and
test_checkpoint_hostile.py's."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from sglang_deploy.memory import architectures
from sglang_deploy_host import checkpoint, safetensors

sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
from glm5_checkpoint import make_glm5_checkpoint  # noqa: E402

GLM5 = architectures.config("glm-5")
DRAFT = architectures.draft_layer_tensors(GLM5)
EH_PROJ = "model.layers.78.eh_proj.weight"


# -- a draft layer that is partly there ------------------------------------------------------------------------
def test_a_graft_that_lost_eh_proj_is_missing_exactly_that_tensor(tmp_path: Path) -> None:
    make_glm5_checkpoint(tmp_path / "graft", draft="bf16", draft_without=(EH_PROJ,))
    found = checkpoint.inspect(tmp_path / "graft")
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
    found = checkpoint.inspect(tmp_path / "graft")
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
    (tmp_path / "half" / checkpoint.INDEX_NAME).write_text(json.dumps(index))
    found = checkpoint.inspect(tmp_path / "half")
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
    found = checkpoint.inspect(tmp_path / "one")
    assert (found.speculative, found.draft_tensors_wrong_dtype) == ("wrong-dtype", [name])
    assert "1 of its tensors are quantized (e.g. model.layers.78.mlp.experts.7.up_proj.weight)" in found.speculative_reason


def test_a_draft_of_every_unquantized_dtype_is_usable(tmp_path: Path) -> None:
    overrides = {"model.layers.78.enorm.weight": "F32", "model.layers.78.hnorm.weight": "F16"}
    make_glm5_checkpoint(tmp_path / "mixed", draft="bf16", draft_dtypes=overrides)
    found = checkpoint.inspect(tmp_path / "mixed")
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
    found = checkpoint.inspect(tmp_path / "two")
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
    pad_json(small / "config.json", config, checkpoint.JSON_MAX_BYTES)
    assert checkpoint.inspect(small).num_layers == 1
    pad_json(small / "config.json", config, checkpoint.JSON_MAX_BYTES + 1)
    with pytest.raises(checkpoint.CheckpointError, match=f"more than the {checkpoint.JSON_MAX_BYTES:,} this reads"):
        checkpoint.inspect(small)


def test_the_quantization_config_has_the_same_cap(small: Path) -> None:
    quant = {"quantization": {"quant_algo": "NVFP4"}}
    pad_json(small / checkpoint.QUANT_CONFIG_NAME, quant, checkpoint.JSON_MAX_BYTES)
    assert checkpoint.inspect(small).quantization == "NVFP4"
    pad_json(small / checkpoint.QUANT_CONFIG_NAME, quant, checkpoint.JSON_MAX_BYTES + 1)
    with pytest.raises(checkpoint.CheckpointError, match="hf_quant_config.json"):
        checkpoint.inspect(small)


def test_the_index_at_its_cap_is_read_and_one_byte_more_is_not(small: Path) -> None:
    (small / "model.safetensors").rename(small / "model-00001-of-00001.safetensors")
    index = {"weight_map": {"model.layers.0.w": "model-00001-of-00001.safetensors"}}
    pad_json(small / checkpoint.INDEX_NAME, index, checkpoint.INDEX_MAX_BYTES)
    assert checkpoint.inspect(small).tensors == 1
    pad_json(small / checkpoint.INDEX_NAME, index, checkpoint.INDEX_MAX_BYTES + 1)
    with pytest.raises(checkpoint.CheckpointError, match=f"the index .*more than the {checkpoint.INDEX_MAX_BYTES:,}"):
        checkpoint.inspect(small)


def test_a_header_at_its_cap_is_read_and_eight_bytes_more_is_not(small: Path) -> None:
    header = {"model.layers.0.w": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}}
    write_shard(small / "model.safetensors", header, 8, pad_to=safetensors.MAX_HEADER_BYTES)
    assert checkpoint.inspect(small).tensors == 1
    write_shard(small / "model.safetensors", header, 8, pad_to=safetensors.MAX_HEADER_BYTES + 8)
    with pytest.raises(checkpoint.CheckpointError, match=f"header length {safetensors.MAX_HEADER_BYTES + 8} is not plausible"):
        checkpoint.inspect(small)


def test_a_header_length_of_zero_is_not_plausible(small: Path) -> None:
    (small / "model.safetensors").write_bytes(struct.pack("<Q", 0))
    with pytest.raises(checkpoint.CheckpointError, match="header length 0 is not plausible"):
        checkpoint.inspect(small)


@pytest.mark.parametrize("dims", [safetensors.MAX_DIMS, safetensors.MAX_DIMS + 1])
def test_a_shape_of_max_dims_is_read_and_one_more_is_not(small: Path, dims: int) -> None:
    header = {"model.layers.0.w": {"dtype": "BF16", "shape": [1] * (dims - 1) + [4], "data_offsets": [0, 8]}}
    write_shard(small / "model.safetensors", header, 8)
    if dims <= safetensors.MAX_DIMS:
        assert checkpoint.inspect(small).tensors == 1
    else:
        with pytest.raises(checkpoint.CheckpointError, match=f"not a list of at most {safetensors.MAX_DIMS} sizes"):
            checkpoint.inspect(small)


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


@pytest.mark.parametrize(("key", "top"), sorted(checkpoint.MAX_COUNTS.items()))
def test_each_count_at_its_cap_is_a_count_and_one_more_is_not(key: str, top: int) -> None:
    assert checkpoint._int({key: top}, key) == top
    with pytest.raises(checkpoint.CheckpointError, match=f"{key} = {top + 1} is more than any real model has"):
        checkpoint._int({key: top + 1}, key)
    for bad in (-1, True, 1.5, "3"):
        with pytest.raises(checkpoint.CheckpointError, match="is not a count"):
            checkpoint._int({key: bad}, key)
    assert checkpoint._int({}, key, 0) == 0
    with pytest.raises(checkpoint.CheckpointError, match=f"config.json has no {key}"):
        checkpoint._int({}, key)


def test_a_shown_name_is_whole_up_to_120_characters_and_cut_with_dots_past_it() -> None:
    assert safetensors.shown("n" * 120) == "n" * 120
    assert safetensors.shown("n" * 121) == "n" * 117 + "..."
    assert safetensors.shown("a\x1bb") == "a\\x1bb" and safetensors.shown("tab\there") == "tab\\there"
