"""Filters for the roles: the memory planner and the doctor (``sglang_deploy``), one call each."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

try:
    from sglang_deploy import architectures, doctor, planner
    from sglang_deploy.lanes import LaneError, load_lane
except ImportError as exc:  # a clear message beats a bare "no filter named sglang_memory_plan"
    raise ImportError(
        "the sglang_deploy package is not importable by this Ansible's Python. "
        "Fix: run scripts/setup (or `pip install -e .` in the venv running ansible-playbook)"
    ) from exc


# sglang_server_memory_plan keys that are not PlanInputs fields.
PLAN_VAR_EXTRAS = frozenset({"sm_major", "architecture"})


def sglang_memory_plan(
    flags: Any,
    gpu_facts: Any = None,
    plan_vars: Any = None,
    host: str = "?",
    count_used_memory: bool = False,
    lane: str = "cu128",
) -> dict[str, Any]:
    """Plan for a host's launch flags.

    ``flags``: merged launch flags (name -> value; ``mem-fraction-static`` may be ``auto``).
    ``gpu_facts``: the host's ``gpufacts.py`` JSON (parsed), or None to use ``plan_vars``.
    ``plan_vars``: ``sglang_server_memory_plan``: ``architecture`` (a known one, e.g. glm-5: the KV
    cell, page size and memory terms follow from it and the flags, for ``lane``'s sglang), sm_major
    (when there are no facts), weights_gib_per_gpu, gpu_memory_mib when there are no facts, and any
    PlanInputs field (which wins over what the architecture gives).
    ``count_used_memory``: subtract the memory the facts show in use. Off by default: a role run
    against a serving host sees its own server's memory, and ``auto`` must resolve to the same
    number on every run (idempotence); busy GPUs are the unit's ExecStartPre= idle check's job.

    Returns the plan (``Plan.to_dict()``) plus ``requested`` (the flag as given), ``explanation``
    and ``mem_fraction_static``: the number to launch with (the recommendation for ``auto``, None
    when the flag is absent). An unsafe explicit fraction gives ``safe: false``; the role decides.
    """
    try:
        flags = dict(flags or {})
        requested = flags.get("mem-fraction-static")
        normalized = {k.lstrip("-").replace("_", "-"): v for k, v in flags.items()}
        values = planner.inputs_from_flags(normalized)
        values.pop("kv_cache_dtype", None)
        extra = dict(plan_vars or {})
        unknown = set(extra) - set(planner.PlanInputs.__dataclass_fields__) - PLAN_VAR_EXTRAS
        if unknown:
            raise planner.PlanError(
                f"sglang_server_memory_plan has unknown keys {sorted(unknown)}; known: "
                f"{sorted(set(planner.PlanInputs.__dataclass_fields__) | PLAN_VAR_EXTRAS)}"
            )
        sm_major = extra.pop("sm_major", None)
        summary = planner.gpu_facts_summary(dict(gpu_facts)) if gpu_facts else None
        if summary is not None:
            sm_major = summary.get("sm_major", sm_major)
        name = extra.pop("architecture", None)
        if name is not None:
            try:
                config = architectures.config(str(name))
                version = load_lane(lane).sglang
            except (KeyError, LaneError) as err:
                raise planner.PlanError(f"sglang_server_memory_plan.architecture: {err}") from None
            derived, _notes = planner.architecture_inputs(
                config, normalized, sm_major=sm_major, sglang_version=version, architecture=str(name)
            )
            values.update(derived)
        values.update(extra)
        if summary is not None:
            values["gpu_memory_mib"] = summary["gpu_memory_mib"]
            if count_used_memory:
                values["gpu_memory_used_mib"] = summary["gpu_memory_used_mib"]
        if not values.get("gpu_memory_mib"):
            raise planner.PlanError(
                "no GPU memory size: gather the host's GPU facts first, or set "
                "sglang_server_memory_plan.gpu_memory_mib"
            )
        if "cuda_graph_bs" in values and values["cuda_graph_bs"] is not None:
            values["cuda_graph_bs"] = tuple(values["cuda_graph_bs"])
        result = planner.plan(planner.PlanInputs(**values))
        # auto -> the recommendation (an error when there is none); absent -> None (sglang's
        # own heuristic stays in charge).
        fraction = result.fraction_to_launch(requested)
    except (planner.PlanError, TypeError, ValueError) as err:
        raise AnsibleFilterError(f"host {host}: memory plan: {err}") from None
    out = result.to_dict()
    out["requested"] = requested
    out["explanation"] = result.explanation()
    out["mem_fraction_static"] = fraction
    return out


def sglang_doctor(log: Any, plan: Any = None) -> list[dict[str, Any]]:
    """Doctor findings ({id, evidence, summary, fix}) for a log (text or list of lines), e.g. the
    unit's journal after a failed start; ``plan`` (the memory plan) fills the fixes' values."""
    lines = log.splitlines() if isinstance(log, str) else [str(line) for line in log or []]
    return [f.to_dict() for f in doctor.diagnose(lines, plan=dict(plan) if plan else None)]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"sglang_memory_plan": sglang_memory_plan, "sglang_doctor": sglang_doctor}
