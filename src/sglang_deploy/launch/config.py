"""The launch configuration: one data model for the sglang server's flags and environment.

Inventory data (``sglang_server_flags`` + ``sglang_server_flags_override``, ``sglang_server_env`` +
``sglang_server_env_override``) goes in; the argv, the systemd ``ExecStart=``/``Environment=`` lines
and what ``validate`` checks come out. Everything that renders a launch goes through
:meth:`LaunchConfig.from_vars`, so the unit, ``sglang-deploy render`` and the validator cannot drift.

Flag values:
  ``true``                 bare switch (``--trust-remote-code``)
  ``false`` / ``null``     flag left out (use ``null`` in an override to remove a profile default)
  string / number          ``--flag value``
  list                     ``--flag v1 v2 ...`` (argparse ``nargs``)
  ``{env: NAME}``          ``--flag`` with the value of variable NAME of the 0600 environment file:
                           sglang_launcher.py hands it to sglang inside the process, so the secret
                           is neither in the unit file nor in the process's argv (nor in its log)
  other mapping            ``--flag '<json>'`` (e.g. ``json-model-override-args``)
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Union

from sglang_deploy.lanes.catalog import DEFAULT_LANE, lane_names
from sglang_deploy.launch import flagtable
from sglang_deploy.launch.flagtable import LaunchSettings
from sglang_deploy_host.serving import sglang_launcher, systemd, unit_flags

DEFAULT_MODULE = "sglang.launch_server"
# Where the sglang_server role installs sglang_launcher.py (sglang_server_libexec_dir).
DEFAULT_LAUNCHER = "/usr/local/libexec/sglang-deploy/sglang_launcher.py"

# Which flags are one sglang option, how each lane spells them, their types, and the values the planner resolves
# per host: the flag table (flag_table.yml, flagtable.py). The validator catches any alias the table misses by
# argparse ``dest``.
TABLE = flagtable.table()


class LaunchConfigError(ValueError):
    """Inventory data that cannot become a launch command. The message names variable and fix."""


@dataclass(frozen=True)
class EnvRef:
    """A flag value taken from the service's environment at start (``${NAME}``)."""

    name: str


Scalar = str
FlagValue = Union[bool, Scalar, tuple[Scalar, ...], EnvRef]


@dataclass(frozen=True)
class Flag:
    """One command-line option: ``name`` without dashes; ``True`` is a bare switch."""

    name: str
    value: FlagValue

    @property
    def option(self) -> str:
        return "--" + self.name

    def argv(self) -> list[str]:
        """The flag's words. An ``EnvRef`` value is shown as ``${NAME}``: a placeholder of the
        type sglang parses (a string); at start the launcher puts the real value in its place."""
        if self.value is True:
            return [self.option]
        if isinstance(self.value, EnvRef):
            return [self.option, "${" + self.value.name + "}"]
        if isinstance(self.value, tuple):
            return [self.option, *self.value]
        return [self.option, str(self.value)]


@dataclass(frozen=True)
class LaunchConfig:
    """The server's command line and environment, validated for shape (not yet for sglang)."""

    python: str
    flags: tuple[Flag, ...]
    environment: tuple[tuple[str, str], ...] = ()
    module: str = DEFAULT_MODULE
    secret_env_names: frozenset[str] = field(default_factory=frozenset)
    launcher: str = DEFAULT_LAUNCHER
    lane: str = DEFAULT_LANE
    settings: LaunchSettings = field(default_factory=LaunchSettings)
    """The flags the table knows, typed (flagtable.py): what every reader of a launch reads."""

    @classmethod
    def from_vars(
        cls,
        flags: Mapping[str, Any] | None,
        *,
        python: str,
        flags_override: Mapping[str, Any] | None = None,
        env: Mapping[str, Any] | None = None,
        env_override: Mapping[str, Any] | None = None,
        secret_env_names: Iterable[str] = (),
        module: str = DEFAULT_MODULE,
        launcher: str = DEFAULT_LAUNCHER,
        profile: str | None = None,
        profiles: Mapping[str, Any] | None = None,
        lane: str = DEFAULT_LANE,
    ) -> LaunchConfig:
        """Build from inventory variables (the flags, the launch profile merged over them, then the
        override), each flag in ``lane``'s sglang spelling and typed by the flag table; raises
        :class:`LaunchConfigError` with the fix."""
        if not python:
            raise LaunchConfigError("sglang_server_python is empty: set it to the ml-env's python3")
        merged_flags = merge_flags(profile_flags(flags, profile, profiles, lane), flags_override)
        merged_env = merge_flags(env, env_override, variable="sglang_server_env")
        parsed = tuple(_flag(name, value, lane) for name, value in merged_flags.items() if value is not None)
        _check_conflicts(parsed)
        settings = _settings(parsed, lane)
        environment = tuple(
            (_env_name(name), _env_value(name, value))
            for name, value in merged_env.items()
            if value is not None
        )
        config = cls(
            python=python,
            flags=parsed,
            environment=environment,
            module=module,
            secret_env_names=frozenset(secret_env_names),
            launcher=launcher,
            lane=lane,
            settings=settings,
        )
        config._check_env_refs()
        return config

    def amended(self, *, flags: Mapping[str, Any] | None = None, env: Mapping[str, Any] | None = None) -> LaunchConfig:
        """This launch with ``flags`` and ``env`` changed (null removes one; a flag in any spelling the table knows
        replaces it in place, rendered for this launch's lane): what the resolver adds after the inventory (the P2P
        adjustment, the role's own flags, the planner's fraction). Only the changes are parsed; the whole launch is
        checked again (conflicts, types, environment references). No change: this launch itself."""
        if not flags and not env:
            return self
        parsed = list(self.flags)
        for key, value in (flags or {}).items():
            wanted = _identity(key)
            at = next((i for i, flag in enumerate(parsed) if _identity(flag.name) == wanted), None)
            if value is None:
                parsed = [flag for i, flag in enumerate(parsed) if i != at]
            elif at is None:
                parsed.append(_flag(key, value, self.lane))
            else:
                parsed[at] = _flag(key, value, self.lane)
        _check_conflicts(parsed)
        environment = dict(self.environment)
        for name, value in (env or {}).items():
            if value is None:
                environment.pop(name, None)
            else:
                environment[_env_name(name)] = _env_value(name, value)
        settings = _settings(parsed, self.lane)
        config = replace(self, flags=tuple(parsed), environment=tuple(environment.items()), settings=settings)
        config._check_env_refs()
        return config

    # -- reading -------------------------------------------------------------------------------
    @property
    def tp_size(self) -> int:
        """Tensor-parallel size the server will use (sglang's default is 1)."""
        return self.settings.tp

    # -- rendering -----------------------------------------------------------------------------
    def flag_argv(self) -> list[str]:
        """The flags alone, as sglang's parser sees them (``${NAME}`` left for env references)."""
        return [word for flag in self.flags for word in flag.argv()]

    def validation_argv(self) -> list[str]:
        """:meth:`flag_argv` with our own placeholders (not sglang's) swapped for a value of the type
        sglang parses: ``mem-fraction-static: auto`` is resolved per host by the memory planner."""
        words: list[str] = []
        placeholders = TABLE.placeholders()
        for flag in self.flags:
            spec = TABLE.spec(flag.name)
            placeholder = placeholders.get(spec.name) if spec is not None else None
            if placeholder is not None and str(flag.value) == placeholder[0]:
                words += [f"--{flag.name}", placeholder[1]]
            else:
                words += flag.argv()
        return words

    def env_flags(self) -> list[tuple[str, str]]:
        """``(flag, variable)`` of the flags whose value the launcher reads from the environment."""
        return [(f.name, f.value.name) for f in self.flags if isinstance(f.value, EnvRef)]

    def argv(self) -> list[str]:
        """What systemd executes: the launcher, with each environment flag by its variable's NAME
        (the value never enters an argv), then every other flag."""
        plain = [flag for flag in self.flags if not isinstance(flag.value, EnvRef)]
        words = [word for flag in plain for word in flag.argv()]
        return sglang_launcher.command_line(self.python, self.launcher, self.module, self.env_flags(), words)

    def exec_start(self) -> str:
        """ExecStart= value: one flag per continuation line, so the unit reads like the seeds."""
        head = sglang_launcher.command_line(self.python, self.launcher, self.module, self.env_flags(), [])
        return systemd.exec_start(head, [f.argv() for f in self.flags if not isinstance(f.value, EnvRef)])

    def environment_assignments(self) -> list[str]:
        """Values for ``Environment=`` lines, in inventory order."""
        return [systemd.environment_assignment(name, value) for name, value in self.environment]

    def to_dict(self) -> dict[str, Any]:
        """Plain data for Ansible (filters return this) and for ``--json`` output."""
        return {
            "python": self.python,
            "module": self.module,
            "argv": self.argv(),
            "env_flags": dict(self.env_flags()),
            "flag_argv": self.flag_argv(),
            "validation_argv": self.validation_argv(),
            "flags": {f.name: _plain(f.value) for f in self.flags},
            "environment": dict(self.environment),
            "exec_start": self.exec_start(),
            "environment_assignments": self.environment_assignments(),
            "tp_size": self.tp_size,
            "lane": self.lane,
        }

    def exposure_problem(self, *, allow_unauthenticated: bool) -> str | None:
        """Why this launch would serve the model insecurely, or None.

        A secret written as a flag value lands in the unit file and the process's argv; a server bound
        to a non-loopback address without a key serves anyone who reaches the port, which only an
        explicit ``sglang_server_allow_unauthenticated`` may ask for.
        """
        for flag in self.flags:
            spec = TABLE.spec(flag.name)
            if spec is not None and spec.type == "secret" and not isinstance(flag.value, EnvRef):
                is_key = flag.name == "api-key"
                fix = "sglang_server_api_key" if is_key else "{env: NAME} with NAME in sglang_server_secret_env"
                return (
                    f"sglang_server_flags['{flag.name}'] holds the {'key' if is_key else 'secret'} itself, which would land in the unit "
                    f"file and in the server's argv (readable by every local user). Fix: remove it and set {fix} "
                    "(from vault or the environment) instead"
                )
        served = self.settings
        return unit_flags.exposure_problem(
            "the server",
            unit_flags.DEFAULT_BIND_HOST if served.host is None else served.host,
            unit_flags.DEFAULT_PORT if served.port is None else served.port,
            has_key=served.api_key is not None,
            allowed=allow_unauthenticated,
            key_var="sglang_server_api_key",
            bind_var="sglang_server_flags['host']",
            allow_var="sglang_server_allow_unauthenticated",
        )

    def _check_env_refs(self) -> None:
        known = {name for name, _ in self.environment} | self.secret_env_names
        for flag in self.flags:
            if isinstance(flag.value, EnvRef) and flag.value.name not in known:
                raise LaunchConfigError(
                    f"sglang_server_flags['{flag.name}'] reads ${{{flag.value.name}}}, which is "
                    "neither in sglang_server_env nor in sglang_server_secret_env. Fix: define it "
                    "there (secrets in sglang_server_secret_env, from vault or the environment)."
                )


# -- launch profiles -----------------------------------------------------------------------------
PROFILE_LANES_KEY = "lanes"
"""A profile's key for what it changes on one lane only (``lanes: {cu130: {flag: value}}``), merged after the
profile's own changes: a choice that differs between the lanes' sglang (an SM120 kernel one lane has), not a
rename (the flag table renders each flag in the lane's spelling by itself)."""


def profile_flags(
    flags: Mapping[str, Any] | None,
    profile: str | None,
    profiles: Mapping[str, Any] | None,
    lane: str = DEFAULT_LANE,
) -> dict[str, Any]:
    """``sglang_server_flags`` with the launch profile ``sglang_server_profile`` (an entry of
    ``sglang_server_profiles``: flag changes, null removes a flag, then its ``lanes`` entry for ``lane``) merged
    in; "" or None = the flags as they are. What every reader of a host's flags starts from (the override comes
    after)."""
    if profile is not None and not isinstance(profile, str):
        raise LaunchConfigError(
            f"sglang_server_profile = {profile!r} is not a profile's name (a {type(profile).__name__}). "
            'Fix: one name of sglang_server_profiles, e.g. "tuned", or "" for sglang_server_flags as they are'
        )
    if not profile:
        return merge_flags(flags, None)
    if profiles is not None and not isinstance(profiles, Mapping):
        raise LaunchConfigError(
            f"sglang_server_profiles must be a mapping (profile name: flag changes), got {type(profiles).__name__}"
        )
    if not isinstance(profiles, Mapping) or profile not in profiles:
        known = ", ".join(sorted(str(name) for name in profiles)) if isinstance(profiles, Mapping) else ""
        raise LaunchConfigError(
            f"sglang_server_profile {profile!r} is not one of sglang_server_profiles ({known or 'none defined'}). "
            'Fix: set sglang_server_profile to one of those, or "" for sglang_server_flags as they are'
        )
    changes = profiles[profile]
    if changes is None:
        changes = {}
    if not isinstance(changes, Mapping):
        raise LaunchConfigError(
            f"sglang_server_profiles['{profile}'] must be a mapping of flag changes, got {type(changes).__name__}"
        )
    label = f"sglang_server_profiles['{profile}']"
    per_lane = changes.get(PROFILE_LANES_KEY) or {}
    if not isinstance(per_lane, Mapping) or not all(
        isinstance(v, Mapping) or v is None for v in per_lane.values()
    ):
        raise LaunchConfigError(
            f"{label}['{PROFILE_LANES_KEY}'] must map lane names to flag changes, e.g. {{cu130: {{flag: value}}}}"
        )
    unknown = sorted(str(name) for name in per_lane if name not in lane_names())
    if unknown:
        raise LaunchConfigError(
            f"{label}['{PROFILE_LANES_KEY}'] names {', '.join(unknown)}, which is no lane (known: {', '.join(lane_names())}). "
            "Fix: spell the lane as sglang_common_lane does"
        )
    own = {key: value for key, value in changes.items() if key != PROFILE_LANES_KEY}
    merged = merge_flags(flags, own, override_label=label)
    return merge_flags(merged, per_lane.get(lane), override_label=f"{label}['{PROFILE_LANES_KEY}']['{lane}']")


# -- helpers -----------------------------------------------------------------------------------
def merge_flags(
    base: Mapping[str, Any] | None,
    override: Mapping[str, Any] | None,
    *,
    variable: str = "sglang_server_flags",
    override_label: str = "",
) -> dict[str, Any]:
    """``base`` updated by ``override``: replaced keys keep their place, new ones go last (a null
    value stays, to remove the flag when rendered). The one merge rule of flags and environment. For flags, an
    override's key replaces the base's key for the same flag in any spelling (``tp_size`` for ``tp-size``, a lane's
    ``dsa-prefill-backend`` for ``nsa-prefill-backend``: the flag table's rows), under the override's spelling."""
    merged: dict[str, Any] = {}
    is_flags = variable == "sglang_server_flags"
    for label, part in ((variable, base), (override_label or variable + "_override", override)):
        if part is None:
            continue
        if not isinstance(part, Mapping):
            raise LaunchConfigError(
                f"{label} must be a mapping (name: value), got {type(part).__name__}"
            )
        # The earlier parts' keys by flag: each replaced once, so two spellings within one part stay a conflict.
        earlier = {_identity(key): key for key in merged} if is_flags else {}
        for key, value in part.items():
            if not isinstance(key, str) or not key.strip("-_ "):
                raise LaunchConfigError(f"{label} has an empty or non-string key: {key!r}")
            replaced = earlier.pop(_identity(key), None) if is_flags else None
            if replaced is not None and replaced != key:
                merged = {(key if k == replaced else k): (value if k == replaced else v) for k, v in merged.items()}
            else:
                merged[key] = value
    return merged


def _settings(flags: Sequence[Flag], lane: str) -> LaunchSettings:
    """The typed view of parsed flags (flagtable.settings_of), its refusals as launch errors."""
    try:
        return flagtable.settings_of({flag.name: flag.value for flag in flags}, lane)
    except flagtable.FlagTableError as err:
        raise LaunchConfigError(str(err)) from None


def _identity(key: str) -> str:
    """Which flag a key names: its table row, else its one spelling (flag_name)."""
    spec = TABLE.spec(flag_name(key))
    return spec.name if spec is not None else flag_name(key)


def flag_name(name: object) -> str:
    """The one spelling of a flag's name: ``--tp_size`` / ``tp_size`` / ``tp-size`` all name ``tp-size``."""
    return str(name).strip().lstrip("-").replace("_", "-")


def normalized_flags(flags: Mapping[str, Any]) -> dict[str, Any]:
    """``flags`` keyed by :func:`flag_name` (a later spelling of one flag wins, as in a merge)."""
    return {flag_name(key): value for key, value in flags.items()}


def _scalar(name: str, value: Any) -> str:
    if isinstance(value, bool):
        raise LaunchConfigError(
            f"sglang_server_flags['{name}']: a list item or value cannot be a boolean ({value!r}); "
            "use true only for a bare switch"
        )
    if isinstance(value, float):
        if not math.isfinite(value):
            raise LaunchConfigError(f"sglang_server_flags['{name}'] = {value!r} is not finite")
        return repr(value)
    if isinstance(value, (str, int)):
        return str(value)
    raise LaunchConfigError(
        f"sglang_server_flags['{name}'] has a value of type {type(value).__name__}; "
        "use a string, number, true, a list or {env: NAME}"
    )


def _flag(raw_name: str, value: Any, lane: str) -> Flag:
    problem = unit_flags.flag_name_problem(raw_name, "sglang_server_flags")
    if problem:
        raise LaunchConfigError(problem)
    try:
        name = TABLE.rendered_name(flag_name(raw_name), lane)
    except flagtable.FlagTableError as err:
        raise LaunchConfigError(str(err)) from None
    if value is True:
        return Flag(name, True)
    if value is False:
        raise LaunchConfigError(unit_flags.false_value_problem("sglang_server_flags", name))
    if isinstance(value, Mapping):
        keys = set(value)
        if keys == {"env"}:
            env_name = str(value["env"])
            if not systemd.ENV_NAME.fullmatch(env_name):
                raise LaunchConfigError(
                    f"sglang_server_flags['{raw_name}']: {{env: {env_name}}} is not a valid "
                    "environment variable name"
                )
            return Flag(name, EnvRef(env_name))
        return Flag(name, json.dumps(_plain_mapping(value), separators=(",", ":")))
    if isinstance(value, Sequence) and not isinstance(value, str):
        if not value:
            raise LaunchConfigError(
                f"sglang_server_flags['{raw_name}'] is an empty list; use null to remove the flag"
            )
        return Flag(name, tuple(_scalar(raw_name, item) for item in value))
    return Flag(name, _scalar(raw_name, value))


def _plain_mapping(value: Mapping[str, Any]) -> dict[str, Any]:
    # json.dumps needs plain containers; Ansible may hand over its own mapping types.
    return json.loads(json.dumps(dict(value), default=str))


def _plain(value: FlagValue) -> Any:
    if isinstance(value, EnvRef):
        return {"env": value.name}
    if isinstance(value, tuple):
        return list(value)
    return value


def _check_conflicts(flags: Sequence[Flag]) -> None:
    seen: dict[str, str] = {}
    for flag in flags:
        spec = TABLE.spec(flag.name)
        group = spec.name if spec is not None else flag.name
        if group in seen:
            first = seen[group]
            what = "is set twice" if first == flag.name else f"and '{first}' both set"
            spellings = sorted(spec.spellings()) if spec is not None else [group]
            raise LaunchConfigError(
                f"sglang_server_flags: '{flag.name}' {what} (they are one sglang option: "
                f"{', '.join('--' + s for s in spellings)}). Fix: keep one key; to replace a profile default from host_vars use "
                "sglang_server_flags_override with the same key, or null to remove it."
            )
        seen[group] = flag.name


def _env_name(name: str) -> str:
    if not systemd.ENV_NAME.fullmatch(name):
        raise LaunchConfigError(
            f"sglang_server_env: {name!r} is not a valid environment variable name"
        )
    return name


def _env_value(name: str, value: Any) -> str:
    if isinstance(value, bool):
        raise LaunchConfigError(
            f"sglang_server_env['{name}'] = {value!r}: booleans are ambiguous for programs reading "
            "the environment. Fix: write the exact string, e.g. '1' or '0'."
        )
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (str, int)):
        return str(value)
    raise LaunchConfigError(
        f"sglang_server_env['{name}'] has a value of type {type(value).__name__}; use a string"
    )
