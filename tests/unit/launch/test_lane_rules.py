"""Each lane's SM120 rules (lanes/<lane>.yml sm120_rules), each refused with the source it was read in."""

from __future__ import annotations

from typing import Any

import pytest

from sglang_deploy.lanes.catalog import LaneError, load_lane
from sglang_deploy.lanes.catalog import _parse_sm120_rules  # the loader's own check of the rules
from sglang_deploy.launch import lane_rules
from sglang_deploy.launch.config import LaunchConfig, merge_flags

PY = "/opt/sglang-deploy/ml-env/bin/python3"
# The seed launch's flags that the rules read (inventory/proxmox/group_vars/sglang_servers/sglang_server.yml).
SEED = {"tp-size": 8, "max-running-requests": 64, "kv-cache-dtype": "auto", "attention-backend": "flashinfer",
        "nsa-decode-backend": "trtllm", "nsa-prefill-backend": "trtllm", "enable-flashinfer-allreduce-fusion": True}  # fmt: skip
# What the profiles' lanes.cu130 entries change (inventory/proxmox/group_vars/sglang_servers/profiles.yml).
CU130_FP8 = {"dsa-prefill-backend": "flashinfer_sparse_mla", "dsa-decode-backend": "flashinfer_sparse_mla",
             "enable-flashinfer-allreduce-fusion": None}  # fmt: skip


def problem(
    lane: str, flags: dict[str, Any], sm_major: int | None = 12, architecture: str | None = "glm-5", **changes: Any
) -> str | None:
    """The rule ``flags`` break, with ``changes`` merged over them (a profile's lanes entry: any spelling replaces)."""
    merged = merge_flags(flags, {name.replace("_", "-"): value for name, value in changes.items()})
    settings = LaunchConfig.from_vars(merged, python=PY, lane=lane).settings
    return lane_rules.problem(load_lane(lane), settings, sm_major, architecture=architecture)


def test_the_seed_launch_keeps_every_rule_of_the_cu128_lane() -> None:
    assert problem("cu128", SEED) is None
    assert problem("cu128", {**SEED, "kv-cache-dtype": "bfloat16"}) is None


def test_the_seed_launch_on_cu130_is_refused_with_0_5_23s_fp8_backend_rule_and_its_source() -> None:
    message = problem("cu130", SEED)
    assert message is not None and message.startswith("lane cu130 (sglang 0.5.23) on SM120: with an fp8 KV pool")
    assert "takes only flashinfer_sparse_mla, triton_sparse_mla for dsa-prefill-backend, not trtllm" in message
    assert "flash_mla_sm120.py:678-713" in message and "overrides.py:490-545" in message and ":637-674" in message
    assert "Fix: set dsa-prefill-backend: flashinfer_sparse_mla" in message
    decode = problem("cu130", merge_flags(SEED, {"nsa-prefill-backend": "triton_sparse_mla"}))
    assert decode is not None and "for dsa-decode-backend, not trtllm" in decode
    assert problem("cu130", merge_flags(SEED, CU130_FP8)) is None
    assert problem("cu130", merge_flags(merge_flags(SEED, CU130_FP8), {"dsa-prefill-backend": "triton_sparse_mla"})) is None


def test_an_explicit_fp8_pool_meets_the_same_rule_and_an_unset_backend_passes() -> None:
    assert problem("cu130", {**SEED, "kv-cache-dtype": "fp8_e4m3"}) is not None
    unset = {k: v for k, v in SEED.items() if "backend" not in k or k == "attention-backend"}
    assert problem("cu130", {**unset, "enable-flashinfer-allreduce-fusion": None}) is None  # auto picks flashinfer_sparse_mla


def test_flashinfer_sparse_mla_runs_only_with_an_fp8_e4m3_pool() -> None:
    for dtype in ("bfloat16", "bf16"):
        message = problem("cu130", merge_flags(SEED, CU130_FP8), kv_cache_dtype=dtype)
        assert message is not None and "flashinfer_sparse_mla runs only with an fp8_e4m3 KV pool, not kv-cache-dtype " + dtype in message
        assert "_validate_flashinfer_sparse_mla_backend" in message
    assert problem("cu130", merge_flags(SEED, CU130_FP8), kv_cache_dtype="fp8_e4m3") is None


def test_a_bf16_pool_with_its_prefill_backend_unset_is_refused_naming_flashmla_and_the_issues() -> None:
    flags = {"tp-size": 8, "max-running-requests": 64, "kv-cache-dtype": "bfloat16"}
    message = problem("cu130", flags)
    assert message is not None and "an unset dsa-prefill-backend becomes flashmla_sparse, which has no SM120 kernels" in message
    assert "sgl-project/sglang #29580, #37105" in message and "Fix: set dsa-prefill-backend: trtllm" in message
    assert problem("cu130", {**flags, "dsa-prefill-backend": "trtllm"}) is None
    # Whether the model is DSA is known from its architecture or its DSA flags; neither: not judged.
    assert problem("cu130", flags, architecture=None) is None
    assert problem("cu130", {**flags, "dsa-decode-backend": "trtllm"}, architecture=None) is not None
    assert problem("cu128", flags) is None  # 0.5.10.post1's automatic choice is not this lane's rule


@pytest.mark.parametrize("dtype", ["fp8_e5m2", "nvfp4", "mxfp8"])
def test_a_dsa_model_starts_only_with_bf16_or_fp8_e4m3_in_0_5_23(dtype: str) -> None:
    flags = {"tp-size": 8, "max-running-requests": 64, "dsa-prefill-backend": "trtllm", "dsa-decode-backend": "trtllm"}
    message = problem("cu130", {**flags, "kv-cache-dtype": dtype})
    assert message is not None and f"a DSA model starts only with kv-cache-dtype auto, bf16, bfloat16, fp8_e4m3, not {dtype}" in message
    assert "overrides.py:532-545" in message
    for fine in ("bf16", "bfloat16"):
        assert problem("cu130", {**flags, "kv-cache-dtype": fine}) is None
    assert problem("cu130", {"tp-size": 8, "max-running-requests": 64, "kv-cache-dtype": dtype}, architecture=None) is None


@pytest.mark.parametrize("lane", ["cu128", "cu130"])
def test_flashmla_and_fa3_backends_have_no_sm120_kernels_in_either_lane(lane: str) -> None:
    for backend in ("flashmla_sparse", "flashmla_kv", "flashmla_auto", "fa3"):
        message = problem(lane, merge_flags(merge_flags(SEED, CU130_FP8), {"nsa-decode-backend": backend}))
        assert message is not None and f"decode-backend {backend} has no SM120 kernels" in message, (lane, backend)
        assert load_lane(lane).sm120_rules.dsa_backends_without_sm120_source in message


def test_allreduce_fusion_raises_on_sm120_in_0_5_23_only_and_only_with_tp_above_1() -> None:
    flags = {**SEED, "kv-cache-dtype": "bfloat16"}
    message = problem("cu130", flags)
    assert message is not None and "enable-flashinfer-allreduce-fusion raises 'FlashInfer allreduce fusion requires" in message
    assert "flashinfer_comm_fusion.py:46-51" in message and "Fix: remove enable-flashinfer-allreduce-fusion" in message
    assert problem("cu130", {**flags, "tp-size": 1}) is None
    assert problem("cu128", flags) is None


def test_decode_graphs_are_capped_at_256_in_0_5_23() -> None:
    flags = merge_flags(SEED, CU130_FP8)
    assert problem("cu130", {**flags, "cuda-graph-max-bs": 256}) is None
    over = problem("cu130", {**flags, "cuda-graph-max-bs": 257})
    assert over is not None and "cuda-graph-max-bs-decode captures decode graphs up to batch 257, beyond the 256" in over
    assert "memory_hook.py:146-159" in over
    listed = problem("cu130", {**flags, "cuda-graph-bs": [1, 8, 512]})
    assert listed is not None and "cuda-graph-bs-decode captures decode graphs up to batch 512" in listed
    assert problem("cu130", {**flags, "cuda-graph-max-bs": 512, "disable-cuda-graph": True}) is None
    uncapped = {k: v for k, v in flags.items() if k != "max-running-requests"}
    message = problem("cu130", uncapped)
    assert message is not None and "nothing caps the decode graphs" in message and "max-running-requests" in message
    assert problem("cu130", {**uncapped, "tp-size": 2}) is None  # below TP 4 the default is 256
    assert problem("cu128", {**SEED, "cuda-graph-max-bs": 512}) is None


def test_no_rule_judges_another_gpu() -> None:
    for sm_major in (None, 9, 10):
        assert problem("cu130", SEED, sm_major=sm_major) is None


def test_docs_lanes_cites_every_source_the_lanes_rules_name() -> None:
    """docs/lanes.md is the user's view of the rules: each file and line range a lane's rules were read at is there."""
    import re

    from conftest import ROOT

    docs = (ROOT / "docs" / "lanes.md").read_text()
    for name in ("cu128", "cu130"):
        lane = load_lane(name)
        rules = lane.sm120_rules
        sources = [rules.dsa_backends_without_sm120_source, rules.dsa_fp8_source, rules.dsa_bf16_source,
                   rules.allreduce_fusion_source, rules.decode_graph_source, lane.shared_experts_fusion_auto_off]  # fmt: skip
        cited = {ref for source in sources for ref in re.findall(r"[\w.]+\.py:\d+(?:-\d+)?", source)}
        assert name == "cu128" or len(cited) >= 8
        for ref in cited:
            assert ref in docs, (name, ref)


def test_a_rule_without_its_source_or_of_the_wrong_type_is_refused() -> None:
    with pytest.raises(LaneError, match="decode_graph_max_bs without a source"):
        _parse_sm120_rules({"decode_graph_max_bs": 256}, "x")
    with pytest.raises(LaneError, match="allreduce_fusion_refused must be true/false"):
        _parse_sm120_rules({"allreduce_fusion_refused": "yes"}, "x")
    with pytest.raises(LaneError, match="unknown colour"):
        _parse_sm120_rules({"colour": 1}, "x")
    with pytest.raises(LaneError, match="dsa_fp8_backends without a source"):
        _parse_sm120_rules({"dsa_fp8_backends": {"prefill": ["a"], "decode": ["a"], "source": ""}}, "x")


def test_the_pool_is_fp8_for_auto_from_sm_10_and_the_message_names_the_dtype_asked_for() -> None:
    from sglang_deploy.launch.flagtable import LaunchSettings

    assert lane_rules.resolved_kv_fp8(LaunchSettings(), 10) and not lane_rules.resolved_kv_fp8(LaunchSettings(), 9)
    assert not lane_rules.resolved_kv_fp8(LaunchSettings(kv_cache_dtype="fp8_e5m2"), 12)
    message = problem("cu130", SEED, kv_cache_dtype="fp8_e4m3")
    assert message is not None and "(kv-cache-dtype fp8_e4m3)" in message


def test_uncapped_decode_graphs_are_refused_from_tp_4() -> None:
    uncapped = {k: v for k, v in merge_flags(SEED, CU130_FP8).items() if k != "max-running-requests"}
    assert problem("cu130", uncapped, tp_size=4) is not None
    assert problem("cu130", uncapped, tp_size=3) is None
