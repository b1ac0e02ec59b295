"""Two benchmark runs side by side (``sglang-deploy bench --compare``): a table per concurrency with B/A for
each metric, one plot and a verdict."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_deploy import inputfiles, ownpath
from sglang_deploy.bench import quality
from sglang_deploy.bench.runs import (
    BenchInputError,
    DEFAULT_THRESHOLD,
    Run,
    SHIPPED_BASELINES,
    finite_number,
    inert_line,
    inert_points,
    load_baseline,
    load_run,
    read_jsonl,
    write_result_file,
)

# --- two runs side by side (sglang-deploy bench --compare) -----------------------------------------------
# What a comparison shows per concurrency: bench_serving's name, the column title, higher is better?
COMPARE_METRICS = (
    ("output_throughput", "output tok/s", True),
    ("total_throughput", "total tok/s", True),
    ("median_ttft_ms", "median TTFT ms", False),
    ("p99_ttft_ms", "p99 TTFT ms", False),
    ("median_itl_ms", "median ITL ms", False),
    ("p99_itl_ms", "p99 ITL ms", False),
    ("accept_length", "accept length", True),
)
# The metric the verdict judges (the others are shown): what the operators' target is written in.
COMPARE_VERDICT_METRIC = "output_throughput"


@dataclass(frozen=True)
class Side:
    """One side of a comparison: a run (its records with every metric, its failed steps) or a baseline
    file's records (throughputs only, e.g. the shipped seed-004)."""

    name: str
    source: str
    points: dict[int, dict[str, Any]]
    failed: dict[int, str]
    input_len: int | None = None
    output_len: int | None = None
    # The run's quality check (bench/quality.py), None when not checked (or a baseline file).
    quality: dict[str, Any] | None = None

    @property
    def label(self) -> str:
        """A short name for a plot legend: a run directory's own name, with its parent's when that name
        is a generic one (``bench``, a UTC time)."""
        parts = Path(self.name).parts
        if len(parts) >= 2 and (parts[-1] == "bench" or re.fullmatch(r"\d{8}T\d{6}Z", parts[-1])):
            return f"{parts[-2]}/{parts[-1]}"
        return parts[-1] if parts else self.name


def load_side(spec: str) -> Side:
    """A run directory, its sweep.json or results.jsonl, a JSON file with ``records`` or a shipped
    baseline name (as ``--baseline`` takes them)."""
    path = Path(spec)
    if path.is_dir() or path.name == "sweep.json":
        directory = path if path.is_dir() else path.parent
        return side_of_run(directory, load_run(directory))
    baseline = load_baseline(spec)  # checks the file; the records themselves are read again for the latencies
    records = _baseline_records(spec)
    points = {c: records.get(c, baseline.points[c]) for c in baseline.points}
    return Side(baseline.name, baseline.source, points, {}, baseline.input_len, baseline.output_len)


def side_of_run(directory: Path, run: Run) -> Side:
    """A run (on disk at ``directory``, or just made) as one side of a comparison."""
    settings = run.meta.get("settings") or {}
    failed = {step["concurrency"]: str(step.get("problem")) for step in run.failed_steps}
    lengths = [value if isinstance(value, int) else None for value in (settings.get("input_len"), settings.get("output_len"))]
    return Side(str(directory), f"run of {run.meta.get('started', '?')} against {run.meta.get('host', '?')}",
                run.points(), failed, lengths[0], lengths[1], quality.of_run(run.meta))  # fmt: skip


def _baseline_records(spec: str) -> dict[int, dict[str, Any]]:
    path = Path(spec)
    if not path.exists():
        path = SHIPPED_BASELINES / f"{spec}.json"
    if path.suffix == ".jsonl":
        records = read_jsonl(path)
    else:
        records = inputfiles.read_json(path, "--compare").get("records") or []  # load_baseline read it already
    return {record["max_concurrency"]: record for record in records if isinstance(record, dict)}


@dataclass(frozen=True)
class CompareRow:
    concurrency: int
    a: dict[str, Any] | None
    b: dict[str, Any] | None
    a_failed: str | None
    b_failed: str | None

    def ratio(self, metric: str) -> float | None:
        """B / A for ``metric`` when both sides measured it."""
        va = (self.a or {}).get(metric)
        vb = (self.b or {}).get(metric)
        return vb / va if finite_number(va) and finite_number(vb) and va else None

    def cell(self, metric: str) -> str:
        """``A / B (B/Ax)`` for a table: FAILED for a failed step, - where a side has no figure."""
        texts = []
        for record, failed in ((self.a, self.a_failed), (self.b, self.b_failed)):
            value = (record or {}).get(metric)
            texts.append("FAILED" if failed else (f"{value:,.1f}" if finite_number(value) else "-"))
        ratio = self.ratio(metric)
        return " / ".join(texts) + (f" ({ratio:.2f}x)" if ratio is not None else "")


@dataclass(frozen=True)
class RunComparison:
    a: Side
    b: Side
    threshold: float
    rows: tuple[CompareRow, ...]
    notes: tuple[str, ...] = ()

    def judged(self) -> list[tuple[int, float]]:
        """(concurrency, B/A output throughput) where both sides measured it."""
        return [(row.concurrency, r) for row in self.rows if (r := row.ratio(COMPARE_VERDICT_METRIC)) is not None]

    @property
    def b_failed(self) -> list[int]:
        return [row.concurrency for row in self.rows if row.b_failed]

    @property
    def slower(self) -> list[int]:
        return [c for c, r in self.judged() if r < 1 - self.threshold]

    @property
    def faster(self) -> list[int]:
        return [c for c, r in self.judged() if r > 1 + self.threshold]

    @property
    def b_inert(self) -> list[tuple[int, float]]:
        return inert_points(self.b.points)

    def verdict(self) -> str:
        """One line: what B is against A in output throughput (beyond +-threshold counts), and B's
        speculative decoding if it accepts nothing."""
        judged = self.judged()
        failed = f"; B FAILED at concurrency {', '.join(map(str, self.b_failed))}" if self.b_failed else ""
        if self.b_inert:
            failed += f"; B is {inert_line(self.b_inert)}"
        if self.a.quality is not None or self.b.quality is not None:
            failed += f"; quality A: {quality.brief(self.a.quality)}, B: {quality.brief(self.b.quality)}"
        if not judged:
            return "NOTHING TO COMPARE: no concurrency where both sides measured output throughput" + failed
        ratios = ", ".join(f"{r:.2f}x at {c}" for c, r in judged)
        band = f"+-{self.threshold:.0%}"
        if self.slower and self.faster:
            head = f"MIXED: B is faster at {', '.join(map(str, self.faster))} and slower at {', '.join(map(str, self.slower))}"
        elif self.slower:
            head = "B is SLOWER" + (" everywhere" if len(self.slower) == len(judged) else f" at {', '.join(map(str, self.slower))}")
        elif self.faster:
            head = "B is FASTER" + (" everywhere" if len(self.faster) == len(judged) else f" at {', '.join(map(str, self.faster))}")
        else:
            head = f"SAME within {band}"
        return f"{head} (output throughput B/A: {ratios}; a difference beyond {band} counts){failed}"

    @property
    def ok(self) -> bool:
        """B neither failed a step, nor fell below A beyond the threshold, nor drafted for nothing, nor failed its
        quality check (the exit status)."""
        return bool(self.judged()) and not self.slower and not self.b_failed and not self.b_inert and quality.passed(self.b.quality)

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": {"name": self.a.name, "source": self.a.source},
            "b": {"name": self.b.name, "source": self.b.source},
            "threshold": self.threshold,
            "verdict": self.verdict(),
            "quality": {"a": self.a.quality, "b": self.b.quality},
            "notes": list(self.notes),
            "rows": [
                {"concurrency": row.concurrency, "a_failed": row.a_failed, "b_failed": row.b_failed,
                 **{f"{metric}_{side}": (getattr(row, side) or {}).get(metric) for metric, _t, _h in COMPARE_METRICS
                    for side in ("a", "b")},
                 **{f"{metric}_ratio": row.ratio(metric) for metric, _t, _h in COMPARE_METRICS}}
                for row in self.rows
            ],
        }  # fmt: skip


def compare_sides(a: Side, b: Side, threshold: float = DEFAULT_THRESHOLD) -> RunComparison:
    """B against A at every concurrency either side has. Two runs of other lengths are not one workload:
    BenchInputError; a side without recorded lengths (the seed's figures) gets a note."""
    notes = []
    lengths_a, lengths_b = (a.input_len, a.output_len), (b.input_len, b.output_len)
    if None in lengths_a or None in lengths_b:
        unknown = a.name if None in lengths_a else b.name
        notes.append(f"{unknown} does not record its input/output lengths: the ratios show direction, not precision")
    elif lengths_a != lengths_b:
        raise BenchInputError(
            f"{a.name} ran {lengths_a[0]} input / {lengths_a[1]} output tokens, {b.name} {lengths_b[0]} / {lengths_b[1]}: "
            "not the same workload. Fix: compare runs made with the same --input-len/--output-len"
        )
    concurrencies = sorted(set(a.points) | set(b.points) | set(a.failed) | set(b.failed))
    rows = tuple(
        CompareRow(c, a.points.get(c), b.points.get(c), a.failed.get(c), b.failed.get(c)) for c in concurrencies
    )
    return RunComparison(a, b, threshold, rows, tuple(notes))


def compare_markdown(comparison: RunComparison, plot_name: str) -> str:
    a, b = comparison.a, comparison.b
    out = ["# sglang serving benchmark: B against A", "",
           f"- A: {a.name} ({a.source})", f"- B: {b.name} ({b.source})"]  # fmt: skip
    out += [f"- note: {note}" for note in comparison.notes]
    head = ["concurrency"] + [f"{title} A / B (B/A)" for _m, title, _h in COMPARE_METRICS]
    out += ["", "| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for row in comparison.rows:
        cells = [str(row.concurrency)] + [row.cell(metric) for metric, _title, _higher in COMPARE_METRICS]
        out.append("| " + " | ".join(cells) + " |")
    for row in comparison.rows:
        for side, problem in (("A", row.a_failed), ("B", row.b_failed)):
            if problem:
                out.append(f"\n{side} failed at concurrency {row.concurrency}: {problem}")
    for side, kept in (("A", comparison.a.quality), ("B", comparison.b.quality)):
        out.append(f"\nQuality of {side}: {(kept or {}).get('line') or 'not checked'}")
    out += ["", f"![A and B against concurrency]({plot_name})", "", f"Verdict: **{comparison.verdict()}**", ""]
    return "\n".join(out)


def compare_plot(comparison: RunComparison, path: Path) -> None:
    """Output throughput, TTFT and ITL (medians) of both sides against concurrency, one figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    panels = (("output throughput (tok/s)", "output_throughput"), ("median TTFT (ms)", "median_ttft_ms"),
              ("median ITL (ms)", "median_itl_ms"))  # fmt: skip
    ticks = sorted({row.concurrency for row in comparison.rows})
    for axis, (title, metric) in zip(axes, panels):
        for side, style in ((comparison.a, {"marker": "s", "linestyle": "--"}), (comparison.b, {"marker": "o"})):
            xs = sorted(c for c, record in side.points.items() if finite_number(record.get(metric)))
            if xs:
                label = ("A: " if side is comparison.a else "B: ") + side.label
                axis.plot(xs, [side.points[c][metric] for c in xs], label=label, **style)
        axis.set_title(title)
        axis.set_xlabel("concurrent requests")
        axis.set_xscale("log", base=2)
        if ticks:
            axis.xaxis.set_major_locator(FixedLocator(ticks))
        axis.xaxis.set_minor_locator(NullLocator())
        axis.xaxis.set_major_formatter(ScalarFormatter())
        axis.set_ylim(bottom=0)
        axis.grid(True, alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=8)
    fig.suptitle(comparison.verdict(), fontsize=9, wrap=True)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_comparison(directory: Path, comparison: RunComparison) -> dict[str, Path]:
    """compare.md, compare.json and compare.png in ``directory`` (private, 0700/0600; ownpath)."""
    directory = ownpath.private_directory(directory, "the comparison's directory")
    paths = {name: directory / name for name in ("compare.md", "compare.json", "compare.png")}
    compare_plot(comparison, paths["compare.png"])
    paths["compare.png"].chmod(0o600)
    write_result_file(paths["compare.json"], json.dumps(comparison.to_dict(), indent=2) + "\n")
    write_result_file(paths["compare.md"], compare_markdown(comparison, paths["compare.png"].name))
    return paths
