"""scripts/mutation, the mutation testing of the code that guards users (docs/testing.md, "Mutation testing"):
its configuration holds (every target, scope, test and operator real; every equivalent names a live mutant with
its reason; every floor at or below the last full run's score), and a real run on a small project of its own
kills what its tests pin, reports what they miss, leaves the listed equivalents out, never touches the
checkout, and fails below a floor."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from conftest import ROOT


def _load() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("sglang_deploy_mutation", str(ROOT / "scripts" / "mutation"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[loader.name] = module  # dataclasses look their module up
    loader.exec_module(module)
    return module


mutation = _load()
SCORES = ROOT / "tests" / "mutation" / "scores.json"


def test_the_configuration_names_real_files_scopes_tests_and_operators() -> None:
    targets, operators = mutation.load_targets()
    mutation.operators_known(operators)
    equivalents = mutation.load_equivalents()
    the_plan = mutation.plan(targets, operators, equivalents)  # a stale equivalent or a wrong scope raises here
    assert {t.name for t in targets} >= {"safepath", "safetensors", "checkpoint", "gate", "tls", "watchdog", "masker",
                                         "variables", "plan-inputs", "planner-draft", "router", "pve-schema", "flag-names"}  # fmt: skip
    for target in targets:
        assert the_plan.figures[target.name].in_scope > 0, target.name
    for (name, key), reason in equivalents.items():
        assert name in {t.name for t in targets} and len(reason) > 20, (name, key)


def test_every_floor_is_at_or_below_the_last_full_runs_score() -> None:
    """Floors only go up, and never above what a full run measured (tests/mutation/scores.json); a target no full
    run has measured yet keeps floor 0."""
    targets, _ = mutation.load_targets()
    recorded = json.loads(SCORES.read_text())["targets"]
    assert set(recorded) <= {target.name for target in targets}, "scores.json names a target targets.yml lacks"
    for target in targets:
        if target.name not in recorded:
            assert target.floor == 0, f"{target.name}: a floor without a recorded full run"
            continue
        figures = recorded[target.name]
        assert figures["run"] == figures["in_scope"] - figures["equivalent"], f"{target.name}: not a full run"
        assert figures["killed"] + figures["survived"] <= figures["run"], target.name  # the rest: nothing to change
        assert len(figures["survivors"]) == figures["survived"], target.name
        score = figures["score"]
        assert score is not None and target.floor <= score, (target.name, target.floor, score)


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"path": "nope.py"}, "is not a file of the checkout"),
        ({"scope": ["no_such_function"]}, "scope names no_such_function"),
        ({"tests": ["tests/unit/no_such_test.py"]}, "does not exist"),
        ({"floor": 101}, "floor must be a number from 0 to 100"),
        ({"floor": True}, "floor must be a number"),
        ({"extra": 1}, "unknown keys ['extra']"),
        ({"name": "Bad Name"}, "must be a lower-case name"),
    ],
)  # fmt: skip
def test_a_wrong_target_is_refused_in_one_line(tmp_path: Path, change: dict, needle: str) -> None:
    data = yaml.safe_load((ROOT / "tests" / "mutation" / "targets.yml").read_text())
    data["targets"] = [{**data["targets"][0], **change}]
    path = tmp_path / "targets.yml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(mutation.ConfigError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        targets, operators = mutation.load_targets(path)
        mutation.plan(targets, operators, {})


def test_an_equivalent_needs_its_reason_and_a_live_mutant(tmp_path: Path) -> None:
    path = tmp_path / "equivalent.yml"
    path.write_text(yaml.safe_dump({"equivalent": [{"target": "safepath", "mutant": "x", "reason": "same"}]}))
    with pytest.raises(mutation.ConfigError, match="must say why"):
        mutation.load_equivalents(path)
    path.write_text(yaml.safe_dump({"equivalent": [{"target": "safepath", "mutant": "core/AddNot | gone | 0",
                                                    "reason": "a line that no longer exists in the file"}]}))  # fmt: skip
    targets, operators = mutation.load_targets()
    with pytest.raises(mutation.ConfigError, match="is no mutant of .* any more"):
        mutation.plan([t for t in targets if t.name == "safepath"], operators, mutation.load_equivalents(path))


# -- a real run on a project of its own ------------------------------------------------------------------------
GUARD = '''\
LIMIT = 10


def allowed(size):
    """Pinned at both edges by the tests."""
    if size < 0:
        return False
    return size <= LIMIT


def loose(size):
    """Tested only far from its edge: its boundary mutant survives."""
    return size > 100
'''
TESTS = '''\
from guard import allowed, loose


def test_allowed_edges():
    assert allowed(0) and allowed(10)
    assert not allowed(11) and not allowed(-1)


def test_loose_far_away():
    assert loose(1000) and not loose(5)
'''


def _project(tmp_path: Path, targets: list[dict], equivalent: list[dict]) -> Path:
    root = tmp_path / "project"
    (root / "src").mkdir(parents=True)
    (root / "src" / "guard.py").write_text(GUARD)
    (root / "tests").mkdir()
    (root / "tests" / "test_guard.py").write_text(TESTS)
    (root / "tests" / "conftest.py").write_text("")
    config = {"operators": ["core/ReplaceComparisonOperator_Lt_LtE", "core/ReplaceComparisonOperator_LtE_Lt",
                            "core/ReplaceComparisonOperator_Gt_GtE", "core/ReplaceTrueWithFalse", "core/ReplaceFalseWithTrue"],
              "targets": targets}  # fmt: skip
    (root / "targets.yml").write_text(yaml.safe_dump(config))
    (root / "equivalent.yml").write_text(yaml.safe_dump({"equivalent": equivalent}))
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "x"]):
        subprocess.run(["git", *args], cwd=root, check=True, timeout=60)
    return root


def _run(root: Path, known: dict[str, set[str]] | None = None, **plan_args: object) -> tuple[str, bool, object]:
    targets, operators = mutation.load_targets(root / "targets.yml", root)
    the_plan = mutation.plan(targets, operators, mutation.load_equivalents(root / "equivalent.yml"), root=root, **plan_args)
    seconds, broken = mutation.execute(the_plan, jobs=2, budget_s=None, log=io.StringIO(), root=root)
    text, ok = mutation.report(the_plan, seconds, broken, known)
    return text, ok, the_plan


def test_a_run_kills_what_the_tests_pin_reports_what_they_miss_and_never_touches_the_checkout(tmp_path: Path) -> None:
    target = {"name": "guard", "path": "src/guard.py", "tests": ["tests/test_guard.py"], "floor": 50}
    root = _project(tmp_path, [target], [])
    text, ok, the_plan = _run(root)
    figures = the_plan.figures["guard"]  # type: ignore[attr-defined]
    # allowed: < -> <= (0 refused), <= -> < (10 refused), False -> True: killed; loose: > -> >= survives.
    assert (figures.in_scope, figures.killed, figures.survived) == (4, 3, 1), text
    assert "| guard | 4 | 0 | 4 | 4 | 3 | 1 | 75.0 % | 50 % |" in text and ok
    assert "src/guard.py:13 survived - mutant: 'core/ReplaceComparisonOperator_Gt_GtE | return size > 100 | 0'" in text
    assert "-    return size > 100\n+    return size >= 100" in text
    assert (root / "src" / "guard.py").read_text() == GUARD
    assert subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, check=True).stdout == ""


def test_a_listed_equivalent_is_left_out_and_a_floor_above_the_score_fails(tmp_path: Path) -> None:
    survivor = "core/ReplaceComparisonOperator_Gt_GtE | return size > 100 | 0"
    target = {"name": "guard", "path": "src/guard.py", "tests": ["tests/test_guard.py"], "floor": 100}
    root = _project(tmp_path, [target], [])
    text, ok, _ = _run(root)
    assert not ok and "75.0 % BELOW" in text
    root2 = _project(tmp_path / "b", [target], [{"target": "guard", "mutant": survivor,
                                                  "reason": "pretend this boundary cannot matter, for the test"}])  # fmt: skip
    text, ok, the_plan = _run(root2)
    assert ok and "| guard | 4 | 1 | 3 | 3 | 3 | 0 | 100.0 % | 100 % |" in text, text
    # A rerun of one survivor only, by its key.
    text, ok, the_plan = _run(root, only={("guard", survivor)})
    assert the_plan.figures["guard"].selected == 1 and the_plan.figures["guard"].survived == 1  # type: ignore[attr-defined]


def test_a_partial_run_fails_on_a_new_survivor_and_not_on_a_floor(tmp_path: Path) -> None:
    """CI's sample: a score over a few mutants is no measure against a floor, but a survivor the last full run did
    not record is a new gap in the tests."""
    survivor = "core/ReplaceComparisonOperator_Gt_GtE | return size > 100 | 0"
    target = {"name": "guard", "path": "src/guard.py", "tests": ["tests/test_guard.py"], "floor": 75}
    root = _project(tmp_path, [target], [])
    text, ok, _ = _run(root, known={}, only={("guard", survivor)})
    assert not ok and "0.0 % NEW SURVIVORS: 1" in text and "(a full run only)" in text, text
    text, ok, _ = _run(root, known={"guard": {survivor}}, only={("guard", survivor)})
    assert ok and "survived (known: the last full run's survivor)" in text, text
    # The same mutant in a full run counts against the floor, known or not: 3 of 4 = 75 % meets 75.
    text, ok, _ = _run(root, known={})
    assert ok and "| guard | 4 | 0 | 4 | 4 | 3 | 1 | 75.0 % | 75 % |" in text, text


def test_a_target_whose_tests_fail_unmutated_is_an_error_not_a_score(tmp_path: Path) -> None:
    target = {"name": "guard", "path": "src/guard.py", "tests": ["tests/test_guard.py"], "floor": 0}
    root = _project(tmp_path, [target], [])
    (root / "tests" / "test_guard.py").write_text(TESTS + "\n\ndef test_broken():\n    assert False\n")
    text, ok, the_plan = _run(root)
    assert not ok and "the tests of guard fail before any mutation" in text
    assert the_plan.figures["guard"].outcomes == []  # type: ignore[attr-defined]


def test_ci_selection_takes_changed_lines_and_a_seeded_sample(tmp_path: Path) -> None:
    target = {"name": "guard", "path": "src/guard.py", "tests": ["tests/test_guard.py"], "floor": 0}
    root = _project(tmp_path, [target], [])
    targets, operators = mutation.load_targets(root / "targets.yml", root)
    quiet = mutation.plan(targets, operators, {}, changed_since="HEAD", sample=0, seed="s", root=root)
    assert quiet.selected["guard"] == []
    (root / "src" / "guard.py").write_text(GUARD.replace("return size > 100", "return size > 200"))
    changed = mutation.plan(targets, operators, {}, changed_since="HEAD", sample=0, seed="s", root=root)
    assert [m.line for m in changed.selected["guard"]] == [13]
    one = mutation.plan(targets, operators, {}, changed_since="HEAD", sample=1, seed="s", root=root)
    again = mutation.plan(targets, operators, {}, changed_since="HEAD", sample=1, seed="s", root=root)
    assert len(one.selected["guard"]) == 2 and one.selected["guard"] == again.selected["guard"]
    untouched = mutation.plan(targets, operators, {}, changed_since="HEAD~0", sample=3, untouched_targets=0, seed="s", root=root)
    assert untouched.selected["guard"]  # changed lines always run


def test_the_cli_lists_and_refuses_an_unknown_target() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "mutation"), "no-such-target", "--list"],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 2 and "no target 'no-such-target'; the targets: safepath" in done.stderr
    listed = subprocess.run([sys.executable, str(ROOT / "scripts" / "mutation"), "tls", "--list"],
                            capture_output=True, text=True, timeout=120, check=True).stdout.splitlines()  # fmt: skip
    assert listed and all(line.startswith("tls\tsrc/sglang_deploy/serving/tls.py:") for line in listed)


def test_an_except_clause_loses_each_caught_name_dotted_or_not() -> None:
    """cosmic-ray 8.7.0's ExceptionReplacer crashes on ``except (A, mod.B)`` and renames the dot of ``except mod.B``;
    the script's replaces each caught name whole."""
    from cosmic_ray.ast import ast_nodes
    from cosmic_ray.mutating import mutate_code
    import parso

    source = "try:\n    f()\nexcept (A, mod.B) as err:\n    pass\ntry:\n    g()\nexcept x509.ExtensionNotFound:\n    pass\n"
    operator = mutation._operator("core/ExceptionReplacer")
    count = sum(1 for node in ast_nodes(parso.parse(source)) for _ in operator.mutation_positions(node))
    mutated = [mutate_code(source, mutation._operator("core/ExceptionReplacer"), index) for index in range(count)]
    caught = [next(line for line in text.splitlines() if "CosmicRayTestingException" in line) for text in mutated]
    assert caught == ["except (CosmicRayTestingException, mod.B) as err:", "except (A, CosmicRayTestingException) as err:",
                      "except CosmicRayTestingException:"]  # fmt: skip
