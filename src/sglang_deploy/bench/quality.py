"""The quality check beside a benchmark: ``bench --quality-reference REF`` checks the benchmarked launch against a
reference (module_utils/sglang_deploy_host/serving/quality.py) after its sweep and keeps the verdict in the run
(sweep.json's ``quality``), and ``bench --compare`` shows both sides' verdicts beside their speed: a launch that is
faster but no longer computes the model is not a win."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# A verdict that lets a run (or B of a comparison) stand.
PASSING = "PASS"


def summary(verdict: Mapping[str, Any] | None, problem: str = "") -> dict[str, Any]:
    """What a run keeps of a check: the verdict word, its figures and its one line (``problem``: why there is none)."""
    if verdict is None:
        return {"verdict": "NO VERDICT", "line": f"sglang-deploy quality check: NO VERDICT: {problem}"}
    kl = verdict.get("kl") or {}
    return {
        "verdict": verdict.get("verdict"), "reasons": list(verdict.get("reasons") or []),
        "kl_mean": kl.get("mean"), "kl_p99": kl.get("p99"), "top1_agreement": verdict.get("top1_agreement"),
        "reference": verdict.get("reference"), "thresholds": verdict.get("thresholds"),
        "line": _line(verdict),
    }  # fmt: skip


def _line(verdict: Mapping[str, Any]) -> str:
    kl = verdict.get("kl") or {}
    reasons = "; ".join(verdict.get("reasons") or [])
    figures = f"KL mean {kl.get('mean', 0):.4g}, p99 {kl.get('p99', 0):.4g}, top-1 {verdict.get('top1_agreement', 0):.1%}"
    return f"sglang-deploy quality check: {verdict.get('verdict')}" + (f": {reasons}" if reasons else "") + f" [{figures}]"


def of_run(meta: Mapping[str, Any]) -> dict[str, Any] | None:
    """The check kept in a run's meta (None: the run was not checked)."""
    kept = meta.get("quality")
    return dict(kept) if isinstance(kept, Mapping) else None


def word(kept: Mapping[str, Any] | None) -> str:
    return "not checked" if kept is None else str(kept.get("verdict"))


def passed(kept: Mapping[str, Any] | None) -> bool:
    """True when not checked (nothing to hold against it) or PASS."""
    return kept is None or kept.get("verdict") == PASSING


def brief(kept: Mapping[str, Any] | None) -> str:
    """One short clause for a comparison's verdict line."""
    if kept is None:
        return "not checked"
    if kept.get("verdict") == "NO VERDICT":
        return "NO VERDICT"
    return f"{kept.get('verdict')} (KL mean {float(kept.get('kl_mean') or 0):.3g}, top-1 {float(kept.get('top1_agreement') or 0):.1%})"
