"""An inventory's variables against the roles' own: a role-prefixed name no role defines is a mistake.

A variable named like a role's (``sglang_server_...``, ``hf_model_...``) that the role does not define - a
typo, a renamed or removed variable, one from a newer version - is ignored by Ansible without a word, and
the operator believes a setting is live that is not. Every role declares its variables in
``meta/argument_specs.yml`` (a test keeps them equal to its defaults), and the roles publish a few facts of
their own (``set_fact``); anything else with a role's prefix is refused before any host changes (the start of
``render``, ``validate`` and ``up``: playbooks/resolve.yml; ``plan -i``), naming the file that sets it and the
closest defined name. Deliberate extras (a site's own variables that happen to share a prefix) are listed in
``sglang_deploy_extra_variables``.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

# Where a deliberate extra variable is listed (an inventory variable itself).
EXTRAS_VAR = "sglang_deploy_extra_variables"
_SET_FACT = re.compile(r"^\s*(?:ansible\.builtin\.)?set_fact:\s*$")
_FACT_NAME = re.compile(r"^\s+([a-z][a-z0-9_]*):")


class UnknownVariablesError(ValueError):
    """Role-prefixed variables no role defines; the message names each, its file and the closest name."""


@functools.lru_cache(maxsize=4)
def role_variables(roles_dir: str) -> tuple[frozenset[str], tuple[str, ...]]:
    """The variables the roles define (their argument specs) and publish (set_fact outside ``__`` names), and
    the roles' prefixes (``<role>_``)."""
    roles = Path(roles_dir)
    defined: set[str] = set()
    prefixes = []
    for spec_path in sorted(roles.glob("*/meta/argument_specs.yml")):
        role = spec_path.parents[1].name
        prefixes.append(f"{role}_")
        spec = yaml.safe_load(spec_path.read_text(encoding="utf-8")) or {}
        for entry in (spec.get("argument_specs") or {}).values():
            defined.update((entry or {}).get("options") or {})
        for tasks in sorted((roles / role / "tasks").glob("*.yml")):
            defined.update(_published(tasks.read_text(encoding="utf-8")))
    if not prefixes:  # a check that found no roles would pass everything
        raise UnknownVariablesError(f"no role argument specs under {roles_dir}: cannot tell which variables the roles define")
    return frozenset(defined), tuple(sorted(prefixes, key=len, reverse=True))


def role_defaults(role: str, roles_dir: str | Path) -> dict[str, Any]:
    """A role's ``defaults/main.yml``, the one place its defaults are written: a CLI option that stands for a
    role's variable takes its default from here, never from a second literal."""
    path = Path(roles_dir) / role / "defaults" / "main.yml"
    try:
        values = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise UnknownVariablesError(f"cannot read the defaults of role {role} ({path}): {err}") from None
    if not isinstance(values, dict):
        raise UnknownVariablesError(f"{path} holds no variables")
    return values


def _published(text: str) -> set[str]:
    """The fact names a task file sets (the keys right under ``set_fact:``), ``__`` ones left out."""
    names: set[str] = set()
    lines = text.splitlines()
    for number, line in enumerate(lines):
        if not _SET_FACT.match(line):
            continue
        indent = len(line) - len(line.lstrip())
        for follow in lines[number + 1:]:
            if follow.strip() and len(follow) - len(follow.lstrip()) <= indent:
                break
            match = _FACT_NAME.match(follow)
            if match and len(follow) - len(follow.lstrip()) == indent + 2 and match.group(1) != "cacheable":
                names.add(match.group(1))
    return names


def unknown(
    names: Iterable[str], roles_dir: str, extras: Sequence[str] = ()
) -> list[tuple[str, str | None]]:
    """Each role-prefixed name in ``names`` that no role defines or publishes and ``extras`` does not list,
    with the closest defined name (or None)."""
    defined, prefixes = role_variables(roles_dir)
    allowed = set(extras)
    found = []
    for name in sorted(set(names)):
        if name.startswith("_") or name in defined or name in allowed or not name.startswith(prefixes):
            continue
        found.append((name, _closest(name, defined, prefixes)))
    return found


def _closest(name: str, defined: frozenset[str], prefixes: tuple[str, ...]) -> str | None:
    """The defined name of the same role whose rest is closest to ``name``'s rest; the shared prefix is left
    out of the comparison, or every name of a role would look alike."""
    prefix = next(p for p in prefixes if name.startswith(p))
    rests = {d[len(prefix):]: d for d in defined if d.startswith(prefix)}
    close = difflib.get_close_matches(name[len(prefix):], sorted(rests), n=1, cutoff=0.6)
    return rests[close[0]] if close else None


# An inventory file larger than this is not searched for a name (an inventory is kilobytes).
_SOURCE_MAX_BYTES = 1 << 20
# At most this many files of one inventory are searched.
_SOURCE_MAX_FILES = 2000


def sources(name: str, inventory_sources: Sequence[str]) -> list[str]:
    """The inventory files (group_vars, host_vars, the hosts file) that set ``name`` at their top level."""
    hits = []
    for source in inventory_sources:
        root = Path(source)
        if root.is_file():
            candidates = [root]
        else:
            candidates = sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())[:_SOURCE_MAX_FILES]
        for path in candidates:
            try:
                with path.open("rb") as handle:
                    text = handle.read(_SOURCE_MAX_BYTES + 1).decode("utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            if len(text) > _SOURCE_MAX_BYTES:
                continue
            if re.search(rf"^\s*{re.escape(name)}\s*:", text, re.M):
                hits.append(str(path))
    return hits


def check(host: str, variables: Mapping[str, Any], roles_dir: str, inventory_sources: Sequence[str] = ()) -> None:
    """UnknownVariablesError naming every role-prefixed variable of ``host`` that no role defines."""
    extras = variables.get(EXTRAS_VAR) or []
    if not isinstance(extras, list) or not all(isinstance(e, str) for e in extras):
        raise UnknownVariablesError(f"host {host}: {EXTRAS_VAR} must be a list of variable names, found {extras!r}")
    found = unknown(variables, roles_dir, extras)
    if not found:
        return
    lines = []
    for name, close in found:
        where = ", ".join(sources(name, inventory_sources)) or "not in an inventory file: --extra-vars or a template"
        hint = f" Did you mean {close}?" if close else ""
        lines.append(f"{name} (set in {where}) is not a variable of any role.{hint}")
    raise UnknownVariablesError(
        f"host {host}: " + " ".join(lines) + f" Ansible would ignore it. Fix: correct the name, or list a deliberate "
        f"extra variable in {EXTRAS_VAR}"
    )
