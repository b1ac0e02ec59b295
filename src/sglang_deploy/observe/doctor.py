"""Doctor: name the known sglang start/serve failures in a log and say the fix.

Rules are data (``doctor_rules.yml`` beside this module): each has an ``id``, ``patterns`` (regexes,
any line matching one is evidence), optional ``context`` (regexes of which at least one must occur
somewhere in the log for the rule to apply, e.g. "this OOM happened during graph capture"),
optional ``unless`` (regexes that, when present anywhere, mean another rule explains the lines
better), a one-line ``summary`` and a ``fix``. A fix may name planner values as ``{placeholders}``
(``recommended_mem_fraction_static``, ``sglang_default_mem_fraction_static``, ...); they are filled
from a plan when one is given, else with a pointer to ``sglang-deploy plan``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from string import Formatter
from typing import Any

import yaml

from sglang_deploy import inputfiles

MAX_EVIDENCE_LINES = 5
RULES_FILE = "doctor_rules.yml"
# Colour codes and journald/sglang prefixes do not change what a line says.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class RulesError(ValueError):
    """The rules file is malformed; the message names the rule and the field."""


@dataclass(frozen=True)
class Rule:
    id: str
    patterns: tuple[re.Pattern[str], ...]
    summary: str
    fix: str
    context: tuple[re.Pattern[str], ...] = ()
    unless: tuple[re.Pattern[str], ...] = ()


@dataclass(frozen=True)
class Finding:
    id: str
    evidence: list[str]
    summary: str
    fix: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_rules(text: str | None = None) -> tuple[Rule, ...]:
    """Parse rules from YAML ``text`` (default: the packaged ``doctor_rules.yml``)."""
    if text is None:
        text = resources.files("sglang_deploy.observe").joinpath(RULES_FILE).read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    if not isinstance(data, list):
        raise RulesError("the doctor rules must be a YAML list of rules")
    rules: list[Rule] = []
    seen: set[str] = set()
    for position, raw in enumerate(data):
        if not isinstance(raw, Mapping):
            raise RulesError(f"rule #{position} is not a mapping")
        rule_id = str(raw.get("id") or "")
        if not rule_id or rule_id in seen:
            raise RulesError(f"rule #{position}: id {rule_id!r} is empty or repeated")
        seen.add(rule_id)
        for key in ("patterns", "summary", "fix"):
            if not raw.get(key):
                raise RulesError(f"rule {rule_id}: {key} is missing")
        rules.append(
            Rule(
                id=rule_id,
                patterns=_compile(rule_id, "patterns", raw["patterns"]),
                summary=str(raw["summary"]).strip(),
                fix=str(raw["fix"]).strip(),
                context=_compile(rule_id, "context", raw.get("context") or []),
                unless=_compile(rule_id, "unless", raw.get("unless") or []),
            )
        )
    return tuple(rules)


@lru_cache(maxsize=1)
def default_rules() -> tuple[Rule, ...]:
    return load_rules()


def diagnose(
    lines: Iterable[str],
    *,
    rules: Sequence[Rule] | None = None,
    plan: Mapping[str, Any] | None = None,
) -> list[Finding]:
    """Findings for a log, in rule order; each rule at most once."""
    clean = [_ANSI.sub("", line.rstrip("\r\n")) for line in lines]
    text = "\n".join(clean)
    findings: list[Finding] = []
    for rule in rules if rules is not None else default_rules():
        if rule.context and not any(p.search(text) for p in rule.context):
            continue
        if rule.unless and any(p.search(text) for p in rule.unless):
            continue
        evidence: list[str] = []
        for line in clean:
            if any(p.search(line) for p in rule.patterns):
                stripped = line.strip()
                if stripped and stripped not in evidence:
                    evidence.append(stripped)
            if len(evidence) >= MAX_EVIDENCE_LINES:
                break
        if evidence:
            findings.append(
                Finding(rule.id, evidence, rule.summary, fill_placeholders(rule.fix, plan))
            )
    return findings


class PlanFileError(ValueError):
    """A ``--plan`` file that is not ``sglang-deploy plan --json`` output."""


def load_plan(path: str | Path) -> dict[str, Any]:
    """The plan a ``--plan`` file holds: a JSON object as ``sglang-deploy plan --json`` prints it."""
    try:
        data = inputfiles.read_json(path, "--plan")
    except inputfiles.InputFileError as err:
        raise PlanFileError(str(err)) from None
    if not isinstance(data, dict) or "recommended_mem_fraction_static" not in data:
        raise PlanFileError(
            f"--plan {path}: not a memory plan (want the JSON object `sglang-deploy plan --json` "
            "prints, with recommended_mem_fraction_static)"
        )
    return data


def fill_placeholders(fix: str, plan: Mapping[str, Any] | None) -> str:
    """``{name}`` -> the plan's value, or a pointer to ``sglang-deploy plan`` without one."""
    names = {field for _, field, _, _ in Formatter().parse(fix) if field}
    values = {
        name: (plan[name] if plan and plan.get(name) is not None
               else f"<{name} from `sglang-deploy plan`>")
        for name in names
    }
    return fix.format(**values)


def render_text(findings: Sequence[Finding]) -> str:
    if not findings:
        return "doctor: no known failure found"
    blocks = []
    for finding in findings:
        evidence = "\n".join(f"    | {line}" for line in finding.evidence)
        blocks.append(
            f"[{finding.id}] {finding.summary}\n{evidence}\n    fix: {finding.fix}"
        )
    return "\n\n".join(blocks)


def _compile(rule_id: str, key: str, patterns: Any) -> tuple[re.Pattern[str], ...]:
    if isinstance(patterns, str) or not isinstance(patterns, list):
        raise RulesError(f"rule {rule_id}: {key} must be a list of regexes")
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(str(pattern)))
        except re.error as err:
            raise RulesError(f"rule {rule_id}: {key} regex {pattern!r}: {err}") from None
    return tuple(compiled)
