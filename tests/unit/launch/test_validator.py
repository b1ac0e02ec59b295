"""The flag validator: pure mapping of argparse's verdicts, and the real sglang parsers (slow).

The slow tests build (once, ~2 min each, then cached under ~/.cache/sglang-deploy) a CPU-only venv
per lane and run the pinned sglang's own argparse in it -- no mocks of sglang. The venv's CPU torch
is found by the validator itself, with no variable set (test_validator_torch.py): PyTorch's CPU
index where it is reachable, else a CPU wheel in pip's find-links or indexes (CI's machine image
has torch 2.13.0+cpu in /opt/wheels), else PyPI's build.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from seed_004 import SEED_004_FLAGS

from sglang_deploy.launch import validator
from sglang_deploy.lanes.catalog import Lane, load_lane
from sglang_deploy.launch.validator import (
    FlagProblem,
    Option,
    ProbeAnswer,
    Segment,
    ValidationResult,
    line_problems,
    problem_from_message,
    problems_from_answer,
    split_segments,
    validate_flags,
)
from sglang_deploy.launch.validator_venv import (
    ENV_PYTHON,
    ENV_TORCH,
    ENV_TORCH_INDEX,
    ValidatorError,
    build_spec,
    ensure_validator_env,
    torch_source,
    validator_dir,
)

ATTENTION = Option(("--attention-backend",), ("fa3", "flashinfer", "triton"))
OPTIONS = (
    Option(("-h", "--help"), None),
    Option(("--model-path", "--model"), None),
    Option(("--tp-size", "--tensor-parallel-size"), None),
    Option(("--dsa-decode-backend",), ("fa3", "trtllm")),
    ATTENTION,
)


def segment(*tokens: str) -> Segment:
    return Segment(tokens)


# --- segments ------------------------------------------------------------------------------------


def test_seed_flags_split_into_one_segment_per_flag() -> None:
    segments = split_segments(SEED_004_FLAGS)
    assert len(segments) == sum(token.startswith("--") for token in SEED_004_FLAGS) == 19
    assert segments[0] == segment("--model", "lukealonso/GLM-5-NVFP4")
    assert [s.flag for s in segments if s.value is None] == [
        "--trust-remote-code",
        "--disable-custom-all-reduce",
        "--enable-flashinfer-allreduce-fusion",
    ]
    assert [t for s in segments for t in s.tokens] == SEED_004_FLAGS


def test_segments_keep_negative_numbers_and_inline_values_as_values() -> None:
    segments = split_segments(["stray", "--seed", "-1", "--port=8000", "--x", "-0.5", "-"])
    assert [(s.flag, s.value) for s in segments] == [
        ("", "stray"),
        ("--seed", "-1"),
        ("--port", "8000"),
        ("--x", "-0.5 -"),
    ]


# --- argparse messages -> problems -----------------------------------------------------------------


def test_invalid_choice_lists_the_parsers_choices_and_the_closest() -> None:
    message = "argument --attention-backend: invalid choice: 'flashinfr' (choose from 'fa3', ...)"
    problem = problem_from_message(message, OPTIONS, segment("--attention-backend", "flashinfr"))
    assert problem == FlagProblem(
        "--attention-backend",
        "flashinfr",
        "invalid choice",
        ["fa3", "flashinfer", "triton"],
        "invalid_choice",
        "flashinfer",
    )


def test_unknown_flag_suggests_the_renamed_one() -> None:
    message = "unrecognized arguments: --nsa-decode-backend trtllm"
    problem = problem_from_message(message, OPTIONS, segment("--nsa-decode-backend", "trtllm"))
    assert (problem.flag, problem.value, problem.kind) == (
        "--nsa-decode-backend",
        "trtllm",
        "unknown_flag",
    )
    assert problem.suggestion == "--dsa-decode-backend"


def test_unknown_flag_without_a_close_match_has_no_suggestion() -> None:
    problem = problem_from_message("unrecognized arguments: --zzz", OPTIONS, segment("--zzz"))
    assert (problem.kind, problem.suggestion, problem.value) == ("unknown_flag", None, None)


def test_extra_values_after_a_known_flag() -> None:
    problem = problem_from_message(
        "unrecognized arguments: 9", OPTIONS, segment("--tp-size", "8", "9")
    )
    assert (problem.flag, problem.kind, problem.message) == (
        "--tp-size",
        "invalid_value",
        "too many values (extra: 9)",
    )


def test_values_that_follow_no_flag() -> None:
    problem = problem_from_message("unrecognized arguments: stray", OPTIONS, segment("stray"))
    assert (problem.flag, problem.value, problem.message) == (
        "",
        "stray",
        "values that follow no flag",
    )


@pytest.mark.parametrize(
    ("message", "tokens", "kind", "text"),
    [
        (
            "argument --mem-fraction-static: invalid float value: 'abc'",
            ("--mem-fraction-static", "abc"),
            "invalid_value",
            "invalid float value",
        ),
        (
            "argument --port: expected one argument",
            ("--port",),
            "missing_value",
            "expected one argument",
        ),
        (
            "argument --trust-remote-code: ignored explicit argument 'yes'",
            ("--trust-remote-code=yes",),
            "unexpected_value",
            "a bare switch takes no value",
        ),
        (
            "ambiguous option: --dis could match --disable-a, --disable-b",
            ("--dis",),
            "ambiguous_flag",
            "ambiguous abbreviation, could match --disable-a, --disable-b",
        ),
        (
            "argument --json-model-override-args: not valid JSON",
            ("--json-model-override-args", "{"),
            "invalid_value",
            "not valid JSON",
        ),
        ("ValueError: --foo was removed", ("--foo",), "other", "ValueError: --foo was removed"),
    ],
)
def test_argparse_messages_map_to_kinds(
    message: str, tokens: tuple[str, ...], kind: str, text: str
) -> None:
    problem = problem_from_message(message, OPTIONS, Segment(tokens))
    assert (problem.flag, problem.kind, problem.message) == (tokens[0].split("=")[0], kind, text)


def test_required_options_are_whole_line_problems() -> None:
    problems = line_problems("the following arguments are required: --model-path/--model, --x")
    assert [(p.flag, p.kind) for p in problems] == [
        ("--model-path", "missing_required"),
        ("--x", "missing_required"),
    ]


def test_answer_reports_every_segment_then_new_whole_line_problems() -> None:
    segments = split_segments(["--model-path", "--attention-backend", "x", "--tp-size", "8"])
    answer = ProbeAnswer(
        sglang_version="0.5.10.post1",
        segment_errors=(
            "argument --model-path/--model: expected one argument",
            "argument --attention-backend: invalid choice: 'x' (choose from ...)",
            None,
        ),
        rest_error="the following arguments are required: --model-path/--model",
        options=OPTIONS,
    )
    problems = problems_from_answer(answer, segments)
    assert [(p.flag, p.kind) for p in problems] == [
        ("--model-path", "missing_value"),
        ("--attention-backend", "invalid_choice"),
    ]


def test_an_accepted_line_has_no_problems() -> None:
    segments = split_segments(SEED_004_FLAGS)
    answer = ProbeAnswer("0.5.10.post1", (None,) * len(segments), None, OPTIONS)
    assert problems_from_answer(answer, segments) == ()


# --- spellings and ranges (what sglang accepts but must not be launched) ----------------------------

DEST_OPTIONS = (
    Option(("--model-path", "--model"), None, "model_path"),
    Option(("--mem-fraction-static",), None, "mem_fraction_static"),
    Option(("--tp-size", "--tensor-parallel-size"), None, "tp_size"),
    Option(("--port",), None, "port"),
    Option(("--enable-x",), None, "x"),
    Option(("--disable-x",), None, "x"),  # a store_false twin of --enable-x
)


def test_options_resolve_exactly_or_by_a_unique_prefix() -> None:
    assert validator.resolve_option("--model", DEST_OPTIONS) == (DEST_OPTIONS[0], True)
    assert validator.resolve_option("--mem-fraction", DEST_OPTIONS) == (DEST_OPTIONS[1], False)
    assert validator.resolve_option("--tensor", DEST_OPTIONS) == (DEST_OPTIONS[2], False)
    assert validator.resolve_option("--m", DEST_OPTIONS) == (None, False)  # ambiguous
    assert validator.resolve_option("--nope", DEST_OPTIONS) == (None, False)


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--mem-fraction", "0.97"], [("--mem-fraction", "abbreviation")]),
        (["--mem-fraction-static", "0.92", "--mem-fraction", "0.97"],
         [("--mem-fraction", "abbreviation"), ("--mem-fraction", "conflict")]),
        (["--model", "a", "--model-path", "b"], [("--model-path", "conflict")]),
        (["--tp-size", "8", "--tensor-parallel-size", "4"], [("--tensor-parallel-size", "conflict")]),
        (["--enable-x", "--disable-x"], [("--disable-x", "conflict")]),
        (["--port", "1", "--port", "2"], [("--port", "conflict")]),
        (["--model", "a", "--tp-size", "8", "--port=8000"], []),
    ],
)  # fmt: skip
def test_abbreviations_and_second_spellings_are_found_by_dest(argv: list[str], expected: list) -> None:
    problems = validator.spelling_problems(split_segments(argv), DEST_OPTIONS)
    assert [(p.flag, p.kind) for p in problems] == expected


def test_a_conflict_names_both_keys_and_the_fix() -> None:
    (problem,) = validator.spelling_problems(split_segments(["--model", "a", "--model-path", "b"]), DEST_OPTIONS)
    text = problem.format("0.5.10.post1", "gpu-01")
    assert "host gpu-01: sglang 0.5.10.post1 rejects --model-path 'b': sets the same option as --model" in text
    assert "keep one of the two keys" in text


@pytest.mark.parametrize(
    "flag, dest, value, ok",
    [("--tp-size", "tp_size", 8, True), ("--tp-size", "tp_size", 0, False),
     ("--tensor-parallel-size", "tp_size", -1, False),
     ("--mem-fraction-static", "mem_fraction_static", 0.92, True),
     ("--mem-fraction-static", "mem_fraction_static", 1.0, False),
     ("--mem-fraction-static", "mem_fraction_static", 0.0, False),
     ("--mem-fraction-static", "mem_fraction_static", float("nan"), False),
     ("--port", "port", 65535, True), ("--port", "port", 65536, False),
     ("--chunked-prefill-size", "chunked_prefill_size", -1, True),
     ("--chunked-prefill-size", "chunked_prefill_size", 0, False),
     ("--cuda-graph-bs", "cuda_graph_bs", [1, 2, 0], False), ("--cuda-graph-bs", "cuda_graph_bs", [1, 64], True),
     ("--context-length", "context_length", 131072, True), ("--model", "model_path", "x", True)],
)  # fmt: skip
def test_range_checks_read_the_values_as_sglang_typed_them(flag: str, dest: str, value: object, ok: bool) -> None:
    options = (
        *DEST_OPTIONS[:2],
        Option(("--tp-size", "--tensor-parallel-size"), None, "tp_size"),
        Option(("--port",), None, "port"),
        Option(("--chunked-prefill-size",), None, "chunked_prefill_size"),
        Option(("--cuda-graph-bs",), None, "cuda_graph_bs"),
        Option(("--context-length",), None, "context_length"),
    )
    problems = validator.range_problems(split_segments([flag, "v"]), [{dest: value}], options)
    assert [p.kind for p in problems] == ([] if ok else ["out_of_range"])


# --- messages --------------------------------------------------------------------------------------


def test_message_names_host_flag_value_version_choices_and_fix() -> None:
    problem = FlagProblem(
        "--attention-backend",
        "flashinfr",
        "invalid choice",
        ["fa3", "flashinfer"],
        "invalid_choice",
        "flashinfer",
    )
    result = ValidationResult("0.5.10.post1", "cu128", (problem,))
    assert result.format("gpu-01") == (
        "host gpu-01: sglang 0.5.10.post1 rejects --attention-backend 'flashinfr': invalid choice; "
        "did you mean 'flashinfer'? Valid choices: fa3, flashinfer. Fix: set "
        "sglang_server_flags['attention-backend'] to one of these in inventory (host_vars/group_vars)."
    )


def test_unknown_flag_message_offers_the_rename() -> None:
    problem = FlagProblem(
        "--nsa-decode-backend",
        "trtllm",
        "unrecognized flag",
        None,
        "unknown_flag",
        "--dsa-decode-backend",
    )
    text = ValidationResult("0.5.23", "cu130", (problem,), host="gpu-01").format()
    assert text.startswith(
        "host gpu-01: sglang 0.5.23 rejects --nsa-decode-backend 'trtllm': unrecognized flag;"
    )
    assert "rename sglang_server_flags['nsa-decode-backend'] to 'dsa-decode-backend'" in text


def test_accepted_message() -> None:
    result = ValidationResult("0.5.10.post1", "cu128", ())
    assert result.ok
    assert (
        result.format("gpu-01")
        == "host gpu-01: sglang 0.5.10.post1 (lane cu128) accepts the command line."
    )


# --- the venv spec -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cu128() -> Lane:
    return load_lane("cu128")


@pytest.fixture(scope="module")
def cu130() -> Lane:
    return load_lane("cu130")


def test_spec_defaults_to_the_lanes_cpu_torch(cu128: Lane) -> None:
    spec = build_spec(cu128, {})
    assert (spec.torch, spec.torch_index) == (
        "torch==2.9.1",
        "https://download.pytorch.org/whl/cpu",
    )
    assert (spec.python, spec.python_version) == (
        sys.executable,
        f"{sys.version_info[0]}.{sys.version_info[1]}",
    )


def test_torch_override_drops_the_lanes_index_unless_one_is_given(cu128: Lane) -> None:
    assert build_spec(cu128, {ENV_TORCH: "torch==2.13.0+cpu"}).torch_index == ""
    spec = build_spec(
        cu128, {ENV_TORCH: "torch==2.13.0+cpu", ENV_TORCH_INDEX: "https://mirror/cpu"}
    )
    assert (spec.torch, spec.torch_index) == ("torch==2.13.0+cpu", "https://mirror/cpu")
    assert build_spec(cu128, {ENV_TORCH_INDEX: ""}).torch_index == ""


def test_marker_ignores_which_python_path_made_the_venv(cu128: Lane) -> None:
    """A project venv's python and its base python build the same validator venv."""
    spec = build_spec(cu128, {})
    assert "python" not in spec.marker()
    assert spec.marker()["packages"] == list(cu128.validator.packages)


def test_marker_ignores_which_torch_source_won(cu128: Lane) -> None:
    """A venv built while the PyTorch index was down is reused when it is back (and vice versa)."""
    spec = build_spec(cu128, {})
    assert spec.matches({**spec.marker(), "torch_source": "the CPU wheel /w/torch.whl from ..."})
    assert spec.matches(spec.marker())
    assert not spec.matches(None)
    assert not spec.matches({**spec.marker(), "torch": "torch==2.13.0"})


def test_an_explicit_torch_source_is_part_of_the_venvs_identity(cu128: Lane) -> None:
    """Naming the lane's own index explicitly makes it the only source: a different venv."""
    lane_index = cu128.validator.torch_index
    explicit = build_spec(cu128, {ENV_TORCH_INDEX: lane_index})
    assert (explicit.torch, explicit.torch_index, explicit.torch_explicit) == (
        "torch==2.9.1",
        lane_index,
        True,
    )
    assert not explicit.matches(build_spec(cu128, {}).marker())


def test_torch_source_reads_the_venvs_marker(cu128: Lane, tmp_path: Path) -> None:
    assert torch_source(tmp_path) is None
    marker = {**build_spec(cu128, {}).marker(), "torch_source": "the lane's CPU index https://x"}
    (tmp_path / "sglang-deploy-validator.json").write_text(json.dumps(marker), encoding="utf-8")
    assert torch_source(tmp_path) == "the lane's CPU index https://x"


def test_a_broken_python_override_is_named(cu128: Lane) -> None:
    with pytest.raises(ValidatorError, match=ENV_PYTHON):
        build_spec(cu128, {ENV_PYTHON: "/nonexistent/python"})


def test_a_failed_build_leaves_nothing_behind(
    cu128: Lane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pip rejects the explicit requirement at once (no network), after the venv step ran; being
    explicit, it is the only source tried, and the fix names the variables."""
    monkeypatch.setenv(ENV_TORCH, "torch[")
    with pytest.raises(ValidatorError) as failed:
        ensure_validator_env(cu128, tmp_path)
    attempt, fix = str(failed.value).splitlines()[1:3]
    assert attempt.startswith(
        f"  1. torch[ from pip's own configuration (set by {ENV_TORCH} / {ENV_TORCH_INDEX}): "
        "pip failed (exit 1): ERROR: Invalid requirement: 'torch['"
    )
    assert fix.startswith(f"Fix: correct {ENV_TORCH} / {ENV_TORCH_INDEX}, or unset both")
    # A forced torch has a venv of its own (validator_dir): only its lock is left.
    forced = validator_dir(build_spec(cu128, os.environ), tmp_path)
    assert forced.name.startswith(f"sglang-0.5.10.post1-py{sys.version_info[0]}.{sys.version_info[1]}-torch-")
    assert [p.name for p in (tmp_path / "validators").iterdir()] == [f"{forced.name}.lock"]


# --- the real parsers (slow: the cached validator venvs) ------------------------------------------------


@pytest.mark.slow
def test_seed_004_flags_pass_on_0_5_10_post1(cu128: Lane) -> None:
    result = validate_flags(SEED_004_FLAGS, cu128, "gpu-01")
    assert result.ok, result.format()
    assert result.sglang_version == "0.5.10.post1"


@pytest.mark.slow
def test_an_abbreviation_is_refused_with_the_full_name_on_0_5_10_post1(cu128: Lane) -> None:
    """argparse accepts --tp for --tp-size, but the planner and every check read full names (the
    launch model renders an inventory's tp as --tp-size itself)."""
    argv = ["--tp" if token == "--tp-size" else token for token in SEED_004_FLAGS]
    (problem,) = validate_flags(argv, cu128, "gpu-01").problems
    assert (problem.flag, problem.kind, problem.suggestion) == ("--tp", "abbreviation", "--tp-size")
    assert "rename sglang_server_flags['tp'] to 'tp-size'" in problem.format("0.5.10.post1")


@pytest.mark.slow
def test_a_second_spelling_of_a_flag_is_a_conflict_found_by_dest(cu128: Lane) -> None:
    """mem-fraction: 0.97 next to the profile's mem-fraction-static: 0.92 would silently win over
    the fraction the memory planner judged; --model-path next to --model likewise."""
    result = validate_flags([*SEED_004_FLAGS, "--mem-fraction", "0.97", "--model-path", "/other"], cu128)
    found = [(p.flag, p.kind) for p in result.problems]
    assert found == [
        ("--mem-fraction", "abbreviation"),
        ("--mem-fraction", "conflict"),
        ("--model-path", "conflict"),
    ]
    assert "sets the same option as --mem-fraction-static" in result.problems[1].message
    assert "sets the same option as --model" in result.problems[2].message


@pytest.mark.slow
def test_an_answer_is_kept_in_the_validator_venv_and_asked_again_when_anything_in_its_key_changes(
    cu128: Lane, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The same flags asked twice import sglang once; the kept answer is the probe's own. A changed
    sglang variable, a corrupt kept file or a changed probe asks the parser again."""
    import subprocess

    from sglang_deploy.launch import validator_venv

    argv = _with(SEED_004_FLAGS, {"--max-running-requests": ["17"]})  # a request no other test makes
    import uuid

    monkeypatch.setenv("SGLANG_DEPLOY_TEST_ANSWERS", uuid.uuid4().hex)  # a key no earlier run kept
    probes: list[list[str]] = []
    real_run = subprocess.run

    def counting_run(args, *rest, **kwargs):  # type: ignore[no-untyped-def]
        if str(validator_venv._PROBE) in map(str, args):
            probes.append(list(map(str, args)))
        return real_run(args, *rest, **kwargs)

    monkeypatch.setattr(validator_venv.subprocess, "run", counting_run)
    first = validate_flags(argv, cu128, "gpu-01")
    assert len(probes) == 1 and first.ok, first.format()
    again = validate_flags(argv, cu128, "gpu-01")
    assert len(probes) == 1 and again == first
    bad = validate_flags(_with(argv, {"--tp-size": ["0"]}), cu128, "gpu-01")
    assert len(probes) == 2 and not bad.ok  # another request: asked
    assert validate_flags(_with(argv, {"--tp-size": ["0"]}), cu128, "gpu-01") == bad and len(probes) == 2

    kept = _kept_for(cu128, argv)
    kept.write_text("{not json")
    assert validate_flags(argv, cu128, "gpu-01") == first and len(probes) == 3
    assert json.loads(kept.read_text())  # the answer asked again replaced the corrupt one
    monkeypatch.setenv("SGLANG_DEPLOY_TEST_ANSWERS", uuid.uuid4().hex)
    assert validate_flags(argv, cu128, "gpu-01") == first and len(probes) == 4
    changed = tmp_path / validator_venv._PROBE.name
    changed.write_text(validator_venv._PROBE.read_text() + "# a changed probe\n")
    monkeypatch.setattr(validator_venv, "_PROBE", changed)
    assert validate_flags(argv, cu128, "gpu-01") == first and len(probes) == 5


@pytest.mark.slow
@pytest.mark.parametrize(
    "plant",
    ["fifo", "directory", "list", "wrong-types", "too-few-segments", "huge"],
)
def test_a_kept_answer_that_is_not_one_is_asked_again_never_waited_on(
    cu128: Lane, monkeypatch: pytest.MonkeyPatch, plant: str
) -> None:
    """Whatever sits at a kept answer's path - a FIFO (opening it would wait for a writer for ever), a
    directory, valid JSON of another shape, an answer for other segments, a file over the cap - the parser
    is asked again: one answer, no hang, no traceback."""
    import os
    import uuid

    monkeypatch.setenv("SGLANG_DEPLOY_TEST_ANSWERS", uuid.uuid4().hex)
    argv = _with(SEED_004_FLAGS, {"--max-running-requests": ["19"]})
    first = validate_flags(argv, cu128, "gpu-01")
    kept = _kept_for(cu128, argv)
    answer = json.loads(kept.read_text())
    kept.unlink()
    if plant == "fifo":
        os.mkfifo(kept)
    elif plant == "directory":
        kept.mkdir()
    elif plant == "list":
        kept.write_text("[1, 2, 3]")
    elif plant == "wrong-types":
        kept.write_text(json.dumps({**answer, "options": [{"option_strings": "--tp-size", "choices": 7}]}))
    elif plant == "too-few-segments":
        kept.write_text(json.dumps({**answer, "segment_errors": answer["segment_errors"][:1]}))
    else:
        kept.write_text(" " * (5 * 1024 * 1024) + json.dumps(answer))
    try:
        again = validate_flags(argv, cu128, "gpu-01")
    finally:
        if kept.is_dir() and not kept.is_symlink():
            kept.rmdir()
    assert again == first


def test_a_probe_answer_of_another_shape_is_one_error_not_a_traceback() -> None:
    from sglang_deploy.launch.validator import ProbeAnswer

    good = {"sglang_version": "0.5.10", "segment_errors": [None], "rest_error": None,
            "options": [{"option_strings": ["--tp-size"], "choices": None, "dest": "tp_size"}]}  # fmt: skip
    assert ProbeAnswer.from_json(good, segments=1).options[0].dest == "tp_size"
    for bad, field in [
        ([], "not a JSON object"), ({**good, "sglang_version": 5}, "sglang_version"),
        ({**good, "segment_errors": "x"}, "segment_errors"), ({**good, "options": [["--tp"]]}, "options"),
        ({**good, "options": [{"option_strings": "--tp", "choices": None}]}, "option_strings"),
        ({**good, "segment_values": [1]}, "segment_values"),
    ]:  # fmt: skip
        with pytest.raises(ValueError, match=field):
            ProbeAnswer.from_json(bad, segments=1)
    with pytest.raises(ValueError, match="one entry per segment"):
        ProbeAnswer.from_json(good, segments=2)


def _kept_for(lane: Lane, argv: list[str]) -> Path:
    """The file the answer to ``argv`` is kept in (as validate_flags asks it)."""
    from sglang_deploy.launch import validator_venv

    env = validator_venv.ensure_validator_env(lane)
    segments = [list(s.tokens) for s in split_segments(argv)]
    request = {"argv": argv, "segments": segments, "stand_ins": list(lane.validator.stand_ins)}
    path = validator_venv._kept_answer_file(env, request)
    assert path is not None and path.is_file()
    return path


def _with(argv: list[str], changes: dict[str, list[str]]) -> list[str]:
    """``argv`` with each flag of ``changes`` set to the given values (replaced or appended)."""
    segments = [s for s in split_segments(argv) if s.flag not in changes]
    return [t for s in segments for t in s.tokens] + [t for f, v in changes.items() for t in (f, *v)]


@pytest.mark.slow
def test_values_no_server_can_start_with_are_out_of_range(cu128: Lane) -> None:
    bad = {
        "--tp-size": ["0"], "--mem-fraction-static": ["1.5"], "--port": ["70000"],
        "--chunked-prefill-size": ["0"], "--max-running-requests": ["0"], "--context-length": ["0"],
        "--max-total-tokens": ["-5"], "--page-size": ["0"], "--cuda-graph-max-bs": ["0"],
        "--cuda-graph-bs": ["1", "2", "0"],
    }  # fmt: skip
    result = validate_flags(_with(SEED_004_FLAGS, bad), cu128, "gpu-01")
    assert [(p.flag, p.kind) for p in result.problems] == [(flag, "out_of_range") for flag in bad]
    assert "rejects --port '70000': out of range: want a TCP port, 1-65535" in result.format()
    edges = validate_flags(_with(SEED_004_FLAGS, {"--mem-fraction-static": ["0"], "--port": ["0"]}), cu128)
    assert [(p.flag, p.kind) for p in edges.problems] == [
        ("--mem-fraction-static", "out_of_range"), ("--port", "out_of_range"),
    ]  # fmt: skip
    fine = {"--chunked-prefill-size": ["-1"], "--context-length": ["128k"]}  # -1: no chunking
    assert validate_flags(_with(SEED_004_FLAGS, fine), cu128).ok


@pytest.mark.slow
def test_nsa_flags_are_rejected_by_0_5_23_with_the_dsa_rename(cu130: Lane) -> None:
    result = validate_flags(SEED_004_FLAGS, cu130, "gpu-01")
    assert result.sglang_version == "0.5.23"
    assert [(p.flag, p.value, p.kind, p.suggestion) for p in result.problems] == [
        ("--nsa-decode-backend", "trtllm", "unknown_flag", "--dsa-decode-backend"),
        ("--nsa-prefill-backend", "trtllm", "unknown_flag", "--dsa-prefill-backend"),
    ]
    assert "host gpu-01: sglang 0.5.23 rejects --nsa-decode-backend 'trtllm'" in result.format()


@pytest.mark.slow
def test_seed_004_with_dsa_names_passes_on_0_5_23(cu130: Lane) -> None:
    argv = [token.replace("--nsa-", "--dsa-") for token in SEED_004_FLAGS]
    result = validate_flags(argv, cu130)
    assert result.ok, result.format()


@pytest.mark.slow
def test_misspelt_choice_is_rejected_with_the_valid_choices(cu128: Lane) -> None:
    argv = [*SEED_004_FLAGS, "--attention-backend", "flashinfr"]
    result = validate_flags(argv, cu128, "gpu-01")
    (problem,) = result.problems
    assert (problem.flag, problem.value, problem.kind) == (
        "--attention-backend",
        "flashinfr",
        "invalid_choice",
    )
    assert problem.choices is not None and "flashinfer" in problem.choices
    assert problem.suggestion == "flashinfer"
    text = result.format()
    assert text.startswith(
        "host gpu-01: sglang 0.5.10.post1 rejects --attention-backend 'flashinfr': invalid choice"
    )
    assert "flashinfer, " in text and "sglang_server_flags['attention-backend']" in text


@pytest.mark.slow
def test_every_problem_of_a_line_is_reported(cu128: Lane) -> None:
    argv = [
        "--model",
        "m",
        "--attention-backend",
        "flashinfr",
        "--tp-size",
        "8",
        "--bogus-flag",
        "--port",
    ]
    result = validate_flags(argv, cu128)
    assert [(p.flag, p.kind) for p in result.problems] == [
        ("--attention-backend", "invalid_choice"),
        ("--bogus-flag", "unknown_flag"),
        ("--port", "missing_value"),
    ]


@pytest.mark.slow
def test_bad_type_is_rejected(cu128: Lane) -> None:
    result = validate_flags([*SEED_004_FLAGS, "--mem-fraction-static", "abc"], cu128)
    (problem,) = result.problems
    assert (problem.flag, problem.value, problem.message) == (
        "--mem-fraction-static",
        "abc",
        "invalid float value",
    )


@pytest.mark.slow
def test_a_missing_model_is_reported_with_other_problems(cu128: Lane) -> None:
    result = validate_flags(["--tp-size", "eight"], cu128)
    assert [(p.flag, p.kind) for p in result.problems] == [
        ("--tp-size", "invalid_value"),
        ("--model-path", "missing_required"),
    ]


@pytest.mark.slow
def test_main_exits_0_when_accepted_and_1_when_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    assert validator.main(["--lane", "cu128", "--host", "gpu-01", "--", *SEED_004_FLAGS]) == 0
    assert "host gpu-01: sglang 0.5.10.post1 (lane cu128) accepts" in capsys.readouterr().out
    assert validator.main(["--lane", "cu130", "--", *SEED_004_FLAGS]) == 1
    assert "rejects --nsa-decode-backend" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("lane_name", ["cu128", "cu130"])
def test_the_lanes_recorded_choices_are_its_parsers(lane_name: str) -> None:
    """`plan` refuses a value offline from the lane's recorded choices, and TLS on a lane without its recorded
    TLS flags: they must be what the lane's sglang takes. Where its parser has no choices (0.5.23's --speculative-algorithm), the recorded names are its
    SpeculativeAlgorithm enum's (NONE left out) and the NEXTN alias."""
    import subprocess

    from sglang_deploy.launch import validator_venv
    from sglang_deploy.lanes.catalog import load_lane

    lane = load_lane(lane_name)
    env = validator_venv.ensure_validator_env(lane)
    argv = ["--model-path", "x"]
    answer = validator_venv.run_probe(
        env, argv, [s.tokens for s in split_segments(argv)], lane.validator.stand_ins, ProbeAnswer.from_json
    )
    parser = {s.lstrip("-"): o.choices for o in answer.options for s in o.option_strings}
    assert lane.choices, "no choices recorded"
    # TLS (serving/server.py refuses it on a lane without these): the parser must have every one.
    assert set(lane.tls_flags) == {"ssl-certfile", "ssl-keyfile", "ssl-ca-certs"}
    assert set(lane.tls_flags) <= set(parser), f"{lane_name}: sglang {lane.sglang} lacks {set(lane.tls_flags) - set(parser)}"
    for flag, recorded in lane.choices:
        assert flag in parser, f"{lane_name}: sglang {lane.sglang} has no --{flag}"
        if parser[flag] is not None:
            assert tuple(parser[flag]) == recorded, (flag, parser[flag])
            continue
        assert flag == "speculative-algorithm", f"{lane_name}: --{flag} has no choices in the parser; record none"
        names = subprocess.run(
            [str(env / "bin" / "python"), "-I", "-c",
             "from sglang.srt.speculative.spec_info import SpeculativeAlgorithm as A; print(' '.join(m.name for m in A))"],
            capture_output=True, text=True, timeout=300, check=True,
        ).stdout.split()  # fmt: skip
        assert set(recorded) == (set(names) - {"NONE"}) | {"NEXTN"}, (names, recorded)


@pytest.mark.parametrize("action", ["sglang_validate_flags", "sglang_validate_router_flags"])
def test_a_validating_action_without_hosts_fails_naming_itself(action: str, tmp_path: Path) -> None:
    """The actions' shared base (launch/validate_action.py) reads the hosts: none is a failure, not a pass."""
    done = subprocess.run(
        [str(Path(sys.executable).with_name("ansible")), "localhost", "-i", "localhost,", "-c", "local",
         "-m", action, "-a", json.dumps({"hosts": {}}), "--tree", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp")},
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    result = json.loads((tmp_path / "localhost").read_text())
    assert result["msg"] == f"{action}: no hosts to validate", result  # the tree drops "failed"; rc 2 says it
