"""Stack lanes: which sglang, torch, kernels and transformers go together, as data.

Each lane is one ``lanes/<name>.yml`` file shipped with the package; adding a file adds a lane
without a code change. Loading checks every key and type, so a typo in a lane file fails here,
naming the file and the key, instead of surfacing later as a wrong install.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

import yaml

DEFAULT_LANE = "cu128"
"""The mission's CUDA 12.8 lane (docs/architecture.md, "Stack lanes")."""

_LANE_SUFFIX = ".yml"


class LaneError(ValueError):
    """A lane that does not exist or whose file is malformed."""


@dataclass(frozen=True)
class ValidatorSpec:
    """What the CPU-only venv that runs the lane's sglang argparse needs.

    ``torch`` and ``torch_index`` are defaults that the validator lets the environment override
    (a mirror, an offline wheel); ``stand_ins`` are packages sglang imports but the parser never
    uses, answered with stand-ins by the probe instead of being installed.
    """

    torch: str
    torch_index: str
    packages: tuple[str, ...]
    stand_ins: tuple[str, ...]


@dataclass(frozen=True)
class Override:
    """A requirement that replaces every other constraint on its package, and why."""

    requirement: str
    reason: str


@dataclass(frozen=True)
class LockSpec:
    """What the lane's ml-env lock is resolved from (``sglang-deploy lock``; see lock.py).

    One lock file is made per Python in ``pythons`` for ``platform``, from ``index_url`` as it
    was at ``exclude_newer`` (so re-resolving the same inputs gives the same lock; "" = no
    cut-off, for an index without upload dates). ``overrides`` win over any package's own pins
    (uv ``--overrides``), each with its reason.
    """

    pythons: tuple[str, ...]
    platform: str
    index_url: str
    exclude_newer: str
    requirements: tuple[str, ...]
    overrides: tuple[Override, ...]


@dataclass(frozen=True)
class KernelExemption:
    """A kernels object (path under site-packages; ``**/*.cubin`` = a directory's bare cubins) that is
    known to lack the lane's required archs, and why the lane still serves without it."""

    object: str
    reason: str


@dataclass(frozen=True)
class Sm120Rules:
    """What this lane's sglang does on SM12x (RTX PRO 6000 Blackwell) that a launch must respect, each with where it
    was read (launch/lane_rules.py checks them). Empty lists / 0 / "": no such rule in this lane."""

    dsa_backends_without_sm120: tuple[str, ...] = ()
    dsa_backends_without_sm120_source: str = ""
    # The KV cache dtypes a DSA model starts with (empty: not a rule of this lane).
    dsa_kv_cache_dtypes: tuple[str, ...] = ()
    dsa_kv_cache_dtypes_source: str = ""
    # An fp8 pool's DSA backends (prefill, decode), when the lane's sglang takes only these on SM12x.
    dsa_fp8_prefill: tuple[str, ...] = ()
    dsa_fp8_decode: tuple[str, ...] = ()
    dsa_fp8_only: tuple[str, ...] = ()
    dsa_fp8_source: str = ""
    # A bf16 pool's automatic prefill backend, when it has no SM120 kernels, and the one to pin instead.
    dsa_bf16_auto_prefill: str = ""
    dsa_bf16_pin: str = ""
    dsa_bf16_source: str = ""
    allreduce_fusion_refused: bool = False
    allreduce_fusion_source: str = ""
    # The largest decode-graph batch a launch may capture on a 96 GB card (0: no cap).
    decode_graph_max_bs: int = 0
    decode_graph_source: str = ""


@dataclass(frozen=True)
class GraphTier:
    """sglang's defaults for GPUs below ``below_gib`` (None: no bound): chunked prefill and the decode graphs'
    largest batch at TP < 4 and TP >= 4."""

    below_gib: float | None
    chunked_prefill_size: int
    max_bs_small_tp: int
    max_bs_large_tp: int


@dataclass(frozen=True)
class PlannerRules:
    """The memory planner's terms that follow the lane's sglang (memory/planner.py reads them)."""

    graph_tiers: tuple[GraphTier, ...]
    graph_tiers_unknown: tuple[int, int]
    running_requests_cap_explicit_bs: bool
    prefill_graphs_default: bool
    source: str


@dataclass(frozen=True)
class Lane:
    """One stack lane, as checked against PyPI metadata."""

    name: str
    cuda: str
    sglang: str
    torch: str
    sglang_kernel: str
    transformers: str
    required_archs: tuple[str, ...]
    validator: ValidatorSpec
    lock: LockSpec | None = None
    """The ml-env lock's inputs; a lane without one can validate flags but not build an ml-env."""
    kernel_exemptions: tuple[KernelExemption, ...] = ()
    """Objects the kernel proof accepts without ``required_archs`` (it checks that they still lack them)."""
    fp4_gemm_auto_sm120: str = ""
    """What ``--fp4-gemm-backend auto`` runs on SM120 in this lane's sglang ("" = not known)."""
    choices: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """(flag, its values) for the flags the memory planner reads: what this lane's sglang takes (``plan``
    refuses others offline), recorded from its parser; tests/unit/launch/test_validator.py compares them with it."""

    tls_flags: tuple[str, ...] = ()
    """This lane's sglang flags that serve TLS (``ssl-certfile``, ...; none: it cannot), recorded from its parser;
    tests/unit/launch/test_validator.py checks that the parser has each."""
    sm120_rules: Sm120Rules = Sm120Rules()
    """What a launch must respect on SM12x in this lane's sglang (launch/lane_rules.py)."""
    planner: PlannerRules | None = None
    """The memory planner's per-lane terms; None: the planner's own (0.5.10.post1's)."""
    shared_experts_fusion_auto_off: str = ""
    """Where this lane's sglang turns shared-experts fusion off by itself for a checkpoint whose shared expert keeps a
    higher precision ("": it does not; the launch must say --disable-shared-experts-fusion)."""

    def choices_for(self, flag: str) -> tuple[str, ...] | None:
        """The values ``flag`` (``speculative-algorithm``) takes in this lane's sglang; None when not recorded."""
        return dict(self.choices).get(flag)


_OPTIONAL_LANE_KEYS = frozenset(
    {"lock", "kernel_exemptions", "fp4_gemm_auto_sm120", "choices", "tls_flags", "sm120_rules", "planner",
     "shared_experts_fusion_auto_off"}
)  # fmt: skip


def _lane_dir() -> Traversable:
    return resources.files("sglang_deploy.lanes")


def lane_names() -> list[str]:
    """The names of all lanes shipped with the package, sorted."""
    return sorted(
        entry.name.removesuffix(_LANE_SUFFIX)
        for entry in _lane_dir().iterdir()
        if entry.is_file() and entry.name.endswith(_LANE_SUFFIX)
    )


def load_lane(name: str) -> Lane:
    """Load and check the lane ``name``; raise LaneError naming the known lanes if there is none."""
    known = lane_names()
    if name not in known:
        raise LaneError(f"unknown lane {name!r}; known lanes: {', '.join(known)}")
    where = f"lane file lanes/{name}{_LANE_SUFFIX}"
    data = yaml.safe_load(_lane_dir().joinpath(name + _LANE_SUFFIX).read_text(encoding="utf-8"))
    lane = _parse_lane(_mapping(data, where), where)
    if lane.name != name:
        raise LaneError(f"{where}: name is {lane.name!r}, expected {name!r} (the file name)")
    return lane


def _parse_lane(data: dict[str, Any], where: str) -> Lane:
    _check_keys(data, set(Lane.__dataclass_fields__), where, optional=_OPTIONAL_LANE_KEYS)
    validator_where = f"{where}: validator"
    validator = _mapping(data["validator"], validator_where)
    _check_keys(validator, set(ValidatorSpec.__dataclass_fields__), validator_where)
    return Lane(
        name=_string(data, "name", where),
        cuda=_string(data, "cuda", where),
        sglang=_string(data, "sglang", where),
        torch=_string(data, "torch", where),
        sglang_kernel=_string(data, "sglang_kernel", where),
        transformers=_string(data, "transformers", where),
        required_archs=_strings(data, "required_archs", where),
        validator=ValidatorSpec(
            torch=_string(validator, "torch", validator_where),
            torch_index=_string(validator, "torch_index", validator_where),
            packages=_strings(validator, "packages", validator_where),
            stand_ins=_strings(validator, "stand_ins", validator_where),
        ),
        lock=_parse_lock(data["lock"], f"{where}: lock") if "lock" in data else None,
        kernel_exemptions=tuple(
            KernelExemption(object=_string(item, "object", item_where), reason=_string(item, "reason", item_where))
            for item, item_where in _reasoned_items(
                data.get("kernel_exemptions", []), KernelExemption, "kernel_exemptions", where
            )
        ),
        fp4_gemm_auto_sm120=_string(data, "fp4_gemm_auto_sm120", where) if "fp4_gemm_auto_sm120" in data else "",
        choices=tuple(
            (str(flag), _strings(_mapping(data["choices"], f"{where}: choices"), flag, f"{where}: choices"))
            for flag in (data.get("choices") or {})
        ),
        tls_flags=_strings(data, "tls_flags", where) if "tls_flags" in data else (),
        sm120_rules=_parse_sm120_rules(data.get("sm120_rules") or {}, f"{where}: sm120_rules"),
        planner=_parse_planner(data["planner"], f"{where}: planner") if "planner" in data else None,
        shared_experts_fusion_auto_off=(
            _string(data, "shared_experts_fusion_auto_off", where) if "shared_experts_fusion_auto_off" in data else ""
        ),
    )


def _parse_sm120_rules(value: object, where: str) -> Sm120Rules:
    data = _mapping(value, where)
    known = {"dsa_backends_without_sm120", "dsa_backends_without_sm120_source", "dsa_kv_cache_dtypes",
             "dsa_kv_cache_dtypes_source", "dsa_fp8_backends", "dsa_bf16_unset_prefill",
             "allreduce_fusion_refused", "allreduce_fusion_source", "decode_graph_max_bs", "decode_graph_source"}  # fmt: skip
    _check_keys(data, known, where, optional=frozenset(known))
    fp8 = _mapping(data.get("dsa_fp8_backends") or {"prefill": [], "decode": [], "only_fp8": [], "source": ""},
                   f"{where}: dsa_fp8_backends")  # fmt: skip
    _check_keys(fp8, {"prefill", "decode", "only_fp8", "source"}, f"{where}: dsa_fp8_backends", optional=frozenset({"only_fp8"}))
    bf16 = _mapping(data.get("dsa_bf16_unset_prefill") or {"auto": "", "pin": "", "source": ""}, f"{where}: dsa_bf16_unset_prefill")
    _check_keys(bf16, {"auto", "pin", "source"}, f"{where}: dsa_bf16_unset_prefill")
    refused = data.get("allreduce_fusion_refused", False)
    max_bs = data.get("decode_graph_max_bs", 0)
    if not isinstance(refused, bool) or not isinstance(max_bs, int) or isinstance(max_bs, bool) or max_bs < 0:
        raise LaneError(f"{where}: allreduce_fusion_refused must be true/false and decode_graph_max_bs a count >= 0")
    rules = Sm120Rules(
        dsa_backends_without_sm120=_strings(data, "dsa_backends_without_sm120", where) if "dsa_backends_without_sm120" in data else (),
        dsa_backends_without_sm120_source=str(data.get("dsa_backends_without_sm120_source") or ""),
        dsa_kv_cache_dtypes=_strings(data, "dsa_kv_cache_dtypes", where) if "dsa_kv_cache_dtypes" in data else (),
        dsa_kv_cache_dtypes_source=str(data.get("dsa_kv_cache_dtypes_source") or ""),
        dsa_fp8_prefill=_strings(fp8, "prefill", where), dsa_fp8_decode=_strings(fp8, "decode", where),
        dsa_fp8_only=_strings(fp8, "only_fp8", where) if "only_fp8" in fp8 else (),
        dsa_fp8_source=str(fp8["source"] or ""),
        dsa_bf16_auto_prefill=str(bf16["auto"] or ""), dsa_bf16_pin=str(bf16["pin"] or ""),
        dsa_bf16_source=str(bf16["source"] or ""),
        allreduce_fusion_refused=refused, allreduce_fusion_source=str(data.get("allreduce_fusion_source") or ""),
        decode_graph_max_bs=max_bs, decode_graph_source=str(data.get("decode_graph_source") or ""),
    )  # fmt: skip
    unsourced = [
        name for name, set_, source in (
            ("dsa_backends_without_sm120", rules.dsa_backends_without_sm120, rules.dsa_backends_without_sm120_source),
            ("dsa_kv_cache_dtypes", rules.dsa_kv_cache_dtypes, rules.dsa_kv_cache_dtypes_source),
            ("dsa_fp8_backends", rules.dsa_fp8_prefill, rules.dsa_fp8_source),
            ("dsa_bf16_unset_prefill", rules.dsa_bf16_auto_prefill, rules.dsa_bf16_source),
            ("allreduce_fusion_refused", rules.allreduce_fusion_refused, rules.allreduce_fusion_source),
            ("decode_graph_max_bs", rules.decode_graph_max_bs, rules.decode_graph_source),
        ) if set_ and not source.strip()
    ]  # fmt: skip
    if unsourced:
        raise LaneError(f"{where}: {', '.join(unsourced)} without a source; say where it was read")
    return rules


def _parse_planner(value: object, where: str) -> PlannerRules:
    data = _mapping(value, where)
    fields_ = set(PlannerRules.__dataclass_fields__)
    _check_keys(data, fields_, where)
    tiers = []
    rows = data["graph_tiers"]
    if not isinstance(rows, list) or not rows:
        raise LaneError(f"{where}: graph_tiers must be a list of [below GiB, chunked, max bs TP < 4, TP >= 4]")
    for index, row in enumerate(rows):
        ok = isinstance(row, list) and len(row) == 4 and all(isinstance(v, int) and not isinstance(v, bool) for v in row[1:])
        if not ok or not (row[0] is None or isinstance(row[0], (int, float))):
            raise LaneError(f"{where}: graph_tiers[{index}] = {row!r} is not [below GiB or null, chunked, bs, bs]")
        tiers.append(GraphTier(row[0], row[1], row[2], row[3]))
    if tiers[-1].below_gib is not None or any(t.below_gib is None for t in tiers[:-1]):
        raise LaneError(f"{where}: graph_tiers: only the last row has no bound (null), and it must be there")
    unknown = data["graph_tiers_unknown"]
    if not (isinstance(unknown, list) and len(unknown) == 2 and all(isinstance(v, int) for v in unknown)):
        raise LaneError(f"{where}: graph_tiers_unknown must be [chunked, max bs]")
    for key in ("running_requests_cap_explicit_bs", "prefill_graphs_default"):
        if not isinstance(data[key], bool):
            raise LaneError(f"{where}: {key} must be true or false")
    return PlannerRules(
        graph_tiers=tuple(tiers), graph_tiers_unknown=(unknown[0], unknown[1]),
        running_requests_cap_explicit_bs=data["running_requests_cap_explicit_bs"],
        prefill_graphs_default=data["prefill_graphs_default"], source=_string(data, "source", where),
    )  # fmt: skip


def _reasoned_items(value: object, kind: type, name: str, where: str) -> list[tuple[dict[str, Any], str]]:
    """The entries of the list ``name`` of ``{..., reason}`` mappings, each checked for its keys and a reason."""
    if not isinstance(value, list):
        raise LaneError(f"{where}: {name} must be a list, got {value!r}")
    items = []
    for index, item in enumerate(value):
        item_where = f"{where}: {name}[{index}]"
        entry = _mapping(item, item_where)
        _check_keys(entry, set(kind.__dataclass_fields__), item_where)
        if not isinstance(entry["reason"], str) or not entry["reason"].strip():
            raise LaneError(f"{item_where}: reason is empty; say why")
        items.append((entry, item_where))
    return items


def _parse_lock(value: object, where: str) -> LockSpec:
    data = _mapping(value, where)
    _check_keys(data, set(LockSpec.__dataclass_fields__), where)
    overrides = [
        Override(requirement=_string(item, "requirement", item_where), reason=_string(item, "reason", item_where))
        for item, item_where in _reasoned_items(data["overrides"], Override, "overrides", where)
    ]
    spec = LockSpec(
        pythons=_strings(data, "pythons", where),
        platform=_string(data, "platform", where),
        index_url=_string(data, "index_url", where),
        exclude_newer=_string(data, "exclude_newer", where),
        requirements=_strings(data, "requirements", where),
        overrides=tuple(overrides),
    )
    for python in spec.pythons:
        if not re.fullmatch(r"3\.\d+", python):
            raise LaneError(f"{where}: pythons entry {python!r} is not a minor version such as \"3.12\"")
    if not spec.pythons or not spec.requirements:
        raise LaneError(f"{where}: pythons and requirements must not be empty")
    return spec


def _mapping(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise LaneError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _check_keys(
    data: dict[str, Any], expected: set[str], where: str, optional: frozenset[str] = frozenset()
) -> None:
    """Both directions: a missing key and a misspelt (unknown) key are errors."""
    missing = sorted(expected - optional - data.keys())
    unknown = sorted(set(data) - expected)
    if missing or unknown:
        parts = [
            f"missing {', '.join(missing)}" if missing else "",
            f"unknown {', '.join(unknown)}" if unknown else "",
        ]
        raise LaneError(f"{where}: {'; '.join(p for p in parts if p)}")


def _string(data: dict[str, Any], key: str, where: str) -> str:
    """A string value; versions must be quoted in YAML (``cuda: 12.10`` would load as 12.1)."""
    value = data[key]
    if not isinstance(value, str):
        raise LaneError(
            f"{where}: {key} must be a quoted string, got {type(value).__name__} {value!r}"
        )
    return value


def _strings(data: dict[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = data[key]
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise LaneError(f"{where}: {key} must be a list of strings, got {value!r}")
    return tuple(value)
