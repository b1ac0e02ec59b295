"""A benchmark run on the control node: the sweep against any URL, its run directory, the report and the
verdict against a baseline.

``sglang-deploy bench`` runs sglang's own ``bench_serving``, one concurrency step at a time
(``sglang_deploy_host.serving.bench_steps``: on a serving host through the module sglang_bench, or here with the
lane's validator venv for ``--endpoint``), and turns the steps into a run directory:

    artifacts/bench/<host>/<UTC time>/
        results.jsonl   bench_serving's JSONL record of each step, as it wrote it (its per-request
                        lists left out; the secret fields of the server's /server_info redacted)
        sweep.json      what ran where: settings, the server's flags, lane, GPU facts, this
                        checkout's git revision, each step's outcome and bench_serving's arguments
        report.md       the table, and the verdict against a baseline
        bench.png       throughput, TTFT and ITL against concurrency

A baseline is a previous run (its directory, sweep.json or results.jsonl) or a shipped figure set
(``baselines/<name>.json`` beside this module, e.g. ``seed-004``). The verdict compares the throughputs
(higher is better) at every concurrency both have: new / baseline below 1 - threshold is a
regression. Latencies are shown beside it, not judged: their percentiles move with load noise.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sglang_deploy_host.serving import bench_steps as host_bench
from sglang_deploy import inputfiles, ownpath
from sglang_deploy.bench import quality
from sglang_deploy.launch import validator_venv
from sglang_deploy.lanes.catalog import Lane

RUN_FORMAT = 1
SHIPPED_BASELINES = Path(__file__).with_name("baselines")
# Throughputs the verdict judges (higher is better), as bench_serving names them.
VERDICT_METRICS = ("output_throughput", "total_throughput")
DEFAULT_THRESHOLD = 0.10
# sglang.benchmark.datasets imports Hugging Face `datasets` at module level for its MMMU and
# LongBench sets; random-ids never calls it. Answered by the validator's stand-in (which raises if
# called) instead of 370 MB of pyarrow and pandas; the lane's own stand-ins (torchvision) too.
BENCH_STAND_INS = ("datasets",)
# Runs bench_serving in the validator venv with those stand-ins (the probe's own mechanism), then as on a
# host: redirects off (sglang_deploy_host.serving.bench_steps.NO_REDIRECTS_RUNNER).
_RUNNER = (
    "import importlib.util, runpy, sys\n"
    "spec = importlib.util.spec_from_file_location('_validator_probe', {probe!r})\n"
    "probe = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(probe)\n"
    "probe._install_stand_ins({stand_ins!r})\n"
) + host_bench.NO_REDIRECTS_RUNNER
_GIT_TIMEOUT_S = 10
TABLE_COLUMNS = (
    ("concurrency", "concurrency", "{:d}"),
    ("prompts", "num_prompts", "{:d}"),
    ("failed", "failed_requests", "{:d}"),
    ("output tok/s", "output_throughput", "{:,.1f}"),
    ("total tok/s", "total_throughput", "{:,.1f}"),
    ("req/s", "request_throughput", "{:,.2f}"),
    ("median TTFT ms", "median_ttft_ms", "{:,.1f}"),
    ("p99 TTFT ms", "p99_ttft_ms", "{:,.1f}"),
    ("median ITL ms", "median_itl_ms", "{:,.1f}"),
    ("p99 ITL ms", "p99_itl_ms", "{:,.1f}"),
    # Speculative decoding's mean accepted tokens per step (sglang's avg_spec_accept_length, which
    # bench_serving records); "-" for a server without it.
    ("accept length", "accept_length", "{:.2f}"),
)
# A speculative run accepting fewer tokens per step than this drafts for nothing: every step still pays
# for the draft (a draft layer missing from the checkpoint, or an untrained one, accepts about 1.0).
INERT_ACCEPT_LENGTH = 1.1


class BenchInputError(ValueError):
    """A baseline, tokenizer or setting that cannot be used (CLI: one line, exit 2)."""


# --- running ------------------------------------------------------------------------------------
def bench_command(lane: Lane) -> list[str]:
    """The command that starts the lane's pinned ``sglang.bench_serving`` on this machine: the
    validator venv's interpreter (built on first use) with the stand-ins above."""
    env = validator_venv.ensure_validator_env(lane)
    code = _RUNNER.format(
        probe=str(validator_venv._PROBE),
        stand_ins=[*lane.validator.stand_ins, *BENCH_STAND_INS],
        module=host_bench.BENCH_MODULE,
    )
    return [str(validator_venv._venv_python(env)), "-c", code]


def run_sweep(
    command: Sequence[str],
    settings: host_bench.Settings,
    steps: Sequence[host_bench.Step],
    api_key: str,
    *,
    echo: Callable[[bytes], None] | None = None,
    on_step: Callable[[int, host_bench.Step, dict[str, Any] | None], None] | None = None,
) -> list[dict[str, Any]]:
    """Every step in turn (a failed one does not stop the sweep: the server's health is checked
    before each); ``on_step(index, step, None)`` before a step and with its result after."""
    results = []
    for index, step in enumerate(steps):
        if on_step is not None:
            on_step(index, step, None)
        result = host_bench.run_step(command, settings, step, api_key, echo=echo).to_dict()
        results.append(result)
        if on_step is not None:
            on_step(index, step, result)
    return results


def git_revision(project: Path) -> str:
    """This checkout's commit, ``+dirty`` when tracked files differ from it."""
    try:
        head = subprocess.run(
            ["git", "-C", str(project), "rev-parse", "HEAD"], capture_output=True, text=True,
            timeout=_GIT_TIMEOUT_S, check=True,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "-C", str(project), "status", "--porcelain", "--untracked-files=no"], capture_output=True,
            text=True, timeout=_GIT_TIMEOUT_S, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"
    return head + ("+dirty" if dirty else "")


def utc_stamp(now: float | None = None) -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))


def host_label(url: str) -> str:
    """A directory name for the server at ``url``: host and port, nothing else."""
    parts = urlsplit(url)
    label = f"{parts.hostname or 'server'}-{parts.port or (443 if parts.scheme == 'https' else 80)}"
    return re.sub(r"[^A-Za-z0-9._-]", "_", label)


def step_line(result: Mapping[str, Any]) -> str:
    """One line per finished step, for live progress."""
    head = f"concurrency {result['concurrency']}, {result['num_prompts']} prompts"
    record = result.get("record") or {}
    numbers = (
        f"{record['output_throughput']:,.1f} output / {record['total_throughput']:,.1f} total tok/s, "
        f"p99 TTFT {record['p99_ttft_ms']:,.0f} ms, p99 ITL {record['p99_itl_ms']:,.1f} ms"
        if record
        else ""
    )
    verdict = "ok" if result["ok"] else f"FAILED ({result['problem']})"
    samples = "".join(f"\n    error: {sample}" for sample in result.get("error_samples") or [])
    return f"{head}: {verdict}" + (f" - {numbers}" if numbers else "") + f" [{result['wall_s']:.0f} s]{samples}"


# --- a run on disk ------------------------------------------------------------------------------
@dataclass
class Run:
    """One sweep against one server: ``meta`` is sweep.json less its steps; ``steps`` are the
    StepResult dicts with their records."""

    meta: dict[str, Any]
    steps: list[dict[str, Any]]
    verdict: Verdict | None = None
    # Why a requested verdict could not be given (no concurrency in common with the baseline).
    verdict_problem: str | None = None

    @property
    def ok(self) -> bool:
        return bool(self.steps) and all(step["ok"] for step in self.steps)

    @property
    def failed_steps(self) -> list[dict[str, Any]]:
        return [step for step in self.steps if not step["ok"]]

    def points(self) -> dict[int, dict[str, float]]:
        """Concurrency -> bench_serving's numbers, for the steps that succeeded."""
        return {step["concurrency"]: step["record"] for step in self.steps if step["ok"] and step.get("record")}

    @property
    def server_info(self) -> dict[str, Any]:
        return next((step["record"].get("server_info") or {} for step in self.steps if step.get("record")), {})


def write_run(directory: Path, run: Run) -> dict[str, Path]:
    """results.jsonl, sweep.json, report.md and bench.png in ``directory`` (private, 0700/0600; made by this command or
    the user's own: ownpath)."""
    directory = ownpath.private_directory(directory, "the benchmark's results directory")
    paths = {name: directory / name for name in ("results.jsonl", "sweep.json", "report.md", "bench.png")}
    records = [step["record"] for step in run.steps if step.get("record")]
    write_result_file(paths["results.jsonl"], "".join(json.dumps(record) + "\n" for record in records))
    sweep = {
        **run.meta,
        "format": RUN_FORMAT,
        "steps": [{k: v for k, v in step.items() if k != "record"} for step in run.steps],
        "verdict": run.verdict.to_dict() if run.verdict else None,
    }
    write_result_file(paths["sweep.json"], json.dumps(sweep, indent=2) + "\n")
    plot(run, paths["bench.png"])
    paths["bench.png"].chmod(0o600)
    write_result_file(paths["report.md"], markdown(run, paths["bench.png"].name))
    return paths


def write_result_file(path: Path, text: str) -> None:
    """A result file, written whole into its directory (never through a link planted at its name)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    with os.fdopen(ownpath.new_file(temporary, 0o600), "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(temporary, path)


def load_run(directory: Path) -> Run:
    """A run written by write_run (its sweep.json and results.jsonl)."""
    try:
        sweep = inputfiles.read_json(directory / "sweep.json", "a run's")
        records = read_jsonl(directory / "results.jsonl")
        if not isinstance(sweep, dict) or not isinstance(sweep.get("steps", []), list):
            raise ValueError("sweep.json is not a run's (no object with steps)")
    except ValueError as err:
        raise BenchInputError(f"{directory} is no benchmark run: {err}") from None
    by_concurrency = {record.get("max_concurrency"): record for record in records}
    steps = [{**step, "record": by_concurrency.get(step["concurrency"])} for step in sweep.pop("steps", [])]
    sweep.pop("verdict", None)
    return Run(meta=sweep, steps=steps)


# What playbooks/bench.yml's meta.json says about the sweep (sweep.json keeps them under "settings").
_SETTING_KEYS = ("backend", "input_len", "output_len", "seed", "warmup_requests", "prompts_per_concurrency", "step_timeout")


def run_from_playbook(directory: Path, extra_meta: Mapping[str, Any]) -> Run:
    """The run playbooks/bench.yml wrote for one host (meta.json, steps/c<N>.json), in plan order;
    a planned step without a result (the host failed first) counts as failed."""
    try:
        meta = inputfiles.read_json(directory / "meta.json", "the playbook's")
        found = {}
        for path in (directory / "steps").glob("c*.json"):
            step = inputfiles.read_json(path, "the playbook's")
            found[step["concurrency"]] = step
    except (ValueError, KeyError, TypeError) as err:
        raise BenchInputError(f"{directory}: the playbook's results do not read: {err}") from None
    planned = meta.pop("steps", [])
    steps = [
        found.get(step["concurrency"])
        or {**step, "ok": False, "failed_requests": step["num_prompts"], "problem": "no result (the host failed before this step finished)",
            "error_samples": [], "record": None, "wall_s": 0.0, "argv": [], "output_tail": ""}
        for step in planned
    ]  # fmt: skip
    settings = {key: meta.pop(key) for key in list(meta) if key in _SETTING_KEYS}
    return Run(meta={**extra_meta, **meta, "settings": settings}, steps=steps)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    text = inputfiles.read_text(path, "bench_serving's records", inputfiles.JSON_MAX_BYTES)
    records = [json.loads(line) for line in text.splitlines() if line.strip()]
    if not all(isinstance(record, dict) for record in records):
        raise ValueError(f"{path}: every line must be a JSON object")
    return records


# --- baselines and the verdict ------------------------------------------------------------------
@dataclass(frozen=True)
class Baseline:
    """Figures to compare with: concurrency -> metric -> value."""

    name: str
    source: str
    points: dict[int, dict[str, float]]
    input_len: int | None = None
    output_len: int | None = None
    note: str = ""


def shipped_baselines() -> list[str]:
    return sorted(path.stem for path in SHIPPED_BASELINES.glob("*.json"))


def load_baseline(spec: str) -> Baseline:
    """A shipped baseline by name, a run directory, its sweep.json or results.jsonl, or a JSON file
    with ``records`` (bench_serving field names, e.g. those in baselines/)."""
    path = Path(spec)
    if not path.exists() and (SHIPPED_BASELINES / f"{spec}.json").is_file():
        path = SHIPPED_BASELINES / f"{spec}.json"
    if path.is_dir() or path.name == "sweep.json":
        directory = path if path.is_dir() else path.parent
        run = load_run(directory)
        points = run.points()
        settings = run.meta.get("settings") or {}
        return _baseline(str(directory), f"run of {run.meta.get('started', '?')} against {run.meta.get('host', '?')}",
                         points, settings.get("input_len"), settings.get("output_len"))  # fmt: skip
    try:
        if path.suffix == ".jsonl":
            records, data = read_jsonl(path), {}
        else:
            data = inputfiles.read_json(path, "--baseline")
            records = data.get("records") if isinstance(data, dict) else None
    except ValueError as err:
        known = ", ".join(shipped_baselines())
        what = str(err) if isinstance(err, inputfiles.InputFileError) else f"--baseline {spec}: cannot read it ({err})"
        raise BenchInputError(
            f"{what}. Fix: give a run directory of sglang-deploy bench, its "
            f"sweep.json or results.jsonl, a JSON file with 'records', or a shipped baseline ({known})"
        ) from None
    if not isinstance(records, list) or not records:
        raise BenchInputError(f"--baseline {spec}: no 'records' list (bench_serving records with max_concurrency)")
    points: dict[int, dict[str, float]] = {}
    for record in records:
        concurrency = record.get("max_concurrency") if isinstance(record, dict) else None
        if not isinstance(concurrency, int) or isinstance(concurrency, bool):
            raise BenchInputError(f"--baseline {spec}: a record without an integer max_concurrency: {record!r}")
        points[concurrency] = record
    lengths = [records[0].get(key, data.get(key)) for key in ("random_input_len", "random_output_len")]
    return _baseline(data.get("name") or str(path), data.get("source") or str(path), points, *lengths,
                     note=data.get("note") or "")  # fmt: skip


def _baseline(
    name: str, source: str, points: Mapping[int, Mapping[str, Any]], input_len: Any, output_len: Any, note: str = ""
) -> Baseline:
    numbers = {
        concurrency: {metric: float(record[metric]) for metric in VERDICT_METRICS if finite_number(record.get(metric))}
        for concurrency, record in points.items()
    }  # fmt: skip
    if not any(numbers.values()):
        raise BenchInputError(f"baseline {name}: no throughput figures in it")
    as_int = [int(value) if isinstance(value, int) else None for value in (input_len, output_len)]
    return Baseline(name, source, numbers, as_int[0], as_int[1], note)


def finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_lengths(baseline: Baseline, input_len: int, output_len: int) -> str | None:
    """Refuses a baseline measured with other lengths (a different workload); a note when the
    baseline does not say (the seed's figures)."""
    known = (baseline.input_len, baseline.output_len)
    if None in known:
        return f"baseline {baseline.name} does not record its input/output lengths: the ratios show direction, not precision"
    if known != (input_len, output_len):
        raise BenchInputError(
            f"baseline {baseline.name} was measured with {known[0]} input / {known[1]} output tokens, this run "
            f"uses {input_len} / {output_len}: the numbers are not comparable. Fix: pass --input-len {known[0]} "
            f"--output-len {known[1]}, or another baseline"
        )
    return None


@dataclass(frozen=True)
class Comparison:
    concurrency: int
    metric: str
    new: float
    base: float

    @property
    def ratio(self) -> float:
        return self.new / self.base if self.base else math.inf


@dataclass(frozen=True)
class Verdict:
    baseline: Baseline
    threshold: float
    comparisons: tuple[Comparison, ...]
    notes: tuple[str, ...] = ()

    @property
    def regressions(self) -> list[Comparison]:
        return [c for c in self.comparisons if c.ratio < 1.0 - self.threshold]

    @property
    def concurrencies(self) -> list[int]:
        return sorted({c.concurrency for c in self.comparisons})

    def to_dict(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline.name,
            "baseline_source": self.baseline.source,
            "threshold": self.threshold,
            "regression": bool(self.regressions),
            "notes": list(self.notes),
            "comparisons": [
                {"concurrency": c.concurrency, "metric": c.metric, "new": c.new, "baseline": c.base,
                 "ratio": c.ratio, "regression": c in self.regressions}
                for c in self.comparisons
            ],
        }  # fmt: skip


def compare(run: Run, baseline: Baseline, threshold: float, notes: Iterable[str] = ()) -> Verdict:
    """new / baseline per shared concurrency and throughput metric. A run without any concurrency in
    common with the baseline has nothing to judge: BenchInputError."""
    points = run.points()
    comparisons = tuple(
        Comparison(concurrency, metric, float(points[concurrency][metric]), base[metric])
        for concurrency, base in sorted(baseline.points.items())
        if concurrency in points
        for metric in VERDICT_METRICS
        if metric in base and finite_number(points[concurrency].get(metric))
    )
    if not comparisons:
        check_overlap(baseline, points, "measured")
    return Verdict(baseline, threshold, comparisons, tuple(notes))


def check_overlap(baseline: Baseline, concurrencies: Iterable[int], what: str = "runs") -> None:
    """BenchInputError when no concurrency of the run is one of the baseline's: no verdict possible."""
    mine = sorted(set(concurrencies))
    if not set(mine) & set(baseline.points):
        raise BenchInputError(
            f"baseline {baseline.name} has concurrencies {sorted(baseline.points)}, this run {what} "
            f"{mine or 'none'}: nothing to compare. Fix: include one of them in --concurrency"
        )


# --- the report ---------------------------------------------------------------------------------
def table_rows(run: Run) -> list[list[str]]:
    """One row per step: the step's counts, then bench_serving's numbers ("-" without a record)."""
    rows = []
    for step in run.steps:
        record = step.get("record") or {}
        values = [step.get(key, record.get(key)) for _title, key, _form in TABLE_COLUMNS]
        rows.append([form.format(v) if finite_number(v) else "-" for (_t, _k, form), v in zip(TABLE_COLUMNS, values)])
    return rows


def describe(run: Run) -> list[str]:
    """What was measured, against what, from where: the report's heading lines."""
    meta, info = run.meta, run.server_info
    settings = meta.get("settings") or {}
    lines = [
        f"server: {meta.get('url', '?')} serving {meta.get('model') or info.get('served_model_name', '?')}"
        f" (sglang {info.get('version', '?')}, tp {info.get('tp_size', '?')}, "
        f"max-running-requests {info.get('max_running_requests') or 'default'})",
        f"workload: bench_serving --backend {settings.get('backend')} --dataset-name random-ids, "
        f"{settings.get('input_len')} input / {settings.get('output_len')} output tokens per request (fixed), "
        f"{settings.get('prompts_per_concurrency')} prompts per concurrent request, seed {settings.get('seed')}, "
        f"warm-up {settings.get('warmup_requests') if settings.get('warmup_requests') is not None else 'as many requests as the concurrency'}",
        f"bench_serving from: {meta.get('bench_from', '?')}; lane {meta.get('lane', '?')}",
        "launch flags: " + (" ".join(_flag_words(meta["flags"])) if meta.get("flags") else
                            "the server's own arguments are its /server_info, in each record of results.jsonl"),
        f"checkout: {meta.get('git_revision', '?')} (sglang-deploy {meta.get('tool_version', '?')})",
        f"quality: {(quality.of_run(meta) or {}).get('line') or 'not checked (bench --quality-reference REF checks it)'}",
    ]
    gpus = (meta.get("gpu_facts") or {}).get("gpus") or []
    if gpus:
        first = gpus[0]
        lines.append(
            f"GPUs: {len(gpus)}x {first.get('name', '?')} ({first.get('memory_total_mib', '?')} MiB), driver "
            f"{(meta.get('gpu_facts') or {}).get('driver_version', '?')}"
        )
    elif meta.get("gpu_facts") is not None:
        lines.append("GPUs: none found by nvidia-smi on the host")
    standin = info.get("standin")
    if isinstance(standin, dict):
        rate = f"{standin.get('tokens_per_s'):g} tok/s per request" if standin.get("tokens_per_s") else "no per-request rate"
        cap = f"at most {standin.get('max_tokens_per_s'):g} tok/s in all" if standin.get("max_tokens_per_s") else "no total cap"
        lines.append(
            f"server is the sglang HTTP STAND-IN (tests/standin), not a GPU: {rate}, {cap}, "
            f"first token after {standin.get('ttft_ms', 0):g} ms"
        )
    return lines


def _flag_words(flags: Mapping[str, Any]) -> list[str]:
    words = []
    for name, value in flags.items():
        shown = f"${{{value['env']}}}" if isinstance(value, dict) and "env" in value else value
        words += [f"--{name}"] if value is True else [f"--{name}", str(shown)]
    return words


def markdown(run: Run, plot_name: str) -> str:
    meta = run.meta
    out = [f"# sglang serving benchmark: {meta.get('host', '?')}, {meta.get('started', '?')}", ""]
    out += [f"- {line}" for line in describe(run)]
    out += ["", "| " + " | ".join(title for title, _, _ in TABLE_COLUMNS) + " |",
            "|" + "---:|" * len(TABLE_COLUMNS)]  # fmt: skip
    out += ["| " + " | ".join(row) + " |" for row in table_rows(run)]
    for step in run.failed_steps:
        out.append(f"\n**concurrency {step['concurrency']} FAILED**: {step['problem']}")
        out += [f"  - `{sample}`" for sample in step.get("error_samples") or []]
    out += ["", f"![throughput, TTFT and ITL against concurrency]({plot_name})", ""]
    if run.verdict is not None:
        out += verdict_markdown(run.verdict)
    out.append(f"Verdict: **{overall(run)}**")
    return "\n".join(out) + "\n"


def verdict_markdown(verdict: Verdict) -> list[str]:
    out = [f"## Against {verdict.baseline.name} (a regression: below {1 - verdict.threshold:.0%} of it)", ""]
    out += [verdict.baseline.source, ""] + ([verdict.baseline.note, ""] if verdict.baseline.note else [])
    out += [f"Note: {note}" for note in verdict.notes] + ([""] if verdict.notes else [])
    out += ["| concurrency | metric | this run | baseline | ratio | |", "|---:|---|---:|---:|---:|---|"]
    for c in verdict.comparisons:
        mark = "REGRESSION" if c in verdict.regressions else ("faster" if c.ratio > 1 + verdict.threshold else "same")
        out.append(f"| {c.concurrency} | {c.metric} | {c.new:,.1f} | {c.base:,.1f} | {c.ratio:.2f} | {mark} |")
    return [*out, ""]


def inert_points(points: Mapping[int, Mapping[str, Any]]) -> list[tuple[int, float]]:
    """(concurrency, accept length) where the server decoded speculatively and accepted under
    :data:`INERT_ACCEPT_LENGTH` tokens per step."""
    found = []
    for concurrency, record in sorted(points.items()):
        length = record.get("accept_length")
        if finite_number(length) and length < INERT_ACCEPT_LENGTH:
            found.append((concurrency, float(length)))
    return found


def inert_line(found: Sequence[tuple[int, float]]) -> str:
    lengths = ", ".join(f"{length:.2f} at {c}" for c, length in found)
    return (
        f"INERT: speculative decoding accepts {lengths} tokens per step (under {INERT_ACCEPT_LENGTH}): the draft "
        "costs every step and saves none, and sglang does not say so. A draft layer missing from the checkpoint "
        "(or an untrained one) does this: check it with sglang-deploy checkpoint DIR, or launch without the "
        "speculative flags"
    )


def overall(run: Run) -> str:
    """FAILED (a step failed), INERT (speculative decoding that accepts nothing), REGRESSION, or ok."""
    if not run.ok:
        failures = [f"concurrency {step['concurrency']}: {step['problem']}" for step in run.failed_steps]
        return f"FAILED ({'; '.join(failures) or 'no steps'})"
    inert = inert_points(run.points())
    if inert:
        return inert_line(inert)
    checked = quality.of_run(run.meta)
    if not quality.passed(checked):
        assert checked is not None
        return f"QUALITY {checked['verdict']}: {checked['line']}"
    if run.verdict_problem is not None:
        return f"NO VERDICT ({run.verdict_problem})"
    if run.verdict is not None and run.verdict.regressions:
        worst = min(run.verdict.regressions, key=lambda c: c.ratio)
        return (
            f"REGRESSION against {run.verdict.baseline.name}: {worst.metric} at concurrency {worst.concurrency} "
            f"is {worst.ratio:.2f}x the baseline ({len(run.verdict.regressions)} below {1 - run.verdict.threshold:.0%})"
        )
    return "ok" + (f" against {run.verdict.baseline.name}" if run.verdict is not None else "")


def plot(run: Run, path: Path) -> None:
    """Throughput, TTFT and ITL against concurrency (log2 axis), the baseline's throughputs dashed."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a control node or in CI
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    points = run.points()
    xs = sorted(points)
    if not xs:
        fig, axis = plt.subplots(figsize=(8, 3))
        axis.axis("off")
        axis.text(0.5, 0.5, f"{run.meta.get('host', '?')}: no step succeeded - {overall(run)}", ha="center", wrap=True)
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    panels = (
        ("throughput (tok/s)", (("output_throughput", "output"), ("total_throughput", "total"))),
        ("time to first token (ms)", (("median_ttft_ms", "median"), ("p99_ttft_ms", "p99"))),
        ("inter-token latency (ms)", (("median_itl_ms", "median"), ("p99_itl_ms", "p99"))),
    )
    baseline = run.verdict.baseline if run.verdict is not None else None
    for axis, (title, series) in zip(axes, panels):
        for key, label in series:
            (line,) = axis.plot(xs, [points[x][key] for x in xs], marker="o", label=label)
            if baseline is not None and key in VERDICT_METRICS:
                bx = sorted(c for c, values in baseline.points.items() if key in values)
                if bx:
                    axis.plot(bx, [baseline.points[c][key] for c in bx], linestyle="--", marker="s", fillstyle="none",
                              color=line.get_color(), label=f"{label}, {baseline.name}")  # fmt: skip
        axis.set_title(title)
        axis.set_xlabel("concurrent requests")
        axis.set_xscale("log", base=2)
        ticks = sorted(set(xs) | (set(baseline.points) if baseline is not None else set()))
        axis.xaxis.set_major_locator(FixedLocator(ticks))
        axis.xaxis.set_minor_locator(NullLocator())
        axis.xaxis.set_major_formatter(ScalarFormatter())
        axis.set_ylim(bottom=0)
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8)
    settings = run.meta.get("settings") or {}
    failed = [str(step["concurrency"]) for step in run.failed_steps]
    fig.suptitle(
        f"{run.meta.get('host', '?')} - {run.meta.get('model', '?')} - bench_serving --backend {settings.get('backend')}, "
        f"{settings.get('input_len')} in / {settings.get('output_len')} out tokens - {run.meta.get('started', '?')}"
        + (f" - FAILED at concurrency {', '.join(failed)}" if failed else "")
    )
    if isinstance(run.server_info.get("standin"), dict):
        fig.text(0.5, 0.005, "server: the sglang HTTP stand-in (tests/standin), not a GPU", ha="center", fontsize=9, style="italic")
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    fig.savefig(path, dpi=100)
    plt.close(fig)
