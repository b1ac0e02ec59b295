"""The correctness gate (sglang_deploy_host/serving/gate.py) judges the whole answer: recorded real answers replayed
through it (tests/fixtures/gate/recorded-answers.json: the trained tiny Llama's pass, the untrained one's
fail), degenerate, run-on and fluent-wrong answers refused with a reason each, the degenerate measure on
real text, the probes file, the long-context and multi-step probes, and the stand-in's degenerate modes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import ROOT
from conftest import StandinProcess as Standin

from sglang_deploy_host.serving import endpoint as ep
from sglang_deploy_host.serving import gate

RECORDED = json.loads((ROOT / "tests" / "fixtures" / "gate" / "recorded-answers.json").read_text(encoding="utf-8"))
PROBES = {probe.name: probe for probe in gate.load_probes()}
KEY = "gate-test-key-0123456789"
OK_ARGS = ("--api-key", KEY, "--served-model-name", "glm-5", "--reasoning-parser", "glm45")
STANDIN_ARGS: tuple[str, ...] = ()


def judged(probe: str, content: str, finish: str | None = "stop", **message: object) -> gate.ProbeResult:
    return gate.judge(PROBES[probe], {"content": content, **message}, finish, 2048)


# -- recorded answers -------------------------------------------------------------------------------------
@pytest.mark.parametrize("recorded", RECORDED["trained"], ids=lambda r: r["probe"])
def test_every_recorded_right_answer_passes(recorded: dict[str, str]) -> None:
    result = judged(recorded["probe"], recorded["answer"])
    assert result.ok, result.describe()


@pytest.mark.parametrize("finish", ["stop", "length"])
@pytest.mark.parametrize("recorded", RECORDED["untrained"], ids=lambda r: f"{r['probe']}-{'whole' if r['whole'] else '200'}")
def test_every_recorded_untrained_answer_fails_with_its_reason(recorded: dict[str, object], finish: str) -> None:
    result = judged(str(recorded["probe"]), str(recorded["answer"]), finish)
    assert not result.ok
    if finish == "length":
        assert result.reason.startswith("the answer did not stop: it ran on to max_tokens 2048"), result.reason
    elif recorded["whole"]:  # 1,878 characters of it: a loop
        assert result.reason.startswith("degenerate repetition: 1,878 characters compress to 0.0"), result.reason
    else:
        # A word probe finds no match; a numeric one names the numbers it found (none).
        assert ("more than the probe's max_answer_chars" in result.reason or result.reason == "no match"
                or result.reason.startswith("the answer's numbers (none) do not hold")), result.reason


# -- degenerate, run-on, fluent wrong -----------------------------------------------------------------------
JUNK = " ".join(f"{word}{n}" for n in range(400) for word in ("tok", "ens", "of", "nothing"))


@pytest.mark.parametrize(
    ("probe", "content", "finish", "reason"),
    [
        # The right word until max_tokens: the old gate passed it (the regex matched somewhere).
        ("capital-of-france", "Paris " * 400, "length", "the answer did not stop: it ran on to max_tokens 2048"),
        ("capital-of-france", "Paris " * 400, "stop", "degenerate repetition: 2,399 characters compress to"),
        # The right answer followed by junk: passed before too.
        ("arithmetic", "42. " + JUNK, "length", "the answer did not stop"),
        ("arithmetic", "42. " + JUNK, "stop", "characters, more than the probe's max_answer_chars 120"),
        # A run-on that stays under the degenerate bound but not the probe's length.
        ("capital-of-france", "Paris, of course. " + "France is a country in Europe with many cities. " * 3, "stop",
         "more than the probe's max_answer_chars 120"),
        # Fluent and wrong.
        ("capital-of-france", "The capital of France is Lyon.", "stop", "no match"),
        ("multi-step", "The final number is 57.", "stop", "the answer's numbers (57) do not hold 50"),
        # Thinking that did not finish: only then does the gate say to raise max_tokens.
        ("arithmetic", "", "length", "the thinking did not finish within max_tokens 2048: raise the probe's max_tokens"),
        ("arithmetic", "<think>17 plus 25 is", "length", "the thinking did not finish"),
        ("arithmetic", "42", "abort", "finish_reason 'abort'"),
        ("arithmetic", "42", None, "finish_reason None"),
        ("arithmetic", "", "stop", "empty answer"),
    ],
)  # fmt: skip
def test_degenerate_run_on_and_wrong_answers_fail_naming_probe_and_reason(probe: str, content: str, finish: str | None, reason: str) -> None:
    message = {"reasoning_content": "17 and 25..."} if content == "" else {}
    result = judged(probe, content, finish, **message)
    assert not result.ok and reason in result.reason, result.reason
    assert result.describe().startswith(f"FAILED {probe}: ") and reason in result.describe()


@pytest.mark.parametrize(
    ("probe", "content"),
    [
        ("capital-of-france", "Paris"),
        ("capital-of-france", "The capital of France is **Paris**."),
        ("capital-of-france", "<think>France... its capital.</think>\n\nParis"),
        ("multi-step", "50"),
        ("long-context-retrieval", "The access code of the north vault is 4817."),
        ("python-function", '```python\ndef add(a: float, b: float) -> float:\n    """Return the sum of a and b."""\n    return a + b\n```'),
    ],
)
def test_right_answers_in_the_forms_models_give_pass(probe: str, content: str) -> None:
    result = judged(probe, content)
    assert result.ok, result.describe()


def test_the_degenerate_measure_on_real_text() -> None:
    """What the bound (0.1, from 200 characters) separates, measured: loops far below it, prose, code and
    even a numbered list well above it."""
    loops = [next(r["answer"] for r in RECORDED["untrained"] if r["whole"]), "Paris " * 400, "abc" * 300]
    real = [
        (ROOT / "docs" / "seeds.md").read_text()[:3000],
        (ROOT / "module_utils" / "sglang_deploy_host" / "serving" / "gate.py").read_text()[4000:6000],
        "\n".join(f"{i}. Item number {i} of the list is here." for i in range(1, 30)),
    ]
    assert all(gate.compression_ratio(text) < 0.06 for text in loops), [gate.compression_ratio(t) for t in loops]
    assert all(gate.compression_ratio(text) > 0.15 for text in real), [gate.compression_ratio(t) for t in real]
    assert all(gate.degenerate(text) for text in loops) and not any(gate.degenerate(text) for text in real)
    assert gate.degenerate("ab" * 99) is None  # under 200 characters the length bound does the work


# -- the probes file ----------------------------------------------------------------------------------------
def test_the_shipped_probes_hold_a_long_context_and_a_multi_step_probe() -> None:
    assert {"capital-of-france", "arithmetic", "python-function", "multi-step", "long-context-retrieval"} <= set(PROBES)
    assert all(p.max_tokens >= 1024 for p in PROBES.values()), "reasoning needs room before the answer"
    long = PROBES["long-context-retrieval"]
    assert long.context is not None and long.context.filler_chars >= 16_000  # some thousands of tokens
    assert PROBES["python-function"].max_answer_chars > gate.DEFAULT_MAX_ANSWER_CHARS


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- {prompt: hi, expect: x, max_answer_chars: 0}\n", "max_answer_chars must be a positive integer"),
        ("- {prompt: hi, expect: '42', context: {fact: The code is 17.}}\n", "does not match context.fact"),
        ("- {prompt: hi, expect: '17', context: {fact: The code is 17., depth: 2}}\n", "context.depth must be between 0"),
        ("- {prompt: hi, expect: '17', context: {fact: The code is 17., filler_chars: -1}}\n", "context.filler_chars"),
        ("- {prompt: hi, expect: '17', context: {fact: The code is 17., size: 3}}\n", "context must be a mapping of"),
        ("- {prompt: hi, expect: '17', context: [x]}\n", "context must be a mapping of"),
    ],
)
def test_bad_new_probe_keys_are_refused_with_file_and_entry(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "probes.yml"
    path.write_text(text)
    with pytest.raises(gate.ProbeFileError) as err:
        gate.load_probes(path)
    assert str(path) in str(err.value) and "probe 1" in str(err.value) and message in str(err.value)


# -- the long-context probe -------------------------------------------------------------------------------
def test_the_notes_are_the_same_every_time_and_hold_the_fact_once() -> None:
    probe = PROBES["long-context-retrieval"]
    assert probe.context is not None
    first, second = gate.build_prompt(probe), gate.build_prompt(probe)
    assert first == second and first.startswith(gate.NOTES_HEAD) and first.endswith("Question: " + probe.prompt)
    assert first.count(probe.context.fact) == 1 and first.count("4817") == 1
    assert first.count(" vault ") == 1, "no distractor about a vault: the fact's answer is the only one"
    assert first.count(" cabinet is ") > 50, "distractor codes of the same shape"
    assert abs(len(first) - probe.context.filler_chars) < 600
    # The fact sits at the probe's depth (0.3) of the notes.
    assert 0.25 < first.index(probe.context.fact) / len(first) < 0.35


@pytest.mark.parametrize("context_len", [2048, 4096, 32768])
def test_the_notes_shrink_to_what_the_context_holds_beside_the_answer(context_len: int) -> None:
    probe = PROBES["long-context-retrieval"]
    prompt = gate.build_prompt(probe, context_len)
    reserve = min(probe.max_tokens, context_len // 4)
    assert ep.prompt_token_bound(prompt) + reserve <= context_len
    assert "The access code of the north vault is 4817." in prompt
    if context_len == 32768:
        assert prompt == gate.build_prompt(probe), "a large context takes the whole notes"


# -- against the stand-in ------------------------------------------------------------------------------------
@pytest.mark.parametrize("standin", [OK_ARGS], indirect=True)
def test_the_stand_in_answers_every_probe_the_long_and_the_multi_step_one_too(standin: Standin) -> None:
    server = ep.Endpoint(standin.url, api_key=KEY, timeout=30)
    results = gate.run_probes(server, "glm-5", gate.load_probes())
    assert all(r.ok for r in results), gate.report(results)
    long = next(r for r in results if r.probe.name == "long-context-retrieval")
    assert long.answer == "4817" and long.prompt_chars > 19_000


@pytest.mark.parametrize(
    ("standin", "reason"),
    [((*OK_ARGS, "--standin-mode", "repeat"), "the answer did not stop"),
     ((*OK_ARGS, "--standin-mode", "runon"), "the answer did not stop")],
    indirect=["standin"],
)  # fmt: skip
def test_the_right_word_repeated_or_followed_by_junk_fails_every_probe(standin: Standin, reason: str) -> None:
    server = ep.Endpoint(standin.url, api_key=KEY, timeout=30)
    results = gate.run_probes(server, "glm-5", gate.load_probes())
    assert results and not any(r.ok for r in results), gate.report(results)
    assert all(reason in r.reason for r in results), gate.report(results)
    capital = results[0]
    assert capital.answer.startswith("Paris") and re.search(r"(?i)\bparis\b", capital.answer), "the old gate's regex matched it"
    report = gate.report(results)
    assert report.startswith("FAILED ") and "characters)" in report


# -- on a host: the rolling restart's module and the lookup that hands it the probes ----------------------------
def _ansible(tmp_path: Path, module: str, args: str) -> dict:
    import os
    import subprocess
    import sys

    env = {
        **os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
        "ANSIBLE_STDOUT_CALLBACK": "json", "ANSIBLE_LOCAL_TEMP": str(tmp_path / "local"),
        "ANSIBLE_REMOTE_TEMP": str(tmp_path / "remote"), "ANSIBLE_NOCOLOR": "1",
    }  # fmt: skip
    done = subprocess.run(
        [str(Path(sys.executable).with_name("ansible")), "localhost", "-c", "local", "-m", module, "-a", args,
         "-e", f"ansible_python_interpreter={sys.executable}"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False,
    )  # fmt: skip
    assert done.stdout.startswith("{"), done.stdout + done.stderr
    return json.loads(done.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]


def test_the_lookup_hands_over_the_shipped_probes_checked(tmp_path: Path) -> None:
    result = _ansible(tmp_path, "ansible.builtin.debug", "msg={{ query('sglang_deploy_probes') }}")
    assert result["msg"] == gate.probes_data()
    bad = tmp_path / "bad.yml"
    bad.write_text("- {prompt: hi}\n")
    refused = _ansible(tmp_path, "ansible.builtin.debug", f"msg={{{{ query('sglang_deploy_probes', '{bad}') }}}}")
    assert refused.get("failed") and "'expect' must be a non-empty string" in refused["msg"]


@pytest.mark.parametrize(
    ("standin", "passed"), [(OK_ARGS, True), ((*OK_ARGS, "--standin-mode", "runon"), False)], indirect=["standin"]
)
def test_the_module_runs_the_gate_with_the_key_from_the_env_file(standin: Standin, passed: bool, tmp_path: Path) -> None:
    env_file = tmp_path / "sglang.env"
    env_file.write_text(f"SGLANG_API_KEY='{KEY}'\n")
    env_file.chmod(0o600)
    args = json.dumps({"url": standin.url, "model": "glm-5", "probes": gate.probes_data(), "env_file": str(env_file),
                       "inventory_hostname": "worker-1"})  # fmt: skip
    result = _ansible(tmp_path, "sglang_correctness_gate", args)
    assert result["passed"] is passed and result["changed"] is False
    if passed:
        assert not result.get("failed") and result["report"].count("\nok ") == len(gate.load_probes()) - 1
    else:
        assert result["msg"].startswith(f"host worker-1: the correctness gate failed 6 of 6 probes at {standin.url}")
        assert "the answer did not stop" in result["msg"] and KEY not in json.dumps(result)
