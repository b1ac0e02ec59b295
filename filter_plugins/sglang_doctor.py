"""Filters for the roles: the doctor (``sglang_deploy``), one call. The memory planner runs inside
the server's resolver (``sglang_server_resolve``)."""

from __future__ import annotations

from typing import Any

from sglang_deploy.observe import doctor


def sglang_doctor(log: Any, plan: Any = None) -> list[dict[str, Any]]:
    """Doctor findings ({id, evidence, summary, fix}) for a log (text or list of lines), e.g. the
    unit's journal after a failed start; ``plan`` (the memory plan) fills the fixes' values."""
    lines = log.splitlines() if isinstance(log, str) else [str(line) for line in log or []]
    return [f.to_dict() for f in doctor.diagnose(lines, plan=dict(plan) if plan else None)]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"sglang_doctor": sglang_doctor}
