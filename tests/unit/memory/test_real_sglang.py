"""What a real sglang showed on a real GPU (tests/fixtures/real-sglang/, scripts/device/real-sglang.sh):
the doctor stays quiet on clean starts, the planner's KV pool matches sglang's, and every chat the
endpoint suite and the correctness gate send fits the context the server reported."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sglang_deploy.memory import planner, startlog
from sglang_deploy.observe import doctor
from sglang_deploy_host.serving import endpoint, gate

ROOT = Path(__file__).resolve().parents[3]
RUN = ROOT / "tests" / "fixtures" / "real-sglang" / "h200-sglang-0.5.17"
LOGS = sorted(RUN.glob("*.sglang.log"))
# inventory/device/group_vars/device_h200.yml: sglang_server_memory_plan and the launch flags.
H200_MIB, KV_BYTES_PER_TOKEN, MAX_RUNNING_REQUESTS = 143_771, 1_024, 64


def test_the_run_left_four_server_logs() -> None:
    assert [p.name for p in LOGS] == [
        "h200-mem070.sglang.log", "h200-mem092.sglang.log", "h200-trained.sglang.log", "h200-untrained.sglang.log",
    ]  # fmt: skip


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.name)
def test_doctor_finds_nothing_in_a_real_clean_start(log: Path) -> None:
    assert doctor.diagnose(log.read_text().splitlines()) == []


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.name)
def test_planner_kv_pool_is_within_a_quarter_percent_of_sglangs(log: Path) -> None:
    readings = startlog.parse(log.read_text()).readings
    plan = planner.plan(
        planner.PlanInputs(
            gpu_memory_mib=H200_MIB, weights_gib_per_gpu=0.0, kv_bytes_per_token=KV_BYTES_PER_TOKEN,
            mem_fraction_static=readings["mem_fraction_static"], max_running_requests=MAX_RUNNING_REQUESTS,
        )
    )  # fmt: skip
    assert plan.kv_tokens is not None and plan.safe
    assert abs(plan.kv_tokens - readings["max_total_num_tokens"]) / readings["max_total_num_tokens"] < 0.0025


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.name)
def test_planner_free_memory_after_capture_matches_sglangs_with_this_models_graph_size(log: Path) -> None:
    """With the decode-graph size measured for this model (30-41 MiB for bs 1..64: 0.5 MiB per bs; the
    default 38 is GLM-5's), the planner's free memory after the start is within 100 MiB of sglang's
    ``available_gpu_mem``: the per-token buffers outside the pool (about 6 GiB here) are counted."""
    readings = startlog.parse(log.read_text()).readings
    plan = planner.plan(
        planner.PlanInputs(
            gpu_memory_mib=H200_MIB, weights_gib_per_gpu=0.0, kv_bytes_per_token=KV_BYTES_PER_TOKEN,
            mem_fraction_static=readings["mem_fraction_static"], max_running_requests=MAX_RUNNING_REQUESTS,
            graph_mib_per_bs=0.5,
        )
    )  # fmt: skip
    assert plan.free_after_start_mib is not None
    assert abs(plan.free_after_start_mib - readings["available_gpu_mem_gib"] * 1024) < 100


def test_every_chat_fits_the_context_the_real_server_reported() -> None:
    (card,) = json.loads((RUN / "v1-models.json").read_text())["data"]
    context_len = card["max_model_len"]
    assert context_len == 2048  # the size that refused the old max_tokens 2048 with HTTP 400
    prompts = [(gate.build_prompt(p, context_len), p.max_tokens) for p in gate.load_probes()]
    prompts.append((endpoint.CHAT_SMOKE_PROMPT, endpoint.CHAT_SMOKE_MAX_TOKENS))
    for prompt, wanted in prompts:
        fitted = endpoint.fit_max_tokens(wanted, prompt, context_len)
        assert 1 <= fitted < wanted
        assert fitted + endpoint.prompt_token_bound(prompt) <= context_len


def test_the_suite_passed_on_the_trained_model_and_the_gate_alone_failed_on_the_untrained_one() -> None:
    trained = (RUN / "verify-h200-trained.txt").read_text()
    untrained = (RUN / "verify-h200-untrained.txt").read_text()
    assert re.search(r"=+ 6 passed in ", trained)
    assert re.search(r"=+ 1 failed, 5 passed in ", untrained)
    assert re.findall(r"^FAILED (\S+)", untrained, re.M) == ["tests/infra/test_endpoint.py::test_correctness_gate[local]"]
