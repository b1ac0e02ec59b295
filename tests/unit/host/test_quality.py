"""The quality check (sglang_deploy_host/serving/quality.py, issue 42) against the stand-in's logprob API
(tests/standin/sglang_server_standin.py: a small language model answering sglang's /tokenize and /generate with
return_logprob, shapes from sglang 0.5.17): a reference recorded on the faithful server passes that server again,
and fails a constant one, a drifted one and one that races under concurrency, each with its reason; a server
without logprobs, another tokenizer or another model gets no verdict. Then the figures themselves (KL over the
top-k and the rest, the tie margin at its edge, the percentile), and every malformed reference and prompt set."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
from conftest import StandinProcess as Standin

from sglang_deploy_host.serving import endpoint as ep
from sglang_deploy_host.serving import quality, quality_reference

KEY = "quality-test-key-0123456789"
MODEL = "glm-5"


def _server(tmp_path: Path, mode: str = "ok", model: str = MODEL) -> Standin:
    return Standin(tmp_path / f"standin-{mode}.log", "--api-key", KEY, "--served-model-name", model,
                   "--standin-load-delay", "0", "--standin-mode", mode)  # fmt: skip


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The shipped prompt set recorded on the faithful stand-in."""
    server = _server(tmp_path_factory.mktemp("reference"))
    try:
        return quality.record(ep.Endpoint(server.url, api_key=KEY), MODEL, quality_reference.load_prompt_set())
    finally:
        server.stop()


def check(tmp_path: Path, data: dict[str, Any], mode: str = "ok", model: str = MODEL, **thresholds: float) -> quality.Verdict:
    server = _server(tmp_path, mode, model)
    try:
        reference = quality_reference.parse_reference(data, "ref.json")
        limits = reference.thresholds.merged(thresholds, "test") if thresholds else None
        return quality.check(ep.Endpoint(server.url, api_key=KEY), reference, limits)
    finally:
        server.stop()


# -- the reference ------------------------------------------------------------------------------------------
def test_the_reference_holds_the_set_its_ids_and_every_position(reference: dict[str, Any]) -> None:
    assert reference["format"] == quality_reference.FORMAT and reference["served_model"] == MODEL
    assert reference["prompt_set"] == {"name": "sglang-deploy-default", "version": 1, "top_k": 20, "generate_tokens": 48,
                                       "concurrency": 8, "copies": 3}  # fmt: skip
    prompts = {p["name"]: p for p in reference["prompts"]}
    assert set(prompts) == {"fact-capital", "arithmetic", "multi-step", "code", "explanation", "long-context"}
    # The long prompt reaches its floor with the served tokenizer; every continuation token has its top-k.
    assert len(prompts["long-context"]["prompt_ids"]) >= 8192
    for prompt in prompts.values():
        assert len(prompt["scored"]) == len(prompt["continuation_ids"]) == len(prompt["continuation_logprobs"])
        assert all(len(top) == 20 for top in prompt["scored"])
        assert len(prompt["greedy"]["ids"]) == len(prompt["greedy"]["tops"]) == 48
    assert reference["batch"] == {"requests": 18, "identical": 18, "tie_flips": 0, "tie_flip_margins": []}
    # What the launch says of itself, never the key the server's /get_server_info holds in clear.
    assert reference["launch"]["served_model_name"] == MODEL and KEY not in json.dumps(reference)
    assert reference["tokens"]["prompt"] > 8192 and reference["tokens"]["generated"] == 6 * 48 * 4


def test_a_reference_needs_its_long_prompt_long_enough(tmp_path: Path) -> None:
    data = quality_reference.prompt_set_data()
    data["prompts"][-1]["context"]["filler_chars"] = 2000
    server = _server(tmp_path)
    try:
        with pytest.raises(quality.NoVerdictError, match=r"prompt long-context: [\d,]+ tokens with this tokenizer, fewer than the set's min_prompt_tokens 8,192"):
            quality.record(ep.Endpoint(server.url, api_key=KEY), MODEL, quality_reference.parse_prompt_set(data, "set.yml"))
    finally:
        server.stop()


# -- the verdicts ---------------------------------------------------------------------------------------------
def test_the_same_launch_passes_with_nothing_moved(tmp_path: Path, reference: dict[str, Any]) -> None:
    verdict = check(tmp_path, reference)
    assert verdict.passed and verdict.reasons == [], verdict.report()
    assert verdict.kl["mean"] == verdict.kl["max"] == 0.0 and verdict.top1_agreement == 1.0
    # Every teacher-forced position and every greedy one (the outputs are identical, so all 48 of each).
    assert verdict.kl["prefill_positions"] == sum(len(p["continuation_ids"]) for p in reference["prompts"])
    assert verdict.kl["decode_positions"] == 6 * 48
    assert verdict.greedy["identical"] == 6 and verdict.batch["identical"] == 18 and verdict.batch["concurrency"] == 8
    assert verdict.line().startswith("sglang-deploy quality check: PASS [KL mean 0 (max 0.01)")


def test_a_server_that_ignores_the_prompt_fails(tmp_path: Path, reference: dict[str, Any]) -> None:
    verdict = check(tmp_path, reference, "constant")
    assert not verdict.passed
    assert verdict.reasons[0].startswith("mean per-token KL") and verdict.reasons[1].startswith("p99 per-token KL")
    assert any(r.startswith("top-1 agreement") for r in verdict.reasons)
    assert verdict.greedy["identical"] == 0
    assert verdict.line().startswith("sglang-deploy quality check: FAIL: mean per-token KL")


def test_a_drifted_launch_fails_on_its_distribution(tmp_path: Path, reference: dict[str, Any]) -> None:
    verdict = check(tmp_path, reference, "drift")
    assert not verdict.passed
    assert verdict.reasons[0].startswith("mean per-token KL") and 0.01 < verdict.kl["mean"] < 0.5, verdict.report()
    # Greedy outputs part from the reference's where its margin was wide: departures, named with the margin.
    assert any("departs from the reference's at token" in r for r in verdict.reasons)
    # The same drift passes thresholds set above it: the verdict is the thresholds', not a constant.
    assert check(tmp_path, reference, "drift", kl_mean=1.0, kl_p99=5.0, top1_agreement=0.5, tie_margin=50.0).passed


def test_a_race_under_concurrency_fails_on_batch_consistency(tmp_path: Path, reference: dict[str, Any]) -> None:
    verdict = check(tmp_path, reference, "batch-race")
    # Alone it is the model (every figure of concurrency 1 holds); in a batch its outputs depart.
    assert verdict.kl["mean"] == 0.0 and verdict.greedy["identical"] == 6
    assert not verdict.passed and verdict.reasons[-1].endswith("(batch inconsistency: a race under load)"), verdict.report()
    assert verdict.batch["departures"] and verdict.batch["departures"][0].startswith("request ")


@pytest.mark.parametrize(
    ("mode", "model", "message"),
    [
        ("no-logprobs", MODEL, "this server does not return logprobs"),
        ("retokenized", MODEL, "the reference was recorded with another tokenizer: the prompt of 'fact-capital'"),
        ("ok", "glm-5.1", "this server does not serve 'glm-5' (it lists ['glm-5.1'])"),
    ],
)  # fmt: skip
def test_a_server_it_cannot_judge_gets_no_verdict(tmp_path: Path, reference: dict[str, Any], mode: str, model: str, message: str) -> None:
    with pytest.raises(quality.NoVerdictError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        check(tmp_path, reference, mode, model)


def test_a_reference_not_consistent_with_itself_is_refused(tmp_path: Path) -> None:
    server = _server(tmp_path, "batch-race")
    try:
        with pytest.raises(quality.NoVerdictError, match="this launch is not consistent with itself: request 1"):
            quality.record(ep.Endpoint(server.url, api_key=KEY), MODEL, quality_reference.load_prompt_set())
    finally:
        server.stop()


# -- the figures ------------------------------------------------------------------------------------------------
def top(*pairs: tuple[float, int]) -> quality_reference.TopK:
    return [(math.log(p), token) for p, token in pairs]


def test_kl_is_zero_for_the_same_distribution_and_known_otherwise() -> None:
    p = top((0.7, 1), (0.2, 2), (0.05, 3))
    assert quality.kl_divergence(p, p) == 0.0
    q = top((0.5, 1), (0.4, 2), (0.05, 3))
    # Over the top-k and the rest (0.05 on both sides): 0.7 ln(0.7/0.5) + 0.2 ln(0.2/0.4).
    assert quality.kl_divergence(p, q) == pytest.approx(0.7 * math.log(0.7 / 0.5) + 0.2 * math.log(0.2 / 0.4), abs=1e-12)


def test_a_token_the_server_ranks_below_its_top_k_counts_with_its_last_probability() -> None:
    p = top((0.6, 1), (0.3, 2))
    q = top((0.6, 1), (0.1, 5))  # token 2 is not in the served top-2: at most 0.1
    expected = 0.3 * math.log(0.3 / 0.1) + 0.1 * math.log(0.1 / (1 - 0.6 - 0.1))
    assert quality.kl_divergence(p, q) == pytest.approx(expected, abs=1e-12)


def test_the_tie_margin_is_pinned_at_its_edge() -> None:
    expected = quality_reference.Greedy([1, 2, 3], [top((0.5, 1), (0.3, 9)), top((0.6, 2), (0.3, 9)), top((0.9, 3), (0.1, 9))])
    margin = math.log(0.6) - math.log(0.3)
    at_edge = quality.parting("p", expected, [1, 9, 3], margin)
    assert at_edge is not None and at_edge.position == 1 and at_edge.tie
    above = quality.parting("p", expected, [1, 9, 3], margin - 1e-9)
    assert above is not None and not above.tie
    assert quality.parting("p", expected, [1, 2, 3], 0.0) is None
    # One output stopped where the other went on: a parting at the end, judged by the margin there.
    shorter = quality.parting("p", expected, [1, 2], 0.1)
    assert shorter is not None and shorter.position == 2 and not shorter.tie


def test_the_percentile_is_the_nearest_rank() -> None:
    values = [float(i) for i in range(1, 101)]
    assert quality.percentile(values, 0.99) == 99.0 and quality.percentile(values, 1.0) == 100.0
    assert quality.percentile([3.0], 0.99) == 3.0 and quality.percentile([], 0.99) == 0.0


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"kl_mean": -1}, "thresholds.kl_mean must be a finite number >= 0"),
        ({"kl_mean": float("nan")}, "thresholds.kl_mean must be a finite number >= 0"),
        ({"kl_mean": True}, "thresholds.kl_mean must be a finite number >= 0"),
        ({"top1_agreement": 95}, "thresholds.top1_agreement is a share"),
        ({"kl_mena": 0.1}, "unknown thresholds \\['kl_mena'\\]"),
        ([1], "thresholds must be a mapping"),
    ],
)  # fmt: skip
def test_thresholds_are_checked(data: Any, message: str) -> None:
    with pytest.raises(quality_reference.QualityInputError, match=message):
        quality_reference.Thresholds.from_data(data, "where")
    if isinstance(data, dict):
        with pytest.raises(quality_reference.QualityInputError, match=message):
            quality_reference.Thresholds().merged(data, "where")


# -- malformed input --------------------------------------------------------------------------------------------
def _broken(reference: dict[str, Any], change: Any) -> dict[str, Any]:
    data = copy.deepcopy(reference)
    change(data)
    return data


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(format="something else"), "not a quality reference"),
        (lambda d: d.update(format_version=2), "format_version 2; this sglang-deploy reads 1: record it again"),
        (lambda d: d.pop("served_model"), "served_model must be a non-empty string"),
        (lambda d: d["prompt_set"].update(top_k=1), "prompt_set.top_k must be a whole number from 2 to 20"),
        (lambda d: d["prompt_set"].update(concurrency=4), "prompt_set.concurrency must be a whole number from 8 to 64"),
        (lambda d: d.update(prompts=[]), "prompts must be a list of 1 to 64"),
        (lambda d: d["prompts"][0].update(prompt_ids=[]), "prompts\\[0\\].prompt_ids: want a non-empty list of token ids"),
        (lambda d: d["prompts"][0].update(continuation_ids=[1, -2]), "continuation_ids: want a non-empty list of token ids"),
        (lambda d: d["prompts"][0]["scored"].pop(), "prompts\\[0\\].scored: want \\d+ positions of top logprobs"),
        (lambda d: d["prompts"][0]["scored"][0].reverse(), "prompts\\[0\\].scored\\[0\\]: the pairs are not best first"),
        (lambda d: d["prompts"][0]["scored"][0].__setitem__(0, [0.5, 3]), "is not a \\[logprob <= 0, token_id\\] pair"),
        (lambda d: d["prompts"][0]["scored"][0].__setitem__(0, [float("nan"), 3]), "is not a \\[logprob <= 0, token_id\\] pair"),
        (lambda d: d["prompts"][0]["scored"].__setitem__(0, [[-0.1, 1]] * 21), "want 2 to 20 \\[logprob, token_id\\] pairs"),
        (lambda d: d["prompts"][1]["greedy"].update(tops=[]), "prompts\\[1\\].greedy.tops: want 48 positions"),
        (lambda d: d["prompts"][1].update(continuation_logprobs=[0.0]), "continuation_logprobs: want \\d+ finite logprobs"),
        (lambda d: d.update(thresholds={"kl_mean": "low"}), "thresholds.kl_mean must be a finite number >= 0"),
        # What a report prints comes out of the file: no escape sequence reaches a terminal (issue 43's round).
        (lambda d: d["prompts"][0].update(name="\x1b]0;owned\x07"), "prompts\\[0\\]: name must be printable"),
        (lambda d: d.update(served_model="glm-5\x1b[2J"), "served_model must be printable"),
        (lambda d: d["prompt_set"].update(name="set\x1b[31m"), "prompt_set.name must be printable"),
        (lambda d: d.update(recorded="\x1b[31m2026"), "recorded must be a printable time"),
    ],
)  # fmt: skip
def test_a_malformed_reference_is_refused_naming_the_entry(reference: dict[str, Any], change: Any, message: str) -> None:
    with pytest.raises(quality_reference.QualityInputError, match=message):
        quality_reference.parse_reference(_broken(reference, change), "ref.json")


def test_a_reference_file_is_read_bounded_and_whole(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    with pytest.raises(quality_reference.QualityInputError, match="deep.json: not JSON"):
        quality_reference.load_reference(deep)
    with pytest.raises(quality_reference.QualityInputError, match="cannot read it \\(No such file or directory\\)"):
        quality_reference.load_reference(tmp_path / "missing.json")
    with pytest.raises(quality_reference.QualityInputError, match="a directory"):
        quality_reference.load_reference(tmp_path)
    big = tmp_path / "big.json"
    with big.open("wb") as handle:
        handle.truncate(quality_reference.MAX_REFERENCE_BYTES + 1)
    with pytest.raises(quality_reference.QualityInputError, match="more than the 33,554,432 this reads"):
        quality_reference.load_reference(big)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("version"), "version must be a whole number"),
        (lambda d: d.update(top_k=21), "top_k must be a whole number from 2 to 20"),
        (lambda d: d.update(generate_tokens=0), "generate_tokens must be a whole number from 1 to 512"),
        (lambda d: d.update(batch={"concurrency": 4}), "batch.concurrency must be a whole number from 8 to 64"),
        (lambda d: d.update(batch={"copies": 1, "size": 3}), "batch must be a mapping of concurrency and copies"),
        (lambda d: d.update(extra=1), "unknown keys \\['extra'\\]"),
        (lambda d: d["prompts"][0].pop("continuation"), "prompt 1: continuation must be a non-empty string"),
        (lambda d: d["prompts"][1].update(name=d["prompts"][0]["name"]), "prompt names must be unique"),
        (lambda d: d["prompts"][5]["context"].update(depth=2), "context.depth must be between 0"),
        (lambda d: d.update(prompts=d["prompts"] * 11), "more than the 64 a check takes"),
    ],
)  # fmt: skip
def test_a_malformed_prompt_set_is_refused_naming_the_entry(change: Any, message: str) -> None:
    data = quality_reference.prompt_set_data()
    change(data)
    with pytest.raises(quality_reference.QualityInputError, match=message):
        quality_reference.parse_prompt_set(data, "set.yml")


def test_the_shipped_prompt_set_has_facts_arithmetic_code_and_a_long_prompt() -> None:
    shipped = quality_reference.load_prompt_set()
    assert (shipped.name, shipped.version, shipped.concurrency * 1, shipped.copies) == ("sglang-deploy-default", 1, 8, 3)
    assert len(shipped.prompts) * shipped.copies >= 2 * shipped.concurrency  # at least two full batches at c8
    long = [p for p in shipped.prompts if p.min_prompt_tokens >= 8192]
    assert [p.name for p in long] == ["long-context"] and "4817" in long[0].prompt


def test_a_references_launch_keeps_only_known_printable_fields(reference: dict[str, Any]) -> None:
    data = copy.deepcopy(reference)
    data["launch"] = {"kv_cache_dtype": "bf16\x1b[31m", "attention_backend": "triton", "api_key": "a-key", "x": 1}
    assert quality_reference.parse_reference(data, "ref.json").launch == {"attention_backend": "triton"}
