"""``sglang-deploy quality``: the served model's token distribution against a reference recorded on a known-good
launch (module_utils/sglang_deploy_host/serving/quality.py; docs/quality.md).

  sglang-deploy quality record --endpoint URL --model NAME --out REF.json [--prompts FILE]
  sglang-deploy quality record -i INVENTORY --host HOST --out REF.json [--prompts FILE]
      the prompt set (default: the shipped sglang-deploy-default v1) answered by this launch: teacher-forced
      top-k logprobs of each fixed continuation, greedy outputs at concurrency 1 and as a batch (>= 8).
      Record it once, on a conservative launch known to be good.
  sglang-deploy quality check --reference REF.json --endpoint URL
  sglang-deploy quality check --reference REF.json -i INVENTORY [--host HOST]
      per-token KL divergence (mean, p99), top-1 agreement, greedy agreement and batch consistency against
      the reference: PASS or FAIL with the numbers (--json: all of them).

With -i the work runs on the host (playbooks/quality.yml, the module sglang_quality), against its server's own
URL, with the key read there from the unit's 0600 environment file. With --endpoint the key comes from
$SGLANG_API_KEY or --api-key-file (never from the command line). Exit 0 PASS (or recorded), 1 FAIL, 2 no verdict:
bad input, a reference from another model or tokenizer, a server that returns no logprobs or does not answer.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import stat
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sglang_deploy_host.serving import endpoint, quality, quality_reference
from sglang_deploy_host.serving import unit_flags
from sglang_deploy import ownpath
from sglang_deploy.commands import common
from sglang_deploy.playbook import runner

PLAYBOOK = "playbooks/quality.yml"
THRESHOLD_OPTIONS = {
    "kl_mean": "--max-kl-mean",
    "kl_p99": "--max-kl-p99",
    "top1_agreement": "--min-top1",
    "tie_margin": "--tie-margin",
}

THRESHOLD_HELP = {
    "kl_mean": "the highest mean per-token KL divergence that passes",
    "kl_p99": "the highest 99th-percentile per-token KL divergence that passes",
    "top1_agreement": "the lowest share of positions with the reference's first token that passes",
    "tie_margin": "a greedy output may part from the one it is compared with where the top-2 margin is at most this",
}


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "quality",
        help="the served token distribution against a reference of a known-good launch (record / check)",
        description=__doc__.split("\n\n", 1)[0].replace("``", "") if __doc__ else None,
    )
    actions = parser.add_subparsers(dest="action", required=True)
    record = actions.add_parser("record", help="record a reference on a known-good launch")
    _target_args(record)
    record.add_argument("--model", help="the served model name (with --endpoint)")
    record.add_argument("--prompts", help=f"a prompt set file (default: the shipped {quality_reference.DEFAULT_PROMPTS.name})")
    record.add_argument("--out", required=True, help="the reference file to write (JSON)")
    _threshold_args(record, "stored in the reference")
    check = actions.add_parser("check", help="check a launch against a reference")
    _target_args(check)
    check.add_argument("--reference", required=True, help="a reference file (`quality record`)")
    _threshold_args(check, "instead of the reference's")
    for sub in (record, check):
        sub.add_argument("--json", action="store_true", help="print the whole verdict (or the recording's summary) as JSON")
        sub.set_defaults(func=run)


def _target_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-i", "--inventory", action="append", help="run on this inventory's host (repeatable)")
    parser.add_argument("--host", help="the inventory host (default: every serving host; record takes one)")
    parser.add_argument("--endpoint", metavar="URL", help="any server, e.g. http://10.0.0.5:8000")
    common.add_api_key_args(parser)
    common.add_cafile_arg(parser)


def _threshold_args(parser: argparse.ArgumentParser, where: str) -> None:
    defaults = quality_reference.Thresholds()
    for field, option in THRESHOLD_OPTIONS.items():
        parser.add_argument(option, type=float, dest=f"threshold_{field}", metavar="SHARE" if field == "top1_agreement" else "NATS",
                            help=f"{THRESHOLD_HELP[field]} ({where}; default {getattr(defaults, field):g})")  # fmt: skip


def thresholds_from(args: argparse.Namespace, base: quality_reference.Thresholds) -> quality_reference.Thresholds:
    """``base`` with the options given on the command line (checked as a reference's are)."""
    given = {field: getattr(args, f"threshold_{field}") for field in THRESHOLD_OPTIONS if getattr(args, f"threshold_{field}") is not None}
    return base.merged(given, "the threshold options")


def run(args: argparse.Namespace) -> int:
    command = f"quality {args.action}"
    if bool(args.endpoint) == bool(args.inventory):
        return common.usage_error(command, "give --endpoint URL or -i INVENTORY (one of them)")
    try:
        if args.action == "record":
            prompts = quality_reference.load_prompt_set(args.prompts)
            limits = thresholds_from(args, quality_reference.Thresholds())
            out = output_path(args.out)
        else:
            reference = quality_reference.load_reference(args.reference)
            limits = thresholds_from(args, reference.thresholds)
    except (quality_reference.QualityInputError, ValueError) as err:
        return common.usage_error(command, str(err))
    if args.endpoint:
        return _on_endpoint(args, command, prompts if args.action == "record" else None,
                            reference if args.action == "check" else None, limits,
                            out if args.action == "record" else None)  # fmt: skip
    if args.model or args.api_key_file or args.cafile:
        return common.usage_error(command, "--model/--api-key-file/--cafile go with --endpoint URL (with -i they come from the inventory and the host)")
    return _on_inventory(args, command, limits, out if args.action == "record" else None)


def _on_endpoint(args: argparse.Namespace, command: str, prompts: quality_reference.PromptSet | None,
                 reference: quality_reference.Reference | None, limits: quality_reference.Thresholds, out: Path | None) -> int:  # fmt: skip
    try:
        key = common.api_key_from(args)
        target = endpoint.Endpoint(unit_flags.check_url(args.endpoint), api_key=key, cafile=common.cafile_from(args))
    except (common.ApiKeyError, ValueError) as err:
        return common.usage_error(command, str(err))
    try:
        if prompts is not None:
            if not args.model:
                return common.usage_error(command, "--endpoint needs --model NAME (the served model name)")
            assert out is not None
            return _write_reference(out, quality.record(target, args.model, prompts, limits), args.json)
        assert reference is not None
        verdict = quality.check(target, reference, limits)
    except (quality.NoVerdictError, endpoint.EndpointError) as err:
        return common.usage_error(command, f"no verdict: {' '.join(str(err).split())}")
    return show_verdict(verdict.to_dict(), verdict.report(), args.json)


def show_verdict(data: Mapping[str, Any], report: str, as_json: bool) -> int:
    print(json.dumps(data, indent=2) if as_json else report)
    return 0 if data.get("verdict") == "PASS" else 1


def output_path(path: str) -> Path:
    """Where a reference is written: a new file, or a regular file (never through a link), in a directory of the
    invoking user's (or a sticky one: ownpath.parent_of_new_file)."""
    try:
        out = ownpath.parent_of_new_file(path, "--out")
    except ownpath.UnsafeDirectoryError as err:
        raise ValueError(str(err)) from None
    if out.is_symlink():
        raise ValueError(f"--out {out} is a symbolic link: give the file itself")
    if out.exists() and not out.is_file():
        raise ValueError(f"--out {out} exists and is not a regular file")
    return out


def _write_reference(out: Path, data: Mapping[str, Any], as_json: bool) -> int:
    """The reference, written whole or not at all (a temporary file beside it, then renamed)."""
    fd, temporary = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle)
            handle.write("\n")
        os.chmod(temporary, stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP | stat.S_IROTH)
        os.replace(temporary, out)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    summary = {"reference": str(out), "prompts": len(data["prompts"]), "tokens": data["tokens"], "seconds": data["seconds"],
               "batch": data["batch"], "launch": data["launch"]}  # fmt: skip
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"recorded {out}: {summary['prompts']} prompts of {data['prompt_set']['name']} v{data['prompt_set']['version']}, "
              f"{data['tokens']['prompt']:,} prompt tokens, {data['tokens']['generated']:,} generated in {data['seconds']} s; "
              f"batch at concurrency {data['prompt_set']['concurrency']}: {data['batch']['identical']}/{data['batch']['requests']} identical")  # fmt: skip
    return 0


# --- -i INVENTORY ---------------------------------------------------------------------------------
def _on_inventory(args: argparse.Namespace, command: str, limits: quality_reference.Thresholds, out: Path | None) -> int:
    paths = common.inventories(args)
    hosts = runner.serving_hosts(paths, args.host)  # RunnerError -> exit 2 before anything runs
    if args.action == "record" and len(hosts) != 1:
        return common.usage_error(command, f"record takes one host: --host names one of {', '.join(hosts)}")
    extravars: dict[str, Any] = {
        "sglang_deploy_quality_action": args.action,
        "sglang_deploy_quality_thresholds": dataclasses.asdict(limits),
    }
    if args.action == "record":
        extravars["sglang_deploy_quality_prompts"] = str(Path(args.prompts).resolve()) if args.prompts else ""
    else:
        extravars["sglang_deploy_quality_reference"] = str(Path(args.reference).resolve())
    results = quality_via_ansible(paths, args.host, extravars)
    status = 0
    for host in sorted(results):
        result = results[host]
        if args.action == "record":
            if result.get("reference"):
                assert out is not None
                _write_reference(out, result["reference"], args.json)
            else:
                print(f"sglang-deploy {command}: {host}: {result.get('msg') or 'no reference came back'}", file=sys.stderr)
                status = 2
            continue
        verdict = result.get("verdict")
        if isinstance(verdict, dict):
            print(f"== {host}")
            status = max(status, show_verdict(verdict, str(result.get("report") or ""), args.json))
        else:
            print(f"sglang-deploy {command}: {host}: no verdict: {result.get('msg') or '?'}", file=sys.stderr)
            status = 2
    return status


def quality_via_ansible(inventory_paths: list[str], host: str | None, extravars: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """playbooks/quality.yml on the hosts: host -> the module's result (its ``reference`` or ``verdict``)."""
    import ansible_runner  # heavy import, only when a playbook runs

    results: dict[str, dict[str, Any]] = {}

    def on_event(event: Mapping[str, Any]) -> bool:
        data = event.get("event_data") or {}
        if data.get("task_action") in ("sglang_quality", "sglang_deploy.deploy.sglang_quality") and data.get("host"):
            if event.get("event") in ("runner_on_ok", "runner_on_failed"):
                results[str(data["host"])] = dict(data.get("res") or {})
        return False

    project = runner.project_dir()
    run = ansible_runner.run(
        **runner.runner_kwargs(runner.state_dir() / "artifacts", event_handler=on_event, ident=runner.run_ident("quality")),
        project_dir=str(project), playbook=str(project / PLAYBOOK),
        inventory=[str(Path(i).resolve()) for i in inventory_paths], extravars=dict(extravars), limit=host,
    )  # fmt: skip
    runner.redact_secret_env(Path(run.config.artifact_dir))
    if not results:
        raise runner.RunnerError(f"the quality playbook ran no check ({run.status}, exit {run.rc}); artifacts: {run.config.artifact_dir}")
    return results
