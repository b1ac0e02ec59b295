"""``sglang-deploy plan``: is this ``--mem-fraction-static`` safe, and which one should we use?

Inputs come from flags, or from an inventory host's launch flags (``-i INV --host H``), gathered
GPU facts (``--gpu-facts``), and the model's ``config.json`` / safetensors index. Flags given on
the command line win over the inventory's.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from sglang_deploy_host.model import inspection as inspector
from sglang_deploy_host.fs import files
from sglang_deploy import inputfiles
from sglang_deploy.launch import checkpoints
from sglang_deploy.memory import architectures, plan_inputs, planner
from sglang_deploy.playbook import runner
from sglang_deploy.serving import server
from sglang_deploy.memory.plan_inputs import PLAN_VAR
from sglang_deploy.lanes.catalog import DEFAULT_LANE, Lane, LaneError, load_lane
from sglang_deploy.launch.config import TABLE, LaunchConfig, LaunchConfigError

_console = Console(highlight=False, soft_wrap=True)
_err = Console(stderr=True, highlight=False, soft_wrap=True)



def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "plan",
        help="memory planner: judge --mem-fraction-static and recommend one",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_argument_group("where the inputs come from")
    src.add_argument("-i", "--inventory", help="read the launch flags of a host of this inventory")
    src.add_argument("--host", help="inventory host (default: the only host of sglang_servers)")
    src.add_argument("--profile", help="with -i: plan this launch profile of sglang_server_profiles instead of the host's")
    src.add_argument("--gpu-facts", help="GPU facts JSON (gpufacts.py output / GpuFacts.to_dict())")
    src.add_argument("--model-config", help="the model's config.json (KV cell size)")
    src.add_argument(
        "--architecture", choices=sorted(architectures.KNOWN),
        help="a known architecture instead of --model-config: its shapes and measured memory terms",
    )  # fmt: skip
    src.add_argument("--lane", help=f"whose sglang's rules apply (default: the host's sglang_common_lane, else {DEFAULT_LANE})")
    src.add_argument("--hf-quant-config", help="hf_quant_config.json (default: beside config.json)")
    src.add_argument("--safetensors-index", help="model.safetensors.index.json (weights per GPU)")
    src.add_argument(
        "--checkpoint", metavar="DIR",
        help="a local checkpoint: its headers give the MTP draft's real bytes, and a launch it cannot serve "
        "(a speculative launch without its draft layer, shared-expert fusion across dtypes) is refused; its "
        "config.json stands in for --model-config when neither that nor an architecture is given",
    )  # fmt: skip
    gpu = p.add_argument_group("GPU and model")
    gpu.add_argument("--gpu-memory-mib", type=float, help="nvidia-smi memory.total of one GPU")
    gpu.add_argument("--gpu-memory-used-mib", type=float, help="memory already in use on a GPU")
    gpu.add_argument("--sm-major", type=int, help="compute capability major (12 = SM120)")
    gpu.add_argument("--tp-size", type=int)
    gpu.add_argument("--weights-gib-per-gpu", type=float, help="weights (load footprint) per GPU")
    gpu.add_argument("--kv-bytes-per-token", type=int, help="KV cell size per token per GPU")
    gpu.add_argument("--kv-cache-dtype", help="as sglang's flag (default auto)")
    gpu.add_argument("--attention-backend", help="as sglang's flag (flashinfer + an fp8 pool on MLA: the conversion copy)")
    gpu.add_argument("--dsa-prefill-backend", help="as sglang's --dsa-/--nsa-prefill-backend (the DSA KV layout)")
    gpu.add_argument("--dsa-decode-backend", help="as sglang's --dsa-/--nsa-decode-backend")
    gpu.add_argument("--speculative-algorithm", help="as sglang's flag (EAGLE: the draft's pool and graphs)")
    gpu.add_argument("--page-size", type=int)
    launch = p.add_argument_group("launch flags")
    launch.add_argument("--mem-fraction-static", type=float, help="the fraction to judge")
    launch.add_argument("--chunked-prefill-size", type=int)
    launch.add_argument("--cuda-graph-max-bs", type=int)
    launch.add_argument("--cuda-graph-bs", type=int, nargs="+")
    launch.add_argument("--disable-cuda-graph", action="store_true", default=None)
    launch.add_argument("--max-running-requests", type=int)
    launch.add_argument("--max-total-tokens", type=int)
    model = p.add_argument_group("model terms (defaults calibrated on the seeds)")
    model.add_argument("--runtime-overhead-mib", type=float)
    model.add_argument("--graph-mib-per-bs", type=float)
    model.add_argument("--activation-mib-per-token", type=float)
    model.add_argument("--allocator-slack-mib", type=float)
    model.add_argument("--margin-mib", type=float)
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> int:
    try:
        inputs, notes, verdict = build_inputs(args)
        result = planner.plan(inputs)
    except (planner.PlanError, LaunchConfigError, LaneError) as err:
        _err.print(f"[red]plan: {escape(str(err))}[/]")
        return 2
    result_dict = {**result.to_dict(), "notes": notes}
    if verdict is not None:
        result_dict["checkpoint"] = _checkpoint_summary(verdict)
    if args.json:
        print(json.dumps(result_dict, indent=2))
    else:
        _print_table(result, notes)
    # Unsafe as given, or no fraction at all is safe: either way nothing to launch with.
    return 1 if result.safe is False or result.recommended_mem_fraction_static is None else 0


def build_inputs(
    args: argparse.Namespace,
) -> tuple[planner.PlanInputs, list[str], checkpoints.Verdict | None]:
    """The planner's inputs of the command line, the resolver's road (serving/server.py) with the command line's
    files and options over it: with ``-i``, the role's own inputs of the host (what the resolver is handed, no
    secret), its flags merged as the resolver merges them; the launch judged as the resolver's host phase judges
    it (``server.judge_launch``: the checkpoint - ``--checkpoint``'s headers, else the inventory's known
    checkpoint - the lane's rules for the GPU, the FP4 kernels; a launch it refuses is a PlanError); then the
    memory plan's one road (plan_inputs.py)."""
    notes: list[str] = []
    lane = args.lane
    if args.profile is not None and not args.inventory:
        raise planner.PlanError(
            f"--profile {args.profile!r} needs -i: the launch profiles are an inventory's sglang_server_profiles. "
            "Fix: plan -i INVENTORY --profile NAME (e.g. -i inventory/proxmox), or give the profile's flags themselves"
        )
    # What a refusal names first: the inventory's host ("" for flags given on the command line).
    host_prefix = ""
    if args.inventory:
        host, inputs = host_server_inputs(args.inventory, args.host)
        notes.append(f"launch flags of {host} from {args.inventory}")
        inputs = replace(inputs, python="python3", lane=lane or inputs.lane or DEFAULT_LANE,
                         profile=args.profile if args.profile is not None else inputs.profile)  # fmt: skip
        host_prefix = f"host {host}: "
        if inputs.profile:
            notes.append(f"launch profile {inputs.profile!r}")
        if not isinstance(inputs.memory_plan or {}, Mapping):
            raise planner.PlanError(f"{host_prefix}{PLAN_VAR} must be a mapping, got {type(inputs.memory_plan).__name__}")
    else:
        inputs = server.ServerInputs(flags={}, python="python3", lane=lane or DEFAULT_LANE, unit={})
    lane = inputs.lane
    plan_vars: dict[str, Any] = dict(inputs.memory_plan or {})
    # The command line's flags over the inventory's (in any lane's spelling: the table renders them for the lane).
    given = {
        name.replace("_", "-"): getattr(args, name)
        for name in ("kv_cache_dtype", "attention_backend", "dsa_prefill_backend", "dsa_decode_backend", "speculative_algorithm")
        if getattr(args, name)
    }  # fmt: skip
    if args.tp_size is not None:
        given["tp-size"] = args.tp_size
    try:
        launch_flags = server.inventory_flags(inputs.flags, inputs.profile, inputs.profiles, inputs.flags_override, lane)
        launch = LaunchConfig.from_vars(launch_flags, python=inputs.python, lane=lane).amended(flags=given)
    except LaunchConfigError as err:
        raise planner.PlanError(f"{host_prefix}{err}") from None
    stack_lane = load_lane(lane)
    check_choices(launch, stack_lane)
    found = _inspect(args.checkpoint) if args.checkpoint else None
    if found is not None and not args.model_config and not args.architecture and not plan_vars.get("architecture"):
        args.model_config = str(Path(args.checkpoint) / inspector.CONFIG_NAME)
    gpu_facts = _read_json(args.gpu_facts, "--gpu-facts") if args.gpu_facts else None
    summary = planner.gpu_facts_summary(gpu_facts) if gpu_facts is not None else None
    sm_major = plan_inputs.sm_major_of(summary, plan_vars, args.sm_major)
    try:
        judged = server.judge_launch(inputs, launch, stack_lane, sm_major=sm_major, checkpoint=found,
                                     origin=None if args.inventory else "this launch")  # fmt: skip
    except LaunchConfigError as err:
        raise planner.PlanError(f"{host_prefix}{err}") from None
    overrides: dict[str, Any] = {}
    for name in _FLAG_FIELDS:
        value = getattr(args, name, None)
        if value is not None:
            overrides[name] = tuple(value) if isinstance(value, list) else value
    tp = int(overrides.get("tp_size") or launch.tp_size)
    verdict, draft = judged.verdict, judged.draft
    if found is not None and verdict is not None:
        notes.append(
            f"checkpoint {args.checkpoint}: {verdict.detail}; speculative decoding: {verdict.speculative}"
            + (f"; the draft loads {draft['draft_weights_gib_per_gpu']:.3f} GiB per GPU at TP {tp} (its headers' bytes, "
               f"its own embedding and head {draft['draft_embedding_gib_per_gpu']:.3f} of them)" if draft else "")
        )  # fmt: skip
    notes += [f"WARNING {warning}" for warning in judged.warnings]
    if args.safetensors_index and args.weights_gib_per_gpu is None:
        index = _read_json(args.safetensors_index, "--safetensors-index")
        overrides["weights_gib_per_gpu"] = round(planner.weights_gib_from_index(index, tp), 3)
        notes.append(
            f"weights {overrides['weights_gib_per_gpu']} GiB/GPU = index total_size / tp {tp}: a "
            "lower bound (replicated layers and load buffers add to it)"
        )
    missing_where = f" ({PLAN_VAR} of the inventory's host has no gpu_memory_mib)" if args.inventory else ""
    sources = plan_inputs.PlanSources(
        launch=launch.settings, lane=lane, plan_vars=plan_vars, count_used_memory=True,
        gpu_facts=gpu_facts, architecture=args.architecture, model_config=_model_config(args), sm_major=args.sm_major,
        draft=draft, overrides=overrides,
    )  # fmt: skip
    inputs_for_plan, road_notes = plan_inputs.plan_inputs(
        sources,
        no_memory_fix=f"pass --gpu-memory-mib{missing_where} (nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits "
        "on the GPU host) or --gpu-facts FILE" + (f", or set gpu_memory_mib in {PLAN_VAR}" if args.inventory else ""),
    )
    notes += road_notes
    if inputs_for_plan.weights_gib_per_gpu is None or inputs_for_plan.kv_bytes_per_token is None:
        notes.append(
            "kv_tokens not computed: give --weights-gib-per-gpu (or --safetensors-index) and "
            "--kv-bytes-per-token (or --model-config / --architecture)"
        )
    return inputs_for_plan, notes, verdict if found is not None else None


def _model_config(args: argparse.Namespace) -> dict[str, Any] | None:
    """``--model-config`` with its quantization config: ``kv_cache_quant_algo`` decides what ``auto`` means. Named,
    ``--hf-quant-config`` must be there; beside config.json, whatever is there is read (a FIFO or a directory of
    that name is refused, not skipped)."""
    if not args.model_config:
        return None
    config = _read_json(args.model_config, "--model-config")
    beside = Path(args.model_config).with_name("hf_quant_config.json")
    quant_path = Path(args.hf_quant_config) if args.hf_quant_config else beside
    if args.hf_quant_config or inputfiles.exists(quant_path):
        config = {**config, "quantization_config": _read_json(str(quant_path), "--hf-quant-config")}
    return config


def _inspect(path: str) -> inspector.Inspection:
    try:
        return inspector.inspect(path)
    except inspector.CheckpointError as err:
        raise planner.PlanError(f"--checkpoint {path}: {err}") from None


def _checkpoint_summary(verdict: checkpoints.Verdict) -> dict[str, Any]:
    """The ``checkpoint`` object of ``plan --json``: the inspection's verdicts, without its tensor lists."""
    found = verdict.inspection
    assert found is not None
    return {
        "path": found.path, "architecture": found.architecture, "speculative": found.speculative,
        "draft_bytes": found.draft_bytes, "draft_dtypes": found.draft_dtypes,
        "draft_tensors_missing": len(found.draft_tensors_missing), "shared_experts_fusion": found.shared_experts_fusion,
    }  # fmt: skip


# A model.safetensors.index.json names every tensor: a large MoE checkpoint with per-expert quantization scales
# lists hundreds of thousands (tens of MB), past inputfiles' JSON default; configs and GPU facts are kilobytes.
JSON_MAX_BYTES = {"--safetensors-index": 64 << 20}


def _read_json(path: str, option: str) -> dict[str, Any]:
    """A JSON object from ``path`` (a regular file, under the option's cap, UTF-8); anything else is a
    PlanError naming the option (exit 2)."""
    try:
        data = inputfiles.read_json(path, option, JSON_MAX_BYTES.get(option, inputfiles.JSON_MAX_BYTES))
    except inputfiles.InputFileError as err:
        raise planner.PlanError(str(err)) from None
    if not isinstance(data, dict):
        raise planner.PlanError(f"{option} {path}: want a JSON object, found {type(data).__name__}")
    return data


_FLAG_FIELDS = (
    "gpu_memory_mib", "gpu_memory_used_mib", "tp_size", "weights_gib_per_gpu",
    "kv_bytes_per_token", "page_size", "mem_fraction_static", "chunked_prefill_size",
    "cuda_graph_max_bs", "cuda_graph_bs", "disable_cuda_graph", "max_running_requests",
    "max_total_tokens", "runtime_overhead_mib", "graph_mib_per_bs", "activation_mib_per_token",
    "allocator_slack_mib", "margin_mib",
)


# The resolver's inputs of one host as playbooks/plan_inputs.yml writes them: a few KB.
HOST_INPUTS_MAX_BYTES = 4 << 20


def host_server_inputs(inventory: str, host: str | None) -> tuple[str, server.ServerInputs]:
    """One serving host's resolver inputs (``server.ServerInputs``) as render and up hand them over, without its
    secrets: playbooks/plan_inputs.yml renders the role's own inputs (defaults, inventory, every template; the
    variable check first) into a private directory. A broken inventory, or one whose serving group does not hold
    the host, raises runner.InventoryError (exit 2) instead of planning for nothing."""
    hosts = runner.serving_hosts([inventory], limit=host)
    if len(hosts) != 1:
        raise planner.PlanError(
            f"inventory {inventory} has {len(hosts)} hosts in {runner.SERVING_GROUP} "
            f"({', '.join(hosts)}). Fix: pass --host NAME"
        )
    with tempfile.TemporaryDirectory(prefix="sglang-deploy-plan-") as out:
        run = runner.run_playbook(
            "playbooks/plan_inputs.yml", [inventory], extravars={"sglang_deploy_plan_out": out},
            limit=hosts[0], title="plan", live=False,
        )  # fmt: skip
        if run.rc != 0:
            why = "; ".join(run.failures) or f"ansible-playbook exited {run.rc}"
            raise planner.PlanError(f"reading {hosts[0]} from {inventory}: {why} (artifacts: {run.artifacts})")
        path = Path(out) / f"{hosts[0]}.json"
        try:
            data = json.loads(files.read_regular_file(path, HOST_INPUTS_MAX_BYTES).decode("utf-8"))
        except (OSError, ValueError, files.UnreadableFileError) as err:
            raise planner.PlanError(f"reading {hosts[0]} from {inventory}: {path}: {err}") from None
    if not isinstance(data, dict):
        raise planner.PlanError(f"reading {hosts[0]} from {inventory}: not the resolver's inputs")
    try:
        return hosts[0], server.ServerInputs.from_vars(data)
    except server.ResolveError as err:
        raise planner.PlanError(f"reading {hosts[0]} from {inventory}: {err}") from None


def check_choices(launch: LaunchConfig, lane: Lane) -> None:
    """A PlanError for a flag value the lane's sglang does not take (its recorded choices), or a speculative
    algorithm the planner does not model; what the plan reads must be what the server would launch with."""
    for flag, choices in lane.choices:
        spec = TABLE.spec(flag)
        value = getattr(launch.settings, spec.field) if spec is not None else None
        if value is None or value is False:
            continue
        if str(value) not in choices:
            raise planner.PlanError(
                f"--{flag} {value!r} is not a value sglang {lane.sglang} takes (lane {lane.name}). Fix: one of "
                f"{', '.join(choices)}"
            )
    algorithm = launch.settings.speculative_algorithm
    if algorithm and str(algorithm).upper() not in planner.SPECULATIVE_ALGORITHMS:
        raise planner.PlanError(
            f"--speculative-algorithm {algorithm}: sglang {lane.sglang} takes it, but the memory planner models only "
            f"{', '.join(planner.SPECULATIVE_ALGORITHMS)}; plan its memory on the GPU (sglang-deploy bench) instead"
        )


def _print_table(result: planner.Plan, notes: list[str]) -> None:
    inputs = result.inputs
    table = Table(title="sglang memory plan (per GPU)", show_header=False)
    table.add_column("item")
    table.add_column("value", justify="right")
    table.add_row("GPU memory", f"{inputs['gpu_memory_mib']:,.0f} MiB")
    overhead = f"{inputs['runtime_overhead_mib']:,.0f} MiB"
    table.add_row("CUDA context + NCCL (outside torch)", overhead)
    table.add_row("free when sglang measures (F0)", f"{inputs['free_at_start_mib']:,.0f} MiB")
    labels = {
        "cuda_graphs": f"CUDA graphs (max bs {inputs['effective_cuda_graph_max_bs']})",
        "activations": f"activations (chunk {inputs['effective_chunked_prefill_size']})",
        "allocator_slack": "allocator slack",
        "speculative_draft": "EAGLE/MTP graphs beyond the decode graphs",
        "kv_conversion": "fp8 pool converted to bf16 (flashinfer MLA)",
        "attention_workspace": "attention backend's workspace",
    }
    for key, mib in result.breakdown_mib.items():
        table.add_row(labels.get(key, key), f"{mib:,.0f} MiB")
    table.add_row("needed outside the static pool", f"{result.required_mib:,.0f} MiB")
    if result.mem_fraction_static is not None:
        table.add_row("--mem-fraction-static", f"{result.mem_fraction_static}")
        table.add_row("left outside the pool: F0*(1-f)", f"{result.available_mib:,.0f} MiB")
        table.add_row("headroom", f"{result.headroom_mib:+,.0f} MiB")
        table.add_row("free after graph capture (est.)", f"{result.free_after_start_mib:,.0f} MiB")
        verdict = "[green]safe[/]" if result.safe else "[red]UNSAFE[/]"
        table.add_row("verdict", verdict)
    if inputs["effective_draft_weights_gib_per_gpu"]:
        table.add_row("EAGLE/MTP draft weights (inside the fraction)", f"{inputs['effective_draft_weights_gib_per_gpu']:.2f} GiB")
    if result.kv_tokens is not None:
        table.add_row(f"KV pool at {result.kv_tokens_at}", f"{result.kv_tokens:,} tokens")
    recommended = result.recommended_mem_fraction_static
    table.add_row(
        "recommended --mem-fraction-static",
        "[red]none is safe[/]" if recommended is None else f"{recommended}",
    )
    table.add_row("sglang's own default", f"{result.sglang_default_mem_fraction_static}")
    _console.print(table)
    for note in notes:
        _console.print(f"  note: {note}")
    for reason in result.reasons:
        _console.print(f"  {reason}")
