"""Does a launch suit the checkpoint it serves? The MTP draft and shared-expert fusion, judged once.

What is known about the served checkpoint comes from one of two places: the inspection of its files
(``sglang_deploy_host.model.inspection``: the host's weights before the unit starts, or ``plan --checkpoint``),
which is the judge, or, before any host is contacted (render, validate, the start of ``up``), the table
of known checkpoints (``known_checkpoints.yml``: repository, revisions, what a public source says of the
draft layer). The server's resolver (server.py) and ``sglang-deploy plan`` call :func:`problems` and
:func:`draft_memory` here; nothing else decides these questions.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

from sglang_deploy_host.model import inspection as inspector
from sglang_deploy.lanes.catalog import Lane
from sglang_deploy.launch.config import LaunchConfig

GIB = 1 << 30
# Algorithms whose draft is the served checkpoint's own MTP (nextn) layer when no other draft is named:
# sglang turns NEXTN into EAGLE and points the draft at the model path (server_args.py, for GLM-5 and
# DeepSeek-V3). EAGLE3, STANDALONE and NGRAM draft with something else.
SELF_DRAFTING = frozenset({"EAGLE", "NEXTN"})
VERDICTS = (inspector.USABLE, inspector.MISSING, inspector.WRONG_DTYPE)
# Where the docs say how to serve MTP (README and docs/performance.md link it).
MTP_DOCS = "docs/performance.md#serving-mtp"


class CheckpointTableError(ValueError):
    """known_checkpoints.yml is malformed: a bug in the package, named with the entry."""


@dataclass(frozen=True)
class KnownCheckpoint:
    """An entry of known_checkpoints.yml."""

    repo: str
    revisions: tuple[str, ...]
    draft: str
    draft_layer: int
    source: str
    draft_bytes: int | None = None

    def covers(self, revision: str) -> bool:
        return "*" in self.revisions or revision in self.revisions


@dataclass(frozen=True)
class Verdict:
    """What is known of the served checkpoint's draft and experts, and from where."""

    source: str
    speculative: str
    draft_layer: int
    detail: str
    shared_experts_fusion: str | None = None
    inspection: inspector.Inspection | None = None


@functools.lru_cache(maxsize=1)
def known_checkpoints() -> tuple[KnownCheckpoint, ...]:
    text = resources.files("sglang_deploy.launch").joinpath("known_checkpoints.yml").read_text(encoding="utf-8")
    entries = (yaml.safe_load(text) or {}).get("checkpoints")
    if not isinstance(entries, list):
        raise CheckpointTableError("known_checkpoints.yml: no 'checkpoints' list")
    table = []
    for number, entry in enumerate(entries):
        try:
            known = KnownCheckpoint(
                repo=str(entry["repo"]), revisions=tuple(str(r) for r in entry["revisions"]),
                draft=str(entry["draft"]), draft_layer=int(entry["draft_layer"]), source=" ".join(str(entry["source"]).split()),
                draft_bytes=None if entry.get("draft_bytes") is None else int(entry["draft_bytes"]),
            )  # fmt: skip
        except (KeyError, TypeError, ValueError) as err:
            raise CheckpointTableError(f"known_checkpoints.yml entry {number}: {err!r}") from None
        if known.draft not in VERDICTS or not known.revisions:
            raise CheckpointTableError(f"known_checkpoints.yml entry {number} ({known.repo}): draft {known.draft!r}")
        table.append(known)
    return tuple(table)


def lookup(repo: str, revision: str) -> KnownCheckpoint | None:
    """The table's entry for this repository at this revision, if any."""
    return next((k for k in known_checkpoints() if k.repo == repo and k.covers(revision)), None)


def from_inspection(found: inspector.Inspection | Mapping[str, Any]) -> Verdict:
    """The verdict of an inspection (the object, or its ``to_dict()`` as a module returned it)."""
    inspection = found if isinstance(found, inspector.Inspection) else inspector.Inspection(**dict(found))
    n = inspection.draft_layer
    if inspection.speculative == inspector.MISSING:
        detail = f"draft layer {n} is missing ({len(inspection.draft_tensors_missing)} of its tensors absent, model.layers.{n}.*)"
    elif inspection.speculative == inspector.WRONG_DTYPE:
        detail = (
            f"draft layer {n} is quantized ({len(inspection.draft_tensors_wrong_dtype)} tensors, e.g. "
            f"{inspection.draft_tensors_wrong_dtype[0]}); sglang builds the draft in BF16 under modelopt_fp4"
        )
    else:
        detail = f"draft layer {n} is complete ({inspection.draft_bytes / 1e9:.1f} GB, {'/'.join(sorted(inspection.draft_dtypes))})"
    return Verdict(
        source=f"the checkpoint at {inspection.path} (its headers)", speculative=inspection.speculative,
        draft_layer=n, detail=detail, shared_experts_fusion=inspection.shared_experts_fusion, inspection=inspection,
    )  # fmt: skip


def from_known(repo: str, revision: str) -> Verdict | None:
    """The table's verdict for ``repo`` at ``revision``; None for a checkpoint the table does not know."""
    known = lookup(repo, revision)
    if known is None:
        return None
    detail = {
        inspector.MISSING: f"it ships no draft layer {known.draft_layer} (model.layers.{known.draft_layer}.*)",
        inspector.WRONG_DTYPE: f"its draft layer {known.draft_layer} is quantized",
        inspector.USABLE: f"its draft layer {known.draft_layer} is restored in BF16",
    }[known.draft]
    return Verdict(
        source=f"{repo} (known checkpoint; source: {known.source})",
        speculative=known.draft, draft_layer=known.draft_layer, detail=detail,
    )  # fmt: skip


def self_drafting(config: LaunchConfig) -> str | None:
    """The speculative algorithm, when the launch drafts with the served checkpoint's own MTP layer."""
    launch = config.settings
    algorithm = launch.speculative_algorithm
    if algorithm is None or algorithm.upper() not in SELF_DRAFTING:
        return None
    draft = launch.speculative_draft_model_path
    if draft is not None and draft != launch.model_path:
        return None  # a draft model of its own: not this checkpoint's layer
    return algorithm


def problems(config: LaunchConfig, verdict: Verdict | None, *, where: str, lane: Lane) -> list[str]:
    """Why this launch must not start on this checkpoint (empty: nothing against it). ``where`` names
    what set the flags (e.g. "sglang_server_profile 'tuned-mtp'"); ``lane`` is the launch's lane, loaded by the
    caller (whether its sglang turns shared-experts fusion off by itself)."""
    found: list[str] = []
    if verdict is None:
        return found
    algorithm = self_drafting(config)
    if algorithm is not None and verdict.speculative != inspector.USABLE:
        found.append(
            f"{where} drafts with the checkpoint's own MTP layer (--speculative-algorithm {algorithm}), but "
            f"{verdict.source}: {verdict.detail}. {_CONSEQUENCE[verdict.speculative]} Fix: serve a checkpoint with "
            f"draft layer {verdict.draft_layer} restored in BF16 (e.g. festr2/GLM-5-NVFP4-MTP; {MTP_DOCS}), "
            "or launch without the speculative flags (a profile without them, e.g. sglang_server_profile: tuned)"
        )
    if (
        verdict.shared_experts_fusion == "dtypes-differ"
        and not config.settings.disable_shared_experts_fusion
        and not lane.shared_experts_fusion_auto_off
    ):
        found.append(_fusion_problem(verdict))
    return found


# What sglang does with such a draft, in its own code (deepseek_weight_loader.py, deepseek_nextn.py).
_CONSEQUENCE = {
    inspector.MISSING: (
        "sglang would start and serve without a word, drafting with uninitialised weights (acceptance about 1, "
        "slower than without MTP)."
    ),
    inspector.WRONG_DTYPE: (
        "sglang builds the draft unquantized (BF16) under modelopt_fp4, so these tensors do not fit it: the "
        "load fails, or the draft is garbage."
    ),
}


def _fusion_problem(verdict: Verdict) -> str:
    shared = routed = "?"
    if verdict.inspection is not None:
        shared = "/".join(sorted(verdict.inspection.shared_expert_dtypes))
        routed = "/".join(sorted(verdict.inspection.routed_expert_dtypes))
    # The inspection keeps the target layers' dtypes; when those agree, the draft layer's are the ones that differ.
    where = (
        f"the draft layer's shared expert and routed experts differ in dtype (the other layers' are {shared})"
        if shared == routed and shared != "?"
        else f"the shared expert is {shared} beside {routed} routed experts"
    )
    return (
        f"{verdict.source}: {where}, and sglang fuses the "
        "shared expert into the routed ones without comparing their dtypes (GLM-5 and DeepSeek-V3 on 256 experts): "
        "its output would be wrong. Fix: add disable-shared-experts-fusion: true to the launch "
        "(sglang_server_flags_override)"
    )


def warning(config: LaunchConfig, verdict: Verdict | None, *, where: str, repo: str) -> str | None:
    """What to say before the host is asked: a self-drafting launch on a checkpoint the table does not know."""
    algorithm = self_drafting(config)
    if algorithm is None or verdict is not None:
        return None
    return (
        f"{where} drafts with the checkpoint's own MTP layer (--speculative-algorithm {algorithm}); whether "
        f"{repo or 'the served checkpoint'} ships that layer is not known here. The host reads the weights' headers "
        "before the unit starts and refuses a missing draft; `sglang-deploy checkpoint DIR` checks a local copy now"
    )


def draft_memory(verdict: Verdict | None, tp_size: int) -> dict[str, float]:
    """The planner's draft inputs from the inspected draft (PlanInputs fields; {} without one): the draft
    layer's tensors per GPU as sglang shards them, plus its own embedding and head, which it allocates in
    BF16 at load and frees for the target's once loaded."""
    if verdict is None or verdict.inspection is None or verdict.speculative != inspector.USABLE:
        return {}
    inspection = verdict.inspection
    embedding = inspection.draft_embedding_and_head_bytes / tp_size / GIB
    return {
        "draft_weights_gib_per_gpu": round(inspection.draft_bytes_per_gpu(tp_size) / GIB + embedding, 4),
        "draft_embedding_gib_per_gpu": round(embedding, 4),
    }
