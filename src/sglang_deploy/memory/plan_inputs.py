"""The memory planner's inputs of one launch: the one road from what a host says to :class:`planner.PlanInputs`.

``render`` and ``up`` (server.plan_for_launch, from the resolved host) and ``sglang-deploy plan`` (from an
inventory host, files and its own options) both call :func:`plan_inputs`, so they cannot disagree on what a
key means or which source wins. Later sources win over earlier ones:

  1. the launch's typed flags (LaunchConfig.settings: tp, chunked prefill, graphs, running requests, the fraction,
     speculative algorithm);
  2. what the model's shapes give (a known ``architecture``, or a ``config.json`` read by the caller):
     the KV cell, page size and memory terms for the lane's sglang;
  3. ``sglang_server_memory_plan`` (every key a planner input or one of ``PLAN_VAR_EXTRAS``; a typo is refused);
  4. the inspected draft layer's real bytes (checkpoints.draft_memory);
  5. the GPU facts (measured memory beats a declared ``gpu_memory_mib``);
  6. ``overrides``: the command line's numbers.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sglang_deploy.memory import architectures, planner
from sglang_deploy.lanes.catalog import LaneError, load_lane
from sglang_deploy.launch.flagtable import LaunchSettings

PLAN_VAR = "sglang_server_memory_plan"
"""The host variable holding planner inputs the launch flags do not carry (weights, cell size, ...)."""
PLAN_VAR_EXTRAS = frozenset({"sm_major", "architecture"})
"""``sglang_server_memory_plan`` keys that are not PlanInputs fields."""
PLAN_FIELDS = frozenset(planner.PlanInputs.__dataclass_fields__)


@dataclass(frozen=True)
class PlanSources:
    """Everything that says something about one launch's memory, as the caller read it."""

    launch: LaunchSettings
    """The launch's typed flags (LaunchConfig.settings)."""
    lane: str
    """Whose sglang's rules the architecture's terms follow."""
    plan_vars: Mapping[str, Any] = field(default_factory=dict)
    """``sglang_server_memory_plan``."""
    gpu_facts: Mapping[str, Any] | None = None
    """gpufacts' ``GpuFacts.to_dict()``."""
    count_used_memory: bool = False
    """Subtract the memory the facts show in use. Off for the role: a run against a serving host sees its own
    server's memory, and ``auto`` must resolve to the same number on every run (idempotence)."""
    architecture: str | None = None
    """A known architecture that wins over the plan variable's (the command line's ``--architecture``)."""
    model_config: Mapping[str, Any] | None = None
    """A ``config.json`` the caller read; wins over any architecture name."""
    sm_major: int | None = None
    """A compute capability major that wins over the facts' and the plan variable's."""
    draft: Mapping[str, float] = field(default_factory=dict)
    """The inspected draft's memory (checkpoints.draft_memory); wins over the planner's estimates."""
    overrides: Mapping[str, Any] = field(default_factory=dict)
    """PlanInputs fields that win over every other source."""


def check_plan_vars(plan_vars: Mapping[str, Any]) -> None:
    """PlanError naming the keys of ``sglang_server_memory_plan`` that are no planner input (a typo), the closest
    known one each."""
    known = sorted(PLAN_FIELDS | PLAN_VAR_EXTRAS)
    unknown = sorted(str(k) for k in plan_vars if k not in known)
    if unknown:
        close = {name: difflib.get_close_matches(name, known, n=1) for name in unknown}
        hints = "; ".join(f"{name}: did you mean {match[0]}?" for name, match in close.items() if match)
        raise planner.PlanError(
            f"{PLAN_VAR} has unknown keys {unknown}" + (f" ({hints})" if hints else "") + f"; known: {known}"
        )


def sm_major_of(
    summary: Mapping[str, Any] | None, plan_vars: Mapping[str, Any] | None, given: int | None = None
) -> int | None:
    """The GPUs' compute-capability major that the KV dtype, the lane's rules and the FP4 kernels are judged by:
    ``given`` (the command line's), else the first GPU's in ``summary`` (planner.gpu_facts_summary), else
    ``sm_major`` of ``plan_vars`` (sglang_server_memory_plan); None when none says."""
    if given is not None:
        return given
    return (summary or {}).get("sm_major", (plan_vars or {}).get("sm_major"))


def plan_inputs(sources: PlanSources, *, no_memory_fix: str) -> tuple[planner.PlanInputs, list[str]]:
    """The planner's inputs from ``sources`` (the order in the module's docstring), and notes on where they came
    from. A PlanError names the source at fault; without any GPU memory size it ends with ``no_memory_fix``
    (the caller's own way to give one)."""
    if not isinstance(sources.plan_vars, Mapping):
        raise planner.PlanError(f"{PLAN_VAR} must be a mapping, got {type(sources.plan_vars).__name__}")
    values = planner.inputs_from_settings(sources.launch)
    values.pop("kv_cache_dtype", None)  # architecture_inputs resolves it (auto, the checkpoint's, the lane's)
    notes: list[str] = []
    extra = dict(sources.plan_vars)
    check_plan_vars(extra)
    extra.pop("sm_major", None)
    declared_architecture = extra.pop("architecture", None)
    summary = planner.gpu_facts_summary(dict(sources.gpu_facts)) if sources.gpu_facts is not None else None
    if summary is not None:
        notes.append(f"GPU facts: {summary['gpu_count']} GPUs, smallest {summary['gpu_memory_mib']:.0f} MiB")
    sm_major = sm_major_of(summary, sources.plan_vars, sources.sm_major)
    config, architecture = _model_config(sources, declared_architecture)
    try:
        lane = load_lane(sources.lane)
    except LaneError as err:
        raise planner.PlanError(str(err)) from None
    values["lane_rules"] = lane.planner
    if config is not None:
        derived, derived_notes = planner.architecture_inputs(
            config, sources.launch, sm_major=sm_major, sglang_version=lane.sglang, architecture=architecture
        )
        values.update(derived)
        notes += derived_notes + [f"rules of sglang {lane.sglang} (lane {sources.lane})"]
        if lane.planner is not None and lane.planner.prefill_graphs_default and not sources.launch.disable_piecewise_cuda_graph:
            notes.append(
                f"sglang {lane.sglang} captures prefill CUDA graphs by default (not measured here: check the free memory "
                f"after the first start, or set {sources.launch.name_of('disable_piecewise_cuda_graph')})"
            )
    values.update(extra)
    values.update(sources.draft)
    if summary is not None:
        values["gpu_memory_mib"] = summary["gpu_memory_mib"]
        if sources.count_used_memory:
            values["gpu_memory_used_mib"] = summary["gpu_memory_used_mib"]
    values.update(sources.overrides)
    if not values.get("gpu_memory_mib"):
        raise planner.PlanError(f"no GPU memory size. Fix: {no_memory_fix}")
    if values.get("cuda_graph_bs") is not None:
        values["cuda_graph_bs"] = tuple(values["cuda_graph_bs"])
    try:
        return planner.PlanInputs(**values), notes
    except TypeError as err:
        raise planner.PlanError(str(err)) from None


def _model_config(sources: PlanSources, declared: Any) -> tuple[Mapping[str, Any] | None, str | None]:
    """The model's config and the known architecture it stands for (None for a config the caller read)."""
    if sources.model_config is not None:
        return sources.model_config, None
    name, where = (sources.architecture, "--architecture") if sources.architecture else (declared, f"{PLAN_VAR}.architecture")
    if name is None:
        return None, None
    try:
        return architectures.config(str(name)), str(name)
    except KeyError as err:
        raise planner.PlanError(f"{where}: {err.args[0]}") from None
