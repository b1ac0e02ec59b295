"""Filters for the sglang_router role and playbooks/rolling.yml: each one is a single call into
``sglang_deploy.router``."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

try:
    from sglang_deploy import router
except ImportError as exc:  # a clear message beats a bare "no filter named sglang_router_..."
    raise ImportError(
        "the sglang_deploy package is not importable by this Ansible's Python. "
        "Fix: run scripts/setup (or `pip install -e .` in the venv running ansible-playbook)"
    ) from exc


def _call(func: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return func(*args, **kwargs)
    except (router.RouterConfigError, ValueError) as err:
        raise AnsibleFilterError(str(err)) from None


def _worker_vars(host_vars: Any) -> dict[str, Any]:
    """Only what a worker's URL is made of, read key by key: a worker's other variables (its flags'
    model path from the sglang_common role's defaults) cannot be templated from a router's play."""
    picked: dict[str, Any] = {}
    for name in router.WORKER_URL_VARS:
        if name in host_vars:
            picked[name] = host_vars[name]
    return picked


def sglang_router_worker_urls(hostnames: Any, hostvars: Any) -> list[str]:
    """groups['sglang_servers'] | sglang_router_worker_urls(hostvars)."""
    return _call(router.worker_urls, list(hostnames), {h: _worker_vars(hostvars[h]) for h in hostnames})


def sglang_router_worker_url(hostname: str, hostvars: Any) -> str:
    return _call(router.worker_url, hostname, _worker_vars(hostvars[hostname]))


def sglang_router_exec_args(settings: dict[str, Any]) -> str:
    return _call(router.exec_args, settings)


def sglang_router_exposure_problem(host: str, api_key: str, allow_unauthenticated: bool) -> str:
    return router.exposure_problem(str(host), str(api_key or ""), bool(allow_unauthenticated)) or ""


def sglang_router_in_flight(load: Any) -> int:
    return _call(router.in_flight, load)


def sglang_router_worker_entry(answer: Any, url: str) -> dict[str, Any]:
    return _call(router.worker_entry, answer, url) or {}


def sglang_router_worker_entry_healthy(url: str, answer: Any) -> bool:
    """Whether the router's GET /workers answer lists ``url`` as healthy."""
    entry = _call(router.worker_entry, answer, url)
    return bool(entry and entry.get("is_healthy") is True)


def sglang_router_circuits_closed(urls: Any, metrics_text: Any) -> bool:
    """Whether the router's circuit breaker is closed for every URL (its Prometheus text)."""
    return _call(router.circuits_closed, list(urls), str(metrics_text))


def sglang_router_circuit_states(metrics_text: Any) -> dict[str, int]:
    return _call(router.circuit_states, str(metrics_text))


def sglang_router_file_sd(workers: dict[str, str], routers: dict[str, Any], labels: Any = None) -> list[dict[str, Any]]:
    return _call(router.file_sd, workers, {k: tuple(v) for k, v in routers.items()}, labels)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "sglang_router_worker_urls": sglang_router_worker_urls,
            "sglang_router_worker_url": sglang_router_worker_url,
            "sglang_router_exec_args": sglang_router_exec_args,
            "sglang_router_exposure_problem": sglang_router_exposure_problem,
            "sglang_router_in_flight": sglang_router_in_flight,
            "sglang_router_worker_entry": sglang_router_worker_entry,
            "sglang_router_worker_entry_healthy": sglang_router_worker_entry_healthy,
            "sglang_router_circuits_closed": sglang_router_circuits_closed,
            "sglang_router_circuit_states": sglang_router_circuit_states,
            "sglang_router_file_sd": sglang_router_file_sd,
        }
