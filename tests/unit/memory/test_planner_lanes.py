"""The planner per lane: the graph terms that differ between sglang 0.5.10.post1 (cu128) and 0.5.23 (cu130) come
from the lane file's `planner` section (lanes/<lane>.yml), each read in that sglang's source."""

from __future__ import annotations

import dataclasses

import pytest

from sglang_deploy.lanes.catalog import GraphTier, LaneError, PlannerRules, _parse_planner, load_lane
from sglang_deploy.launch.config import LaunchConfig
from sglang_deploy.memory import planner
from sglang_deploy.memory.plan_inputs import PlanSources, plan_inputs

CU128 = load_lane("cu128").planner
CU130 = load_lane("cu130").planner
BOX_MIB = 97_887  # RTX PRO 6000 Blackwell


@pytest.mark.parametrize(
    ("gpu_mib", "tp", "cu128", "cu130"),
    [
        (16_000, 8, (2048, 8), (2048, 8)),
        (24_000, 1, (2048, 24), (4096, 48)),  # the one tier 0.5.23 changed (memory_hook.py:101-117)
        (24_000, 4, (2048, 80), (4096, 160)),
        (40_000, 8, (4096, 160), (4096, 160)),
        (80_000, 2, (8192, 256), (8192, 256)),
        (BOX_MIB, 8, (8192, 512), (8192, 512)),  # the box: 512 at TP >= 4 in both
        (BOX_MIB, 3, (8192, 256), (8192, 256)),
        (163_840, 8, (16384, 512), (16384, 512)),
        (None, 8, (4096, 160), (4096, 160)),
    ],
)
def test_each_lane_picks_its_sglangs_tier(gpu_mib: int | None, tp: int, cu128: tuple, cu130: tuple) -> None:
    assert planner.graph_tier(gpu_mib, tp, CU128) == cu128
    assert planner.graph_tier(gpu_mib, tp, CU130) == cu130
    assert planner.graph_tier(gpu_mib, tp) == cu128  # no lane: the default lane's


def _plan(rules: PlannerRules | None, **values: object) -> planner.Plan:
    inputs = planner.PlanInputs(gpu_memory_mib=BOX_MIB, tp_size=8, lane_rules=rules, **values)  # type: ignore[arg-type]
    return planner.plan(inputs)


def test_max_running_requests_caps_an_explicit_graph_batch_in_0_5_10_only() -> None:
    """0.5.10.post1 caps every captured batch by the request pool at run time (cuda_graph_runner.py:454-480);
    0.5.23 caps only its own default (memory_hook.py:182-188), so an explicit batch is captured as asked."""
    assert _plan(CU128, max_running_requests=64).inputs["effective_cuda_graph_max_bs"] == 64
    assert _plan(CU130, max_running_requests=64).inputs["effective_cuda_graph_max_bs"] == 64
    assert _plan(CU128, max_running_requests=64, cuda_graph_max_bs=128).inputs["effective_cuda_graph_max_bs"] == 64
    assert _plan(CU130, max_running_requests=64, cuda_graph_max_bs=128).inputs["effective_cuda_graph_max_bs"] == 128
    assert _plan(CU130, max_running_requests=64, cuda_graph_bs=(1, 96)).inputs["effective_cuda_graph_max_bs"] == 96
    assert _plan(CU130).inputs["effective_cuda_graph_max_bs"] == 512
    assert _plan(CU130, disable_cuda_graph=True).inputs["effective_cuda_graph_max_bs"] == 0
    # More graphs, more memory outside the pool: a lower recommendation.
    low = _plan(CU130, max_running_requests=64, cuda_graph_max_bs=256).recommended_mem_fraction_static
    high = _plan(CU128, max_running_requests=64, cuda_graph_max_bs=256).recommended_mem_fraction_static
    assert low is not None and high is not None and low < high


def test_the_road_takes_the_lanes_rules_and_says_what_0_5_23_adds() -> None:
    launch = LaunchConfig.from_vars({"tp-size": 8, "max-running-requests": 64, "kv-cache-dtype": "bfloat16"},
                                    python="/py", lane="cu130").settings  # fmt: skip
    box = {"architecture": "glm-5", "gpu_memory_mib": BOX_MIB, "sm_major": 12, "weights_gib_per_gpu": 60.95}
    inputs, notes = plan_inputs(PlanSources(launch=launch, lane="cu130", plan_vars=box), no_memory_fix="x")
    assert inputs.lane_rules == CU130
    assert any("captures prefill CUDA graphs by default" in note and "disable-prefill-cuda-graph" in note for note in notes)
    inputs_128, notes_128 = plan_inputs(PlanSources(launch=dataclasses.replace(launch, lane="cu128"), lane="cu128", plan_vars=box),
                                        no_memory_fix="x")  # fmt: skip
    assert inputs_128.lane_rules == CU128 and not any("prefill CUDA graphs" in note for note in notes_128)
    off = LaunchConfig.from_vars({"tp-size": 8, "disable-prefill-cuda-graph": True}, python="/py", lane="cu130").settings
    _, notes_off = plan_inputs(PlanSources(launch=off, lane="cu130", plan_vars=box), no_memory_fix="x")
    assert not any("prefill CUDA graphs" in note for note in notes_off)
    # The plan's inputs in its output carry no rules object: the --json of plan and the resolved fact stay plain.
    assert "lane_rules" not in planner.plan(inputs).inputs


def test_a_malformed_planner_section_is_refused_naming_it() -> None:
    good = {"graph_tiers": [[20, 2048, 8, 8], [None, 4096, 16, 16]], "graph_tiers_unknown": [4096, 160],
            "running_requests_cap_explicit_bs": True, "prefill_graphs_default": False, "source": "x"}  # fmt: skip
    assert _parse_planner(good, "w").graph_tiers == (GraphTier(20, 2048, 8, 8), GraphTier(None, 4096, 16, 16))
    for change, message in (
        ({"graph_tiers": []}, "graph_tiers must be a list"),
        ({"graph_tiers": [[20, 2048, 8]]}, r"graph_tiers\[0\]"),
        ({"graph_tiers": [[20, 2048, 8, 8]]}, "only the last row has no bound"),
        ({"graph_tiers": [[None, 1, 1, 1], [None, 1, 1, 1]]}, "only the last row has no bound"),
        ({"graph_tiers": [["x", 1, 1, 1], [None, 1, 1, 1]]}, r"graph_tiers\[0\]"),
        ({"graph_tiers_unknown": [1]}, "graph_tiers_unknown must be"),
        ({"prefill_graphs_default": "no"}, "prefill_graphs_default must be true or false"),
        ({"colour": 1}, "unknown colour"),
    ):
        with pytest.raises(LaneError, match=message):
            _parse_planner({**good, **change}, "w")
