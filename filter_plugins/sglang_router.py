"""Filters for the sglang_router and sglang_rolling roles and the router playbooks: each one is a
single call into ``sglang_deploy.fleet.router``."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

from sglang_deploy.fleet import router


def _call(func: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return func(*args, **kwargs)
    except (router.RouterConfigError, ValueError) as err:
        raise AnsibleFilterError(str(err)) from None


def sglang_router_resolve(settings: Any, unit: Any, host: str, api_key: Any = "") -> dict[str, Any]:
    """The router resolved once (published as the fact sglang_router_resolved)."""
    return _call(router.resolve, dict(settings), dict(unit), host=host, api_key=str(api_key or ""))


def sglang_router_basis(settings: Any, unit: Any, api_key: Any = "") -> str:
    """What a resolution of these settings would be made from (router.basis; no secret in it)."""
    return _call(router.basis, dict(settings), dict(unit), api_key=str(api_key or ""))


def sglang_router_env_file_lines(api_key: Any) -> list[str]:
    return _call(router.env_file_lines, str(api_key or ""))


def sglang_worker_urls(hostnames: Any, hostvars: Any) -> list[str]:
    """groups['sglang_servers'] | sglang_worker_urls(hostvars): each worker's resolved URL."""
    return _call(router.worker_urls, {h: hostvars[h].get("sglang_server_resolved") for h in hostnames})


def sglang_worker_cafiles(hostnames: Any, hostvars: Any) -> list[str]:
    """groups['sglang_servers'] | sglang_worker_cafiles(hostvars): the CAs of the workers serving TLS, each once."""
    return _call(router.worker_cafiles, {h: hostvars[h].get("sglang_server_resolved") for h in hostnames})


def sglang_router_endpoints(hostnames: Any, hostvars: Any) -> dict[str, dict[str, str]]:
    """routers | sglang_router_endpoints(hostvars): each router's resolved API and metrics URL."""
    return _call(router.router_endpoints, {h: hostvars[h].get("sglang_router_resolved") for h in hostnames})


def sglang_router_in_flight(load: Any) -> int:
    return _call(router.in_flight, load)


def sglang_router_worker_entry(answer: Any, url: str) -> dict[str, Any]:
    return _call(router.worker_entry, answer, url) or {}


def sglang_router_worker_entry_healthy(url: str, answer: Any) -> bool:
    """Whether the router's GET /workers answer lists ``url`` healthy and knowing its model (in rotation)."""
    return bool(_call(router.worker_in_rotation, answer, url))


def sglang_router_workers_with_another_key(hostnames: Any, hostvars: Any, router_key: Any = "") -> list[str]:
    """workers | sglang_router_workers_with_another_key(hostvars, sglang_router_api_key): names, never keys."""
    keys = {h: hostvars[h].get("sglang_server_api_key", "") for h in hostnames}
    return _call(router.workers_with_another_key, str(router_key or ""), keys)


def sglang_router_worker_addition(url: str, api_key: Any = "") -> dict[str, str]:
    """The POST /workers body for ``url`` (with the workers' key, so that the router learns its model)."""
    return _call(router.worker_addition, url, str(api_key or ""))


def sglang_router_circuits_closed(urls: Any, metrics_text: Any) -> bool:
    """Whether the router's circuit breaker is closed for every URL (its Prometheus text)."""
    return _call(router.circuits_closed, list(urls), str(metrics_text))


def sglang_router_circuit_states(metrics_text: Any) -> dict[str, int]:
    return _call(router.circuit_states, str(metrics_text))


def sglang_router_file_sd(workers: dict[str, str], routers: dict[str, str], labels: Any = None) -> list[dict[str, Any]]:
    return _call(router.file_sd, workers, routers, labels)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "sglang_router_resolve": sglang_router_resolve,
            "sglang_router_basis": sglang_router_basis,
            "sglang_router_env_file_lines": sglang_router_env_file_lines,
            "sglang_worker_urls": sglang_worker_urls,
            "sglang_worker_cafiles": sglang_worker_cafiles,
            "sglang_router_endpoints": sglang_router_endpoints,
            "sglang_router_in_flight": sglang_router_in_flight,
            "sglang_router_worker_entry": sglang_router_worker_entry,
            "sglang_router_worker_entry_healthy": sglang_router_worker_entry_healthy,
            "sglang_router_worker_addition": sglang_router_worker_addition,
            "sglang_router_workers_with_another_key": sglang_router_workers_with_another_key,
            "sglang_router_circuits_closed": sglang_router_circuits_closed,
            "sglang_router_circuit_states": sglang_router_circuit_states,
            "sglang_router_file_sd": sglang_router_file_sd,
        }
