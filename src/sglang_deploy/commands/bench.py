"""``sglang-deploy bench``: a concurrency sweep with sglang's own bench_serving, a report (JSONL,
table, plot) and a verdict against a baseline. Exit 0: every step ran clean and nothing regressed;
1: a step failed (its failed requests counted) or a throughput fell below the threshold; 2: bad input.

  sglang-deploy bench -i INVENTORY [-l HOST]
      playbooks/bench.yml: on each serving host, bench_serving from the host's ml-env against the
      host's own server; the API key is read there from the unit's 0600 environment file.
  sglang-deploy bench --endpoint URL --model NAME --tokenizer PATH
      any server, with the lane's pinned bench_serving from its validator venv here. The API key
      comes from $SGLANG_API_KEY or --api-key-file (never from the command line, which every user
      of the machine can read).
  sglang-deploy bench --compare A B
      two stored runs (or a run and a shipped baseline such as seed-004) side by side, no sweep:
      a table per concurrency with B/A for each metric, one plot and a verdict (exit 1 when B is
      slower beyond --threshold or failed a step). With -i or --endpoint and one run, --compare A
      puts the new sweep (B) beside A.

Results: artifacts/bench/<host>/<UTC time>/ (results.jsonl, sweep.json, report.md, bench.png).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from sglang_deploy_host.serving import bench_steps as host_bench
from sglang_deploy_host.serving import endpoint, unit_flags
from sglang_deploy_host.serving import quality as host_quality
from sglang_deploy_host.serving import quality_reference
from sglang_deploy import __version__
from sglang_deploy.bench import comparison as bench_comparison
from sglang_deploy.bench import quality as bench_quality
from sglang_deploy.bench import runs as bench_runs
from sglang_deploy.playbook import runner
from sglang_deploy.commands import common
from sglang_deploy.lanes.catalog import DEFAULT_LANE, LaneError, load_lane
from sglang_deploy.launch.validator_venv import ValidatorError

_console = Console(stderr=True, highlight=False, soft_wrap=True)
PLAYBOOK = "playbooks/bench.yml"
ROLE = "sglang_deploy_bench"
STEP_TASK = "Run bench_serving at each concurrency"

BACKEND_HELP = (
    "bench_serving backend (sglang: the native /generate, which counts every generated token). "
    "The OpenAI chat backend (sglang-oai-chat) counts only delta.content, so with --reasoning-parser "
    "(glm45 in the profile) the thinking tokens are invisible to it: its TTFT is the time to the first "
    "answer token after the thinking, its ITL and token counts are wrong"
)


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "bench",
        help="concurrency sweep with sglang's bench_serving: report, plot, verdict against a baseline",
        description=__doc__.split("\n\n", 1)[0].replace("``", "") if __doc__ else None,
    )
    common.add_inventory_args(parser)
    where = parser.add_argument_group("--endpoint mode (any server)")
    where.add_argument("--endpoint", metavar="URL", help="benchmark this server, e.g. http://10.0.0.5:8000")
    where.add_argument("--model", help="served model name (with --endpoint)")
    where.add_argument(
        "--tokenizer",
        help="the model's tokenizer directory (required with --endpoint; with -i a path on the host, "
        "default the server's tokenizer-path or model directory)",
    )
    common.add_api_key_args(where)
    common.add_cafile_arg(where)
    where.add_argument("--lane", default=DEFAULT_LANE, help=f"whose pinned bench_serving runs (default {DEFAULT_LANE})")
    sweep = parser.add_argument_group("the sweep")
    sweep.add_argument(
        "--concurrency", type=_concurrencies,
        help="comma-separated concurrencies (default 1,8,16,32,64, capped and topped by the server's --max-running-requests)",
    )  # fmt: skip
    # The sweep's defaults are the role's (roles/sglang_deploy_bench/defaults/main.yml), for -i and --endpoint alike.
    role = common.role_defaults(ROLE)

    def default(name: str) -> Any:
        return role.get(f"{ROLE}_{name}")

    sweep.add_argument(
        "--prompts-per-concurrency", type=int, default=default("prompts_per_concurrency"),
        help=f"prompts per concurrent request in each step (default {default('prompts_per_concurrency')}, "
        f"minimum {host_bench.MIN_PROMPTS_PER_CONCURRENCY})",
    )  # fmt: skip
    sweep.add_argument("--input-len", type=int, default=default("input_len"), help=f"input tokens per request (default {default('input_len')})")
    sweep.add_argument("--output-len", type=int, default=default("output_len"), help=f"output tokens per request (default {default('output_len')})")
    sweep.add_argument("--backend", choices=host_bench.BACKENDS, default=default("backend"),
                       help=f"{BACKEND_HELP} (default {default('backend')})")  # fmt: skip
    sweep.add_argument("--seed", type=int, default=default("seed"), help=f"bench_serving's random seed (default {default('seed')})")
    sweep.add_argument("--warmup-requests", type=int, default=default("warmup_requests"),
                       help="warm-up requests before each step (default: the step's concurrency)")  # fmt: skip
    sweep.add_argument(
        "--step-timeout", type=float, default=default("step_timeout"),
        help=f"seconds one step may take before bench_serving is killed (default {default('step_timeout')})",
    )  # fmt: skip
    verdict = parser.add_argument_group("the verdict")
    verdict.add_argument(
        "--baseline",
        help="a previous run (its directory, sweep.json or results.jsonl), a JSON file with 'records', or a "
        f"shipped baseline: {', '.join(bench_runs.shipped_baselines())}",
    )
    verdict.add_argument(
        "--compare", nargs="+", metavar="RUN",
        help="A B: two stored runs (or a shipped baseline) side by side, no sweep; A with -i/--endpoint: the new "
        "sweep beside A. Table, one plot and a verdict (compare.md, compare.png, compare.json)",
    )  # fmt: skip
    verdict.add_argument(
        "--quality-reference", metavar="REF",
        help="after the sweep, check the launch against this quality reference (sglang-deploy quality record): the "
        "verdict is kept in the run and shown beside the speed; a FAIL fails the run (docs/quality.md)",
    )  # fmt: skip
    verdict.add_argument(
        "--threshold", type=float, default=bench_runs.DEFAULT_THRESHOLD,
        help="a throughput below (1 - THRESHOLD) x the baseline's is a regression (default 0.10)",
    )  # fmt: skip
    parser.add_argument("--out", help="results root (default: the project's artifacts/bench)")
    parser.set_defaults(func=run)


def _concurrencies(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: concurrencies are integers >= 1")
    return values


def run(args: argparse.Namespace) -> int:
    try:
        args.resolved_api_key = common.api_key_from(args)
    except common.ApiKeyError as err:
        return common.usage_error("bench", str(err))
    sweep = ("prompts-per-concurrency", "input-len", "output-len", "backend", "seed", "step-timeout")
    refused = common.missing_role_defaults("bench", ROLE, {f"--{o}": getattr(args, o.replace("-", "_")) for o in sweep})
    if refused is not None:
        return refused
    if not (0 < args.threshold < 1):
        return common.usage_error("bench", f"--threshold {args.threshold} must be between 0 and 1 (0.10 = 10% slower is a regression)")
    out = Path(args.out).resolve() if args.out else runner.state_dir() / "artifacts" / "bench"
    if args.compare and len(args.compare) > 2:
        return common.usage_error("bench", f"--compare takes one run (with -i/--endpoint) or two (A B), not {len(args.compare)}")
    if args.compare and len(args.compare) == 2:
        if args.endpoint or args.inventory or args.limit or args.baseline or args.quality_reference:
            return common.usage_error("bench", "--compare A B compares two stored runs (with the quality verdicts they keep); it runs no "
                               "sweep (drop -i/--endpoint/--baseline/--quality-reference)")
        return run_compare(args.compare[0], args.compare[1], args.threshold, out)
    try:
        # Everything that can be refused before a host or server is contacted (the plan itself needs
        # the server's --max-running-requests, known only later).
        host_bench.check_numbers(args.backend, args.input_len, args.output_len, args.warmup_requests, args.step_timeout)
        host_bench.plan(args.concurrency, None, args.prompts_per_concurrency)
        baseline = bench_runs.load_baseline(args.baseline) if args.baseline else None
        notes = [note for note in [bench_runs.check_lengths(baseline, args.input_len, args.output_len)] if note] if baseline else []
        against = bench_comparison.load_side(args.compare[0]) if args.compare else None
        if against is not None and None not in (against.input_len, against.output_len) and (
            (against.input_len, against.output_len) != (args.input_len, args.output_len)
        ):
            raise bench_runs.BenchInputError(
                f"--compare {args.compare[0]} ran {against.input_len} input / {against.output_len} output tokens, this "
                f"sweep would run {args.input_len} / {args.output_len}. Fix: pass --input-len {against.input_len} "
                f"--output-len {against.output_len}"
            )
    except (host_bench.BenchError, bench_runs.BenchInputError) as err:
        return common.usage_error("bench", str(err))
    args.compare_side = against
    try:
        args.quality = quality_reference.load_reference(args.quality_reference) if args.quality_reference else None
    except quality_reference.QualityInputError as err:
        return common.usage_error("bench", f"--quality-reference {err}")
    if args.endpoint:
        if args.inventory or args.limit:
            return common.usage_error("bench", "--endpoint benchmarks one URL; it does not take -i/-l")
        return run_endpoint(args, out, baseline, notes)
    if args.model or args.api_key_file or args.cafile:
        return common.usage_error(
            "bench", "--model/--api-key-file/--cafile go with --endpoint URL (with -i they come from the inventory and the host)"
        )
    return run_inventory(args, out, baseline, notes)


# --- --endpoint -----------------------------------------------------------------------------------
def _server_info(url: str, api_key: str, cafile: str = "") -> dict[str, Any]:
    """The server's /server_info (sglang: every launch argument), {} when it does not answer one."""
    try:
        response = endpoint.Endpoint(url, api_key=api_key, cafile=cafile).get("/server_info")
        info = response.json() if response.status == 200 else {}
    except endpoint.EndpointError:
        return {}
    return info if isinstance(info, dict) else {}


def run_endpoint(args: argparse.Namespace, out: Path, baseline: bench_runs.Baseline | None, notes: list[str]) -> int:
    if not args.model or not args.tokenizer:
        return common.usage_error("bench", "--endpoint needs --model NAME (the served name) and --tokenizer PATH (the model's tokenizer directory)")
    try:
        unit_flags.check_url(args.endpoint)
        cafile = common.cafile_from(args)
        api_key = args.resolved_api_key
        lane = load_lane(args.lane)
    except (ValueError, LaneError) as err:
        return common.usage_error("bench", str(err))
    tokenizer = Path(args.tokenizer)
    if not (tokenizer / "tokenizer_config.json").is_file() and not tokenizer.is_file():
        return common.usage_error("bench", f"--tokenizer {tokenizer}: no tokenizer there (a directory with tokenizer_config.json, as a model has)")
    settings = host_bench.Settings(
        base_url=args.endpoint, model=args.model, tokenizer=str(tokenizer.resolve()), backend=args.backend,
        input_len=args.input_len, output_len=args.output_len, seed=args.seed,
        warmup_requests=args.warmup_requests, timeout_s=args.step_timeout, cafile=cafile,
    )  # fmt: skip
    try:
        top = _server_info(args.endpoint, api_key, cafile).get("max_running_requests")
        steps = host_bench.plan(args.concurrency, top if isinstance(top, int) else None, args.prompts_per_concurrency)
        if baseline is not None:
            bench_runs.check_overlap(baseline, [step.concurrency for step in steps])
        command = bench_runs.bench_command(lane)
    except (host_bench.BenchError, bench_runs.BenchInputError, ValidatorError) as err:
        return common.usage_error("bench", str(err))
    started = time.time()
    label = bench_runs.host_label(args.endpoint)
    _console.print(
        f"bench {escape(args.endpoint)} ({escape(args.model)}): concurrency {', '.join(str(s.concurrency) for s in steps)}, "
        f"{args.input_len} in / {args.output_len} out tokens, bench_serving of sglang {lane.sglang} (lane {lane.name})"
    )
    live = _console.is_terminal
    results = bench_runs.run_sweep(
        command, settings, steps, api_key,
        echo=(lambda chunk: (sys.stderr.buffer.write(chunk), sys.stderr.flush())) if live else None,
        on_step=lambda index, step, result: _progress(label, index, len(steps), step, result),
    )  # fmt: skip
    meta = {
        "tool": "sglang-deploy bench", "tool_version": __version__, "mode": "endpoint", "host": label,
        "url": args.endpoint, "model": args.model, "tokenizer": settings.tokenizer,
        "started": bench_runs.utc_stamp(started), "finished": bench_runs.utc_stamp(),
        "lane": lane.name, "bench_from": f"the lane's validator venv (sglang {lane.sglang}) on the control node",
        "git_revision": bench_runs.git_revision(runner.project_dir()), "gpu_facts": None, "flags": None,
        "settings": _settings(args),
    }  # fmt: skip
    if args.quality is not None:
        meta["quality"] = _check_endpoint(args.quality, endpoint.Endpoint(args.endpoint, api_key=api_key, cafile=cafile))
    return _finish([(out / label / bench_runs.utc_stamp(started), bench_runs.Run(meta=meta, steps=results))], baseline, args.threshold, notes,
                   args.compare_side)


def _check_endpoint(reference: quality_reference.Reference, target: endpoint.Endpoint) -> dict[str, Any]:
    """The quality check of the benchmarked server, as a run keeps it (bench/quality.py)."""
    _console.print(f"quality check against the reference recorded {escape(reference.recorded)} ...")
    try:
        verdict = host_quality.check(target, reference)
    except (host_quality.NoVerdictError, endpoint.EndpointError) as err:
        kept = bench_quality.summary(None, " ".join(str(err).split()))
    else:
        kept = bench_quality.summary(verdict.to_dict())
    _console.print(f"[{'green' if bench_quality.passed(kept) else 'red'}]{escape(kept['line'])}[/]")
    return kept


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """What the sweep ran with (playbooks/bench.yml records the same keys for -i)."""
    return {
        "backend": args.backend, "input_len": args.input_len, "output_len": args.output_len, "seed": args.seed,
        "warmup_requests": args.warmup_requests, "prompts_per_concurrency": args.prompts_per_concurrency,
        "step_timeout": args.step_timeout,
    }  # fmt: skip


def _progress(host: str, index: int, total: int, step: host_bench.Step, result: Mapping[str, Any] | None) -> None:
    if result is None:
        _console.print(f"{time.strftime('%H:%M:%S')} {host} [{index + 1}/{total}] concurrency {step.concurrency}, {step.num_prompts} prompts ...")
    else:
        style = "green" if result["ok"] else "red"
        _console.print(f"[{style}]{time.strftime('%H:%M:%S')} {escape(host)} [{index + 1}/{total}] {escape(bench_runs.step_line(result))}[/]")


# --- -i INVENTORY ---------------------------------------------------------------------------------
class _InventoryProgress:
    """ansible-runner events -> the runner's plain lines (tasks, failures, "still running" while a
    step polls) and a line per finished step with what it measured."""

    def __init__(self) -> None:
        self.view = runner.ProgressView(_console, plain=True)

    def handle(self, event: Mapping[str, Any]) -> bool:
        keep = self.view.handle(event)
        data = event.get("event_data") or {}
        step = (data.get("res") or {}).get("step")
        if event.get("event") == "runner_item_on_ok" and data.get("task") == STEP_TASK and isinstance(step, dict):
            style = "green" if step.get("ok") else "red"
            _console.print(f"[{style}]{time.strftime('%H:%M:%S')} {escape(str(data.get('host')))} {escape(bench_runs.step_line(step))}[/]")
        return keep


def run_inventory(args: argparse.Namespace, out: Path, baseline: bench_runs.Baseline | None, notes: list[str]) -> int:
    import ansible_runner  # heavy import, only when a playbook runs

    inventories = args.inventory or [str(runner.project_dir() / "inventory" / "proxmox")]
    runner.serving_hosts(inventories, args.limit)  # RunnerError -> exit 2 before anything runs
    runner.ansible_executable("ansible-playbook")
    started = time.time()
    stamp = bench_runs.utc_stamp(started)
    extravars: dict[str, Any] = {
        "sglang_deploy_bench_out": str(out), "sglang_deploy_bench_stamp": stamp,
        "sglang_deploy_bench_concurrency": args.concurrency or [],
        "sglang_deploy_bench_prompts_per_concurrency": args.prompts_per_concurrency,
        "sglang_deploy_bench_input_len": args.input_len, "sglang_deploy_bench_output_len": args.output_len,
        "sglang_deploy_bench_backend": args.backend, "sglang_deploy_bench_seed": args.seed,
        "sglang_deploy_bench_warmup_requests": args.warmup_requests,
        "sglang_deploy_bench_step_timeout": args.step_timeout,
    }  # fmt: skip
    if args.tokenizer:
        extravars["sglang_deploy_bench_tokenizer"] = args.tokenizer
    progress = _InventoryProgress()
    project = runner.project_dir()
    # Not runner.run_playbook: its view has no hook for the steps' own lines.
    result = ansible_runner.run(
        **runner.runner_kwargs(runner.state_dir() / "artifacts", event_handler=progress.handle, ident=runner.run_ident("bench")),
        project_dir=str(project), playbook=str(project / PLAYBOOK),
        inventory=[str(Path(i).resolve()) for i in inventories], extravars=extravars, limit=args.limit,
    )  # fmt: skip
    runner.redact_secret_env(Path(result.config.artifact_dir))
    for line in progress.view.recap_lines():
        _console.print(line, markup=False)
    extra = {
        "tool": "sglang-deploy bench", "tool_version": __version__, "mode": "inventory",
        "started": stamp, "finished": bench_runs.utc_stamp(), "git_revision": bench_runs.git_revision(project),
    }  # fmt: skip
    checked = _check_inventory(args, inventories) if args.quality is not None else {}
    runs = []
    for directory in sorted(out.glob(f"*/{stamp}")):
        try:
            run = bench_runs.run_from_playbook(directory, extra)
        except bench_runs.BenchInputError as err:
            _console.print(f"[red]{escape(str(err))}[/]")
            continue
        flags = run.meta.get("flags") or {}
        run.meta["bench_from"] = f"{run.meta.get('python', '?')} (the ml-env) on the host"
        run.meta["url"] = f"{unit_flags.base_url(flags)} on {run.meta.get('host', '?')}"
        run.meta["model"] = unit_flags.served_model_name(flags)
        if args.quality is not None:
            run.meta["quality"] = checked.get(str(run.meta.get("host")), bench_quality.summary(None, "the host ran no check"))
        runs.append((directory, run))
    status = _finish(runs, baseline, args.threshold, notes, args.compare_side) if runs else 1
    if result.rc != 0 or not runs:
        _console.print(f"[red]the benchmark playbook failed[/] ({result.status}); artifacts: {result.config.artifact_dir}")
        return max(status, 1)
    return status


def _check_inventory(args: argparse.Namespace, inventories: list[str]) -> dict[str, dict[str, Any]]:
    """The quality check on each benchmarked host (playbooks/quality.yml), as the runs keep it, by host."""
    from sglang_deploy.commands.quality import quality_via_ansible

    results = quality_via_ansible(inventories, args.limit, {
        "sglang_deploy_quality_action": "check", "sglang_deploy_quality_reference": str(Path(args.quality_reference).resolve()),
    })  # fmt: skip
    kept = {}
    for host, result in results.items():
        verdict = result.get("verdict")
        kept[host] = bench_quality.summary(verdict) if isinstance(verdict, dict) else bench_quality.summary(None, str(result.get("msg") or "?"))
        _console.print(f"{escape(host)}: {escape(kept[host]['line'])}")
    return kept


# --- the report -----------------------------------------------------------------------------------
def run_compare(spec_a: str, spec_b: str, threshold: float, out: Path) -> int:
    """--compare A B: two stored runs side by side, written to OUT/compare/<UTC time>/."""
    try:
        comparison = bench_comparison.compare_sides(bench_comparison.load_side(spec_a), bench_comparison.load_side(spec_b), threshold)
    except bench_runs.BenchInputError as err:
        return common.usage_error("bench", str(err))
    return _report_comparison(out / "compare" / bench_runs.utc_stamp(), comparison)


def _report_comparison(directory: Path, comparison: bench_comparison.RunComparison) -> int:
    paths = bench_comparison.write_comparison(directory, comparison)
    width = None if _console.is_terminal else 160
    _console.print(_compare_table(comparison), width=width)
    for note in comparison.notes:
        _console.print(f"note: {escape(note)}")
    style = "green" if comparison.ok else "red"
    _console.print(f"[{style}]{escape(comparison.verdict())}[/]")
    _console.print(f"comparison: {paths['compare.md']}\nplot:       {paths['compare.png']}")
    print(paths["compare.md"])
    return 0 if comparison.ok else 1


def _compare_table(comparison: bench_comparison.RunComparison) -> Table:
    table = Table(title=f"B: {comparison.b.name}  against  A: {comparison.a.name}")
    table.add_column("concurrency", justify="right")
    for _metric, title, _higher in bench_comparison.COMPARE_METRICS:
        table.add_column(f"{title} A / B", justify="right")
    for row in comparison.rows:
        table.add_row(str(row.concurrency), *(row.cell(metric) for metric, _title, _higher in bench_comparison.COMPARE_METRICS))
    return table


def _finish(
    runs: list[tuple[Path, bench_runs.Run]], baseline: bench_runs.Baseline | None, threshold: float, notes: list[str],
    against: bench_comparison.Side | None = None,
) -> int:
    """Verdict, files and a summary for each run (and, with --compare A, the run beside A); the exit
    status of them all."""
    status = 0
    for directory, run in runs:
        if baseline is not None:
            try:
                run.verdict = bench_runs.compare(run, baseline, threshold, notes)
            except bench_runs.BenchInputError as err:
                run.verdict_problem = str(err)
        paths = bench_runs.write_run(directory, run)
        # A log or a pipe is not 80 columns wide: the numbers must not be cut there.
        width = None if _console.is_terminal else 160
        _console.print(_table(run), width=width)
        if run.verdict is not None:
            _console.print(_verdict_table(run.verdict), width=width)
        verdict = bench_runs.overall(run)
        style = "green" if verdict.startswith("ok") else "red"
        _console.print(f"[{style}]{escape(run.meta.get('host', '?'))}: {escape(verdict)}[/]")
        _console.print(f"report: {paths['report.md']}\nplot:   {paths['bench.png']}")
        print(paths["report.md"])
        if not verdict.startswith("ok"):
            status = 1
        if against is not None:
            comparison = bench_comparison.compare_sides(against, bench_comparison.side_of_run(directory, run), threshold)
            status = max(status, _report_comparison(directory, comparison))
    return status


def _table(run: bench_runs.Run) -> Table:
    table = Table(title=f"{run.meta.get('host', '?')} - {run.meta.get('model', '?')}")
    for title, _key, _form in bench_runs.TABLE_COLUMNS:
        table.add_column(title, justify="right")
    for step, row in zip(run.steps, bench_runs.table_rows(run)):
        table.add_row(*row, style=None if step["ok"] else "red")
    return table


def _verdict_table(verdict: bench_runs.Verdict) -> Table:
    table = Table(title=f"against {verdict.baseline.name} (regression below {1 - verdict.threshold:.0%})")
    for column in ("concurrency", "metric", "this run", "baseline", "ratio"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    for c in verdict.comparisons:
        style = "red" if c in verdict.regressions else None
        table.add_row(str(c.concurrency), c.metric, f"{c.new:,.1f}", f"{c.base:,.1f}", f"{c.ratio:.2f}", style=style)
    return table
