"""The correctness gate judges each answer as the answer to its own question (sglang_deploy_host/serving/gate.py, issue 42):
numeric answers pinned on both sides (near misses of every kind fail, the right number written every way passes),
a conflicting answer beside the right one fails, the same answer to different questions fails, an answer that holds
another probe's answer fails - and a server that answers one constant string holding every right answer, which passed
all six probes before, fails through the real gate against the stand-in."""

from __future__ import annotations

import pytest
from conftest import StandinProcess as Standin

from sglang_deploy_host.serving import endpoint as ep
from sglang_deploy_host.serving import gate

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


# -- the probes file at its edges: each check alone, each bound on both sides (issue 44) --------------------------
def _one(**entry: object) -> list[dict[str, object]]:
    return [{"name": "n", "prompt": "What is the code?", "expect": "17", **entry}]


FACT = "The code is 17."


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "want a non-empty list"),
        ([], "want a non-empty list"),
        (_one(prompt="   "), "'prompt' must be a non-empty string"),
        (_one(prompt=5), "'prompt' must be a non-empty string"),
        (_one(expect="  "), "'expect' must be a non-empty string"),
        (_one(expect=5), "'expect' must be a non-empty string"),
        (_one(reject="  "), "'reject' must be a non-empty string"),
        (_one(max_tokens=0), "max_tokens must be a positive integer"),
        (_one(max_tokens="8"), "max_tokens must be a positive integer"),
        (_one(max_tokens=True), "max_tokens must be a positive integer"),
        (_one(context={"fact": "   "}), "context.fact must be a non-empty string"),
        (_one(context={"fact": 17}), "context.fact must be a non-empty string"),
        (_one(context={"fact": FACT, "filler_chars": "9"}), "context.filler_chars"),
        (_one(context={"fact": FACT, "filler_chars": True}), "context.filler_chars"),
        (_one(context={"fact": FACT, "filler_chars": -1}), "context.filler_chars"),
        (_one(context={"fact": FACT, "depth": -0.01}), "context.depth must be between 0"),
        (_one(context={"fact": FACT, "depth": 1.01}), "context.depth must be between 0"),
        (_one(context={"fact": FACT, "depth": True}), "context.depth must be between 0"),
        (_one(context={"fact": FACT, "depth": "0.5"}), "context.depth must be between 0"),
        (_one(expect=None, number=True), "number must be a number"),
        (_one(expect=None, number=float("nan")), "number must be a number"),
        (_one(expect=None, number=float("inf")), "number must be a number"),
        (_one(expect=None, number=float("-inf")), "number must be a number"),
        (_one() + _one(), "probe names must be unique, repeated: ['n']"),
    ],
)
def test_each_check_of_a_probe_entry_refuses_alone(data: object, message: str) -> None:
    with pytest.raises(gate.ProbeFileError) as err:
        gate.parse_probes(data, "f.yml")
    assert message in str(err.value) and str(err.value).startswith("f.yml")


def test_each_bound_of_a_probe_entry_takes_its_edge() -> None:
    (probe,) = gate.parse_probes(_one(max_tokens=1, max_answer_chars=1, context={"fact": FACT, "filler_chars": 0, "depth": 0}), "f.yml")
    assert (probe.max_tokens, probe.max_answer_chars, probe.context) == (1, 1, gate.Context(FACT, 0, 0.0))
    (probe,) = gate.parse_probes(_one(context={"fact": FACT, "depth": 1}), "f.yml")
    assert probe.context == gate.Context(FACT, 0, 1.0)
    names = [p.name for p in gate.parse_probes(_one() + _one(name="m"), "f.yml")]
    assert names == ["n", "m"]


# -- judging at the edges ----------------------------------------------------------------------------------------
def test_an_answer_of_exactly_the_probes_limit_passes_and_one_more_character_fails() -> None:
    probe = gate.Probe("p", "Say 17.", gate.re.compile("17"), max_answer_chars=20)
    assert gate.judge(probe, {"content": "17" + "." * 18}).ok
    assert gate.judge(probe, {"content": "17" + "." * 19}).reason == "the answer is 21 characters, more than the probe's max_answer_chars 20"


def test_thinking_is_told_from_an_answer_wherever_it_shows() -> None:
    probe = gate.Probe("p", "Say 17.", gate.re.compile("17"))
    # A reasoning parser moved the thinking aside: an empty content ran out of tokens while thinking.
    assert gate.judge(probe, {"content": "", "reasoning_content": "let me see"}, "length", 9).reason == (
        "the thinking did not finish within max_tokens 9: raise the probe's max_tokens")
    assert gate.judge(probe, {"content": "", "reasoning_content": "let me see"}).reason == "empty answer (only thinking)"
    assert gate.judge(probe, {"content": "", "reasoning_content": ""}).reason == "empty answer"
    # Without a parser, thinking that opens after some text and closes with nothing after it is thinking too.
    assert gate.judge(probe, {"content": "ok <think>17 or</think>"}, "length", 9).reason.startswith("the thinking did not finish")
    assert gate.judge(probe, {"content": "ok 17"}, "length", 9).reason.startswith("the answer did not stop")


def test_degeneration_is_judged_from_its_minimum_length_and_below_its_ratio(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = "ab" * (gate.DEGENERATE_MIN_CHARS // 2)
    assert gate.degenerate(loop) is not None and gate.degenerate(loop[:-1]) is None
    monkeypatch.setattr(gate, "compression_ratio", lambda text: gate.DEGENERATE_RATIO)
    assert gate.degenerate(loop) is None  # at the ratio: not degenerate
    monkeypatch.setattr(gate, "compression_ratio", lambda text: gate.DEGENERATE_RATIO - 1e-9)
    assert gate.degenerate(loop) is not None


def test_the_first_reason_against_an_answer_is_the_one_given() -> None:
    """An answer equal to another's and holding a third's answer fails as 'the same answer' (checked first, and the
    search stops there)."""
    judged_all = results({**RIGHT, "capital-of-france": "Paris 42 91", "arithmetic": "Paris 42 91"})
    capital = next(r for r in judged_all if r.probe.name == "capital-of-france")
    assert capital.reason.startswith("the same answer as probe arithmetic"), capital.describe()


def test_another_probes_number_is_no_conflict_when_it_is_one_of_my_steps() -> None:
    mine = gate.Probe("mine", "Add 3 and 4, then 2.", gate.re.compile("9"), number=9.0, steps=(7.0,))
    other = gate.Probe("other", "What is 3 + 4?", gate.re.compile("7"), number=7.0)
    answers = [gate.judge(mine, {"content": "3 + 4 = 7, and 7 + 2 = 9"}), gate.judge(other, {"content": "7"})]
    assert [r.ok for r in gate.judge_all(answers)] == [True, True], [r.describe() for r in gate.judge_all(answers)]


def test_an_answer_holding_two_other_answers_is_failed_for_the_first() -> None:
    """The reason names the first other probe whose answer it holds (the search stops there), numeric or not."""
    text = [gate.Probe(name, f"Say {word}.", gate.re.compile(word)) for name, word in (("a", "alpha"), ("b", "beta"), ("c", "gamma"))]
    judged_text = gate.judge_all([gate.judge(text[0], {"content": "alpha beta gamma"}), gate.judge(text[1], {"content": "beta"}),
                                  gate.judge(text[2], {"content": "gamma"})])  # fmt: skip
    assert judged_text[0].reason == "it also holds probe b's answer (/beta/): not an answer to its own question"
    numeric = [gate.Probe("w", "Say alpha.", gate.re.compile("alpha")), gate.Probe("x", "2 + 3?", gate.re.compile("5"), number=5.0),
               gate.Probe("y", "2 * 3?", gate.re.compile("6"), number=6.0)]  # fmt: skip
    judged_numbers = gate.judge_all([gate.judge(numeric[0], {"content": "alpha 5 6"}), gate.judge(numeric[1], {"content": "5"}),
                                     gate.judge(numeric[2], {"content": "6"})])  # fmt: skip
    assert judged_numbers[0].reason == "it also holds probe x's answer 5: not an answer to its own question"
