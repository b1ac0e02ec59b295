"""The router (SGLang Model Gateway, PyPI ``smg``, the pinned Rust router) in front of several sglang workers: the router
resolved once (its flags, the ExecStart= through the server's launcher, the unit's checked values, its
URLs), the worker URLs from the workers' resolved servers, the workers' in-flight count for a drain, and
the Prometheus file_sd targets. The sglang_router and sglang_rolling roles call these through
``filter_plugins/sglang_router.py``; the rules live here once, with unit tests. The quoting, loopback
test, exposure rule, secret-flag list and launcher are the server's (module_utils/sglang_deploy_host).

smg is sglang-router's continuation: sglang-router 0.3.2 was that package's last release, and fixes land only
in smg. Checked against smg 1.13.0 (``python -m smg.launch_router --help``, its source ``smg/router_args.py``,
and its HTTP API run here against stand-in workers): ``--worker-urls URL...``, ``--policy`` (:data:`POLICIES`),
``--health-check-interval-secs`` and friends, ``--request-timeout-secs``, ``--prometheus-host/-port``,
``--api-key`` (what clients must send, and what the router sends to the workers: one key for both); the
worker API is ``GET /workers`` (``{"workers": [{"id", "url", "is_healthy", "status", "load", ...}]}``),
``POST /workers`` ``{"url": ...}`` and ``DELETE /workers/<id>`` (both answer 202 and act in the
background; a POST for a URL still listed answers 409), all behind the router's API key; ``/health``,
``/liveness`` and ``/readiness`` (``{"status": "ready", "healthy_workers", "total_workers"}``, 503 without a
healthy worker) are open, as is ``/v1/models``; every generation route needs the key (401 without).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from sglang_deploy_host.serving import sglang_launcher, systemd, unit_flags
from sglang_deploy_host.watch import file_sd as targets_file
from sglang_deploy.playbook import resolution

POLICIES = (
    "random", "round_robin", "passthrough", "cache_aware", "power_of_two", "least_load", "manual",
    "consistent_hashing", "prefix_hash",
)  # fmt: skip
"""smg 1.13.0's --policy choices (smg/router_args.py)."""

PACKAGE = "smg"
"""The router's PyPI package; the role's locks pin it (roles/sglang_router/files/locks/smg-py<X.Y>.txt)."""
RETIRED_PACKAGE = "sglang-router"
"""Its predecessor, whose last release (0.3.2) the role installed before smg: its versions are 0.x."""
MODULE = "smg.launch_router"
API_KEY_ENV = "SGLANG_ROUTER_API_KEY"
"""The env file variable holding sglang_router_api_key; the launcher hands it over as --api-key."""
# smg writes no Python output of its own; colours are stripped by the launcher (--strip-ansi).
ENVIRONMENT = (("PYTHONUNBUFFERED", "1"), ("NO_COLOR", "1"), ("RUST_LOG_STYLE", "never"))
STATES = ("started", "stopped", "installed")


class RouterConfigError(ValueError):
    """A router setting that cannot be turned into a safe command line."""


def checked_worker_url(url: str, what: str) -> str:
    """A worker URL that may go into the router's command line: http(s), a host, no credentials (they
    would sit in ExecStart=, which every local user reads), no space or control character; in its one spelling
    (unit_flags.normalized_url), so that one worker written two ways is one worker."""
    try:
        return unit_flags.normalized_url(url)
    except ValueError as err:
        raise RouterConfigError(f"{what}: {err}") from None


def worker_urls(resolved: Mapping[str, Any]) -> list[str]:
    """One URL per worker host (host -> its published ``sglang_server_resolved``), in the given order;
    a host not resolved in this run or an earlier one (the fact cache) is named with the fix."""
    urls: list[str] = []
    for host, server in resolved.items():
        if not isinstance(server, Mapping) or "endpoint" not in server:
            raise RouterConfigError(
                f"worker {host} has no resolved server (sglang_server_resolved): it was outside --limit and "
                "no earlier run cached it. Fix: run `sglang-deploy validate -i INVENTORY` once "
                "without --limit"
            )
        urls.append(checked_worker_url(str(server["endpoint"]["worker_url"]), f"worker {host}'s URL"))
    _refuse_duplicates(urls, "the workers")
    return urls


def _refuse_duplicates(urls: list[str], what: str) -> None:
    duplicates = sorted({u for u in urls if urls.count(u) > 1})
    if duplicates:
        raise RouterConfigError(
            f"{what}: several share a URL once written one way (scheme and host in lower case, the port as a number, no "
            f"trailing /): {', '.join(duplicates)}. Fix: list each worker once"
        )


def worker_cafiles(resolved: Mapping[str, Any]) -> list[str]:
    """The CAs (control-node files, each once) that the workers serving TLS are verified with (host -> its
    published ``sglang_server_resolved``; its ``tls.source.cafile``); [] when none serves TLS."""
    found: list[str] = []
    for server in resolved.values():
        tls = server.get("tls") if isinstance(server, Mapping) else None
        cafile = str(((tls or {}).get("source") or {}).get("cafile") or "")
        if cafile and cafile not in found:
            found.append(cafile)
    return found


def router_endpoints(resolved: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """Router name -> ``{url, metrics}`` as the router host itself reaches them, from each router's
    published ``sglang_router_resolved`` (host -> resolution); a router never resolved is named."""
    endpoints: dict[str, dict[str, str]] = {}
    for host, router in resolved.items():
        if not isinstance(router, Mapping) or "url" not in router:
            raise RouterConfigError(
                f"router {host} has no resolved router (sglang_router_resolved): it was outside --limit and no "
                "earlier run cached it. Fix: run `sglang-deploy validate -i INVENTORY` once without --limit"
            )
        endpoints[host] = {"url": str(router["url"]), "metrics": str(router["metrics_url"])}
    return endpoints


def flag_argv(flags: Mapping[str, Any]) -> list[str]:
    """A flag mapping (name -> value; True = bare switch; False/None = left out; list = several
    values) as router argv, in the mapping's order. Secret flags are refused."""
    return [word for group in flag_groups(flags) for word in group]


def flag_groups(flags: Mapping[str, Any]) -> list[list[str]]:
    """:func:`flag_argv`, one list of words per flag (one ExecStart= continuation line each)."""
    groups: list[list[str]] = []
    for raw_name, value in flags.items():
        problem = unit_flags.flag_name_problem(raw_name, "sglang_router_extra_flags")
        if problem:
            raise RouterConfigError(problem)
        name = str(raw_name).strip().lstrip("-").replace("_", "-")
        if name in unit_flags.SECRET_FLAGS:
            raise RouterConfigError(
                f"--{name} must not be a flag: a secret in argv is visible to every local user "
                "(the API key is sglang_router_api_key, handed over in-process)"
            )
        if value is False:
            raise RouterConfigError(unit_flags.false_value_problem("sglang_router_extra_flags", name))
        if value is None:
            continue
        if value is True:
            groups.append([f"--{name}"])
        elif isinstance(value, (list, tuple)):
            if value:
                groups.append([f"--{name}", *(str(v) for v in value)])
        elif isinstance(value, Mapping):
            raise RouterConfigError(f"--{name}: a mapping is not a flag value")
        else:
            if isinstance(value, float) and not math.isfinite(value):
                raise RouterConfigError(f"--{name}: {value} is not a number a router accepts")
            groups.append([f"--{name}", str(value)])
    for group in groups:
        if any(c in word for word in group for c in "\n\r\0"):
            raise RouterConfigError(f"a router argument holds a control character: {group!r}")
    return groups


def router_flags(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The role's settings (without the sglang_router_ prefix) as the router's flags."""
    policy = settings["policy"]
    if policy not in POLICIES:
        raise RouterConfigError(f"sglang_router_policy {policy!r} is not one of {', '.join(POLICIES)}")
    urls = [checked_worker_url(str(url), "sglang_router_worker_urls") for url in settings["worker_urls"]]
    _refuse_duplicates(urls, "sglang_router_worker_urls")
    if not urls:
        raise RouterConfigError("no worker URLs: the worker group is empty and sglang_router_worker_urls is []")
    flags: dict[str, Any] = {
        "host": settings["host"],
        "port": settings["port"],
        "worker-urls": urls,
        "policy": policy,
        "health-check-interval-secs": settings["health_check_interval_secs"],
        "health-check-timeout-secs": settings["health_check_timeout_secs"],
        "health-failure-threshold": settings["health_failure_threshold"],
        "health-success-threshold": settings["health_success_threshold"],
        "health-check-endpoint": settings["health_check_endpoint"],
        "request-timeout-secs": settings["request_timeout_secs"],
        "shutdown-grace-period-secs": settings["shutdown_grace_period_secs"],
        "worker-startup-timeout-secs": settings["worker_startup_timeout_secs"],
        "prometheus-host": settings["prometheus_host"],
        "prometheus-port": settings["prometheus_port"],
        "log-level": settings["log_level"],
    }
    for name, value in (settings.get("extra_flags") or {}).items():
        key = str(name).removeprefix("--").replace("_", "-")
        if value is None:
            flags.pop(key, None)
        else:
            flags[key] = value
    return flags


def exposure_problem(host: str, port: Any, api_key: str, allow_unauthenticated: bool) -> str | None:
    """Why this router would be an open endpoint, or None (the server's rule, endpoint.py)."""
    return unit_flags.exposure_problem(
        "the router", host, port, has_key=bool(api_key), allowed=allow_unauthenticated,
        key_var="sglang_router_api_key", bind_var="sglang_router_host", allow_var="sglang_router_allow_unauthenticated",
    )  # fmt: skip


def resolve(settings: Mapping[str, Any], unit: Mapping[str, Any], *, host: str, api_key: str) -> dict[str, Any]:
    """The router of ``host`` resolved once (published as ``sglang_router_resolved``; no secret in it).

    ``settings``: the role's variables without the prefix (worker_urls already resolved, state,
    allow_unauthenticated, venv, metrics_address, file_sd_path too); ``unit``: the unit's values for
    systemd.unit_settings. Returns flags, the ExecStart= (the server's launcher, which hands the key
    over in-process and strips the router's colour codes), the environment, the unit's checked values,
    and how the host itself (url, metrics_url) and Prometheus (metrics_target) reach it; ``basis``: what it was
    resolved from (:func:`basis`).
    """
    try:
        resolved = _resolve(settings, unit, host, api_key)
    except (RouterConfigError, systemd.UnitValueError, ValueError) as err:
        raise RouterConfigError(f"host {host}: {err}") from None
    return {**resolved, "basis": basis(settings, unit, api_key=api_key)}


def basis(settings: Mapping[str, Any], unit: Mapping[str, Any], *, api_key: str) -> str:
    """What :func:`resolve` reads, as a digest (playbook/resolution.py; the key as whether it is set): the
    role resolves its router again only when this changed since the run's last resolution."""
    return resolution.basis(dict(settings), dict(unit), bool(api_key))


def check_version(version: Any) -> None:
    """Refuse a version of the retired sglang-router (an inventory written for it): the role installs smg."""
    text = str(version)
    if not re.fullmatch(r"[0-9]+(\.[0-9]+){1,2}([.-]?(post|rc|dev)[0-9]+)?", text):
        raise RouterConfigError(f"sglang_router_version {text!r} is not a release number (such as 1.13.0)")
    if text.startswith("0."):
        raise RouterConfigError(
            f"sglang_router_version {text} is a release of {RETIRED_PACKAGE}, which ended with 0.3.2: the "
            f"router continues as SGLang Model Gateway ({PACKAGE} on PyPI), with the same flags and worker API, and the "
            f"role installs {PACKAGE} from its locks. Fix: remove sglang_router_version from the inventory (the role's "
            f"default is the {PACKAGE} version its locks pin), or set it to that version"
        )


def _resolve(settings: Mapping[str, Any], unit_values: Mapping[str, Any], host: str, api_key: str) -> dict[str, Any]:
    check_version(settings["version"])
    if settings["state"] not in STATES:
        raise RouterConfigError(f"sglang_router_state {settings['state']!r} is not one of {', '.join(STATES)}")
    if api_key:
        problem = unit_flags.api_key_problem(api_key, "sglang_router_api_key")
        if problem:
            raise RouterConfigError(problem)
    port = unit_flags.port_number(settings["port"], "sglang_router_port")
    metrics_port = unit_flags.port_number(settings["prometheus_port"], "sglang_router_prometheus_port")
    problem = exposure_problem(str(settings["host"]), port, api_key, bool(settings["allow_unauthenticated"]))
    if problem:
        raise RouterConfigError(problem)
    flags = router_flags(settings)
    cafiles = _worker_cafiles(settings, flags)
    if cafiles:
        flags["ca-cert-paths"] = [entry["dest"] for entry in cafiles]
    groups = flag_groups(flags)
    unit = systemd.unit_settings(dict(unit_values), prefix="sglang_router_")
    env_flags = [("api-key", API_KEY_ENV)] if api_key else []
    head = sglang_launcher.command_line(
        f"{settings['venv']}/bin/python3", f"{unit['libexec_dir']}/sglang_launcher.py", MODULE, env_flags, [], strip_ansi=True
    )
    metrics_host = str(settings["prometheus_host"])
    try:  # what Prometheus is handed: a plain host:port and, when set, a targets file of plain characters
        targets_file.check_host(str(settings["metrics_address"] or host), "sglang_router_metrics_address")
        file_sd_path = targets_file.check_path(str(settings["file_sd_path"]), "sglang_router_file_sd_path") if settings["file_sd_path"] else ""
    except targets_file.FileSdError as err:
        raise RouterConfigError(str(err)) from None
    return {
        "host": host,
        "flags": flags,
        "argv": head + [word for group in groups for word in group],
        "exec_start": systemd.exec_start(head, groups),
        "environment_assignments": [systemd.environment_assignment(k, v) for k, v in ENVIRONMENT],
        "unit": unit,
        "worker_urls": list(flags["worker-urls"]),
        "url": f"http://{unit_flags.client_host(str(settings['host']))}:{port}",
        "metrics_url": f"http://{unit_flags.client_host(metrics_host)}:{metrics_port}/metrics",
        "metrics_target": f"{unit_flags.url_host(str(settings['metrics_address'] or host))}:{metrics_port}",
        "file_sd_path": file_sd_path,
        "api_key_env": API_KEY_ENV if api_key else None,
        # The workers' CAs: each control-node file (source) and where the role installs it (dest, in tls_dir).
        "worker_cafiles": cafiles,
        "tls_dir": str(settings["tls_dir"]) if cafiles else "",
    }


def _worker_cafiles(settings: Mapping[str, Any], flags: Mapping[str, Any]) -> list[dict[str, str]]:
    """The CAs the router verifies https workers with (``--ca-cert-paths``), each installed as its own file;
    RouterConfigError for https workers without one (the router would trust only the public CAs)."""
    sources = [str(path) for path in settings.get("worker_cafiles") or []]
    https = [url for url in flags["worker-urls"] if str(url).startswith("https://")]
    if https and not sources and "ca-cert-paths" not in flags:
        raise RouterConfigError(
            f"the workers {', '.join(https)} speak TLS and no CA to verify them is known. Fix: set "
            "sglang_server_tls_cafile on them (the router takes each worker's CA), or give the router's own "
            "ca-cert-paths in sglang_router_extra_flags"
        )
    if not sources:
        return []
    directory = systemd.absolute_path("sglang_router_tls_dir", settings["tls_dir"])
    return [{"source": path, "dest": f"{directory}/worker-ca-{index}.crt"} for index, path in enumerate(sources, 1)]


def env_file_lines(api_key: str) -> list[str]:
    """The router's 0600 EnvironmentFile=: its API key, for the launcher."""
    return [systemd.env_file_line(API_KEY_ENV, api_key)] if api_key else []


def in_flight(load: Any) -> int:
    """Requests a worker still holds: running + waiting over its data-parallel ranks.

    Reads sglang's ``GET /v1/loads`` answer (``{"loads": [{"num_running_reqs", "num_waiting_reqs",
    ...}, ...], "aggregate": ...}``, srt/entrypoints/v1_loads.py, what the rollout asks) and the
    deprecated ``GET /get_load`` one (a list of ``{"num_reqs", "num_waiting_reqs", ...}``, one per rank,
    or one such dict) of older workers."""
    if isinstance(load, Mapping) and "loads" in load:
        ranks, keys = load["loads"], ("num_running_reqs", "num_waiting_reqs")
        if not isinstance(ranks, list):
            raise ValueError(f"not a /v1/loads answer: {load!r}")
    else:
        ranks, keys = (load if isinstance(load, list) else [load]), ("num_reqs", "num_waiting_reqs")
    total = 0
    for rank in ranks:
        if not isinstance(rank, Mapping):
            raise ValueError(f"not a /v1/loads or /get_load answer: {load!r}")
        for key in keys:
            value = rank.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"not a /v1/loads or /get_load answer ({key}={value!r}): {load!r}")
            total += value
    return total


def worker_entry(workers_answer: Any, url: str) -> dict[str, Any] | None:
    """The router's entry for ``url`` in its ``GET /workers`` answer, or None."""
    if not isinstance(workers_answer, Mapping) or not isinstance(workers_answer.get("workers"), list):
        raise ValueError(f"not a /workers answer: {workers_answer!r}")
    wanted = url.rstrip("/")
    for worker in workers_answer["workers"]:
        if isinstance(worker, Mapping) and str(worker.get("url", "")).rstrip("/") == wanted:
            return dict(worker)
    return None


UNKNOWN_MODEL = "unknown"
"""The model smg lists for a worker whose model it could not ask (it asked without the worker's key)."""


def worker_in_rotation(workers_answer: Any, url: str) -> bool:
    """Whether the router's ``GET /workers`` answer lists ``url`` healthy and knowing what it serves: smg lists a
    worker added without its API key with model ``unknown`` (its model discovery got 401), healthy yet never
    chosen for a request that names the served model."""
    entry = worker_entry(workers_answer, url)
    if not entry or entry.get("is_healthy") is not True:
        return False
    return str(entry.get("model_id") or "") != UNKNOWN_MODEL


def workers_with_another_key(router_key: str, worker_keys: Mapping[str, Any]) -> list[str]:
    """The workers (host -> its sglang_server_api_key) whose key is not the router's: smg sends its own key to
    the workers (model discovery, health, requests), so such a worker answers it 401 and never serves through
    it. Names only, never a key. A router without a key checks nothing (its exposure rule decides)."""
    if not router_key:
        return []
    return sorted(host for host, key in worker_keys.items() if str(key or "") != router_key)


def worker_addition(url: str, api_key: str) -> dict[str, str]:
    """The ``POST /workers`` body that puts a worker (back) into a router: its URL and, when the workers have
    one, their API key, which smg needs to ask the worker what it serves (without it: model ``unknown``)."""
    return {"url": checked_worker_url(url, "the worker's URL"), **({"api_key": api_key} if api_key else {})}


# smg_worker_cb_state{worker="http://10.0.0.1:8000"} 1 (smg; 0 closed, 1 open, 2 half-open).
_CB_STATE = re.compile(r'^[a-z_:]*worker_cb_state\{(?:[^}]*,)?worker="(?P<url>[^"]+)"[^}]*\}\s+(?P<value>[0-9.eE+-]+)\s*$')


def circuit_states(metrics_text: str) -> dict[str, int]:
    """Worker URL -> the router's circuit breaker state for it (0 closed, 1 open: requests refused,
    2 half-open: on trial), from the router's Prometheus text (its --prometheus-port)."""
    states: dict[str, int] = {}
    for line in metrics_text.splitlines():
        match = _CB_STATE.match(line.strip())
        if match:
            states[match["url"].rstrip("/")] = int(float(match["value"]))
    return states


def circuits_closed(urls: list[str], metrics_text: str) -> bool:
    """Whether the router takes requests for every URL at full rate: its circuit is closed. A worker
    the router is healthy with can still have its circuit open (for --cb-timeout-duration-secs after
    a crash): taking the others out then leaves the router nothing to send to. A URL without the
    metric (circuit breaker disabled, another router version) counts as closed."""
    states = circuit_states(metrics_text)
    return all(states.get(url.rstrip("/"), 0) == 0 for url in urls)


def file_sd(
    workers: Mapping[str, str], routers: Mapping[str, str], labels: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """Prometheus file_sd groups: each worker (name -> URL; sglang serves /metrics on its own port
    with --enable-metrics) and each router's metrics endpoint (name -> ``address:port``). A worker that
    serves TLS gets ``__scheme__: https`` (Prometheus' own label for a target's scheme): the scrape job's
    tls_config then verifies it (monitoring/prometheus/scrape-sglang.yml)."""
    common = dict(labels or {})
    groups: list[dict[str, Any]] = []
    for name, url in workers.items():
        scheme, _, rest = url.partition("://")
        target = rest.split("/", 1)[0]
        tls = {"__scheme__": "https"} if scheme == "https" else {}
        groups.append({"targets": [target], "labels": {**common, "job": "sglang-worker", "instance_name": name, **tls}})
    for name, target in routers.items():
        groups.append({"targets": [target], "labels": {**common, "job": "sglang-router", "instance_name": name}})
    return groups
