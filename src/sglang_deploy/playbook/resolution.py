"""What a published resolution (``sglang_server_resolved``, ``sglang_router_resolved``) was made from.

A host is resolved at two points of a run that changes it: from the inventory alone on the control node,
before any host is touched (``playbooks/resolve.yml``), and on the host with what only the host can say
(its GPUs, the venv the ml-env points at, the weights' headers) before its unit is written. Between them
a rebuild installs the driver, the venv and the weights, so what the resolver reads may change; where it
has not changed, resolving again would only repeat the same answer. The roles compare this digest of the
resolver's inputs with the one the run's last resolution carries and resolve again only when they differ.

Secrets never enter the digest: a secret is represented by whether it is set and under which name.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

VOLATILE_FACT_KEYS = ("disks",)
"""GPU-facts keys no resolver reads that move within a run (free space while the weights download)."""


def gpu_facts_basis(gpu_facts: Mapping[str, Any] | None) -> dict[str, Any]:
    """The GPU facts as a resolver sees them: none without a GPU (the resolver treats both alike)."""
    if not gpu_facts or not gpu_facts.get("gpus"):
        return {}
    return {key: value for key, value in gpu_facts.items() if key not in VOLATILE_FACT_KEYS}


def basis(*parts: Any) -> str:
    """A short digest of ``parts`` (JSON, keys sorted): equal inputs, equal digest, within one run."""
    text = json.dumps(parts, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
