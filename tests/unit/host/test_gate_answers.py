"""The correctness gate judges each answer as the answer to its own question (sglang_deploy_host/gate.py, issue 42):
numeric answers pinned on both sides (near misses of every kind fail, the right number written every way passes),
a conflicting answer beside the right one fails, the same answer to different questions fails, an answer that holds
another probe's answer fails - and a server that answers one constant string holding every right answer, which passed
all six probes before, fails through the real gate against the stand-in."""

from __future__ import annotations

import pytest
from conftest import StandinProcess as Standin

from sglang_deploy_host import endpoint as ep
from sglang_deploy_host import gate

PROBES = {probe.name: probe for probe in gate.load_probes()}
CONSTANT = "Paris 42 91 50 4817 def add(a, b): return a + b"
KEY = "gate-answers-key-0123456789"


def judged(probe: str, content: str) -> gate.ProbeResult:
    return gate.judge(PROBES[probe], {"content": content}, "stop", 2048)


# -- numbers, both sides pinned -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("probe", "answer"),
    [
        ("arithmetic", "42"), ("arithmetic", "42."), ("arithmetic", "The answer is 42."), ("arithmetic", "**42**"),
        ("arithmetic", "17 + 25 = 42"),  # the question's own numbers beside the answer
        ("arithmetic-product", "13 * 7 = 91"), ("arithmetic-product", "91"),
        ("multi-step", "50"), ("multi-step", "7 x 2 = 14, 14 + 5 = 19, 19 x 3 = 57, 57 - 7 = 50. The final number is 50."),
        ("long-context-retrieval", "4817"), ("long-context-retrieval", "The code is 4,817."),
    ],
)  # fmt: skip
def test_the_right_number_passes_however_it_is_written(probe: str, answer: str) -> None:
    result = judged(probe, answer)
    assert result.ok, result.describe()


@pytest.mark.parametrize(
    ("probe", "answer", "reason"),
    [
        # The old regex's boundaries, now pinned: a longer number is another number.
        ("arithmetic", "420", "the answer's numbers (420) do not hold 42"),
        ("arithmetic", "142", "the answer's numbers (142) do not hold 42"),
        ("arithmetic", "1742", "the answer's numbers (1742) do not hold 42"),
        ("arithmetic", "42.5", "the answer's numbers (42.5) do not hold 42"),
        ("arithmetic", "-42", "the answer's numbers (-42) do not hold 42"),
        ("arithmetic", "4.2", "the answer's numbers (4.2) do not hold 42"),
        ("arithmetic", "42nd", "the answer's numbers (none) do not hold 42"),
        ("arithmetic", "x42", "the answer's numbers (none) do not hold 42"),
        ("arithmetic", "42,000", "the answer's numbers (42000) do not hold 42"),
        ("arithmetic", "forty-two", "the answer's numbers (none) do not hold 42"),
        # The right number with a conflicting one: a hedge, a second guess, a wrong sum shown.
        ("arithmetic", "42, or maybe 43", "a conflicting number beside 42: 43"),
        ("arithmetic", "17 + 25 = 41. Sorry: 42", "a conflicting number beside 42: 41"),
        ("arithmetic-product", "91 (or 92)", "a conflicting number beside 91: 92"),
        ("multi-step", "50 or 57", None),  # 57 is a working step: allowed; but...
        ("multi-step", "50, not 51", "a conflicting number beside 50: 51"),
        # A distractor's code from the notes is not the question's number.
        ("long-context-retrieval", "4817 (or 2931)", "a conflicting number beside 4817: 2931"),
        ("long-context-retrieval", "4871", "the answer's numbers (4871) do not hold 4817"),
    ],
)  # fmt: skip
def test_numeric_near_misses_fail_naming_the_numbers(probe: str, answer: str, reason: str | None) -> None:
    result = judged(probe, answer)
    if reason is None:
        assert result.ok, result.describe()
        return
    assert not result.ok and result.reason == reason, result.describe()


def test_numbers_in_reads_each_number_whole() -> None:
    assert gate.numbers_in("17 + 25 = 42.") == [17, 25, 42]
    assert gate.numbers_in("4,817 and 4,81 and 1.5 and \u22123") == [4817, 1.5, -3]
    assert gate.numbers_in("v2 x42 42nd 3.14.15") == []


# -- words and code: a conflicting answer -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("probe", "answer", "reason"),
    [
        ("capital-of-france", "Paris or Lyon", "a conflicting answer in it: 'Lyon' (the probe's reject)"),
        ("capital-of-france", "Paris. (Some say Marseille.)", "a conflicting answer in it: 'Marseille' (the probe's reject)"),
        ("python-function", "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b",
         "a conflicting answer in it: 'return a - b' (the probe's reject)"),
    ],
)  # fmt: skip
def test_a_conflicting_answer_beside_the_right_one_fails(probe: str, answer: str, reason: str) -> None:
    result = judged(probe, answer)
    assert not result.ok and result.reason == reason, result.describe()


def test_a_probe_file_entry_is_checked_for_its_new_keys() -> None:
    with pytest.raises(gate.ProbeFileError, match="number must be a number"):
        gate.parse_probes([{"name": "n", "prompt": "p?", "number": "42"}], "f.yml")
    with pytest.raises(gate.ProbeFileError, match="only a numeric probe"):
        gate.parse_probes([{"name": "n", "prompt": "p?", "expect": "x", "steps": [1]}], "f.yml")
    with pytest.raises(gate.ProbeFileError, match="reject .* is not a valid regex"):
        gate.parse_probes([{"name": "n", "prompt": "p?", "expect": "x", "reject": "("}], "f.yml")
    with pytest.raises(gate.ProbeFileError, match="'expect' must be a non-empty string \\(or give a numeric probe's 'number'\\)"):
        gate.parse_probes([{"name": "n", "prompt": "p?"}], "f.yml")
    # A numeric probe's own expect is its number pinned on both sides.
    (probe,) = gate.parse_probes([{"name": "n", "prompt": "p?", "number": 7}], "f.yml")
    assert probe.expect.search("it is 7.") and not probe.expect.search("77") and not probe.expect.search("7.5")


# -- answers against each other ----------------------------------------------------------------------------
def results(answers: dict[str, str]) -> list[gate.ProbeResult]:
    return gate.judge_all([judged(name, text) for name, text in answers.items()])


RIGHT = {
    "capital-of-france": "Paris", "arithmetic": "42", "arithmetic-product": "91",
    "python-function": "```python\ndef add(a, b):\n    return a + b\n```", "multi-step": "50",
    "long-context-retrieval": "4817",
}  # fmt: skip


def test_right_answers_pass_against_each_other() -> None:
    assert [r.describe() for r in results(RIGHT) if not r.ok] == []


def test_one_constant_string_for_every_question_fails_every_probe() -> None:
    # The word and code probes alone pass it (every right answer at once); the numeric ones, pinned, do not.
    assert judged("capital-of-france", CONSTANT).ok and judged("python-function", CONSTANT).ok
    assert judged("arithmetic", CONSTANT).reason == "a conflicting number beside 42: 91, 50, 4817"
    judged_all = results(dict.fromkeys(RIGHT, CONSTANT))
    assert [r.ok for r in judged_all] == [False] * len(RIGHT)
    for result in judged_all:
        assert result.reason.startswith(("the same answer as probe", "a conflicting number beside")), result.describe()


def test_the_same_answer_to_two_questions_fails_both() -> None:
    both = results({**RIGHT, "arithmetic": "The answer: 42 91", "arithmetic-product": "The answer: 42 91"})
    failed = {r.probe.name: r.reason for r in both if not r.ok}
    assert set(failed) == {"arithmetic", "arithmetic-product"}
    assert all("conflicting number" in reason or "the same answer as probe" in reason for reason in failed.values())


def test_an_answer_holding_another_probes_answer_fails() -> None:
    mixed = results({**RIGHT, "capital-of-france": "Paris (42)"})
    failed = {r.probe.name: r.reason for r in mixed if not r.ok}
    assert failed == {"capital-of-france": "it also holds probe arithmetic's answer 42: not an answer to its own question"}
    # A word answer inside another answer counts too.
    mixed = results({**RIGHT, "python-function": "def add(a, b):\n    return a + b  # Paris"})
    assert {r.probe.name for r in mixed if not r.ok} == {"python-function"}


def test_numbers_the_question_holds_are_not_another_probes_answer() -> None:
    # multi-step's working steps and its question's 7 are its own; the arithmetic probe asks about 17 and 25.
    steps = results({**RIGHT, "multi-step": "7 x 2 = 14, + 5 = 19, x 3 = 57, - 7 = 50"})
    assert [r.describe() for r in steps if not r.ok] == []


# -- the real gate against a constant server ---------------------------------------------------------------
@pytest.mark.parametrize("standin", [("--api-key", KEY, "--served-model-name", "glm-5", "--standin-mode", "constant")], indirect=True)
def test_the_gate_fails_a_server_that_answers_one_constant_string(standin: Standin) -> None:
    found = gate.run_probes(ep.Endpoint(standin.url, api_key=KEY), "glm-5", gate.load_probes())
    assert [r.answer for r in found] == [CONSTANT] * len(found)
    assert [r.ok for r in found] == [False] * len(found), gate.report(found)


@pytest.mark.parametrize("standin", [("--api-key", KEY, "--served-model-name", "glm-5")], indirect=True)
def test_the_gate_passes_the_right_answers_of_the_stand_in(standin: Standin) -> None:
    found = gate.run_probes(ep.Endpoint(standin.url, api_key=KEY), "glm-5", gate.load_probes())
    assert all(r.ok for r in found), gate.report(found)
