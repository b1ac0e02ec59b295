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
from dataclasses import dataclass, field
from typing import Any, Union

from sglang_deploy_host import endpoint, sglang_launcher, systemd

DEFAULT_MODULE = "sglang.launch_server"
# Where the sglang_server role installs sglang_launcher.py (sglang_server_libexec_dir).
DEFAULT_LAUNCHER = "/usr/local/libexec/sglang-deploy/sglang_launcher.py"

# Option strings that name the same argparse action in sglang (checked in 0.5.10.post1's
# server_args.py). Two of one group in the same config is a conflict; the validator catches any
# group this table misses by argparse ``dest``.
ALIAS_GROUPS: tuple[tuple[str, ...], ...] = (
    ("model-path", "model"),
    ("tensor-parallel-size", "tp-size", "tp"),
    ("pipeline-parallel-size", "pp-size"),
    ("data-parallel-size", "dp-size"),
    ("expert-parallel-size", "ep-size", "ep"),
    ("attention-context-parallel-size", "attn-cp-size"),
    ("moe-data-parallel-size", "moe-dp-size"),
    ("dist-init-addr", "nccl-init-addr"),
    ("speculative-draft-model-path", "speculative-draft-model"),
)
# Names sglang accepts only through argparse prefix matching: rendered in full, because a new flag
# sharing the prefix would make them ambiguous (the seeds' ``--tp 8`` is ``--tp-size 8``).
ABBREVIATIONS: dict[str, str] = {"tp": "tp-size"}
# Our own flag values that a role resolves per host (flag -> (placeholder, a value sglang's parser
# accepts in its place for validation)): the memory planner turns ``auto`` into a fraction.
RESOLVED_PER_HOST: dict[str, tuple[str, str]] = {"mem-fraction-static": ("auto", "0.9")}

_GROUP_OF: dict[str, tuple[str, ...]] = {name: group for group in ALIAS_GROUPS for name in group}


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
    ) -> LaunchConfig:
        """Build from inventory variables (the flags, the launch profile merged over them, then the
        override); raises :class:`LaunchConfigError` with the fix."""
        if not python:
            raise LaunchConfigError("sglang_server_python is empty: set it to the ml-env's python3")
        merged_flags = merge_flags(profile_flags(flags, profile, profiles), flags_override)
        merged_env = merge_flags(env, env_override, variable="sglang_server_env")
        parsed = tuple(_flag(name, value) for name, value in merged_flags.items() if value is not None)
        _check_conflicts(parsed)
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
        )
        config._check_env_refs()
        return config

    # -- reading -------------------------------------------------------------------------------
    def flag(self, name: str) -> Flag | None:
        """The flag called ``name`` or any of its aliases, if set."""
        wanted = set(_GROUP_OF.get(flag_name(name), (flag_name(name),)))
        return next((f for f in self.flags if f.name in wanted), None)

    @property
    def tp_size(self) -> int:
        """Tensor-parallel size the server will use (sglang's default is 1)."""
        tp = self.flag("tp-size")
        if tp is None:
            return 1
        try:
            return int(str(tp.value))
        except ValueError:
            raise LaunchConfigError(
                f"sglang_server_flags['{tp.name}'] = {tp.value!r} is not an integer GPU count"
            ) from None

    # -- rendering -----------------------------------------------------------------------------
    def flag_argv(self) -> list[str]:
        """The flags alone, as sglang's parser sees them (``${NAME}`` left for env references)."""
        return [word for flag in self.flags for word in flag.argv()]

    def validation_argv(self) -> list[str]:
        """:meth:`flag_argv` with our own placeholders (not sglang's) swapped for a value of the type
        sglang parses: ``mem-fraction-static: auto`` is resolved per host by the memory planner."""
        words: list[str] = []
        for flag in self.flags:
            placeholder = RESOLVED_PER_HOST.get(flag.name)
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
        }

    def exposure_problem(self, *, allow_unauthenticated: bool) -> str | None:
        """Why this launch would serve the model insecurely, or None.

        A secret written as a flag value lands in the unit file and the process's argv; a server bound
        to a non-loopback address without a key serves anyone who reaches the port, which only an
        explicit ``sglang_server_allow_unauthenticated`` may ask for.
        """
        for flag in self.flags:
            if flag.name in endpoint.SECRET_FLAGS and not isinstance(flag.value, EnvRef):
                is_key = flag.name == "api-key"
                fix = "sglang_server_api_key" if is_key else "{env: NAME} with NAME in sglang_server_secret_env"
                return (
                    f"sglang_server_flags['{flag.name}'] holds the {'key' if is_key else 'secret'} itself, which would land in the unit "
                    f"file and in the server's argv (readable by every local user). Fix: remove it and set {fix} "
                    "(from vault or the environment) instead"
                )
        host = self.flag("host")
        port = self.flag("port")
        return endpoint.exposure_problem(
            "the server",
            endpoint.DEFAULT_BIND_HOST if host is None else str(host.value),
            endpoint.DEFAULT_PORT if port is None else port.value,
            has_key=self.flag("api-key") is not None,
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
def profile_flags(
    flags: Mapping[str, Any] | None, profile: str | None, profiles: Mapping[str, Any] | None
) -> dict[str, Any]:
    """``sglang_server_flags`` with the launch profile ``sglang_server_profile`` (an entry of
    ``sglang_server_profiles``: flag changes, null removes a flag) merged in; "" or None = the flags
    as they are. What every reader of a host's flags starts from (the override comes after)."""
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
    return merge_flags(flags, changes, override_label=f"sglang_server_profiles['{profile}']")


# -- helpers -----------------------------------------------------------------------------------
def merge_flags(
    base: Mapping[str, Any] | None,
    override: Mapping[str, Any] | None,
    *,
    variable: str = "sglang_server_flags",
    override_label: str = "",
) -> dict[str, Any]:
    """``base`` updated by ``override``: replaced keys keep their place, new ones go last (a null
    value stays, to remove the flag when rendered). The one merge rule of flags and environment."""
    merged: dict[str, Any] = {}
    for label, part in ((variable, base), (override_label or variable + "_override", override)):
        if part is None:
            continue
        if not isinstance(part, Mapping):
            raise LaunchConfigError(
                f"{label} must be a mapping (name: value), got {type(part).__name__}"
            )
        for key, value in part.items():
            if not isinstance(key, str) or not key.strip("-_ "):
                raise LaunchConfigError(f"{label} has an empty or non-string key: {key!r}")
            merged[key] = value
    return merged


def flag_name(name: object) -> str:
    """The one spelling of a flag's name: ``--tp_size`` / ``tp_size`` / ``tp-size`` all name ``tp-size``."""
    return str(name).strip().lstrip("-").replace("_", "-")


def normalized_flags(flags: Mapping[str, Any]) -> dict[str, Any]:
    """``flags`` keyed by :func:`flag_name` (a later spelling of one flag wins, as in a merge)."""
    return {flag_name(key): value for key, value in flags.items()}


def flag_key(flags: Mapping[str, Any], name: str) -> str:
    """The key ``flags`` spells flag ``name`` with (``--x_y``, ``x_y`` and ``x-y`` are one flag); ``name`` when absent."""
    return next((str(key) for key in flags if flag_name(key) == name), name)


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


def _flag(raw_name: str, value: Any) -> Flag:
    problem = endpoint.flag_name_problem(raw_name, "sglang_server_flags")
    if problem:
        raise LaunchConfigError(problem)
    name = flag_name(raw_name)
    name = ABBREVIATIONS.get(name, name)
    if value is True:
        return Flag(name, True)
    if value is False:
        raise LaunchConfigError(endpoint.false_value_problem("sglang_server_flags", name))
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
    seen: dict[tuple[str, ...], str] = {}
    for flag in flags:
        group = _GROUP_OF.get(flag.name, (flag.name,))
        if group in seen:
            first = seen[group]
            what = "is set twice" if first == flag.name else f"and '{first}' both set"
            raise LaunchConfigError(
                f"sglang_server_flags: '{flag.name}' {what} (they are one sglang option: "
                f"--{group[0]}). Fix: keep one key; to replace a profile default from host_vars use "
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
