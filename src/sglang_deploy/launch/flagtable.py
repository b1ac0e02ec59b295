"""The flag table: every sglang flag the project reasons about, typed, with its spelling in each lane's sglang.

``flag_table.yml`` is the data (the user's view: docs/lanes.md). :func:`table` loads and checks it once;
:class:`LaunchSettings` is the typed view of one launch that :class:`sglang_deploy.launch.config.LaunchConfig` builds from
it, and what the planner, preflight, the checkpoint rules and the resolver read: no module outside this one looks a
flag up by its name. A flag not in the table still reaches sglang as written; the lane's pinned parser
(``sglang-deploy validate``) stays the judge of what sglang takes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from importlib import resources
from typing import Any, Union

import yaml

TYPES = frozenset({"switch", "int", "float", "fraction", "text", "choice", "ints", "path", "secret"})
PLANNER_ROLES = frozenset({"", "reads", "owns"})
_ENTRY_KEYS = frozenset(
    {"type", "min", "max", "also", "meaning", "lanes", "absent", "aliases", "abbreviations", "planner", "placeholder",
     "source"}
)  # fmt: skip


class FlagTableError(ValueError):
    """A flag value of the wrong type or out of bounds, or a flag the lane's sglang lacks; names variable and fix."""


@dataclass(frozen=True)
class FlagSpec:
    """One row of the table (flag_table.yml's header explains each field)."""

    name: str
    type: str
    minimum: int | None = None
    maximum: int | None = None
    also: tuple[int, ...] = ()
    meaning: str = ""
    lanes: tuple[tuple[str, str | None], ...] = ()
    absent: tuple[tuple[str, str], ...] = ()
    aliases: tuple[str, ...] = ()
    abbreviations: tuple[str, ...] = ()
    planner: str = ""
    placeholder: tuple[str, str] | None = None
    source: tuple[tuple[str, str], ...] = ()

    @property
    def field(self) -> str:
        """Its name in :class:`LaunchSettings`."""
        return self.name.replace("-", "_")

    def spelling(self, lane: str) -> str | None:
        """How ``lane``'s sglang spells it; None when that sglang has no such flag."""
        return dict(self.lanes).get(lane, self.name)

    def lane_spellings(self) -> frozenset[str]:
        """The project's name and every lane's spelling: written in an inventory, each means this flag and is
        rendered in the lane's own spelling."""
        return frozenset({self.name} | {spelling for _, spelling in self.lanes if spelling})

    def spellings(self) -> frozenset[str]:
        """Every name that means this flag."""
        return self.lane_spellings() | set(self.aliases) | set(self.abbreviations)

    def absent_fix(self, lane: str) -> str:
        return dict(self.absent).get(lane, "remove it")

    def bounds(self) -> str:
        """The bounds in words ("" for a row without any)."""
        if self.meaning:
            return self.meaning
        if self.type == "fraction":
            return "a fraction between 0 and 1"
        if self.minimum is None:
            return ""
        return f"an integer >= {self.minimum}" + (f" and <= {self.maximum}" if self.maximum is not None else "")

    def holds(self, number: float) -> bool:
        """Within the row's bounds (a fraction: 0 < x < 1)."""
        if self.type == "fraction":
            return 0 < number < 1
        if number in self.also:
            return True
        return (self.minimum is None or number >= self.minimum) and (self.maximum is None or number <= self.maximum)


@dataclass(frozen=True)
class FlagTable:
    """The loaded table: its rows, and every spelling's row."""

    specs: tuple[FlagSpec, ...]
    by_spelling: Mapping[str, FlagSpec]

    def spec(self, name: str) -> FlagSpec | None:
        """The row a flag name (any spelling, dashes) belongs to; None for a flag the table does not know."""
        return self.by_spelling.get(name)

    def rendered_name(self, name: str, lane: str, variable: str = "sglang_server_flags") -> str:
        """The name ``name`` is rendered with on ``lane``: a lane spelling or an abbreviation becomes the lane's own
        spelling, an alias stays as written (sglang takes it in every lane), an unknown flag stays as written.
        FlagTableError when the lane's sglang has no such flag, naming the flag, the lane and the choice to make."""
        spec = self.by_spelling.get(name)
        if spec is None or name in spec.aliases:
            return name
        spelling = spec.spelling(lane)
        if spelling is None:
            raise FlagTableError(
                f"{variable}['{name}']: lane {lane}'s sglang has no --{name} and no flag that does its work. "
                f"Fix: {spec.absent_fix(lane)}"
            )
        return spelling

    def placeholders(self) -> dict[str, tuple[str, str]]:
        """(project name -> (our value, a value the parser takes)) of the flags the planner resolves per host."""
        return {spec.name: spec.placeholder for spec in self.specs if spec.placeholder is not None}


def _pairs(value: Any, where: str, *, nullable: bool = False) -> tuple[tuple[str, Any], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and (isinstance(v, str) or (nullable and v is None)) for k, v in value.items()
    ):
        raise FlagTableError(f"flag_table.yml: {where} must map lane names to strings, got {value!r}")
    return tuple(value.items())


def _names(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise FlagTableError(f"flag_table.yml: {where} must be a list of names, got {value!r}")
    return tuple(value)


def parse_table(data: Any) -> FlagTable:
    """The table from its YAML data; FlagTableError naming the entry and key at fault."""
    rows = data.get("flags") if isinstance(data, dict) else None
    if not isinstance(rows, dict) or not rows:
        raise FlagTableError("flag_table.yml: expected a mapping 'flags' of flag entries")
    specs: list[FlagSpec] = []
    by_spelling: dict[str, FlagSpec] = {}
    for name, entry in rows.items():
        where = f"flags['{name}']"
        if not isinstance(entry, dict):
            raise FlagTableError(f"flag_table.yml: {where} must be a mapping")
        unknown = sorted(set(entry) - _ENTRY_KEYS)
        if unknown or entry.get("type") not in TYPES or entry.get("planner", "") not in PLANNER_ROLES:
            raise FlagTableError(
                f"flag_table.yml: {where}: unknown keys {unknown}, or a type not in {sorted(TYPES)}, or a planner role "
                f"not in {sorted(PLANNER_ROLES)}"
            )
        placeholder = entry.get("placeholder")
        if placeholder is not None and not (
            isinstance(placeholder, list) and len(placeholder) == 2 and all(isinstance(p, str) for p in placeholder)
        ):
            raise FlagTableError(f"flag_table.yml: {where}.placeholder must be [our value, a value sglang parses]")
        lanes = _pairs(entry.get("lanes"), f"{where}.lanes", nullable=True)
        absent = _pairs(entry.get("absent"), f"{where}.absent")
        missing_fix = sorted(lane for lane, spelling in lanes if spelling is None and lane not in dict(absent))
        if missing_fix:
            raise FlagTableError(f"flag_table.yml: {where}: lanes {missing_fix} lack it but `absent` says no choice")
        also = entry.get("also") or []
        if not isinstance(also, list) or not all(isinstance(v, int) for v in also):
            raise FlagTableError(f"flag_table.yml: {where}.also must be a list of integers")
        spec = FlagSpec(
            name=str(name), type=entry["type"], minimum=entry.get("min"), maximum=entry.get("max"),
            also=tuple(also), meaning=str(entry.get("meaning") or ""),
            lanes=lanes, absent=absent,
            aliases=_names(entry.get("aliases"), f"{where}.aliases"),
            abbreviations=_names(entry.get("abbreviations"), f"{where}.abbreviations"),
            planner=entry.get("planner", ""), placeholder=tuple(placeholder) if placeholder else None,  # type: ignore[arg-type]
            source=_pairs(entry.get("source"), f"{where}.source"),
        )  # fmt: skip
        for spelling in spec.spellings():
            if spelling in by_spelling:
                raise FlagTableError(f"flag_table.yml: '{spelling}' names both {by_spelling[spelling].name} and {name}")
            by_spelling[spelling] = spec
        specs.append(spec)
    return FlagTable(tuple(specs), by_spelling)


@functools.lru_cache(maxsize=1)
def table() -> FlagTable:
    """The shipped table, loaded once."""
    text = resources.files("sglang_deploy.launch").joinpath("flag_table.yml").read_text(encoding="utf-8")
    return parse_table(yaml.safe_load(text))


# -- the typed view of one launch ------------------------------------------------------------------------------
@dataclass(frozen=True)
class SecretRef:
    """A secret flag set from the service's environment: the variable's name (the value never leaves the host)."""

    env: str


Fraction = Union[float, str]  # a fraction, or the placeholder the planner resolves ("auto")


@dataclass(frozen=True)
class LaunchSettings:
    """The launch's flags the table knows, typed (None / False: not set). One field per table row
    (tests/unit/launch/test_flagtable.py holds them in step); ``lane`` is whose sglang the launch is rendered for,
    ``names`` each set field's rendered flag name (for messages: the name the user reads in the unit)."""

    lane: str = ""
    model_path: str | None = None
    served_model_name: str | None = None
    speculative_draft_model_path: str | None = None
    tp_size: int | None = None
    pp_size: int | None = None
    dp_size: int | None = None
    ep_size: int | None = None
    moe_dp_size: int | None = None
    attn_cp_size: int | None = None
    dist_init_addr: str | None = None
    nnodes: int | None = None
    enable_dp_attention: bool = False
    mem_fraction_static: Fraction | None = None
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    max_prefill_tokens: int | None = None
    chunked_prefill_size: int | None = None
    page_size: int | None = None
    context_length: int | None = None
    cuda_graph_max_bs: int | None = None
    cuda_graph_bs: tuple[int, ...] | None = None
    disable_cuda_graph: bool = False
    disable_piecewise_cuda_graph: bool = False
    speculative_algorithm: str | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None
    kv_cache_dtype: str | None = None
    attention_backend: str | None = None
    dsa_prefill_backend: str | None = None
    dsa_decode_backend: str | None = None
    quantization: str | None = None
    fp4_gemm_backend: str | None = None
    disable_shared_experts_fusion: bool = False
    disable_custom_all_reduce: bool = False
    enable_flashinfer_allreduce_fusion: bool = False
    enable_nan_detection: bool = False
    host: str | None = None
    port: int | None = None
    nccl_port: int | None = None
    enable_metrics: bool = False
    api_key: SecretRef | str | None = None
    admin_api_key: SecretRef | str | None = None
    ssl_keyfile_password: SecretRef | str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_ca_certs: str | None = None
    enable_ssl_refresh: bool = False
    names: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    @property
    def tp(self) -> int:
        """The tensor-parallel size the server runs with (sglang's default: 1)."""
        return self.tp_size or 1

    @property
    def fraction_is_placeholder(self) -> bool:
        """``mem-fraction-static`` is the planner's placeholder (``auto``), resolved per host."""
        placeholder = table().placeholders()["mem-fraction-static"][0]
        return self.mem_fraction_static == placeholder

    def name_of(self, field_name: str) -> str:
        """The flag name a set field was rendered with (its lane spelling or the alias written), else the table's."""
        named = dict(self.names).get(field_name)
        if named:
            return named
        dashed = field_name.replace("_", "-")
        spec = table().spec(dashed)
        return (spec.spelling(self.lane) if spec is not None and self.lane else None) or dashed

    def planner_inputs(self) -> dict[str, Any]:
        """The set fields the memory planner reads (the table's ``planner: reads``), by field name."""
        out: dict[str, Any] = {}
        for spec in table().specs:
            if spec.planner == "reads":
                value = getattr(self, spec.field)
                if value is not None and value is not False:
                    out[spec.field] = value
        return out


SETTINGS_FIELDS = frozenset(f.name for f in fields(LaunchSettings)) - {"lane", "names"}


def _template_problem(variable: str, name: str, text: str) -> str | None:
    if "{{" in text or "{%" in text:
        return (
            f"{variable}['{name}'] = {text!r} is a Jinja template nothing evaluated here. Fix: run through Ansible "
            f"(render, up, plan -i), or give the value itself"
        )
    return None


def typed_value(spec: FlagSpec, name: str, value: Any, variable: str = "sglang_server_flags") -> Any:
    """``value`` (as LaunchConfig holds it: True, a string, a tuple of strings, or an env reference with ``.name``)
    as the table's type; FlagTableError naming the variable, the flag, what it is and the fix."""
    ref = f"{variable}['{name}']"
    env_name = getattr(value, "name", None)
    if spec.type == "secret":
        return SecretRef(str(env_name)) if env_name is not None else str(value)
    if env_name is not None:
        if spec.type in ("text", "choice", "path"):
            return None  # known only at start, from the environment: nothing here reads it
        raise FlagTableError(
            f"{ref} reads ${{{env_name}}}, but the planner and the lane's rules need its value here. Fix: write it in the "
            "inventory"
        )
    if spec.type == "switch":
        if value is not True:
            raise FlagTableError(f"{ref} = {value!r}: it is a bare switch. Fix: true to set it, null to leave it out")
        return True
    if value is True:
        raise FlagTableError(f"{ref} is true, but it takes a value ({spec.type}). Fix: give it one")
    if spec.type == "ints":
        items = tuple(value) if isinstance(value, (tuple, list)) else str(value).split()
        return tuple(typed_value(FlagSpec(spec.name, "int", spec.minimum, spec.maximum), name, item, variable) for item in items)
    if isinstance(value, list):
        value = tuple(value)
    if isinstance(value, tuple):
        raise FlagTableError(f"{ref} is a list, but it takes one value ({spec.type}). Fix: give one")
    text = str(value)
    if spec.type in ("text", "choice", "path"):
        return text
    problem = _template_problem(variable, name, text)
    if problem:  # a number nothing evaluated: the planner and the rules cannot read it
        raise FlagTableError(problem)
    if spec.type == "fraction" and spec.placeholder is not None and text == spec.placeholder[0]:
        return text
    if spec.type == "int":
        try:
            number: float = int(text)
        except ValueError:
            raise FlagTableError(f"{ref} = {text!r} is not an integer. Fix: a whole number") from None
    else:
        try:
            number = float(text)
        except ValueError:
            number = math.nan
        if not math.isfinite(number):
            extra = f" or {spec.placeholder[0]!r}" if spec.placeholder else ""
            raise FlagTableError(f"{ref} = {text!r} is not a number. Fix: a number{extra}")
    if not spec.holds(number):
        raise FlagTableError(f"{ref} = {text!r} is out of bounds: want {spec.bounds()}. Fix: a value in them")
    return number


def settings_of(flags: Mapping[str, Any], lane: str, variable: str = "sglang_server_flags") -> LaunchSettings:
    """The typed view of rendered flags (name -> value, as LaunchConfig holds them)."""
    values: dict[str, Any] = {}
    names: list[tuple[str, str]] = []
    rows = table()
    for name, value in flags.items():
        spec = rows.spec(name)
        if spec is None:
            continue
        values[spec.field] = typed_value(spec, name, value, variable)
        names.append((spec.field, name))
    return LaunchSettings(lane=lane, names=tuple(names), **values)
