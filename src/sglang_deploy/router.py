"""sglang-router (the pinned Rust router from PyPI) in front of several sglang workers: the router's
command line, the worker URLs taken from the inventory, the workers' in-flight count for a drain, and
the Prometheus file_sd targets. The sglang_router role and playbooks/rolling.yml call these through
``filter_plugins/sglang_router.py``; the rules live here once, with unit tests.

Checked against sglang-router 0.3.2 (``python -m sglang_router.launch_router --help`` and its HTTP
API): ``--worker-urls URL...``, ``--policy {random,round_robin,cache_aware,power_of_two,manual}``,
``--health-check-interval-secs`` and friends, ``--request-timeout-secs``, ``--prometheus-host/-port``;
the worker API is ``GET /workers`` (``{"workers": [{"id", "url", "is_healthy", "load", ...}]}``),
``POST /workers`` ``{"url": ...}`` and ``DELETE /workers/<id>`` (both answer 202 and act in the
background), all behind the router's API key; ``/health``, ``/liveness`` and ``/readiness``
(``{"status": "ready", "healthy_workers", "total_workers"}``, 503 without a healthy worker) are open.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from sglang_deploy_host import endpoint

POLICIES = ("random", "round_robin", "cache_aware", "power_of_two", "manual")
"""sglang-router 0.3.2's --policy choices."""

SECRET_FLAGS = frozenset(
    {"api-key", "control-plane-api-keys", "oracle-password", "postgres-db-url", "redis-url", "client-key-path"}
)
"""Flags whose value is a secret (or a URL that usually carries one): never in the unit's argv."""

DEFAULT_WORKER_PORT = 30000
"""sglang's own --port default, used when a worker's flags name no port."""


class RouterConfigError(ValueError):
    """A router setting that cannot be turned into a safe command line."""


def _bracket(address: str) -> str:
    try:
        if isinstance(ipaddress.ip_address(address), ipaddress.IPv6Address):
            return f"[{address}]"
    except ValueError:
        pass
    return address


# The variables of a worker host its URL is made of (the filters read only these).
WORKER_URL_VARS = (
    "sglang_router_worker_url", "sglang_server_flags", "sglang_server_flags_override",
    "sglang_server_profile", "sglang_server_profiles", "sglang_router_worker_address", "ansible_host",
)  # fmt: skip


def worker_url(hostname: str, host_vars: Mapping[str, Any]) -> str:
    """A worker's URL as the router reaches it: its ``sglang_router_worker_url`` when set, else
    ``http://<ansible_host or name>:<port>`` with the port of its merged sglang_server flags."""
    explicit = host_vars.get("sglang_router_worker_url")
    if explicit:
        return checked_worker_url(str(explicit).rstrip("/"), f"{hostname}: sglang_router_worker_url")
    # The port alone, the override first, then the launch profile: the flags' other values need not
    # template here.
    override = host_vars.get("sglang_server_flags_override") or {}
    profile = host_vars.get("sglang_server_profile") or ""
    profiles = host_vars.get("sglang_server_profiles") or {}
    profiled = (profiles.get(profile) or {}) if isinstance(profiles, Mapping) else {}
    if "port" in override:
        port = override["port"]
    elif "port" in profiled:
        port = profiled["port"]
    else:
        port = (host_vars.get("sglang_server_flags") or {}).get("port")
    port = DEFAULT_WORKER_PORT if port is None else port
    if isinstance(port, bool) or not str(port).isdigit() or not 1 <= int(port) <= 65535:
        raise RouterConfigError(f"{hostname}: worker port {port!r} is not a port (1-65535)")
    address = str(host_vars.get("sglang_router_worker_address") or host_vars.get("ansible_host") or hostname)
    return f"http://{_bracket(address)}:{int(port)}"


def checked_worker_url(url: str, what: str) -> str:
    """A worker URL that may go into the router's command line: http(s), a host, no credentials (they
    would sit in ExecStart=, which every local user reads), no space or control character."""
    try:
        return endpoint.check_url(url)
    except ValueError as err:
        raise RouterConfigError(f"{what}: {err}") from None


def worker_urls(hostnames: Iterable[str], hostvars: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One URL per worker host, in inventory order; two hosts with one URL is a mistake."""
    urls = [worker_url(name, hostvars.get(name) or {}) for name in hostnames]
    duplicates = sorted({u for u in urls if urls.count(u) > 1})
    if duplicates:
        raise RouterConfigError(f"several workers share a URL: {', '.join(duplicates)}")
    return urls


def _systemd_word(word: str) -> str:
    """One argv word quoted for ExecStart= (double quotes, with systemd's escapes)."""
    if any(c in word for c in "\n\r\0"):
        raise RouterConfigError(f"a router argument holds a control character: {word!r}")
    escaped = word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{escaped}"'


def flag_argv(flags: Mapping[str, Any]) -> list[str]:
    """A flag mapping (name -> value; True = bare switch; False/None = left out; list = several
    values) as router argv, in the mapping's order. Secret flags are refused."""
    argv: list[str] = []
    for raw_name, value in flags.items():
        name = str(raw_name).removeprefix("--").replace("_", "-")
        if name in SECRET_FLAGS:
            raise RouterConfigError(
                f"--{name} must not be a flag: a secret in argv is visible to every local user "
                "(the API key is sglang_router_api_key, handed over in-process)"
            )
        if value is None or value is False:
            continue
        if value is True:
            argv.append(f"--{name}")
        elif isinstance(value, (list, tuple)):
            if not value:
                continue
            argv.append(f"--{name}")
            argv.extend(str(v) for v in value)
        elif isinstance(value, Mapping):
            raise RouterConfigError(f"--{name}: a mapping is not a flag value")
        else:
            if isinstance(value, float) and not math.isfinite(value):
                raise RouterConfigError(f"--{name}: {value} is not a number a router accepts")
            argv.extend([f"--{name}", str(value)])
    return argv


def router_flags(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The role's settings (without the sglang_router_ prefix) as the router's flags."""
    policy = settings["policy"]
    if policy not in POLICIES:
        raise RouterConfigError(f"policy {policy!r} is not one of {', '.join(POLICIES)}")
    urls = [checked_worker_url(str(url), "sglang_router_worker_urls") for url in settings["worker_urls"]]
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


def exec_args(settings: Mapping[str, Any]) -> str:
    """The router's argv for ExecStart=, each word quoted for systemd."""
    return " ".join(_systemd_word(w) for w in flag_argv(router_flags(settings)))


def is_loopback(address: str) -> bool:
    if address in ("localhost", ""):
        return address == "localhost"
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def exposure_problem(host: str, api_key: str, allow_unauthenticated: bool) -> str | None:
    """Why this router would be an open endpoint, or None."""
    if api_key or allow_unauthenticated or is_loopback(host):
        return None
    return (
        f"the router would listen on {host} without an API key: anyone who reaches it can generate and "
        "add or remove workers. Set sglang_router_api_key (vault), bind 127.0.0.1, or set "
        "sglang_router_allow_unauthenticated: true on purpose"
    )


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


# smg_worker_cb_state{worker="http://10.0.0.1:8000"} 1 (sglang-router 0.3.2; 0 closed, 1 open, 2 half-open).
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


def _target(url_or_host: str, port: Any = None) -> str:
    if port is None:
        rest = url_or_host.split("://", 1)[-1]
        return rest.split("/", 1)[0]
    return f"{_bracket(url_or_host)}:{int(port)}"


def file_sd(
    workers: Mapping[str, str],
    routers: Mapping[str, tuple[str, Any]],
    labels: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Prometheus file_sd groups: each worker (name -> URL; sglang serves /metrics on its own port
    with --enable-metrics) and each router's metrics port (name -> (address, port))."""
    common = dict(labels or {})
    groups: list[dict[str, Any]] = []
    for name, url in workers.items():
        groups.append({"targets": [_target(url)], "labels": {**common, "job": "sglang-worker", "instance_name": name}})
    for name, (address, port) in routers.items():
        groups.append(
            {"targets": [_target(address, port)], "labels": {**common, "job": "sglang-router", "instance_name": name}}
        )
    return groups
