"""One serving host, resolved once: every value about its sglang server that anything else reads.

The sglang_server role's variables (``ServerInputs``, read from the role's ``__sglang_server_inputs``)
and, when the host can be asked, its GPU facts go in; a :class:`ResolvedServer` comes out and is
published as the fact ``sglang_server_resolved`` (roles/sglang_server/tasks/resolve.yml). The unit
template, ``render``, ``validate``, preflight, bench, verify, the rolling restart, the router's
worker list and the Prometheus targets all read that fact instead of merging flags themselves.

One resolver in two phases (docs/architecture.md, "The walk of one flag"): from the inventory alone
on the control node (playbooks/resolve.yml: no GPU facts, the known checkpoints judge), then on the host
with what only it can say (its GPUs, the ml-env's venv, the weights' headers), again only when that
changed (playbook/resolution.py). ``sglang-deploy plan`` is a view of it: it takes the same inputs
(``plan -i``), merges the flags with :func:`inventory_flags`, judges the launch with :func:`judge_launch`
and plans the memory on the same road (plan_inputs.py), with its command line over them.

What happens, in order (each step's rule lives in the module named):
  1. flags: ``sglang_server_flags``, the launch profile, ``sglang_server_flags_override``
     (launch.py: replaced keys keep their place, new keys go last, null removes);
  2. GPUs without peer-to-peer, when ``sglang_server_p2p_adjust`` and the facts say so:
     ``--disable-custom-all-reduce`` and ``NCCL_P2P_DISABLE=1`` (preflight.py);
  3. the memory plan judges ``--mem-fraction-static`` against the GPUs (planner.py): ``auto`` becomes
     the recommendation, an unsafe explicit fraction is refused unless allowed;
  4. the role's own additions: ``--api-key`` from the 0600 env file when ``sglang_server_api_key`` is set;
  5. the launch (argv, ``ExecStart=``, ``Environment=``; launch.py), the exposure rule, the unit's
     checked values and paths (systemd.py), the endpoint (bind, port, URLs, served model); with a kept
     disk, every JIT cache variable points into the current key's directory there (jitcache.py), which
     the unit may write (``ReadWritePaths=``); the inventory's ``sglang_server_env`` still wins.

Secrets go in (the API key and the secret environment are checked) but never come out: the result
holds variable names only, so printing it (``-v``, ``render --json``) shows no secret.
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from sglang_deploy_host.serving import quality, quality_reference, systemd, unit_flags
from sglang_deploy_host.gpu import gpufacts
from sglang_deploy_host.model import inspection as inspector
from sglang_deploy_host import watchdog as host_watchdog
from sglang_deploy_host.watch import model as watch_model
from sglang_deploy.launch import checkpoints, flagtable, fp4_gemm, lane_rules
from sglang_deploy.launch.flagtable import LaunchSettings
from sglang_deploy.memory import planner
from sglang_deploy.serving import jitcache, preflight, tls
from sglang_deploy.memory.plan_inputs import PLAN_VAR, PlanSources, plan_inputs, sm_major_of
from sglang_deploy.lanes.catalog import DEFAULT_LANE, Lane, LaneError, load_lane
from sglang_deploy.playbook import resolution
from sglang_deploy.launch.config import (
    LaunchConfig,
    LaunchConfigError,
    flag_name,
    merge_flags,
    normalized_flags,
    profile_flags,
)

STATES = ("started", "stopped", "installed")


class ResolveError(ValueError):
    """A host's server settings that cannot be served; the message names host, variable and fix."""


@dataclass(frozen=True)
class ServerInputs:
    """The sglang_server role's variables (names without ``sglang_server_``), as the inventory set them."""

    flags: Mapping[str, Any] | None
    python: str
    lane: str
    unit: Mapping[str, Any]
    state: str = "started"
    profile: str = ""
    profiles: Mapping[str, Any] | None = None
    flags_override: Mapping[str, Any] | None = None
    env: Mapping[str, Any] | None = None
    env_override: Mapping[str, Any] | None = None
    secret_env: Mapping[str, Any] | None = None
    api_key: str = ""
    allow_unauthenticated: bool = False
    memory_plan: Mapping[str, Any] | None = None
    mem_fraction_unsafe_ok: bool = False
    p2p_adjust: bool = False
    advertise_url: str = ""
    advertise_address: str = ""
    watchdog: Mapping[str, Any] | None = None
    # The kept disk's JIT caches: root ("" = none), lock_digest (the ml-env's venv name), cuda_version.
    jit_cache: Mapping[str, Any] | None = None
    # The served checkpoint as the hub names it: known_checkpoints.yml judges it before the host is asked.
    checkpoint_repo: str = ""
    checkpoint_revision: str = ""
    # TLS on the endpoint: the control node's certfile, keyfile, cafile ("" = plain HTTP) and the host's dir.
    tls: Mapping[str, Any] | None = None
    # The quality check after the readiness gate: reference ("" = none), thresholds, the host's state_dir.
    quality: Mapping[str, Any] | None = None

    @classmethod
    def from_vars(cls, values: Mapping[str, Any]) -> ServerInputs:
        """From the role's ``__sglang_server_inputs`` mapping; a missing or unknown key is a bug in
        the role's vars (they are listed once, in roles/sglang_server/vars/main.yml)."""
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(values) - known)
        if unknown:
            raise ResolveError(f"unknown server inputs {unknown} (known: {sorted(known)})")
        try:
            return cls(**dict(values))
        except TypeError as err:
            raise ResolveError(f"server inputs: {err}") from None


@dataclass(frozen=True)
class Endpoint:
    """Where the server listens and how the host itself and a router reach it."""

    bind_host: str
    port: int
    local_url: str
    worker_url: str
    served_model: str
    api_key_env: str | None
    # The CA file on this host that its own clients (readiness and correctness gates, watchdog, bench) verify
    # the server's certificate with; "" for plain HTTP.
    cafile: str = ""


@dataclass(frozen=True)
class ResolvedServer:
    """The published result (``sglang_server_resolved``); :meth:`to_dict` documents its keys."""

    host: str
    lane: str
    state: str
    flags: dict[str, Any]
    environment: dict[str, str]
    launch: dict[str, Any]
    unit: dict[str, Any]
    endpoint: Endpoint
    memory_plan: dict[str, Any] | None
    adjustments: dict[str, dict[str, Any]]
    secret_env_names: list[str]
    pending: list[str] = field(default_factory=list)
    watchdog: dict[str, Any] = field(default_factory=dict)
    jit_cache: dict[str, Any] = field(default_factory=dict)
    checkpoint: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    tls: dict[str, Any] = field(default_factory=dict)
    quality: dict[str, Any] = field(default_factory=dict)
    basis: str = ""

    def to_dict(self) -> dict[str, Any]:
        """``state``: the service state asked for; ``flags``: the canonical launch flags (what sglang gets; ``{env: NAME}`` for secrets);
        ``environment``: the unit's ``Environment=``; ``launch``: :meth:`LaunchConfig.to_dict`
        (argv, exec_start, environment_assignments, flag_argv, validation_argv, tp_size);
        ``unit``: systemd.unit_settings plus ``restart_marker`` and ``requires_mounts_for``; ``endpoint``: bind_host, port,
        local_url, worker_url, served_model, api_key_env; ``memory_plan``: the planner's result or
        None; ``adjustments``: what the P2P adjustment added; ``pending``: what could not be resolved
        without the host's GPU facts (empty when the launch is final); ``watchdog``: the watchdog
        timer's units and checked values (:func:`watchdog_settings`); ``jit_cache``:
        :func:`jitcache.resolve` (``{}`` without a kept disk); ``checkpoint``: what is known of the served
        checkpoint's draft and experts and from where (``{}``: nothing, :func:`_checkpoint_summary`);
        ``warnings``: what the operator should read before the unit starts (nothing refused); ``tls``: :func:`_tls`
        (``{}`` for plain HTTP); ``quality``: :func:`_quality` (``{}`` without a reference); ``basis``: what it was resolved from (:func:`basis`), so the role resolves again only when that changed."""
        return asdict(self)


def resolve(
    inputs: ServerInputs,
    *,
    host: str,
    gpu_facts: Mapping[str, Any] | None = None,
    checkpoint: Mapping[str, Any] | None = None,
) -> ResolvedServer:
    """The host's server, resolved; :class:`ResolveError` naming host, variable and fix. ``checkpoint`` is
    the host's inspection of the served weights (the sglang_checkpoint module's ``inspection``), which
    judges the launch; without it the known checkpoints do (known_checkpoints.yml)."""
    try:
        return replace(_resolve(inputs, host, gpu_facts, checkpoint), basis=basis(inputs, gpu_facts, checkpoint))
    except (
        LaunchConfigError, planner.PlanError, systemd.UnitValueError, preflight.PreflightError, jitcache.JitCacheError
    ) as err:
        raise ResolveError(f"host {host}: {err}") from None


def basis(
    inputs: ServerInputs, gpu_facts: Mapping[str, Any] | None = None, checkpoint: Mapping[str, Any] | None = None
) -> str:
    """What :func:`resolve` reads, as a digest (playbook/resolution.py): the role's inputs with each secret
    as whether it is set and its names, the GPU facts as the resolver sees them, the checkpoint's inspection."""
    # Not asdict: Ansible's lazy containers cannot be deep-copied by type; json reads them as they are.
    values: dict[str, Any] = {name: getattr(inputs, name) for name in inputs.__dataclass_fields__}
    values["api_key"] = bool(inputs.api_key)
    values["secret_env"] = sorted(str(name) for name in (inputs.secret_env or {}))
    return resolution.basis(values, resolution.gpu_facts_basis(gpu_facts), dict(checkpoint or {}))


def _resolve(
    inputs: ServerInputs, host: str, gpu_facts: Mapping[str, Any] | None, checkpoint: Mapping[str, Any] | None
) -> ResolvedServer:
    if inputs.state not in STATES:
        raise LaunchConfigError(
            f"sglang_server_state={inputs.state} is not a state this role knows. Fix: use started, stopped or "
            "installed (installed = unit in place, not started)"
        )
    facts = dict(gpu_facts) if gpu_facts and gpu_facts.get("gpus") else None
    unit = systemd.unit_settings(dict(inputs.unit))
    unit["restart_marker"] = f"{unit['config_dir']}/{unit['name']}.restart-pending"
    secret_env = _secret_env(inputs)
    # 1. the flags and environment as the inventory gives them
    flags = inventory_flags(inputs.flags, inputs.profile, inputs.profiles, inputs.flags_override, inputs.lane)
    env = merge_flags(inputs.env, inputs.env_override, variable="sglang_server_env")
    # The JIT caches on the kept disk, under their key; the inventory's environment goes over them.
    cache_inputs = dict(inputs.jit_cache or {})
    jit_cache = jitcache.resolve(
        str(cache_inputs.get("root") or ""),
        lock_digest=str(cache_inputs.get("lock_digest") or ""),
        cuda_version=str(cache_inputs.get("cuda_version") or ""),
        gpu_facts=facts,
        kept_disk=str(cache_inputs.get("kept_disk") or ""),
        home=str(unit["home"]),
        cache_root=str(cache_inputs.get("cache_root") or ""),
    )
    if jit_cache:
        env = merge_flags(jit_cache["environment"], env, variable="sglang_server_env")
        if jit_cache["root"] not in unit["read_write_paths"]:
            unit["read_write_paths"] = [*unit["read_write_paths"], jit_cache["root"]]
    # The launch, built once: each flag in the lane's spelling, typed by the flag table; what follows amends it.
    config = LaunchConfig.from_vars(
        flags, python=inputs.python, env=env, secret_env_names=secret_env, lane=inputs.lane,
        launcher=f"{unit['libexec_dir']}/sglang_launcher.py",
    )  # fmt: skip
    # 2. GPUs without peer-to-peer
    adjustments: dict[str, dict[str, Any]] = {"flags": {}, "env": {}}
    if inputs.p2p_adjust and facts is not None and facts.get("nvidia_smi_found", True):
        adjustments = preflight.p2p_adjustments(gpufacts.GpuFacts.from_dict(facts), config)
        config = config.amended(flags=adjustments["flags"], env=adjustments["env"])
    # The checkpoint, the GPU's kernels and the lane's rules: a launch they cannot serve is refused here, before the
    # memory plan.
    lane = _lane(inputs.lane)
    sm_major = sm_major_of(planner.gpu_facts_summary(facts) if facts else None, inputs.memory_plan)
    judged = judge_launch(inputs, config, lane, sm_major=sm_major, checkpoint=checkpoint)
    verdict, warnings = judged.verdict, judged.warnings
    # 3. the memory plan
    pending: list[str] = []
    plan = _memory_plan(inputs, config, facts, pending, judged.draft)
    # 4. the role's own additions
    additions: dict[str, Any] = {}
    if inputs.api_key:
        additions["api-key"] = {"env": unit_flags.API_KEY_ENV}
    served_tls = _tls(inputs, config, lane)
    if served_tls:
        additions.update({flag: served_tls[kind] for kind, flag in TLS_FLAGS.items()})
    if plan is not None and config.settings.fraction_is_placeholder:
        # Under the name the launch spells it with (mem_fraction_static too), replacing `auto`.
        additions[config.settings.name_of("mem_fraction_static")] = plan["mem_fraction_static"]
    # 5. the launch, its exposure, the endpoint
    config = config.amended(flags=additions)
    problem = config.exposure_problem(allow_unauthenticated=bool(inputs.allow_unauthenticated))
    if problem:
        raise LaunchConfigError(problem)
    launch = config.to_dict()
    unit["requires_mounts_for"] = _requires_mounts_for(config.settings, jit_cache)
    served = _endpoint(inputs, config.settings, launch["flags"], host)
    if served_tls:
        # The names its clients verify: the host's own checks reach it on the bound or loopback address, sglang's
        # warmup on ServerArgs.url()'s (::1 for "::"), routers and Prometheus on the worker URL's host.
        hosts = (_url_host(served.local_url), tls.client_name(_SGLANG_WARMUP_HOSTS.get(served.bind_host, served.bind_host)),
                 _url_host(served.worker_url))  # fmt: skip
        served_tls["names"] = list(dict.fromkeys(hosts))
    return ResolvedServer(
        host=host,
        lane=inputs.lane,
        state=inputs.state,
        flags=launch["flags"],
        environment=launch["environment"],
        launch=launch,
        unit=unit,
        endpoint=served,
        memory_plan=plan,
        adjustments=adjustments,
        secret_env_names=secret_env,
        pending=pending,
        watchdog=watchdog_settings(inputs.watchdog or {}, unit, served, launch),
        jit_cache=jit_cache,
        checkpoint=_checkpoint_summary(verdict),
        warnings=warnings,
        tls=served_tls,
        quality=_quality(inputs, str(unit["name"])),
    )


def _quality(inputs: ServerInputs, unit_name: str) -> dict[str, Any]:
    """The quality check after the readiness gate (module_utils/sglang_deploy_host/serving/quality.py): the control node's
    ``reference``, the ``thresholds`` that replace the reference's own, and the host's ``verdict_file`` (what
    ``doctor -i`` reads); ``{}`` without a reference. The reference's content is judged by the validate play."""
    values = dict(inputs.quality or {})
    reference = str(values.get("reference") or "")
    if not reference:
        return {}
    if not reference.startswith("/"):
        raise ResolveError(
            f"sglang_server_quality_reference={reference}: not an absolute path. Fix: e.g. "
            "\"{{ inventory_dir }}/quality/reference.json\" (a relative one would be looked up in a role's files/)"
        )
    thresholds = dict(values.get("thresholds") or {})
    try:
        quality_reference.Thresholds().merged(thresholds, "sglang_server_quality_thresholds")
    except quality_reference.QualityInputError as err:
        raise ResolveError(str(err)) from None
    state_dir = systemd.absolute_path("sglang_server_quality_state_dir", values.get("state_dir"))
    return {"reference": reference, "thresholds": thresholds, "verdict_file": quality.verdict_path(state_dir, unit_name)}


# The lane's sglang flags that serve TLS, by the file they take (server_args.py: uvicorn's ssl_* settings). The CA
# goes to sglang too: its own warmup request then verifies the certificate (without it, it switches that off).
TLS_FLAGS = {"certfile": "ssl-certfile", "keyfile": "ssl-keyfile", "cafile": "ssl-ca-certs"}
# The files' names in sglang_server_tls_dir on the host.
TLS_FILE_NAMES = {"certfile": "server.crt", "keyfile": "server.key", "cafile": "ca.crt"}


def _tls(inputs: ServerInputs, config: LaunchConfig, lane: Lane) -> dict[str, Any]:
    """TLS from the inventory's files: the host's paths (``certfile``, ``keyfile``, ``cafile``, ``dir``) and the
    control node's (``source``); ``{}`` when no file is set. Their content is judged by the validate play
    (tls.judge, which needs the files themselves), before any host changes."""
    values = dict(inputs.tls or {})
    source = {kind: str(values.get(kind) or "") for kind in tls.VARIABLES}
    launch = config.settings
    given = [
        launch.name_of(name) for name in ("ssl_certfile", "ssl_keyfile", "ssl_ca_certs", "ssl_keyfile_password", "enable_ssl_refresh")
        if getattr(launch, name) not in (None, False)
    ]  # fmt: skip
    if given:
        raise LaunchConfigError(
            f"{_origin(inputs, given[0])} sets --{given[0]}: the role serves TLS itself. Fix: remove it and set "
            f"{', '.join(tls.VARIABLES.values())} (docs/security.md, TLS): the files are checked, copied with "
            "the key 0640 root:<service group>, and every client then verifies the certificate"
        )
    if not any(source.values()):
        return {}
    missing = [tls.VARIABLES[kind] for kind, path in source.items() if not path]
    relative = [f"{tls.VARIABLES[kind]}={path}" for kind, path in source.items() if path and not path.startswith("/")]
    if relative:
        raise LaunchConfigError(
            f"{', '.join(relative)}: give the control node's file as an absolute path, e.g. "
            "\"{{ inventory_dir }}/tls/server.crt\" (a relative one would be looked up in a role's files/)"
        )
    if missing:
        raise LaunchConfigError(
            f"TLS needs all three files, and {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set. "
            f"Fix: set {', '.join(missing)} (the CA is what every client verifies the certificate with), or unset "
            "the others for plain HTTP"
        )
    lacking = [flag for flag in TLS_FLAGS.values() if flag not in lane.tls_flags]
    if lacking:
        raise LaunchConfigError(
            f"sglang_common_lane={lane.name}: its sglang {lane.sglang} has no --{', --'.join(lacking)}, so it cannot "
            f"serve TLS. Fix: use a lane whose sglang has them, or unset {', '.join(tls.VARIABLES.values())}"
        )
    directory = systemd.absolute_path("sglang_server_tls_dir", values.get("dir"))
    return {
        "dir": directory,
        **{kind: f"{directory}/{name}" for kind, name in TLS_FILE_NAMES.items()},
        "source": source,
    }


# Where sglang's own warmup request goes for a wildcard bind (ServerArgs.url(), both lanes); else the bind address.
_SGLANG_WARMUP_HOSTS = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}


def _url_host(url: str) -> str:
    return tls.client_name(str(urllib.parse.urlsplit(url).hostname))


@dataclass(frozen=True)
class LaunchJudgment:
    """What the served checkpoint, the GPU's kernels and the lane's rules say of a launch they let start."""

    verdict: checkpoints.Verdict | None
    warnings: list[str]
    # A self-drafting launch's draft as the memory planner takes it (checkpoints.draft_memory); {} otherwise.
    draft: dict[str, float]


def judge_launch(
    inputs: ServerInputs,
    config: LaunchConfig,
    lane: Lane,
    *,
    sm_major: int | None,
    checkpoint: inspector.Inspection | Mapping[str, Any] | None,
    origin: str | None = None,
) -> LaunchJudgment:
    """The host phase's refusals before the memory plan, for :func:`resolve` and ``sglang-deploy plan`` alike: the
    checkpoint (its inspection, else the known checkpoints for ``inputs.checkpoint_repo``), the lane's rules for
    the GPU (``sm_major``, None when unknown) and the FP4 GEMM kernels. LaunchConfigError for a launch that
    cannot be served, naming ``origin`` (default: the variable that set the flag)."""
    verdict, warnings, draft = _judge_checkpoint(inputs, config, lane, checkpoint, origin)
    quantization = verdict.inspection.quantization if verdict is not None and verdict.inspection is not None else None
    architecture = (inputs.memory_plan or {}).get("architecture")
    problem = lane_rules.problem(lane, config.settings, sm_major, architecture=str(architecture) if architecture else None)
    if problem is None and fp4_gemm.runs_fp4_gemms(config, quantization):
        problem = fp4_gemm.problem(lane, config, sm_major)
    if problem:
        raise LaunchConfigError(problem)
    return LaunchJudgment(verdict=verdict, warnings=warnings, draft=draft)


def _judge_checkpoint(
    inputs: ServerInputs,
    config: LaunchConfig,
    lane: Lane,
    inspection: inspector.Inspection | Mapping[str, Any] | None,
    origin: str | None,
) -> tuple[checkpoints.Verdict | None, list[str], dict[str, float]]:
    """The served checkpoint against the launch (checkpoints.py): the verdict, the warnings, and the draft's
    real memory for the planner; LaunchConfigError for a launch the checkpoint cannot serve."""
    repo, revision = str(inputs.checkpoint_repo or ""), str(inputs.checkpoint_revision or "")
    try:
        verdict = checkpoints.from_inspection(inspection) if inspection else checkpoints.from_known(repo, revision)
    except TypeError as err:
        raise LaunchConfigError(f"the checkpoint's inspection is not one this version reads ({err})") from None
    where = origin or _origin(inputs, "speculative-algorithm")
    problems = checkpoints.problems(config, verdict, where=where, lane=lane)
    if problems:
        raise LaunchConfigError("; ".join(problems))
    note = checkpoints.warning(config, verdict, where=where, repo=repo)
    draft = checkpoints.draft_memory(verdict, config.tp_size) if checkpoints.self_drafting(config) else {}
    return verdict, [note] if note else [], draft


def _lane(name: str) -> Lane:
    try:
        return load_lane(name)
    except LaneError as err:
        raise LaunchConfigError(f"sglang_common_lane: {err}") from None


def _origin(inputs: ServerInputs, name: str) -> str:
    """Which variable set flag ``name``: the override, the launch profile, or the flags."""
    for label, part in (
        ("sglang_server_flags_override", inputs.flags_override),
        (f"sglang_server_profile {inputs.profile!r}", (inputs.profiles or {}).get(inputs.profile) if inputs.profile else None),
    ):
        if isinstance(part, Mapping) and any(flag_name(k) == name for k in part):
            return label
    return "sglang_server_flags"


def _checkpoint_summary(verdict: checkpoints.Verdict | None) -> dict[str, Any]:
    if verdict is None:
        return {}
    return {
        "source": verdict.source, "speculative": verdict.speculative, "detail": verdict.detail,
        "draft_layer": verdict.draft_layer, "shared_experts_fusion": verdict.shared_experts_fusion,
        "inspected": verdict.inspection is not None,
    }  # fmt: skip


def model_path(inputs: ServerInputs) -> str:
    """The directory the server loads (``--model-path``/``--model``) as the inventory gives it, "" when it is
    not a plain path (the hub id of a model sglang downloads itself, a value from the environment)."""
    flags = inventory_flags(inputs.flags, inputs.profile, inputs.profiles, inputs.flags_override, inputs.lane)
    try:
        given = {name: value for name, value in normalized_flags(flags).items() if value is not None}  # null: removed
        value = flagtable.settings_of(given, inputs.lane).model_path
    except flagtable.FlagTableError:
        return ""  # the resolve that follows names what is wrong with the flags
    return value if value is not None and value.startswith("/") else ""


def _requires_mounts_for(launch: LaunchSettings, jit_cache: Mapping[str, Any]) -> list[str]:
    """What the unit waits for (``RequiresMountsFor=``): the model's directory and the kept caches' disk (the
    ml-env's venv is there too when the store is on it), so a weights disk that did not mount (it is ``nofail``)
    stops the unit with the mount's name instead of a load that cannot find its files."""
    paths: list[Any] = [launch.model_path]
    paths += [jit_cache["root"]] if jit_cache else []
    kept: list[str] = []
    for path in paths:
        try:  # a path of plain characters only: a model path sglang takes quoted (spaces) gets no dependency
            if isinstance(path, str) and path not in kept:
                kept.append(systemd.absolute_path("RequiresMountsFor", path))
        except systemd.UnitValueError:
            continue
    return kept


def inventory_flags(
    flags: Mapping[str, Any] | None,
    profile: str | None,
    profiles: Mapping[str, Any] | None,
    flags_override: Mapping[str, Any] | None,
    lane: str = DEFAULT_LANE,
) -> dict[str, Any]:
    """Step 1 alone: ``sglang_server_flags``, the launch profile's changes (with its changes for ``lane``), then the
    override (what ``sglang-deploy plan -i`` reads from an inventory without a host to ask)."""
    return merge_flags(profile_flags(flags, profile or "", profiles, lane), flags_override)


def secrets(inputs: ServerInputs) -> dict[str, str]:
    """The 0600 env file's variables (``sglang_server_secret_env`` and the API key): its template
    and the journal's redaction read these; nothing else does."""
    secret = {str(name): str(value) for name, value in (inputs.secret_env or {}).items()}
    if inputs.api_key:
        secret[unit_flags.API_KEY_ENV] = str(inputs.api_key)
    return secret


def _secret_env(inputs: ServerInputs) -> list[str]:
    """The names of :func:`secrets`, each line of the env file checked (the values stay here)."""
    if inputs.api_key:
        problem = unit_flags.api_key_problem(str(inputs.api_key), "sglang_server_api_key")
        if problem:
            raise LaunchConfigError(problem)
    secret = secrets(inputs)
    for name, value in secret.items():
        try:
            systemd.env_file_line(name, value)
        except ValueError as err:
            raise LaunchConfigError(f"sglang_server_secret_env: {err}") from None
    return list(secret)


def _memory_plan(
    inputs: ServerInputs,
    config: LaunchConfig,
    facts: Mapping[str, Any] | None,
    pending: list[str],
    draft: Mapping[str, float],
) -> dict[str, Any] | None:
    """The planner's verdict on --mem-fraction-static, or None when there is nothing to judge (the
    flag is absent, or an explicit fraction without GPU facts or ``gpu_memory_mib``)."""
    plan_vars = dict(inputs.memory_plan or {})
    requested = config.settings.mem_fraction_static
    if requested is None:
        return None
    if facts is None and "gpu_memory_mib" not in plan_vars:
        if config.settings.fraction_is_placeholder:
            pending.append(
                "mem-fraction-static auto needs the host's GPU facts (a driver) or "
                "sglang_server_memory_plan.gpu_memory_mib"
            )
        return None
    try:
        result = plan_for_launch(config.settings, gpu_facts=facts, plan_vars=plan_vars, draft=draft)
    except planner.PlanError as err:
        raise planner.PlanError(f"memory plan: {err}") from None
    if result["safe"] is False and not inputs.mem_fraction_unsafe_ok:
        raise planner.PlanError(
            f"sglang_server_flags['mem-fraction-static'] = {requested} is unsafe for this host's GPUs: "
            f"{result['explanation']}. Fix: set it to {result['recommended_mem_fraction_static']} (or auto), "
            "or set sglang_server_mem_fraction_unsafe_ok: true to start anyway"
        )
    return result


def plan_for_launch(
    launch: LaunchSettings,
    *,
    gpu_facts: Mapping[str, Any] | None,
    plan_vars: Mapping[str, Any] | None,
    count_used_memory: bool = False,
    draft: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The memory plan for a host's launch (its typed flags, rendered for their lane); its inputs come the one road
    ``plan`` takes too (plan_inputs.py: the flags, ``sglang_server_memory_plan`` with its ``architecture``, the
    inspected ``draft``, the GPU facts).

    Returns ``Plan.to_dict()`` plus ``requested`` (the flag as given), ``explanation`` and
    ``mem_fraction_static`` (the number to launch with: the recommendation for ``auto``).
    """
    requested = launch.mem_fraction_static
    sources = PlanSources(
        launch=launch, lane=launch.lane, plan_vars=plan_vars or {}, gpu_facts=gpu_facts,
        count_used_memory=count_used_memory, draft=draft or {},
    )  # fmt: skip
    inputs, _notes = plan_inputs(
        sources, no_memory_fix=f"gather the host's GPU facts first, or set {PLAN_VAR}.gpu_memory_mib"
    )
    result = planner.plan(inputs)
    out = result.to_dict()
    out["requested"] = requested
    out["explanation"] = result.explanation()
    # auto -> the recommendation (an error when there is none); absent -> None (sglang's own heuristic).
    out["mem_fraction_static"] = result.fraction_to_launch(requested)
    return out


def _endpoint(inputs: ServerInputs, launch: LaunchSettings, flags: Mapping[str, Any], host: str) -> Endpoint:
    """From the typed launch; https:// URLs when it serves TLS (``--ssl-certfile`` in the rendered ``flags``:
    unit_flags.serves_tls, as every client on the host decides it)."""
    bind = launch.host if launch.host is not None else unit_flags.DEFAULT_BIND_HOST
    try:
        port = unit_flags.port_number(launch.port if launch.port is not None else unit_flags.DEFAULT_PORT, "sglang_server_flags['port']")
    except ValueError as err:
        raise LaunchConfigError(str(err)) from None
    served_tls = unit_flags.serves_tls(flags)
    worker = unit_flags.http_url(str(inputs.advertise_address or host), port, "https" if served_tls else "http")
    if inputs.advertise_url:
        try:
            worker = unit_flags.normalized_url(str(inputs.advertise_url))
        except ValueError as err:
            raise LaunchConfigError(f"sglang_server_advertise_url: {err}") from None
        # (An https:// URL in front of a plain server is a proxy's that terminates TLS: its business.)
        if served_tls and urllib.parse.urlsplit(worker).scheme != "https":
            raise LaunchConfigError(
                f"sglang_server_advertise_url={worker} is http://, but the server speaks TLS "
                "(sglang_server_tls_certfile is set): routers and Prometheus would send plain HTTP to it. "
                "Fix: give its https:// URL"
            )
    try:
        served = unit_flags.served_model_name(flags)
    except ValueError:
        served = ""  # validate names the missing --model-path in sglang's own words
    return Endpoint(
        bind_host=bind,
        port=port,
        local_url=unit_flags.base_url(flags),
        worker_url=worker,
        served_model=served,
        api_key_env=unit_flags.API_KEY_ENV if inputs.api_key else None,
        cafile=unit_flags.host_cafile(flags),
    )


# The watchdog's numbers (the role's sglang_server_watchdog_<key>) and their smallest values.
# Each watchdog count's (minimum, maximum): beyond the maximum a value is a typo (1e30 from YAML), not a setting.
_WEEK = 7 * 24 * 3600
_WATCHDOG_COUNTS = {
    "interval_sec": (10, 24 * 3600), "failures": (1, 100), "backoff_initial_sec": (1, _WEEK),
    "backoff_max_sec": (1, _WEEK), "timeout_sec": (1, 3600), "start_grace_sec": (0, 2 * 24 * 3600),
    "gpu_count": (0, 1024), "stable_sec": (60, _WEEK), "max_restarts_per_hour": (1, 60),
}  # fmt: skip
# What systemd gives the watchdog's one tick beyond its generation: the tick's own bound on everything
# else (watchdog.TICK_EXTRA_S: systemctl, journalctl, nvidia-smi, /metrics), and a margin for Python's start.
_WATCHDOG_TICK_EXTRA_SEC = int(host_watchdog.TICK_EXTRA_S) + 30


def watchdog_settings(
    values: Mapping[str, Any], unit: Mapping[str, Any], served: Endpoint, launch: Mapping[str, Any]
) -> dict[str, Any]:
    """The watchdog timer's units (module_utils/sglang_deploy_host/watchdog.py is its check): names,
    paths, ``ExecStart=`` and the values its templates use, each checked and named by its variable.
    ``values`` are the role's ``sglang_server_watchdog_*`` without that prefix."""

    def var(key: str) -> str:
        return f"sglang_server_watchdog_{key}"

    unknown = sorted(set(values) - set(_WATCHDOG_COUNTS) - {"enabled"})
    if unknown:
        raise ResolveError(f"unknown watchdog inputs {[var(k) for k in unknown]}")
    enabled = values.get("enabled", False)
    if not isinstance(enabled, bool):
        raise LaunchConfigError(f"{var('enabled')} = {enabled!r} is not true or false")
    counts = {
        key: systemd.count(var(key), values.get(key, low), low, high) for key, (low, high) in _WATCHDOG_COUNTS.items()
    }
    if counts["backoff_max_sec"] < counts["backoff_initial_sec"]:
        raise LaunchConfigError(
            f"{var('backoff_max_sec')} = {counts['backoff_max_sec']} is below {var('backoff_initial_sec')} = "
            f"{counts['backoff_initial_sec']}. Fix: raise the maximum or lower the first pause"
        )
    name = watch_model.unit_name(str(unit["name"]))
    host = unit_flags.client_host(served.bind_host).strip("[]")
    allow = "localhost"
    if not unit_flags.is_loopback(host):
        try:
            allow = f"localhost {ipaddress.ip_address(host)}"
        except ValueError:
            if enabled:
                raise LaunchConfigError(
                    f"{var('enabled')}: the server binds the host name {host!r}, and the watchdog's IPAddressAllow= "
                    "needs an address. Fix: bind an IP address (sglang_server_flags host), or set "
                    f"{var('enabled')}: false"
                ) from None
    expected = counts["gpu_count"] or int(launch.get("tp_size") or 1)
    visible = dict(launch.get("environment") or {}).get("CUDA_VISIBLE_DEVICES")
    state_file = f"/var/lib/{name}/state.json"
    # node_exporter's textfile collector reads *.prom files: point it at the state directory for the alert.
    metrics_file = f"/var/lib/{name}/sglang-watchdog.prom"
    args = [
        ["--unit", f"{unit['name']}.service"],
        ["--url", served.local_url],
        ["--service-user", str(unit["user"])],
        ["--env-file", str(unit["env_file"])],
        *([["--api-key-env", served.api_key_env]] if served.api_key_env else []),
        *([["--cafile", served.cafile]] if served.cafile else []),
        ["--expected-gpus", str(expected)],
        *([["--visible-devices", str(visible)]] if visible is not None else []),
        ["--state-file", state_file],
        ["--metrics-file", metrics_file],
        ["--failures", str(counts["failures"])],
        ["--backoff-initial", str(counts["backoff_initial_sec"])],
        ["--backoff-max", str(counts["backoff_max_sec"])],
        ["--stable", str(counts["stable_sec"])],
        ["--max-restarts-per-hour", str(counts["max_restarts_per_hour"])],
        ["--timeout", str(counts["timeout_sec"])],
        ["--start-grace", str(counts["start_grace_sec"])],
    ]
    python_path = f"{unit['libexec_dir']}/python"
    return {
        "enabled": enabled,
        "name": name,
        "service_path": f"{unit['unit_dir']}/{name}.service",
        "timer_path": f"{unit['unit_dir']}/{name}.timer",
        # The files the role installs there: the watchdog and the modules it imports (sglang_host_files).
        "python_path": python_path,
        "state_directory": name,
        "state_file": state_file,
        "metrics_file": metrics_file,
        "exec_start": systemd.exec_start(["/usr/bin/python3", "-m", "sglang_deploy_host.watchdog", "check"], args),
        "environment_assignments": [systemd.environment_assignment("PYTHONPATH", python_path)],
        "ip_address_allow": allow,
        "timeout_start_sec": counts["timeout_sec"] + _WATCHDOG_TICK_EXTRA_SEC,
        "expected_gpus": expected,
        **counts,
    }
