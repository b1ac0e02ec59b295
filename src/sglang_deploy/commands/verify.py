"""``sglang-deploy verify``: the testinfra suites against an inventory, or the endpoint suite
against any URL. Exit status 0 only when every test passed.

  sglang-deploy verify -i INVENTORY [-l LIMIT] [--probes FILE]
      playbooks/verify.yml: per serving host, tests/infra/test_sglang_unit.py, test_gpu.py and, when
      the host's sglang_server_state is started, test_service.py and test_endpoint.py.
  sglang-deploy verify --endpoint URL --model NAME [--api-key-file F] [--cafile PEM] [--probes FILE]
      tests/infra/test_endpoint.py alone: health, model list, a chat answer, the correctness gate; an
      https URL is verified against --cafile (else the system's CAs).
      The key comes from $SGLANG_API_KEY or a 0600 --api-key-file (never from the command line, which
      every user of the machine can read); it is handed to pytest through the environment.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from sglang_deploy_host.serving import gate, unit_flags
from sglang_deploy.commands import common
from sglang_deploy.playbook.runner import project_dir, run_playbook

ENDPOINT_SUITE = "tests/infra/test_endpoint.py"
# Bounds the whole endpoint suite: 6 probes and a chat at up to GENERATE_DEADLINE_S (120 s) each,
# and a few GETs at up to SHORT_DEADLINE_S (30 s) each. A server that does not answer at all fails
# every test within the suite's first /health check (tests/infra/test_endpoint.py).
ENDPOINT_SUITE_TIMEOUT_S = 1200


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "verify",
        help="run the testinfra suites (inventory) or the endpoint suite (--endpoint URL)",
        description=__doc__.split("\n\n", 1)[0] if __doc__ else None,
    )
    common.add_inventory_args(parser)
    parser.add_argument("--endpoint", metavar="URL", help="check this server only, e.g. http://10.0.0.5:8000")
    parser.add_argument("--model", help="served model name /v1/models must list (with --endpoint)")
    common.add_api_key_args(parser)
    common.add_cafile_arg(parser)
    parser.add_argument("--probes", help="YAML probes file replacing the default correctness probes")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        api_key = common.api_key_from(args)
    except common.ApiKeyError as err:
        return common.usage_error("verify", str(err))
    if args.probes:
        # A bad probes file is a usage error, reported before any host or server is contacted.
        try:
            gate.load_probes(args.probes)
        except gate.ProbeFileError as err:
            return common.usage_error("verify", str(err))
        args.probes = str(Path(args.probes).resolve())
    if args.endpoint:
        if args.inventory or args.limit:
            return common.usage_error("verify", "--endpoint checks one URL; it does not take -i/-l")
        if not args.model:
            return common.usage_error("verify", "--endpoint needs --model NAME (the served model name)")
        try:
            unit_flags.check_url(args.endpoint)
        except ValueError as err:
            return common.usage_error("verify", f"--endpoint {err}")
        try:
            cafile = common.cafile_from(args)
        except ValueError as err:
            return common.usage_error("verify", str(err))
        return run_endpoint_suite(args.endpoint, args.model, api_key, args.probes, cafile)
    if args.model or args.api_key_file or args.cafile:
        return common.usage_error("verify", "--model/--api-key-file/--cafile go with --endpoint URL (with -i, the CA is sglang_server_tls_cafile)")
    return run_inventory(args.inventory, args.limit, args.probes)


def run_endpoint_suite(url: str, model: str, api_key: str, probes: str | None, cafile: str = "") -> int:
    root = project_dir()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root / "tests" / "infra"), env.get("PYTHONPATH")]))
    env[unit_flags.API_KEY_ENV] = api_key
    argv = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "endpoint_options", "-v",
        f"--sglang-endpoint={url}", f"--sglang-model={model}", f"--sglang-api-key-env={unit_flags.API_KEY_ENV}",
        *([f"--sglang-probes={probes}"] if probes else []),
        *([f"--sglang-cafile={cafile}"] if cafile else []),
        str(root / ENDPOINT_SUITE),
    ]  # fmt: skip
    try:
        proc = subprocess.run(argv, cwd=root, env=env, timeout=ENDPOINT_SUITE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return common.usage_error("verify", f"the endpoint suite ran over {ENDPOINT_SUITE_TIMEOUT_S} s")
    return 0 if proc.returncode == 0 else 1


def run_inventory(inventories: list[str] | None, limit: str | None, probes: str | None) -> int:
    run = run_playbook(
        "playbooks/verify.yml",
        inventories or [str(project_dir() / "inventory" / "proxmox")],
        extravars={"sglang_deploy_verify_probes": probes} if probes else None,
        limit=limit,
        title="verify",
        live=False,
    )
    print(f"artifacts: {run.artifacts}", file=sys.stderr)
    return 0 if run.rc == 0 else 1
