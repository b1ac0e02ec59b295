"""The quality check's thresholds against what a real GPU measured (issue 42):
tests/fixtures/real-sglang/h100-quality-mtp-2026-12-06/, three calls of scripts/device/mtp-evidence.sh on an H100
with sglang 0.5.17, each recording a reference on a trained model and checking other launches against it. The
shipped defaults must pass what computes the model (a restart, MTP with its trained draft, a checkpoint without
its draft) and fail what does not (an FP8 E5M2 KV cache, a RoPE base the weights were not trained with), judged by
the check's own judge on the recorded figures; the third call ran with the shipped defaults, so its recorded
verdicts are the live ones. Every recorded reference still reads."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import ROOT

from sglang_deploy_host.serving import quality, quality_reference

EVIDENCE = ROOT / "tests" / "fixtures" / "real-sglang" / "h100-quality-mtp-2026-12-06"
CALLS = sorted(EVIDENCE.glob("call-*"))
# What each launch must give under the shipped thresholds (docs/quality.md says why).
EXPECTED = {"mtp-trained": "PASS", "mtp-nodraft": "PASS", "q-restart": "PASS", "q-kv-fp8-e4m3": "PASS",
            "q-kv-fp8-e5m2": "FAIL", "q-rope-drift": "FAIL"}  # fmt: skip
_PARTING = re.compile(r"greedy (?P<prompt>\S+): parts at token (?P<position>\d+) \((?P<kind>a tie flip|a departure): top-2 margin (?P<margin>[\d.]+|inf) nats there\)")


def launches() -> list[tuple[str, dict]]:
    found = []
    for call in CALLS:
        for launch in json.loads((call / "quality-evidence.json").read_text())["launches"]:
            found.append((f"{call.name}/{launch['name']}", launch))
    return found


def figures(launch: dict) -> quality.Figures:
    partings = []
    for text in launch["greedy_partings"]:
        match = _PARTING.fullmatch(text)
        assert match, text
        partings.append(quality.Parting(match["prompt"], int(match["position"]), float(match["margin"]), match["kind"] == "a tie flip"))
    departures = 0 if launch["batch_consistent"] else 1
    return quality.Figures(launch["kl_mean"], launch["kl_p99"], launch["top1_agreement"], tuple(partings), departures, 18, 8)


def test_the_evidence_has_every_launch_and_every_call_ran_on_a_real_gpu() -> None:
    assert [c.name for c in CALLS] == ["call-1", "call-2", "call-3"]
    names = {name.split("/")[1] for name, _ in launches()}
    assert names == set(EXPECTED)
    for call in CALLS:
        data = json.loads((call / "quality-evidence.json").read_text())
        assert data["machine"].startswith("NVIDIA H100") and data["sglang"] == "0.5.17"


@pytest.mark.parametrize(("name", "launch"), launches(), ids=[name for name, _ in launches()])
def test_the_shipped_thresholds_judge_each_recorded_launch_as_expected(name: str, launch: dict) -> None:
    reasons = quality.judge(figures(launch), quality_reference.Thresholds())
    verdict = "FAIL" if reasons else "PASS"
    assert verdict == EXPECTED[launch["name"]], (name, reasons, launch)
    # Judged again under the thresholds it ran with, the same figures give the verdict it recorded.
    recorded = quality_reference.Thresholds.from_data(launch["threshold"], name)
    assert ("FAIL" if quality.judge(figures(launch), recorded) else "PASS") == launch["verdict"], name


def test_the_third_call_ran_with_the_shipped_thresholds() -> None:
    (launch,) = json.loads((EVIDENCE / "call-3" / "quality-evidence.json").read_text())["launches"]
    assert launch["threshold"] == quality.asdict(quality_reference.Thresholds())
    assert launch["name"] == "q-kv-fp8-e5m2" and launch["verdict"] == "FAIL"
    # Its p99, and a greedy output that left the reference where the reference was sure (margin 1.25 nats).
    assert launch["reasons"] == [
        f"p99 per-token KL {launch['kl_p99']:.4g} nats is over 0.1",
        "the greedy output of 'long-context' departs from the reference's at token 6, where the reference's top-2 "
        "margin is 1.25 nats (more than tie_margin 0.5)",
    ]


def test_the_margins_between_the_launches_are_the_documented_ones() -> None:
    """The thresholds sit between what passes and what fails with room on both sides (docs/quality.md)."""
    by_name: dict[str, list[dict]] = {}
    for _, launch in launches():
        by_name.setdefault(launch["name"], []).append(launch)
    limits = quality_reference.Thresholds()
    healthy = [l for n in ("mtp-trained", "mtp-nodraft", "q-restart") for l in by_name[n]]
    assert max(l["kl_mean"] for l in healthy) < limits.kl_mean / 100 and max(l["kl_p99"] for l in healthy) < limits.kl_p99 / 100
    assert max(l["kl_p99"] for l in by_name["q-kv-fp8-e4m3"]) < limits.kl_p99
    assert min(l["kl_p99"] for l in by_name["q-kv-fp8-e5m2"]) > limits.kl_p99
    assert min(l["kl_mean"] for l in by_name["q-rope-drift"]) > 10 * limits.kl_mean


@pytest.mark.parametrize("call", CALLS, ids=lambda c: c.name)
def test_every_recorded_reference_still_reads(call: Path) -> None:
    reference = quality_reference.load_reference(call / "quality-reference.json")
    assert reference.served_model == "tiny-mtp" and reference.launch["kv_cache_dtype"] == "bfloat16"
    assert [p.name for p in reference.prompts][-1] == "long-context" and len(reference.prompts[-1].prompt_ids) == 8300
    prompts = quality_reference.load_prompt_set(EVIDENCE / "quality-prompts.yml")
    assert [p.prompt for p in reference.prompts] == [p.prompt for p in prompts.prompts]
