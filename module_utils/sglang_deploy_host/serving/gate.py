"""The correctness gate: prompts with one right answer, and a judge of the whole answer.

STDLIB ONLY at import time, Python >= 3.9: ``sglang-deploy verify`` and tests/infra/test_endpoint.py run it
on the control node, the rolling restart's module (``sglang_correctness_gate``) on the host, against the
worker it restarted. Only :func:`load_probes` (a YAML file) needs PyYAML, imported when called.

The failures the gate exists for (a wrong KV dtype or attention backend, FP4 GEMM NaN under load) mostly
show as *degenerate* text, not as silence: the right word repeated until ``max_tokens``, or the right word
followed by a thousand tokens of junk. So a probe passes only when its answer

1. **stopped by itself**: ``finish_reason`` is ``stop``. ``length`` fails: "raise max_tokens" when the model
   was still thinking (no answer yet, or an unclosed ``<think>``), "the answer did not stop" otherwise;
2. **answers its own question**: matches the probe's ``expect`` (a regex searched in the answer, the reasoning
   split off) and not its ``reject`` (a conflicting answer: another capital, "or maybe ..."); a numeric probe
   (``number``) is pinned on both sides: the answer's numbers, read whole (``420``, ``142``, ``42.5`` and
   ``-42`` are other numbers than 42), must hold the probe's number and nothing else but the question's own
   numbers and the working steps the probe names (``steps``);
3. **fits the probe's length**: at most ``max_answer_chars`` characters (default
   :data:`DEFAULT_MAX_ANSWER_CHARS`: a word or a number in a short sentence; a code probe sets its own);
4. **is not degenerate**: an answer of :data:`DEGENERATE_MIN_CHARS` characters or more that zlib compresses
   to less than :data:`DEGENERATE_RATIO` of its size is a loop. Chosen over a repeated-n-gram share because it
   needs no tokenizer and catches loops in text without spaces as well as with them: the untrained tiny Llama's
   recorded answers compress to 0.05, the right word repeated to 0.01; natural prose 0.6-0.8, code 0.45-0.55, a
   numbered list of 30 lines 0.16 (tests/unit/host/test_gate.py measures each).

Then the answers are judged **against each other** (:func:`judge_all`): the same answer to two different questions
fails both (a server that answers one constant string to every prompt: the right answers to every probe at once
passed each probe on its own), as does an answer that holds another probe's answer (``Paris ... 42 ...``).

A probe with ``context`` buries a fact in generated notes of ``filler_chars`` characters (a few thousand
tokens; distractor facts of the same shape around it) and asks for it: precision loss in the KV cache shows
once the context is long, and a short probe cannot see it. The notes are the same on every run (a fixed
generator seeded by the probe's name) and shrink to what the served context holds beside ``max_tokens``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from . import endpoint

DEFAULT_PROBES = Path(__file__).with_name("probes") / "default.yml"
# Probes run deterministic: the gate must give the same verdict on every run.
PROBE_TEMPERATURE = 0.0
# Room for a reasoning model's thinking before the answer (a cut-off answer fails the probe); a model with a
# shorter context gets what its context leaves (endpoint.complete_in_context).
DEFAULT_PROBE_MAX_TOKENS = 2048
# An answer to "answer with one word / the number only": the word, or a short sentence around it.
DEFAULT_MAX_ANSWER_CHARS = 120
# Degenerate repetition (docstring, 4.): below this many characters the length bound does the work.
DEGENERATE_MIN_CHARS = 200
DEGENERATE_RATIO = 0.1
# A long-context probe's notes never shrink below this (a context that small cannot hold a useful probe).
MIN_FILLER_CHARS = 200
# What the notes say around the filler, and how the question follows them.
NOTES_HEAD = "Below are the notes of a storeroom. Read them, then answer the question after them.\n\n"
NOTES_TAIL = "\n\nQuestion: "


class ProbeFileError(ValueError):
    """A probes file (or a module's probes) that is not a list of probes; the message names the entry."""


@dataclass(frozen=True)
class Context:
    """A long-context probe's notes: ``fact`` at ``depth`` (0 start, 1 end) of ``filler_chars`` of filler."""

    fact: str
    filler_chars: int
    depth: float = 0.5


@dataclass(frozen=True)
class Probe:
    """A prompt with a known answer (see the module docstring for what passes)."""

    name: str
    prompt: str
    expect: "re.Pattern[str]"
    max_tokens: int = DEFAULT_PROBE_MAX_TOKENS
    max_answer_chars: int = DEFAULT_MAX_ANSWER_CHARS
    context: Optional[Context] = None
    # A conflicting answer: found in the answer, it fails (another capital, a hedge).
    reject: "Optional[re.Pattern[str]]" = None
    # A numeric probe's answer, and the working steps an answer may show besides it.
    number: Optional[float] = None
    steps: Tuple[float, ...] = ()


# A number as an answer writes it: a sign, digits (thousands grouped with commas or not), a decimal part. Read
# whole: never a piece of a longer number or word ("420", "x42", "42.5" are not 42).
_NUMBER = re.compile(r"(?<![\w.,])[-\u2212]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w]|[.,]\d)")


def numbers_in(text: str) -> List[float]:
    """Every number written in ``text``, as values (``4,817`` is 4817; ``-3`` and ``\u22123`` are -3)."""
    values = []
    for found in _NUMBER.findall(text):
        values.append(float(found.replace(",", "").replace("\u2212", "-")))
    return values


def _number_text(value: float) -> str:
    return f"{value:g}" if value != int(value) else str(int(value))


def _pinned(value: float) -> str:
    """A regex of ``value`` written whole, its thousands grouped or not (a numeric probe's own ``expect``)."""
    spellings = {_number_text(value)}
    if value == int(value):
        spellings.add(f"{int(value):,}")
    either = "|".join(re.escape(text) for text in sorted(spellings, key=len, reverse=True))
    return r"(?<![\w.,])(?:" + either + r")(?![\w]|[.,]\d)"


@dataclass(frozen=True)
class ProbeResult:
    probe: Probe
    ok: bool
    answer: str
    reason: str = ""
    finish_reason: Optional[str] = None
    prompt_chars: int = 0

    def describe(self) -> str:
        verdict = "ok" if self.ok else "FAILED"
        text = f"{verdict} {self.probe.name}: expected /{self.probe.expect.pattern}/, answer {self.answer[:200]!r}"
        if len(self.answer) > 200:
            text += f" ... ({len(self.answer):,} characters)"
        return text + (f" ({self.reason})" if self.reason else "")


# -- the probes file ----------------------------------------------------------------------------------------
_KEYS = {"name", "prompt", "expect", "max_tokens", "max_answer_chars", "context", "reject", "number", "steps"}


def _positive(where: str, key: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ProbeFileError(f"{where}: {key} must be a positive integer, found {value!r}")
    return value


def parse_context(where: str, value: Any, expect: "Optional[re.Pattern[str]]" = None) -> Context:
    """A long-context entry (fact, filler_chars, depth); ``expect``, when given, must match the fact."""
    if not isinstance(value, dict) or set(value) - {"fact", "filler_chars", "depth"}:
        raise ProbeFileError(f"{where}: context must be a mapping of fact, filler_chars and depth, found {value!r}")
    fact = value.get("fact")
    if not isinstance(fact, str) or not fact.strip():
        raise ProbeFileError(f"{where}: context.fact must be a non-empty string")
    if expect is not None and not expect.search(fact):
        raise ProbeFileError(f"{where}: expect /{expect.pattern}/ does not match context.fact {fact!r}: the notes must hold the answer")
    filler = value.get("filler_chars", 0)
    if not isinstance(filler, int) or isinstance(filler, bool) or filler < 0:
        raise ProbeFileError(f"{where}: context.filler_chars must be a whole number of characters, found {filler!r}")
    depth = value.get("depth", 0.5)
    if isinstance(depth, bool) or not isinstance(depth, (int, float)) or not 0 <= depth <= 1:
        raise ProbeFileError(f"{where}: context.depth must be between 0 (start) and 1 (end), found {depth!r}")
    return Context(fact, filler, float(depth))


def _regex(where: str, key: str, pattern: Any) -> "re.Pattern[str]":
    if not isinstance(pattern, str) or not pattern.strip():
        raise ProbeFileError(f"{where}: '{key}' must be a non-empty string")
    try:
        return re.compile(pattern)
    except re.error as err:
        raise ProbeFileError(f"{where}: {key} {pattern!r} is not a valid regex: {err}") from None


def _number(where: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value in (float("inf"), float("-inf")):
        raise ProbeFileError(f"{where}: {key} must be a number, found {value!r}")
    return float(value)


def parse_probes(data: Any, source: str) -> List[Probe]:
    """Probes from YAML data (or a module's parameters); errors name the file, the entry and the fix."""
    if not isinstance(data, list) or not data:
        raise ProbeFileError(f"{source}: want a non-empty list of {{name, prompt, expect}}, found {type(data).__name__}")
    probes: List[Probe] = []
    for number, entry in enumerate(data, 1):
        where = f"{source}: probe {number}"
        if not isinstance(entry, dict):
            raise ProbeFileError(f"{where}: want a mapping with name, prompt, expect; found {entry!r}")
        unknown = set(entry) - _KEYS
        if unknown:
            raise ProbeFileError(f"{where}: unknown keys {sorted(unknown)} (allowed: {', '.join(sorted(_KEYS))})")
        if not isinstance(entry.get("prompt"), str) or not entry["prompt"].strip():
            raise ProbeFileError(f"{where}: 'prompt' must be a non-empty string")
        value = _number(where, "number", entry["number"]) if entry.get("number") is not None else None
        steps = entry.get("steps") or []
        if not isinstance(steps, list) or (steps and value is None):
            raise ProbeFileError(f"{where}: steps must be a list of numbers, and only a numeric probe (number) has them")
        if value is None and (not isinstance(entry.get("expect"), str) or not entry["expect"].strip()):
            raise ProbeFileError(f"{where}: 'expect' must be a non-empty string (or give a numeric probe's 'number')")
        # A numeric probe's expect, unless it gives one: its number, pinned on both sides.
        pattern = entry.get("expect") or _pinned(value or 0.0)
        expect = _regex(where, "expect", pattern)
        probes.append(
            Probe(
                name=str(entry.get("name") or f"probe-{number}"), prompt=entry["prompt"], expect=expect,
                max_tokens=_positive(where, "max_tokens", entry.get("max_tokens", DEFAULT_PROBE_MAX_TOKENS)),
                max_answer_chars=_positive(where, "max_answer_chars", entry.get("max_answer_chars", DEFAULT_MAX_ANSWER_CHARS)),
                context=parse_context(where, entry["context"], expect) if entry.get("context") is not None else None,
                reject=_regex(where, "reject", entry["reject"]) if entry.get("reject") else None,
                number=value, steps=tuple(_number(where, "steps[]", step) for step in steps),
            )  # fmt: skip
        )
    names = [p.name for p in probes]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ProbeFileError(f"{source}: probe names must be unique, repeated: {duplicates}")
    return probes


def probes_data(path: "str | Path | None" = None) -> Any:
    """The YAML data of a probes file (the shipped default set when ``path`` is None), unparsed: what a
    module on a host takes as its parameters. ProbeFileError when it cannot be read."""
    import yaml  # control node only

    file = Path(path) if path else DEFAULT_PROBES
    try:
        return yaml.safe_load(file.read_text(encoding="utf-8"))
    except OSError as err:
        raise ProbeFileError(f"{file}: cannot read: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise ProbeFileError(f"{file}: not a text file ({err.reason} at byte {err.start})") from None
    except yaml.YAMLError as err:
        raise ProbeFileError(f"{file}: not YAML: {' '.join(str(err).split())}") from None


def load_probes(path: "str | Path | None" = None) -> List[Probe]:
    """Probes from a YAML file; the shipped default set when ``path`` is None."""
    return parse_probes(probes_data(path), str(Path(path) if path else DEFAULT_PROBES))


# -- long-context notes ---------------------------------------------------------------------------------------
_PLACES = ("north", "south", "east", "west", "upper", "lower", "inner", "outer")
_COLOURS = ("red", "blue", "green", "grey", "white", "black", "yellow", "brown")
_ITEMS = ("lamps", "ropes", "barrels", "crates of nails", "tins of paint", "coils of wire", "boxes of screws", "sacks of sand")


class _Numbers:
    """A fixed linear congruential generator (Numerical Recipes' constants): the same notes on every Python."""

    def __init__(self, seed: int) -> None:
        self.state = seed & 0xFFFFFFFF

    def below(self, bound: int) -> int:
        self.state = (1664525 * self.state + 1013904223) & 0xFFFFFFFF
        return (self.state >> 8) % bound


def filler(name: str, chars: int, avoid: str) -> List[str]:
    """Sentences of generated notes, at most ``chars`` characters in all (with a space after each), seeded by
    ``name``; none contains ``avoid`` (the fact's own words, so the only answer in the notes is the fact's)."""
    numbers = _Numbers(sum(ord(c) * (i + 1) for i, c in enumerate(name)))
    sentences: List[str] = []
    size = 0
    while size < chars:
        kind = numbers.below(4)
        place = _PLACES[numbers.below(len(_PLACES))]
        if kind == 0:
            sentence = f"The access code of the {place} cabinet is {1000 + numbers.below(9000)}."
        else:
            sentence = (
                f"Crate {1 + numbers.below(400)} on shelf {1 + numbers.below(30)} of the {place} storeroom holds "
                f"{2 + numbers.below(97)} {_COLOURS[numbers.below(len(_COLOURS))]} {_ITEMS[numbers.below(len(_ITEMS))]}."
            )
        if avoid and avoid.lower() in sentence.lower():
            continue
        if size + len(sentence) + 1 > chars:
            break
        sentences.append(sentence)
        size += len(sentence) + 1
    return sentences


def build_prompt(probe: Probe, context_len: Optional[int] = None) -> str:
    """The text the probe sends: its prompt, or for a long-context probe the notes with the fact buried in
    them and the prompt after them, fitted to ``context_len`` (prompt bytes bound its tokens, as
    endpoint.prompt_token_bound does, beside a quarter of the context or ``max_tokens`` for the answer)."""
    context = probe.context
    if context is None:
        return probe.prompt
    chars = context.filler_chars
    if context_len is not None:
        reserve = min(probe.max_tokens, context_len // 4)
        fixed = len((NOTES_HEAD + context.fact + NOTES_TAIL + probe.prompt).encode("utf-8")) + 2
        room = context_len - reserve - endpoint.CHAT_TEMPLATE_ALLOWANCE_TOKENS - fixed
        chars = max(min(chars, room), MIN_FILLER_CHARS)
    return notes_prompt(probe.name, context, chars, probe.prompt)


def notes_prompt(name: str, context: Context, chars: int, question: str) -> str:
    """Generated notes of ``chars`` characters seeded by ``name``, ``context.fact`` at its depth, then the
    question: a long-context probe's text, and the quality check's long prompt (quality.py)."""
    # The notes must not answer for the fact: leave out any sentence about the fact's own subject.
    subject = re.sub(r"\s+is\s+.*$", "", context.fact.strip().rstrip("."))
    sentences = filler(name, chars, subject)
    at = round(len(sentences) * context.depth)
    notes = " ".join(sentences[:at] + [context.fact] + sentences[at:])
    return NOTES_HEAD + notes + NOTES_TAIL + question


# -- judging --------------------------------------------------------------------------------------------------
_THINK_CLOSE = "</think>"


def strip_reasoning(text: str) -> str:
    """The answer after a model's thinking, for servers run without --reasoning-parser.

    ``<think>..</think>answer`` and (templates that open ``<think>`` in the prompt) ``..</think>answer``
    give ``answer``; thinking that never closed (cut off by max_tokens) gives ``""``.
    """
    if _THINK_CLOSE in text:
        return text.rsplit(_THINK_CLOSE, 1)[1].strip()
    if text.lstrip().startswith("<think>"):
        return ""
    return text.strip()


def answer_text(message: Mapping[str, Any]) -> str:
    """The final answer of a chat message. With a reasoning parser the thinking is already in
    ``reasoning_content`` and only ``content`` counts; without one, thinking tags are stripped."""
    return strip_reasoning(str(message.get("content") or ""))


def _thinking(message: Mapping[str, Any]) -> bool:
    content = str(message.get("content") or "")
    return bool(message.get("reasoning_content")) or content.lstrip().startswith("<think>") or "<think>" in content


def compression_ratio(text: str) -> float:
    """zlib's compressed size over the text's (UTF-8): near 0 for a loop, 0.4-0.8 for prose and code."""
    raw = text.encode("utf-8")
    return len(zlib.compress(raw, 9)) / len(raw) if raw else 1.0


def degenerate(text: str) -> Optional[str]:
    """Why ``text`` is degenerate repetition (module docstring, 4.), or None."""
    if len(text) < DEGENERATE_MIN_CHARS:
        return None
    ratio = compression_ratio(text)
    if ratio >= DEGENERATE_RATIO:
        return None
    return f"degenerate repetition: {len(text):,} characters compress to {ratio:.3f} of their size (a loop; prose is above 0.4)"


def judge(probe: Probe, message: Mapping[str, Any], finish_reason: Optional[str] = "stop", max_tokens: Optional[int] = None) -> ProbeResult:
    """The verdict on one answer (module docstring); the reason names what failed."""
    answer = answer_text(message)
    tokens = f" {max_tokens}" if max_tokens is not None else ""

    def fail(reason: str) -> ProbeResult:
        return ProbeResult(probe, False, answer, reason, finish_reason)

    if finish_reason == "length":
        if not answer and _thinking(message):
            return fail(f"the thinking did not finish within max_tokens{tokens}: raise the probe's max_tokens")
        return fail(f"the answer did not stop: it ran on to max_tokens{tokens} (finish_reason length)")
    if finish_reason != "stop":
        return fail(f"finish_reason {finish_reason!r}: the generation did not end with a stop")
    if not answer:
        return fail("empty answer" + (" (only thinking)" if _thinking(message) else ""))
    looping = degenerate(answer)
    if looping:
        return fail(looping)
    if len(answer) > probe.max_answer_chars:
        return fail(f"the answer is {len(answer):,} characters, more than the probe's max_answer_chars {probe.max_answer_chars:,}")
    if probe.number is not None:
        problem = _numeric_problem(probe, answer)
        if problem:
            return fail(problem)
    if not probe.expect.search(answer):
        return fail("no match")
    conflict = probe.reject.search(answer) if probe.reject is not None else None
    if conflict:
        return fail(f"a conflicting answer in it: {conflict.group(0)!r} (the probe's reject)")
    return ProbeResult(probe, True, answer, "", finish_reason)


def _numeric_problem(probe: Probe, answer: str) -> Optional[str]:
    """Why ``answer`` is not the numeric probe's number (module docstring, 2.), or None."""
    assert probe.number is not None
    found = numbers_in(answer)
    want = _number_text(probe.number)
    if probe.number not in found:
        shown = ", ".join(_number_text(v) for v in found) or "none"
        return f"the answer's numbers ({shown}) do not hold {want}"
    allowed = {probe.number, *probe.steps, *numbers_in(probe.prompt)}
    others = [v for v in found if v not in allowed]
    if others:
        return f"a conflicting number beside {want}: {', '.join(_number_text(v) for v in dict.fromkeys(others))}"
    return None


def _normalized(answer: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", answer.lower()).split())


def judge_all(results: Sequence[ProbeResult]) -> List[ProbeResult]:
    """The answers against each other (module docstring): a passing answer fails when another probe got the same
    answer, or when it holds another probe's answer (another probe's number or expect, which its own question
    does not hold)."""
    judged: List[ProbeResult] = []
    for result in results:
        if not result.ok:
            judged.append(result)
            continue
        reason = ""
        mine = _normalized(result.answer)
        for other in results:
            if other.probe.name == result.probe.name or not other.answer:
                continue
            if mine and _normalized(other.answer) == mine:
                reason = f"the same answer as probe {other.probe.name}: different questions got one answer (a server that no longer reads the prompt)"
                break
            question = result.probe.prompt
            if other.probe.number is not None:
                held = other.probe.number in numbers_in(result.answer)
                mine_too = other.probe.number in numbers_in(question) or other.probe.number in result.probe.steps
                if held and not mine_too and other.probe.number != result.probe.number:
                    reason = f"it also holds probe {other.probe.name}'s answer {_number_text(other.probe.number)}: not an answer to its own question"
                    break
            elif other.probe.expect.search(result.answer) and not other.probe.expect.search(question):
                reason = f"it also holds probe {other.probe.name}'s answer (/{other.probe.expect.pattern}/): not an answer to its own question"
                break
        judged.append(result if not reason else ProbeResult(result.probe, False, result.answer, reason, result.finish_reason, result.prompt_chars))
    return judged


def run_probe(target: endpoint.Endpoint, model: str, probe: Probe, context_len: Optional[int] = None) -> ProbeResult:
    """One probe at temperature 0, its prompt and max_tokens fitted to ``context_len``. A long-context probe
    that sglang refuses for a context it had not reported is built again for the context its refusal names."""
    prompt = build_prompt(probe, context_len)
    try:
        done = endpoint.complete_in_context(target, model, prompt, probe.max_tokens, context_len, PROBE_TEMPERATURE)
    except endpoint.EndpointError as err:
        told = endpoint.context_from_refusal(str(err)) if probe.context is not None and context_len is None else None
        if told is None:
            return ProbeResult(probe, False, "", str(err), None, len(prompt))
        return run_probe(target, model, probe, told)
    result = judge(probe, done.message, done.finish_reason, done.max_tokens)
    return ProbeResult(result.probe, result.ok, result.answer, result.reason, result.finish_reason, len(prompt))


def run_probes(target: endpoint.Endpoint, model: str, probes: Sequence[Probe]) -> List[ProbeResult]:
    """Every probe, fitted to the context /v1/models reports for ``model`` (read once; a model list that
    cannot be read leaves the fitting to sglang's refusal, and the probes report the error)."""
    try:
        context_len = endpoint.context_length(target, model)
    except endpoint.EndpointError:
        context_len = None
    return judge_all([run_probe(target, model, probe, context_len) for probe in probes])


def report(results: Sequence[ProbeResult]) -> str:
    """One line per probe, the failures first: what `verify` and the rolling restart print."""
    ordered = sorted(results, key=lambda r: r.ok)
    return "\n".join(r.describe() + (f" [prompt {r.prompt_chars:,} characters]" if r.probe.context else "") for r in ordered)


def record(results: Sequence[ProbeResult]) -> List[dict]:
    """Each probe's outcome as data: what a device run keeps as evidence of what a server answered."""
    return [
        {"probe": r.probe.name, "ok": r.ok, "reason": r.reason, "finish_reason": r.finish_reason,
         "prompt_chars": r.prompt_chars, "answer": r.answer}
        for r in results
    ]  # fmt: skip


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python3 -m sglang_deploy_host.serving.gate --url URL --model NAME [--env-file F] [--probes FILE] [--json]``:
    the probes against one server, a line (or a JSON record) each; exit 0 when all pass, 1 when one fails."""
    parser = argparse.ArgumentParser(prog="python3 -m sglang_deploy_host.serving.gate", description=main.__doc__)
    parser.add_argument("--url", required=True, help="the server's base URL")
    parser.add_argument("--model", required=True, help="the served model name")
    parser.add_argument("--env-file", help="the unit's EnvironmentFile= holding the API key (else $SGLANG_API_KEY)")
    parser.add_argument("--api-key-env", default=endpoint.API_KEY_ENV, help="the key's variable name")
    parser.add_argument("--probes", help="a probes file (default: the shipped set; needs PyYAML)")
    parser.add_argument("--json", action="store_true", help="print each probe's outcome, answer included, as JSON")
    args = parser.parse_args(argv)
    try:
        probes = load_probes(args.probes)
        target = endpoint.Endpoint(endpoint.check_url(args.url), api_key=endpoint.api_key_from_env_file(args.env_file, args.api_key_env))
    except (ProbeFileError, ValueError) as err:
        print(f"gate: {err}", file=sys.stderr)
        return 2
    results = run_probes(target, args.model, probes)
    print(json.dumps(record(results), indent=2, ensure_ascii=False) if args.json else report(results))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
